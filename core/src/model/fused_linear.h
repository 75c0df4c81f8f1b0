// y = x·Wᵀ + b as one autograd node over cpu::gemm (oneDNN's sgemm where LibTorch brought it) for
// CPU fp32, and over oneDNN's bf16 GEMM under CPU bf16 autocast (y then fp32, not autocast's bf16);
// ATen's linear otherwise. Saves ATen's transpose, addmm and their gradients' views.
#pragma once

#include <torch/types.h>

namespace normlab {

// x [..., K], weight [N, K], bias [N] → [..., N].
torch::Tensor fused_linear(const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias);

}  // namespace normlab
