// Switches for the speed levers (all on), so `normlab bench --disable ...` can measure each one.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

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
  // On a GPU: LibTorch 2.x's fused RMSNorm and AdamW, normlab's rotary and SwiGLU kernels.
  bool cuda_fused = true;
  // Each of them, turned off for a run by the fused self-check when it differs from ATen's
  // composition on the run's device (run/fused_self_check.h).
  bool cuda_rope = true, cuda_swiglu = true, cuda_rms_norm = true, cuda_adamw = true;
  bool sdpa_grouped_heads = true;
  // Tests only: "rope" or "swiglu" makes that kernel's host twin wrong by 1 part in 64, so the
  // self-check's catch of a wrong kernel is tested without a GPU.
  std::string test_fault;
  // Tests only: the GPU path's fused operations on CPU tensors too (normlab's kernels as their
  // host twins), so that their use in every scheme is checked on machines without a GPU.
  bool gpu_paths_on_cpu = false;
};

// NORMLAB_CUDA_FUSED=0 in the environment turns cuda_fused off (ATen's compositions on a GPU).
inline SpeedLevers& speed_levers() {
  static SpeedLevers levers = [] {
    SpeedLevers l;
    const char* fused = std::getenv("NORMLAB_CUDA_FUSED");
    l.cuda_fused = fused == nullptr || std::string_view(fused) != "0";
    return l;
  }();
  return levers;
}

}  // namespace normlab
