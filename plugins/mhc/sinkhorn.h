// Sinkhorn–Knopp normalization as mHC uses it (Xie et al. 2025, arXiv:2512.24880): M = exp(H̃),
// then `iterations` times: divide each row by its sum, then each column by its sum. The result is
// close to doubly stochastic (non-negative, rows and columns summing to 1). Over the last two dims.
#pragma once

#include <torch/types.h>

namespace normlab::mhc {

inline torch::Tensor sinkhorn_knopp(const torch::Tensor& logits, int iterations) {
  // Subtracting the per-matrix maximum leaves every normalized result unchanged and keeps exp
  // finite.
  torch::Tensor m =
      torch::exp(logits - std::get<0>(logits.flatten(-2).max(-1, true)).unsqueeze(-1));
  for (int it = 0; it < iterations; ++it) {
    m = m / m.sum(-1, true);
    m = m / m.sum(-2, true);
  }
  return m;
}

}  // namespace normlab::mhc
