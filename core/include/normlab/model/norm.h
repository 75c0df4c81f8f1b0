// Every normalization kind of the SDK's NormSpec, as one module (parameters: weight, bias, alpha).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "normlab/sdk/norm.h"

namespace normlab {

class NormImpl : public torch::nn::Module {
 public:
  // `heads` > 0 with spec.gain_per_head: the gain is [heads, 1, dim], for x of [B, heads, T, dim].
  NormImpl(const NormSpec& spec, int64_t dim, int64_t heads = 0);
  // Normalizes over the last dimension, which must be `dim`.
  torch::Tensor forward(const torch::Tensor& x);
  // With another module's gain `weight` (spec.gain_from_query: the Query norm's; this module
  // registers none, so q and k share one parameter).
  torch::Tensor forward_with_gain(const torch::Tensor& x, const torch::Tensor& weight);
  const NormSpec& spec() const { return spec_; }
  double gain_factor() const { return gain_factor_; }

  torch::Tensor weight, bias, alpha;  // undefined where the kind has none

 private:
  NormSpec spec_;
  int64_t dim_;
  double gain_factor_;  // weight acts as weight · gain_factor_ (nGPT's scaled gain; 1 otherwise)
};
TORCH_MODULE(Norm);

}  // namespace normlab
