#include "normlab/model/projection.h"

#include <torch/nn/init.h>

#include <cmath>

namespace normlab {

namespace {
thread_local torch::Device building_on = torch::kCPU;
}

torch::Device parameter_device() { return building_on; }

ScopedParameterDevice::ScopedParameterDevice(const torch::Device& device) : previous_(building_on) {
  building_on = device;
}

ScopedParameterDevice::~ScopedParameterDevice() { building_on = previous_; }

ProjectionImpl::ProjectionImpl(int64_t in_features, int64_t out_features, bool with_bias) {
  const torch::TensorOptions on = torch::TensorOptions().device(parameter_device());
  weight = register_parameter("weight", torch::empty({out_features, in_features}, on));
  // LibTorch's LinearImpl::reset_parameters (torch/csrc/api/src/nn/modules/linear.cpp), in its
  // order of draws.
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    bias = register_parameter("bias", torch::empty({out_features}, on));
    const double bound = 1.0 / std::sqrt(double(in_features));
    torch::nn::init::uniform_(bias, -bound, bound);
  } else {
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) {
  return torch::linear(x, weight, bias);
}

}  // namespace normlab
