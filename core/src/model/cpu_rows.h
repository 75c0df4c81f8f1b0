// Row loops shared by the fused CPU kernels (fp32, row-major [rows × n] buffers).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace normlab::cpu {

constexpr int64_t kRowGrain = 64;  // rows per task of the elementwise loops

// Each row of c = bias (then a GEMM with beta = 1 adds the product).
inline void fill_rows(float* c, const float* bias, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::copy(bias, bias + n, c + i * n);
  });
}

// out[j] = Σ_i x[i·n + j] (a bias gradient), accumulated in double in row order: deterministic
// for any thread count.
inline void column_sums(const float* x, int64_t rows, int64_t n, float* out) {
  std::vector<double> acc(size_t(n), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) acc[size_t(j)] += x[i * n + j];
  for (int64_t j = 0; j < n; ++j) out[j] = float(acc[size_t(j)]);
}

}  // namespace normlab::cpu
