// Model assembly, one way for every command: a model's shape (ModelConfig: from a manifest and its
// data, or from a benchmark's geometry) and its scheme (name and parameters) become a
// TransformerModel through the plugin registry, on a device. Used by train, eval/translate/forward,
// export, checkpoint convert, bench and smoke.
#pragma once

#include <map>
#include <string>

#include "normlab/data/dataset.h"
#include "normlab/manifest/experiment.h"
#include "normlab/model/config.h"
#include "normlab/model/transformer_model.h"
#include "torch_api.h"

namespace normlab {

class PluginRegistry;

// The model a manifest describes for a dataset (vocabulary sizes from the data).
ModelConfig model_config(const ExperimentSpec& spec, const data::Dataset& ds);

// What a model is made of.
struct ModelSpec {
  ModelConfig config;
  std::string scheme;
  std::map<std::string, ParamValue> scheme_params;
  bool init_on_cpu = false;  // run.init_on_cpu: built on the CPU, then moved to the device
};
// A run's model: the manifest's shape for its data and its [scheme].
ModelSpec model_spec(const ExperimentSpec& spec, const data::Dataset& ds);
// A benchmark's or smoke test's model: a geometry, one vocabulary for both sides, the scheme's
// default parameters.
ModelSpec model_spec(const ModelGeometry& geometry, const std::string& scheme, int64_t vocab,
                     double dropout);

struct AssembledModel {
  TransformerModel model{nullptr};
  std::string scheme_name, scheme_file;  // as the registry resolved them (env.json, the console)
  int64_t parameters = 0;
  double build_seconds = 0, move_seconds = 0;  // built and initialised, moved to the device
  torch::Device built_on = torch::kCPU;
};
// The scheme created by the registry (a PluginError names the plugin), the model built in training
// mode on `device`: its projections and embeddings allocated and drawn there (from that device's
// generator; unless spec.init_on_cpu), its small parameters moved there.
AssembledModel assemble_model(const ModelSpec& spec, const PluginRegistry& registry,
                              const torch::Device& device = torch::kCPU);

}  // namespace normlab
