// Shared fixtures for the doctest suites: the build tree's plugins and small models.
#pragma once

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <string>

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

// Largest absolute difference, for readable failure messages.
inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace normlab::test
