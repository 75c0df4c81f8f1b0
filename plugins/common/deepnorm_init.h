// DeepNet's constants and initialization (Wang et al. 2022, sec. III-C; docs/schemes/deepnorm.md),
// shared by the built-in DeepNorm, BranchNorm and MAGNETO plugins. Not part of the SDK's stable
// headers: an out-of-tree scheme that wants them copies what it needs.
#pragma once

#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cmath>
#include <string>

#include "normlab/sdk/geometry.h"
#include "normlab/sdk/init.h"

namespace normlab {

// True for the projections DeepNet scales by β: v_proj, out_proj, fc1, fc2 (DeepNet sec. III-C).
// A gated FFN's gate is not scaled: torchscale's GLU (component/gate_linear_unit.py) names its
// up projection fc1 and its down projection fc2, and DeepNorm's init scales only those names.
inline bool deepnorm_scaled_projection(const std::string& proj) {
  auto ends = [&](const char* s) {
    std::string suf(s);
    return proj.size() >= suf.size() &&
           proj.compare(proj.size() - suf.size(), suf.size(), suf) == 0;
  };
  return ends("v_proj") || ends("out_proj") || ends("fc1") || ends("fc2");
}

// DeepNorm constants (DeepNet sec. III-C; docs/schemes/deepnorm.md). Which form applies:
enum class DeepNormForm { EncDecEncoder, EncDecDecoder, EncoderOnly, DecoderOnly };

struct DeepNormConstants {
  double alpha;
  double beta;
};

// Paper constants; `torchscale` uses 1.15 instead of 0.87 for the encoder-decoder encoder's β.
inline DeepNormConstants deepnorm_constants(DeepNormForm form, int N, int M,
                                            bool torchscale = false) {
  switch (form) {
    case DeepNormForm::EncDecEncoder: {
      double nm = std::pow(double(N), 4.0) * double(M);
      return {0.81 * std::pow(nm, 1.0 / 16.0),
              (torchscale ? 1.15 : 0.87) * std::pow(nm, -1.0 / 16.0)};
    }
    case DeepNormForm::EncDecDecoder:
      return {std::pow(3.0 * M, 0.25), std::pow(12.0 * M, -0.25)};
    case DeepNormForm::EncoderOnly:
      return {std::pow(2.0 * N, 0.25), std::pow(8.0 * N, -0.25)};
    case DeepNormForm::DecoderOnly:
      return {std::pow(2.0 * M, 0.25), std::pow(8.0 * M, -0.25)};
  }
  return {1.0, 1.0};
}

inline DeepNormForm deepnorm_form(const ModelGeometry& g, Stack s) {
  if (g.arch == Arch::LM) return DeepNormForm::DecoderOnly;
  return s == Stack::Encoder ? DeepNormForm::EncDecEncoder : DeepNormForm::EncDecDecoder;
}

// DeepNet's initialization of one layer: Xavier-normal, gain β for v/out/fc1/fc2, gain 1 for
// q/k, biases 0 (DeepNet sec. III-C).
inline void deepnorm_init_layer(torch::nn::Module& layer, const LayerGeometry& g, double beta) {
  torch::NoGradGuard no_grad;
  for (const std::string& proj : layer_projections(g)) {
    double gain = deepnorm_scaled_projection(proj) ? beta : 1.0;
    torch::nn::init::xavier_normal_(layer_param(layer, proj + ".weight"), gain);
    if (torch::Tensor b = layer_param_or_none(layer, proj + ".bias"); b.defined())
      torch::nn::init::zeros_(b);
  }
}

}  // namespace normlab
