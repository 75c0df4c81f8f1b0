// Process-wide settings made first thing in main(): OpenBLAS's core type (chosen from cpuid before
// OpenBLAS loads), glibc malloc's thresholds; and which BLAS kernels run.
// No LibTorch include: the runner calls this before anything else.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace normlab {

// Issue 66.16: the arguments that start this normlab again as it was started, before a verb's own:
// [normlab's path], or, when it was started through the dynamic loader (`ld-linux-x86-64.so.2
// [OPTIONS] normlab ARGS`, where /proc/self/exe is the loader and an exec of it with normlab's argv
// took the verb for the program), [the loader, its options..., normlab's path]. The first is an
// absolute path to exec: execv(prefix[0], prefix + args). Every re-start of normlab uses it.
std::vector<std::string> self_command_prefix();

// The path of normlab's own executable (the prefix's last argument), never the loader's: for what
// lies beside it, or a script that runs normlab elsewhere.
std::string self_executable();

// self_command_prefix with main's arguments after it: this process's command, to start it again.
std::vector<std::string> self_command_line();

// What the process's BLAS reports about itself (empty fields when it is not OpenBLAS).
struct BlasInfo {
  std::string library;       // path of the loaded libopenblas*.so
  std::string corename;      // kernels in use, e.g. "Cooperlake" (openblas_get_corename)
  std::string parallel;      // "openmp" | "pthreads" | "sequential"
  int threads = 0;           // the threads a GEMM called now may take (runtime_env.cpp)
  std::string coretype_env;  // OPENBLAS_CORETYPE as the process sees it
  std::string
      chosen_by;  // "normlab" when normlab set OPENBLAS_CORETYPE, "user" when it was set before
  std::string
      layer_gemm;  // what runs the fused kernels' layer GEMMs: "oneDNN dnnl_sgemm" or a BLAS sgemm_
  std::string bf16_gemm;   // the fused kernels' products under bf16 autocast ("" where none runs)
  std::string small_gemm;  // what runs attention's per-head blocks: "OpenBLAS sgemm_",
                           // "system OpenBLAS sgemm_" (beside the wheel's MKL) or "BLAS sgemm_"
};
BlasInfo blas_info();

// The OpenBLAS core type whose kernels are fastest for this CPU's instruction sets ("Cooperlake",
// "SkylakeX", "Haswell", "Zen"), or "" when there is nothing better than OpenBLAS's own choice.
// NORMLAB_OPENBLAS_CORETYPE_PREFERRED replaces the choice (tests use it).
std::string preferred_openblas_coretype();

// Set with OPENBLAS_CORETYPE when normlab chose it (env.json's `coretype_chosen_by`).
inline constexpr const char* kBlasChosenMarker = "NORMLAB_OPENBLAS_CORETYPE_CHOSEN";

// OpenBLAS reads OPENBLAS_CORETYPE once, when it loads: the `normlab` executable calls this before
// it loads libnormlab_cli (and LibTorch, and OpenBLAS), so the preferred kernels cost no
// re-execution (~0.4 s of CPU each: LibTorch's start-up again). When OPENBLAS_CORETYPE is unset
// (a user's setting, even an empty one, is never changed) and NORMLAB_BLAS_AUTO is not 0, sets it
// to preferred_openblas_coretype() (where OpenBLAS would pick the same, nothing changes) and the
// marker; returns whether it did.
bool choose_blas_coretype();

// Whether one of normlab's automatic choices is on: `name` (NORMLAB_BLAS_AUTO, NORMLAB_OMP_AUTO)
// unset or 1, on; 0, off; anything else throws std::invalid_argument naming the variable and the
// value (the CLI's usage error, exit 2, once a computing verb is parsed).
bool automatic_choice_on(const char* name);

// This process's environment ("NAME=value" each) without the choices normlab made for this
// machine — OPENBLAS_CORETYPE where choose_blas_coretype set it, a busy machine's OMP_WAIT_POLICY
// and thread count, and the records of both —, for a process that runs elsewhere (a Slurm job):
// there normlab chooses for that machine. A user's settings stay.
std::vector<std::string> environment_for_other_machines();

