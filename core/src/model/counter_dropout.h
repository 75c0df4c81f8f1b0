// Dropout whose mask is a counter-based hash of (seed, element index): no mask tensor, no serial
// Bernoulli loop; the backward pass recomputes the mask. Each call draws its seed from LibTorch's
// default CPU generator, so a saved/restored generator state replays the same masks (bitwise resume).
#pragma once

#include <torch/types.h>

namespace normlab {

// Like torch::dropout(x, p, training); CPU float tensors use the counter-based mask, anything
// else falls back to torch::dropout.
torch::Tensor counter_dropout(const torch::Tensor& x, double p, bool training);

}  // namespace normlab
