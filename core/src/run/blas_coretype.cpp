// OpenBLAS's kernels, chosen from cpuid before OpenBLAS loads (and forgotten for other machines).
// No LibTorch, no OpenBLAS: the `normlab` executable decides before it loads libnormlab_cli
// (runner/main.cpp), so OpenBLAS reads the choice in its constructor and normlab need not start
// again (issue 70.4).
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "normlab/runtime_env.h"
#include "util/utf8.h"

namespace normlab {
namespace {

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 1, a, b, c, d);
  return (a >> 5) & 1u;  // CPUID.(EAX=7,ECX=1):EAX[5] = AVX512_BF16
#else
  return false;
#endif
}

}  // namespace

std::string preferred_openblas_coretype() {
  if (const char* forced = std::getenv("NORMLAB_OPENBLAS_CORETYPE_PREFERRED"))
    return forced;  // tests
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // Measured (PERF.md, bench/README): on AVX-512 CPUs the AVX-512 kernels are ~2x the Haswell ones;
  // OpenBLAS 0.3.21 falls back to SSE3 kernels on Intel CPUs newer than it.
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && cpu_has_avx512_bf16()) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
#endif
  return "";
}

bool automatic_choice_on(const char* name) {
  const char* value = std::getenv(name);
  if (!value || std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  throw std::invalid_argument(std::string(name) +
                              ": expected 0 (off) or 1 (on, the default), got '" +
                              util::printable(value) + "'");
}

bool choose_blas_coretype() {
  if (std::getenv("OPENBLAS_CORETYPE")) return false;  // the user's choice (even an empty one)
  try {
    if (!automatic_choice_on("NORMLAB_BLAS_AUTO")) return false;
  } catch (const std::invalid_argument&) {
    return false;  // the CLI refuses the value once the verb is parsed (runner/cli.cpp)
  }
  const std::string want = preferred_openblas_coretype();
  if (want.empty()) return false;
  setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
  setenv(kBlasChosenMarker, want.c_str(), 1);
  return true;
}

std::vector<std::string> environment_for_other_machines() {
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  const char* marker = std::getenv(kBlasChosenMarker);
  const bool blas_ours = core && marker && std::strcmp(core, marker) == 0;
  const char* omp = std::getenv("NORMLAB_OMP_CHOICE");  // set by choose_omp_wait_policy only
  const bool passive_ours = omp && std::strncmp(omp, "PASSIVE", 7) == 0;
  const auto named = [](const char* entry, const char* name) {
    const size_t n = std::strlen(name);
    return std::strncmp(entry, name, n) == 0 && entry[n] == '=';
  };
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    if (named(*e, kBlasChosenMarker) || named(*e, "NORMLAB_OMP_CHOICE") ||
        named(*e, "NORMLAB_THREADS_CHOICE") || (blas_ours && named(*e, "OPENBLAS_CORETYPE")) ||
        (passive_ours && named(*e, "OMP_WAIT_POLICY")))
      continue;
    env.emplace_back(*e);
  }
  return env;
}

}  // namespace normlab
