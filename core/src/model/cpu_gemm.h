// Row-major fp32 GEMM for the fused CPU kernels, through libraries the process already has:
// - gemm(): oneDNN's dnnl_sgemm where LibTorch brought libdnnl (Debian's does), else the BLAS.
//   Measured on 2 threads (AMD EPYC, d_model-64 layer shapes such as 768×64·64×192): oneDNN
//   195–210 GFLOP/s against OpenBLAS 0.3.21's 100–130, whose threading splits these skinny
//   products badly; equal on 1 thread.
// - blas_gemm(): the Fortran BLAS sgemm (OpenBLAS under Debian's LibTorch, MKL inside the PyPI
//   wheel's libtorch_cpu; both LP64), for tiny blocks such as attention's per-head products, where
//   OpenBLAS's small-matrix kernels take half of oneDNN's time.
// Both run single-threaded inside at::parallel_for, on the OpenMP pool's threads outside it.
// Calling them directly skips ATen's per-call dispatch, checks and allocations.
#pragma once

#include <dlfcn.h>

#include <cstdint>

#include "speed_levers.h"

namespace normlab::cpu {

using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                       const float*, const int*, const float*, const int*, const float*, float*,
                       const int*);

inline Sgemm blas_sgemm() {
  static const Sgemm fn = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return fn;
}

using OnednnSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                            const float*, int64_t, float, float*, int64_t);

inline OnednnSgemm onednn_sgemm() {
  static const OnednnSgemm fn = reinterpret_cast<OnednnSgemm>(dlsym(RTLD_DEFAULT, "dnnl_sgemm"));
  return fn;
}

// C [m×n] = alpha·op(A)·op(B) + beta·C with row strides lda, ldb, ldc: the column-major sgemm
// computing Cᵀ = op(B)ᵀ·op(A)ᵀ.
inline void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  const char tra = tb ? 'T' : 'N', trb = ta ? 'T' : 'N';
  const int M = int(n), N = int(m), K = int(k), LDA = int(ldb), LDB = int(lda), LDC = int(ldc);
  blas_sgemm()(&tra, &trb, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
}

// The same product for layer-sized operands (see above for which library runs it).
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (OnednnSgemm fn = onednn_sgemm(); fn && speed_levers().onednn_gemm)
    fn(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Which library gemm() uses, for env.json and the benchmark.
inline const char* gemm_library() {
  return onednn_sgemm() && speed_levers().onednn_gemm ? "oneDNN dnnl_sgemm" : "BLAS sgemm_";
}

}  // namespace normlab::cpu
