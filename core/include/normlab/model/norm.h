// Every normalization kind of the SDK's NormSpec, as one module (parameters: weight, bias, alpha).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "normlab/sdk/norm.h"

namespace normlab {

class NormImpl : public torch::nn::Module {
 public:
  NormImpl(const NormSpec& spec, int64_t dim);
  // Normalizes over the last dimension, which must be `dim`.
  torch::Tensor forward(const torch::Tensor& x);
  const NormSpec& spec() const { return spec_; }

  torch::Tensor weight, bias, alpha;  // undefined where the kind has none

 private:
  NormSpec spec_;
  int64_t dim_;
  double gain_factor_;  // weight acts as weight · gain_factor_ (nGPT's scaled gain; 1 otherwise)
};
TORCH_MODULE(Norm);

}  // namespace normlab
