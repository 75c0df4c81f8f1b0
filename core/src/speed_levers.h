// Switches for the speed levers (all on), so `normlab bench --disable ...` can measure each one.
#pragma once

namespace normlab {

struct SpeedLevers {
  bool counter_dropout = true;  // counter-based dropout masks instead of torch::dropout
  bool flat_adamw = true;       // AdamW over one flat buffer instead of per-parameter kernels
  bool fused_loss = true;       // one-kernel label-smoothed cross entropy
  bool fused_attention = true;  // attention as one node calling sgemm per (sentence, head) block
};

inline SpeedLevers& speed_levers() {
  static SpeedLevers levers;
  return levers;
}

}  // namespace normlab