// Issue 59.13: libgomp's idle threads spin; on a machine whose cores are taken LibTorch's threads
// starve and a run is 10–40× slower. When OMP_WAIT_POLICY is unset and the machine is busy at the
// start (the threads runnable right now besides this one at least the cores this process may use
// − 0.5, or the last minute's load average so while another thread is runnable; or a cgroup CPU
// quota below the cores), sets OMP_WAIT_POLICY=PASSIVE, and NORMLAB_THREADS_CHOICE to the cores
// the others leave (usable_threads), and returns true: libgomp reads it when it loads, so a
// process that has loaded it must re-execute (the `normlab` executable chooses before it loads
// libnormlab_cli, and so libgomp: no re-exec). Either way NORMLAB_OMP_CHOICE says what was chosen
// and why, for the run's log and env.json. NORMLAB_OMP_AUTO=0 turns this off; NORMLAB_OMP_LOAD
// replaces both loads (tests).
bool choose_omp_wait_policy();

// NORMLAB_OMP_CHOICE as a run with `run.threads` says it ("" when unset): a count set in the
// manifest (> 0) replaces the "; run.threads = 0 takes N threads" said for 0.
std::string omp_choice_for(int64_t run_threads);

// The threads `run.threads = 0` means: what the machine can give this run — the cores this
// process may use (its affinity mask, and a cgroup v2 CPU quota below it, rounded down), less the
// threads that kept them busy at the start (choose_omp_wait_policy), not every core. At least 1.
int usable_threads();

// normlab's own elementwise CPU kernels (dropout masks, softmax backward, residual + norm rows,
// ReLU, loss rows, AdamW) are built three times from one body: for AVX-512, for AVX2 and for the
// x86-64 baseline (core/src/model/cpu_isa.h). Which one runs is chosen once per process: the best
// this CPU executes, capped by NORMLAB_CPU_ISA ("avx512", "avx2" or "baseline"): a CPU with
// AVX-512 then runs what an AVX2-only CPU runs (bench/run_bench.py --cap-isa avx2), and the tests
// run each build the machine has against the reference path.
enum class KernelIsa : int { baseline = 0, avx2 = 1, avx512 = 2 };
KernelIsa best_kernel_isa();             // what this CPU executes
const char* kernel_isa_name(KernelIsa);  // "avx512", "avx2", "baseline"
// The cap NORMLAB_CPU_ISA sets (best_kernel_isa() when unset); std::invalid_argument naming the
// variable, the expected values and the value (escaped, shortened) for any other text. The CLI
// calls it once a computing verb is parsed: a bad value is a usage error, not a surprise in a
// kernel.
KernelIsa kernel_isa_from_env();
// Tests: run `isa` (at most best_kernel_isa(): the CPU must execute it) from now on.
void set_kernel_isa(KernelIsa isa);
namespace detail {
extern std::atomic<int> g_kernel_isa;  // -1 until the first kernel_isa()
int first_kernel_isa();                // kernel_isa_from_env(), stored
}  // namespace detail
inline KernelIsa kernel_isa() {  // what runs now; read per kernel call, so cheap
  const int isa = detail::g_kernel_isa.load(std::memory_order_relaxed);
  return KernelIsa(isa >= 0 ? isa : detail::first_kernel_isa());
}

// glibc returns freed blocks above 128 KiB–32 MiB to the kernel at once, so every training step
// page-faults its large activations (logits, attention scores) in again: measured 12-15 % of a
// step. Keeps them in the heap instead (mmap threshold 256 MiB, trim threshold 1 GiB), unless
// GLIBC_TUNABLES or MALLOC_*_ variables set malloc's behaviour, or NORMLAB_MALLOC_TUNE=0.
// Training calls it itself (runner/verbs: `trains`), and only without activation checkpointing.
void tune_malloc();

// With activation checkpointing every layer's input stays between blocks that are freed: kept in
// the heap, those freed blocks leave a hole per layer (peak RSS, d 64, 2,048 tokens, 900 layers:
// 2.87 GiB with tune_malloc's thresholds; with glibc's own, 1.5 GiB at 300 layers and 1.1 GiB at
// 600). Blocks from 1 MiB up are mapped and returned at once instead (1.5-1.7 GiB at 900 layers,
// 0.7 at 300, as fast as glibc's own). Same exceptions as tune_malloc. CPU training only.
void tune_malloc_for_checkpointing();

}  // namespace normlab
