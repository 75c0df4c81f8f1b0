// Row-major fp32 GEMM for the fused CPU kernels, through the process's libraries or the system's:
// - gemm(): oneDNN's dnnl_sgemm where LibTorch brought libdnnl (Debian's does), else the BLAS.
//   Measured on 2 threads (AMD EPYC, d_model-64 layer shapes such as 768×64·64×192): oneDNN
//   195–210 GFLOP/s against OpenBLAS 0.3.21's 100–130, whose threading splits these skinny
//   products badly; equal on 1 thread.
// - blas_gemm(): the Fortran BLAS sgemm, OpenBLAS where it is installed, for tiny blocks such as
//   attention's per-head products, where OpenBLAS's small-matrix kernels take half of oneDNN's
//   time.
// The PyPI wheel hides its oneDNN and exports MKL's sgemm, whose generic kernels copy and scale
// even 24×24 blocks. Where the system has them (Debian: libdnnl2 and libopenblas0, which Debian's
// LibTorch brings too), both are loaded privately instead: the wheel build's 64-128-2 18L-18L
// step, 2 threads, took 100 ms with them against 124 ms with MKL (Debian's build: 100).
// Both run single-threaded inside at::parallel_for, on the OpenMP pool's threads outside it.
// Calling them directly skips ATen's per-call dispatch, checks and allocations.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <initializer_list>

#include "speed_levers.h"

namespace normlab::cpu {

using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                       const float*, const int*, const float*, const int*, const float*, float*,
                       const int*);

// `symbol` from the first of `sonames` that loads, or null. RTLD_LOCAL: nothing else binds to the
// library; RTLD_DEEPBIND: it binds to its own symbols first (without it, names that the wheel's
// libtorch_cpu exports too bound there and the products came out wrong: suite fused_kernels).
inline void* system_symbol(const char* symbol, std::initializer_list<const char*> sonames) {
  for (const char* soname : sonames)
    if (void* lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND))
      return dlsym(lib, symbol);
  return nullptr;
}

// The system's OpenBLAS (Debian: libopenblas0), which runtime_env.cpp also reads its kernels from.
inline constexpr const char* kSystemOpenblas = "libopenblas.so.0";

// blas_gemm's sgemm_ and its library's name: the process's where it is OpenBLAS, else the system's
// OpenBLAS, else the process's BLAS (the wheel's MKL).
struct SmallGemm {
  Sgemm fn = nullptr;
  const char* library = "";
};

inline const SmallGemm& small_gemm() {
  static const SmallGemm g = [] {
    auto process = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
    if (dlsym(RTLD_DEFAULT, "openblas_get_config")) return SmallGemm{process, "OpenBLAS sgemm_"};
    if (speed_levers().system_openblas)
      if (void* system = system_symbol("sgemm_", {kSystemOpenblas}))
        return SmallGemm{reinterpret_cast<Sgemm>(system), "system OpenBLAS sgemm_"};
    return SmallGemm{process, "BLAS sgemm_"};
  }();
  return g;
}

inline Sgemm blas_sgemm() { return small_gemm().fn; }

using OnednnSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                            const float*, int64_t, float, float*, int64_t);

inline OnednnSgemm onednn_sgemm() {
  static const OnednnSgemm fn = [] {
    void* process = dlsym(RTLD_DEFAULT, "dnnl_sgemm");
    return reinterpret_cast<OnednnSgemm>(
        process ? process : system_symbol("dnnl_sgemm", {"libdnnl.so.3", "libdnnl.so.2"}));
  }();
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

using OnednnGemmBf16 = int (*)(char, char, int64_t, int64_t, int64_t, float, const void*, int64_t,
                               const void*, int64_t, float, float*, int64_t);

// oneDNN's bf16 GEMM (bf16 operands, fp32 accumulation and result), where oneDNN has one that runs
// on this CPU (AVX512-BF16 natively, AVX-512 by conversion; a 1×1×1 product is tried once), and the
// lever is on; else null.
inline OnednnGemmBf16 onednn_gemm_bf16() {
  static const OnednnGemmBf16 fn = [] {
    const char* name = "dnnl_gemm_bf16bf16f32";
    void* process = dlsym(RTLD_DEFAULT, name);
    auto f = reinterpret_cast<OnednnGemmBf16>(
        process ? process : system_symbol(name, {"libdnnl.so.3", "libdnnl.so.2"}));
    const uint16_t one = 0x3f80;  // 1.0 in bf16
    float c = 0;
    return f && f('N', 'N', 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &c, 1) == 0 && c == 1.0f
               ? f
               : nullptr;
  }();
  return speed_levers().bf16_gemm ? fn : nullptr;
}

// gemm() with bf16 operands a and b (row-major, as above): run.dtype = "bf16" in the fused kernels.
inline void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                      int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  onednn_gemm_bf16()(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Which library gemm() uses, for env.json and the benchmark.
inline const char* gemm_library() {
  return onednn_sgemm() && speed_levers().onednn_gemm ? "oneDNN dnnl_sgemm" : small_gemm().library;
}

}  // namespace normlab::cpu
