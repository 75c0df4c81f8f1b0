#include "run_recipe.h"

#include "data/internal.h"
#include "normlab/commands.h"
#include "normlab/plugins/registry.h"
#include "util/atomic_file.h"

namespace normlab {

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
    plugins.push_back({{"name", p->name}, {"version", p->version}, {"file", p->file.string()}, {"sha256", sha256}});
  }
  return {{"normlab", build.version},
          {"source_revision", build.git},
          {"libtorch", build.libtorch},
          {"device", spec.run.device},
          {"scheme", spec.scheme.name},
          {"plugins", plugins}};
}

}  // namespace normlab
