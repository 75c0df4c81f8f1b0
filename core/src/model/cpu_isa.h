// One body, three builds: NORMLAB_ISA_KERNEL defines a kernel whose body is compiled for AVX-512,
// for AVX2 and for the x86-64 baseline, and a dispatcher that calls the build kernel_isa() names
// (normlab/runtime_env.h: the best this CPU executes, capped by NORMLAB_CPU_ISA). GCC's
// target_clones did the same, but chose in an ifunc resolver when the library loaded, where neither
// a benchmark's cap nor a test could reach it.
//
//   NORMLAB_ISA_KERNEL((), void, relu_span, (float* x, int64_t n), (x, n)) {
//     for (int64_t j = 0; j < n; ++j) x[j] = x[j] < 0.0f ? 0.0f : x[j];
//   }
//
// The first argument holds further attributes of every build, e.g. (optimize("fp-contract=off")).
// The builds are named NAME_avx512, NAME_avx2, NAME_baseline (tests/check_avx2_clones.sh reads
// NAME_avx2's code).
#pragma once

#include "normlab/runtime_env.h"

#define NORMLAB_ISA_ATTRS_(...) __VA_ARGS__
#if defined(__x86_64__) || defined(__i386__)
#define NORMLAB_ISA_KERNEL(attrs, ret, name, params, args)                                     \
  __attribute__((always_inline, NORMLAB_ISA_ATTRS_ attrs)) inline ret name##_body params;      \
  __attribute__((noinline, target("avx512f"), NORMLAB_ISA_ATTRS_ attrs))                       \
  ret name##_avx512 params {                                                                   \
    return name##_body args;                                                                   \
  }                                                                                            \
  __attribute__((noinline, target("avx2"), NORMLAB_ISA_ATTRS_ attrs)) ret name##_avx2 params { \
    return name##_body args;                                                                   \
  }                                                                                            \
  __attribute__((noinline, NORMLAB_ISA_ATTRS_ attrs)) ret name##_baseline params {             \
    return name##_body args;                                                                   \
  }                                                                                            \
  ret name params {                                                                            \
    switch (::normlab::kernel_isa()) {                                                         \
      case ::normlab::KernelIsa::avx512:                                                       \
        return name##_avx512 args;                                                             \
      case ::normlab::KernelIsa::avx2:                                                         \
        return name##_avx2 args;                                                               \
      default:                                                                                 \
        return name##_baseline args;                                                           \
    }                                                                                          \
  }                                                                                            \
  inline ret name##_body params
#else
#define NORMLAB_ISA_KERNEL(attrs, ret, name, params, args) \
  __attribute__((NORMLAB_ISA_ATTRS_ attrs)) ret name params
#endif
