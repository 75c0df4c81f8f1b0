#include "run_recipe.h"

#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "data/internal.h"
#include "normlab/plugins/registry.h"
#include "normlab/runtime_env.h"
#include "normlab/sdk/abi.h"
#include "run/build_info.h"
#include "speed_levers.h"
#include "util/atomic_file.h"

namespace normlab {

// The folder (or file) of --plugin-path or NORMLAB_PLUGIN_PATH that provided the scheme goes into
// run.plugin_path, so the resolved manifest finds it again: `eval` and `export` of the run without
// the option or the variable (issue 27.15).
void record_plugin_origin(ExperimentSpec& spec, const PluginRegistry& registry,
                          const std::vector<std::string>& cli_paths) {
  std::vector<std::filesystem::path> given(cli_paths.begin(), cli_paths.end());
  for (const auto& p : PluginRegistry::environment_paths()) given.push_back(p);
  const std::filesystem::path file =
      std::filesystem::absolute(registry.info(spec.scheme.name).file).lexically_normal();
  for (const auto& g : given) {
    std::filesystem::path p = std::filesystem::absolute(g).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // "dir/"
    if (p != file && p != file.parent_path()) continue;
    if (std::find(spec.run.plugin_path.begin(), spec.run.plugin_path.end(), p.string()) ==
        spec.run.plugin_path.end())
      spec.run.plugin_path.push_back(p.string());
    return;
  }
}

std::string resolved_manifest_text(const ExperimentSpec& spec) {
  ExperimentSpec filled = spec;
  // The default cache folder depends on $HOME: written out, the recipe does not.
  filled.data.cache_dir = data::detail::resolve_cache_dir(spec.data.cache_dir).string();
  return dump_manifest(filled);
}

nlohmann::json run_provenance(const ExperimentSpec& spec, const PluginRegistry& registry) {
  const BuildIdentity build = build_identity();
  nlohmann::json plugins = nlohmann::json::array();
  for (const PluginInfo* p : registry.plugins()) {
    std::string sha256;
    try {
      sha256 = util::sha256_file(p->file);
    } catch (const util::FileError& e) {
      sha256 = std::string("unreadable: ") + e.what();
    }
    plugins.push_back({{"name", p->name},
                       {"version", p->version},
                       {"file", p->file.string()},
                       {"sha256", sha256}});
  }
  return {{"normlab", build.version},  {"source_revision", build.git}, {"libtorch", build.libtorch},
          {"device", spec.run.device}, {"scheme", spec.scheme.name},   {"plugins", plugins}};
}

nlohmann::json run_environment(const ExperimentSpec& spec, const PluginRegistry& registry,
                               const std::string& scheme_name, const std::string& scheme_file,
                               int threads, int64_t parameters) {
  auto env_or = [](const char* name, const char* otherwise) {
    const char* v = std::getenv(name);
    return std::string(v ? v : otherwise);
  };
  nlohmann::json env = {
      {"normlab", build_identity().version},
      {"torch", TORCH_VERSION},
      {"scheme", {{"name", scheme_name}, {"file", scheme_file}, {"abi", NORMLAB_ABI_VERSION}}},
      {"threads", threads},
      // Who chose the thread count: the manifest, or a sweep-level override (results depend on it).
      {"threads_set_by", env_or("NORMLAB_THREADS_SET_BY", "manifest")},
      {"device", spec.run.device},
      {"parameters", parameters},
      {"openblas_coretype", env_or("OPENBLAS_CORETYPE", "")},
      // How idle OpenMP threads wait (a sweep sets PASSIVE when its workers share cores).
      {"omp_wait_policy", env_or("OMP_WAIT_POLICY", "")},
      // Why (issue 59.13): normlab's choice from the load at the start, or "" (the user's/sweep's).
      {"omp_wait_policy_chosen", omp_choice_for(spec.run.threads)},
      // Whether a GPU run took the fused operations (NORMLAB_CUDA_FUSED=0 turns them off).
      {"cuda_fused", speed_levers().cuda_fused},
      // Which build of normlab's elementwise CPU kernels ran (NORMLAB_CPU_ISA caps it).
      {"cpu_kernels", kernel_isa_name(kernel_isa())}};
  const BlasInfo blas = blas_info();  // which kernels run (normlab may have chosen the core type)
  env["blas"] = {{"library", blas.library},
                 {"core", blas.corename},
                 {"parallel", blas.parallel},
                 {"threads", blas.threads},
                 {"coretype_chosen_by", blas.chosen_by},
                 {"layer_gemm", blas.layer_gemm},
                 {"bf16_gemm", blas.bf16_gemm},
                 {"small_gemm", blas.small_gemm}};
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  env["host"] = host;
  env["provenance"] = run_provenance(spec, registry);
  return env;
}

}  // namespace normlab
