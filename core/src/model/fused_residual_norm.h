// A sublayer's residual add and norm, LN(α·x + b), on the CPU in fp32 as one autograd node:
// one pass over the rows forward (sum, statistics, normalisation) and one backward, where the
// unfused path dispatches, allocates and records an add (or a scale and an add) and a LayerNorm,
// each forward and backward: at d_model 64 that costs more than the arithmetic. The compositions
// are Post-LN's LN(x + F), DeepNorm's LN(α·x + F) and B2T's last LN((x + F) + x_in); without b
// it is a norm on its own (Pre-LN's). LayerNorm and RMSNorm (whose unfused form is ~6 operators
// forward and ~10 backward).
#pragma once

#include <torch/types.h>

namespace normlab {

class NormImpl;

// Whether the fused path computes norm(α·x + b): x and b (if defined) the same shape, CPU fp32
// without autocast, a LayerNorm or RMSNorm with a gain (and bias) per channel or none, the lever on
// (`normlab bench --disable norm`).
bool fused_residual_norm_applies(const torch::Tensor& x, const torch::Tensor& b,
                                 const NormImpl& norm);

// norm(α·x + b), or norm(α·x) where b is undefined. α·x + b rounds as ATen's x * α + b does.
torch::Tensor fused_residual_norm(const torch::Tensor& x, const torch::Tensor& b, double alpha,
                                  const NormImpl& norm);

}  // namespace normlab
