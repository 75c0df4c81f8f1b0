// Dropout whose mask is a counter-based hash of (seed, element index): no mask tensor, no serial
// Bernoulli loop; the backward pass recomputes the mask. Each call draws its seed from LibTorch's
// default CPU generator, so a saved/restored generator state replays the same masks (bitwise
// resume).
#pragma once

#include <torch/types.h>

namespace normlab {

// Like torch::dropout(x, p, training); CPU float tensors use the counter-based mask, anything
// else falls back to torch::dropout.
torch::Tensor counter_dropout(const torch::Tensor& x, double p, bool training);

// For fused kernels: the seed one counter_dropout call draws, and its mask on elements
// [begin, begin + n) of a float tensor, out[i] = keep(i) ? in[i]/(1 − p) : 0 (in may be out).
uint64_t draw_dropout_seed();
void counter_dropout_span(const float* in, float* out, int64_t begin, int64_t n, uint64_t seed,
                          double p);

}  // namespace normlab
