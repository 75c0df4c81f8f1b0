#include "normlab/runtime_env.h"

#include <dlfcn.h>
#include <link.h>
#include <sched.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/cpu_gemm.h"

namespace normlab {
namespace {

template <class Fn>
Fn openblas_symbol(const char* name) {
  if (void* fn = dlsym(RTLD_DEFAULT, name)) return reinterpret_cast<Fn>(fn);
  // The system's OpenBLAS, where cpu_gemm.h loaded it privately (beside the wheel's MKL).
  void* lib = dlopen(cpu::kSystemOpenblas, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  return reinterpret_cast<Fn>(lib ? dlsym(lib, name) : nullptr);
}

std::string current_corename() {
  auto fn = openblas_symbol<char* (*)()>("openblas_get_corename");
  return fn ? std::string(fn()) : std::string();
}

int find_openblas(dl_phdr_info* info, size_t, void* data) {
  if (info->dlpi_name && std::strstr(info->dlpi_name, "openblas")) {
    *static_cast<std::string*>(data) = info->dlpi_name;
    return 1;
  }
  return 0;
}

}  // namespace

BlasInfo blas_info() {
  BlasInfo info;
  info.small_gemm = cpu::small_gemm().library;  // loads the system's OpenBLAS where it is used
  dl_iterate_phdr(find_openblas, &info.library);
  if (char* real = info.library.empty() ? nullptr : realpath(info.library.c_str(), nullptr)) {
    info.library = real;  // the alternatives link names the variant (openmp / pthread / serial)
    free(real);
  }
  info.corename = current_corename();
  if (auto par = openblas_symbol<int (*)()>("openblas_get_parallel"))
    info.parallel = par() == 2 ? "openmp" : par() == 1 ? "pthreads" : "sequential";
  if (auto nt = openblas_symbol<int (*)()>("openblas_get_num_threads")) info.threads = nt();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env) info.coretype_env = env;
  const char* marker = std::getenv(kBlasChosenMarker);
  // Set (even empty: OpenBLAS then picks itself, and normlab leaves it) by normlab or by the user.
  if (env) info.chosen_by = marker && info.coretype_env == marker ? "normlab" : "user";
  info.layer_gemm = cpu::gemm_library();
  if (cpu::onednn_gemm_bf16()) info.bf16_gemm = "oneDNN dnnl_gemm_bf16bf16f32";
  return info;
}

namespace {
// Whether OpenBLAS's kernels should be others: sets OPENBLAS_CORETYPE and the marker if so.
bool set_blas_coretype() {
  if (std::getenv("OPENBLAS_CORETYPE")) return false;  // the user's choice
  if (const char* off = std::getenv("NORMLAB_BLAS_AUTO"); off && std::strcmp(off, "0") == 0)
    return false;
  if (std::getenv(kBlasChosenMarker)) return false;  // already re-executed once: never loop
  const std::string current = current_corename();
  if (current.empty()) return false;  // not OpenBLAS (e.g. MKL in the PyPI wheel)
  const std::string want = preferred_openblas_coretype();
  if (want.empty() || strcasecmp(current.c_str(), want.c_str()) == 0) return false;
  setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
  setenv(kBlasChosenMarker, want.c_str(), 1);
  return true;
}

}  // namespace

void choose_blas_kernels(char** argv, bool reexec) {
  const bool blas = set_blas_coretype();
  if (!blas && !reexec) return;
  std::vector<std::string> args;
  try {
    args = self_command_prefix();
  } catch (const std::exception&) {
    args = {"/proc/self/exe"};  // its exec fails below like any other: carry on without
  }
  const std::string program = args[0];
  if (*argv) {
    if (args.size() == 1) args[0] = *argv;  // started directly: the argv[0] the user gave
    for (char** a = argv + 1; *a; ++a) args.emplace_back(*a);
  }
  std::vector<char*> exec_argv;
  for (std::string& a : args) exec_argv.push_back(a.data());
  exec_argv.push_back(nullptr);
  execv(program.c_str(), exec_argv.data());
  // exec failed: carry on with OpenBLAS's own choice and spinning threads, and say so in env.json.
  if (blas) {
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(kBlasChosenMarker);
  }
  if (reexec) {
    unsetenv("OMP_WAIT_POLICY");
    setenv("NORMLAB_OMP_CHOICE", "libgomp's default: the re-execution with PASSIVE failed", 1);
  }
}

}  // namespace normlab
