// Shared fixtures for the doctest suites: the build tree's plugins and small models.
#pragma once

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "normlab/model/transformer_model.h"
#include "normlab/plugins/registry.h"

namespace normlab::test {

// The built-in plugins of this build tree, nothing else.
inline PluginRegistry& builtin_registry() {
  static PluginRegistry reg({NORMLAB_TEST_PLUGIN_DIR}, /*use_default_paths=*/false);
  return reg;
}

inline ModelConfig small_config(Arch arch, int N, int M, int d = 16, int heads = 2, int ffn = 32) {
  ModelConfig cfg;
  cfg.arch = arch;
  cfg.d_model = d;
  cfg.heads = heads;
  cfg.ffn_dim = ffn;
  cfg.enc_layers = arch == Arch::EncDec ? N : 0;
  cfg.dec_layers = M;
  cfg.src_vocab = cfg.tgt_vocab = 50;
  cfg.dropout = 0.0;
  return cfg;
}

inline TransformerModel make_model(const std::string& scheme, const ModelConfig& cfg,
                                   const std::map<std::string, ParamValue>& params = {}) {
  return TransformerModel(cfg, builtin_registry().create(scheme, params, cfg.geometry()));
}

// The manifests in experiments/ name the dataset multi30k (fetched on first use); tests read the
// shared corpus instead: data.dataset cleared and one `data.KEY=path` override per file, for
// load_manifest or `--set`.
inline std::vector<std::string> shared_multi30k_overrides() {
  const std::string dir =
      std::filesystem::absolute(std::filesystem::path(NORMLAB_TEST_SHARED_DATA) / "multi30k").lexically_normal().string();
  std::vector<std::string> sets = {"data.dataset=\"\"", "data.task=\"translation\""};
  for (const auto& [key, file] : std::vector<std::pair<const char*, const char*>>{
           {"train_src", "train.en"}, {"train_tgt", "train.de"}, {"valid_src", "val.en"},
           {"valid_tgt", "val.de"}, {"test_src", "test_2016_flickr.en"}, {"test_tgt", "test_2016_flickr.de"}})
    sets.push_back(std::string("data.") + key + "=\"" + dir + "/" + file + "\"");
  return sets;
}

// Largest absolute difference, for readable failure messages.
inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace normlab::test
