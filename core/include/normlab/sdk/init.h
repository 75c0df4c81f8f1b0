// normlab scheme SDK — a layer's parameter names, and helpers for schemes that re-initialize
// sublayer weights.
//
// The names are a promise (stable across versions; schemes address parameters by them in
// init_layer, and probes, checkpoints and exports use them). In a layer, per sublayer s of
// self_attn, cross_attn (encoder-decoder decoders) and ffn:
//   s.q_proj, s.k_proj, s.v_proj, s.out_proj      attention projections: .weight, and .bias on the
//                                                  "transformer" family
//   ffn.fc1, ffn.fc2 (and ffn.gate, the projection SiLU reads, on "llama")   the same
//   s.q_norm, s.k_norm, s.v_norm, s.inner_norm,   norms a scheme places inside a branch
//   ffn.up_norm, ffn.gate_norm                    (LayerBuilder::add_branch_norm)
// Norms and parameters a scheme adds with LayerBuilder::add_norm/add_parameter carry the names it
// gives them (the built-in schemes: <sublayer>_norm). layer_parameter_names(g) lists the core's.
#pragma once

#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "normlab/sdk/geometry.h"

namespace normlab {

// A layer's parameter by its stable name; throws with the name when it does not exist.
inline torch::Tensor layer_param(torch::nn::Module& layer, const std::string& name) {
  auto params = layer.named_parameters(/*recurse=*/true);
  if (const torch::Tensor* t = params.find(name)) return *t;
  throw std::invalid_argument("layer has no parameter '" + name + "'");
}

// A layer's parameter by name, or an undefined tensor when it has none (a Llama-family layer's
// projections have no ".bias").
inline torch::Tensor layer_param_or_none(torch::nn::Module& layer, const std::string& name) {
  auto params = layer.named_parameters(/*recurse=*/true);
  if (const torch::Tensor* t = params.find(name)) return *t;
  return {};
}

// Projection names of the layer's sublayers, e.g. {"self_attn.q_proj", …, "ffn.fc2"}; a gated
// (SwiGLU) FFN adds "ffn.gate", the projection its SiLU reads.
inline std::vector<std::string> layer_projections(const LayerGeometry& g) {
  std::vector<std::string> out;
  for (int i = 0; i < g.num_sublayers(); ++i) {
    Sublayer s = g.sublayer(i);
    std::string prefix = std::string(to_string(s)) + ".";
    if (s == Sublayer::FFN) {
      out.push_back(prefix + "fc1");
      if (g.model.gated_ffn()) out.push_back(prefix + "gate");
      out.push_back(prefix + "fc2");
    } else {
      for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) out.push_back(prefix + p);
    }
  }
  return out;
}

// Every parameter the core itself creates in a layer (projections' weight and, on the
// "transformer" family, bias), e.g. "self_attn.q_proj.weight"; the scheme's come on top.
inline std::vector<std::string> layer_parameter_names(const LayerGeometry& g) {
  std::vector<std::string> out;
  for (const std::string& p : layer_projections(g)) {
    out.push_back(p + ".weight");
    if (g.model.has_biases()) out.push_back(p + ".bias");
  }
  return out;
}

}  // namespace normlab
