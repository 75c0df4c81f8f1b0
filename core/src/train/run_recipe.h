// What a run directory records so that the run can be made again: the resolved manifest as a
// self-contained recipe and the provenance of the code that ran it (env.json). No LibTorch here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "normlab/manifest/experiment.h"

namespace normlab {

class PluginRegistry;

// manifest.resolved.toml: every default filled (the data cache folder included), every path
// absolute, so `normlab train RUN/manifest.resolved.toml` runs the same experiment from anywhere.
std::string resolved_manifest_text(const ExperimentSpec& spec);

// The folder (or file) of `cli_paths` or NORMLAB_PLUGIN_PATH that provided the scheme goes into
// run.plugin_path, so `eval` and `export` of the run find it without them (train and run-one).
void record_plugin_origin(ExperimentSpec& spec, const PluginRegistry& registry,
                          const std::vector<std::string>& cli_paths);

// {normlab, source_revision, libtorch, device, plugins: [{name, version, file, sha256}]}: the
// build, and every scheme plugin the registry found, each file's SHA-256.
nlohmann::json run_provenance(const ExperimentSpec& spec, const PluginRegistry& registry);

// env.json: normlab's and LibTorch's versions, the scheme (name, file, ABI), threads and who set
// them, device, parameter count, BLAS kernels, host, and run_provenance.
nlohmann::json run_environment(const ExperimentSpec& spec, const PluginRegistry& registry,
                               const std::string& scheme_name, const std::string& scheme_file,
                               int threads, int64_t parameters);

}  // namespace normlab
