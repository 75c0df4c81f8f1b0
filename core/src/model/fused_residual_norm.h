// A sublayer's residual add and LayerNorm, LN(α·x + b), on the CPU in fp32 as one autograd node:
// one pass over the rows forward (sum, statistics, normalisation) and one backward, where the
// unfused path dispatches, allocates and records an add (or a scale and an add) and a LayerNorm,
// each forward and backward: at d_model 64 that costs more than the arithmetic. The compositions
// are Post-LN's LN(x + F), DeepNorm's LN(α·x + F) and B2T's last LN((x + F) + x_in).
#pragma once

#include <torch/types.h>

namespace normlab {

class NormImpl;

// Whether the fused path computes norm(α·x + b): x and b (if defined) the same shape, CPU fp32
// without autocast, a LayerNorm with a gain and bias per channel or none, and the lever on
// (`normlab bench --disable norm`).
bool fused_residual_norm_applies(const torch::Tensor& x, const torch::Tensor& b,
                                 const NormImpl& norm);

// norm(α·x + b), or norm(α·x) where b is undefined. α·x + b rounds as ATen's x * α + b does.
torch::Tensor fused_residual_norm(const torch::Tensor& x, const torch::Tensor& b, double alpha,
                                  const NormImpl& norm);

}  // namespace normlab
