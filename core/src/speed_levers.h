// Switches for the speed levers (all on), so `normlab bench --disable ...` can measure each one.
#pragma once

namespace normlab {

struct SpeedLevers {
  bool counter_dropout = true;   // counter-based dropout masks instead of torch::dropout
  bool flat_adamw = true;        // AdamW over one flat buffer instead of per-parameter kernels
  bool fused_loss = true;        // one-kernel label-smoothed cross entropy
  bool fused_projection = true;  // the output projection inside the loss, by blocks of rows
  bool onednn_gemm = true;       // layer-sized products by oneDNN's sgemm (LibTorch's or system's)
  bool system_openblas = true;   // small products by the system's OpenBLAS beside another BLAS
  bool fused_linear = true;      // attention's projections as one node each (no ATen linear)
  bool fused_attention = true;   // attention as one node calling sgemm per (sentence, head) block
  bool fused_ffn = true;         // the FFN branch (both linears, ReLU, both dropouts) as one node
  bool bf16_gemm = true;  // under bf16 autocast, the fused kernels' products by oneDNN's bf16 GEMM
  bool fused_residual_norm = true;  // a sublayer's residual add and LayerNorm as one node
};

inline SpeedLevers& speed_levers() {
  static SpeedLevers levers;
  return levers;
}

}  // namespace normlab
