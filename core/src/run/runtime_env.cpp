#include "normlab/runtime_env.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <string>

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

// OpenBLAS built with OpenMP sizes each call by omp_get_max_threads() of its libgomp, read at the
// call; its own count (openblas_get_num_threads) catches up only then, so before the first GEMM it
// says the pool's size (2 for a run.threads = 1 run on 2 cores). Debian's LibTorch shares that
// libgomp (run.threads sets it); the wheel's LibTorch has its own, so the system OpenBLAS beside it
// keeps libgomp's default. 0: no libgomp loaded.
int openmp_blas_threads() {
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!gomp) return 0;
  auto fn = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_max_threads"));
  const int n = fn ? fn() : 0;
  dlclose(gomp);
  return n;
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
  if (info.parallel == "openmp")
    if (const int n = openmp_blas_threads(); n > 0) info.threads = n;
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env) info.coretype_env = env;
  const char* marker = std::getenv(kBlasChosenMarker);
  // Set (even empty: OpenBLAS then picks itself, and normlab leaves it) by normlab or by the user.
  if (env) info.chosen_by = marker && info.coretype_env == marker ? "normlab" : "user";
  info.layer_gemm = cpu::gemm_library();
  if (cpu::onednn_gemm_bf16()) info.bf16_gemm = "oneDNN dnnl_gemm_bf16bf16f32";
  return info;
}

}  // namespace normlab
