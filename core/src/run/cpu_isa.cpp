// Which build of normlab's elementwise CPU kernels runs (normlab/runtime_env.h, model/cpu_isa.h).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "normlab/runtime_env.h"
#include "util/utf8.h"

namespace normlab {

KernelIsa best_kernel_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // What GCC's target("avx512f") and target("avx2") builds may execute (the same tests the
  // target_clones resolvers made).
  if (__builtin_cpu_supports("avx512f")) return KernelIsa::avx512;
  if (__builtin_cpu_supports("avx2")) return KernelIsa::avx2;
#endif
  return KernelIsa::baseline;
}

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::avx512:
      return "avx512";
    case KernelIsa::avx2:
      return "avx2";
    default:
      return "baseline";
  }
}

KernelIsa kernel_isa_from_env() {
  const KernelIsa best = best_kernel_isa();
  const char* text = std::getenv("NORMLAB_CPU_ISA");
  if (!text) return best;
  const std::string cap = text;
  for (KernelIsa isa : {KernelIsa::avx512, KernelIsa::avx2, KernelIsa::baseline})
    if (cap == kernel_isa_name(isa))
      return std::min(isa, best);  // a cap, never more than the CPU has
  throw std::invalid_argument(
      "NORMLAB_CPU_ISA: expected avx512, avx2 or baseline (the instruction set normlab's CPU "
      "kernels may use at most), got '" +
      util::printable(cap) + "'");
}

void set_kernel_isa(KernelIsa isa) {
  if (isa > best_kernel_isa())
    throw std::invalid_argument(std::string("set_kernel_isa: this CPU does not execute ") +
                                kernel_isa_name(isa));
  detail::g_kernel_isa.store(int(isa), std::memory_order_relaxed);
}

namespace detail {
// Constant-initialized: nothing is read from the environment when the library loads.
std::atomic<int> g_kernel_isa{-1};
int first_kernel_isa() {
  int isa;
  try {
    isa = int(kernel_isa_from_env());
  } catch (const std::invalid_argument& e) {
    // The executable refused it already (a usage error); a program linking libnormlab is told.
    isa = int(best_kernel_isa());
    std::fprintf(stderr, "normlab: warning: %s; the kernels use %s\n", e.what(),
                 kernel_isa_name(KernelIsa(isa)));
  }
  int unset = -1;  // a concurrent first call or a set_kernel_isa may have stored one already
  return detail::g_kernel_isa.compare_exchange_strong(unset, isa) ? isa : unset;
}
}  // namespace detail

}  // namespace normlab
