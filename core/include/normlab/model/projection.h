// A projection y = x·Wᵀ + b with torch::nn::Linear's parameters ("weight", optional "bias") and
// default init, created on the device the model is being built for (issue 43.2: a 1.36B model's
// parameters allocated and drawn on the GPU, not on the CPU and then copied).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

namespace normlab {

// Where the model's constructors create their projections and embeddings: the CPU unless a
// ScopedParameterDevice says otherwise. assemble_model sets the run's device (or keeps the CPU
// for run.init_on_cpu). Scoped per thread, as a device guard is.
torch::Device parameter_device();
class ScopedParameterDevice {
 public:
  explicit ScopedParameterDevice(const torch::Device& device);
  ~ScopedParameterDevice();
  ScopedParameterDevice(const ScopedParameterDevice&) = delete;
  ScopedParameterDevice& operator=(const ScopedParameterDevice&) = delete;

 private:
  torch::Device previous_;
};

class ProjectionImpl : public torch::nn::Module {
 public:
  // Drawn as torch::nn::Linear draws them (weight U(±1/√in) by Kaiming-uniform with a = √5, bias
  // U(±1/√in)) from the generator of parameter_device(): on the CPU, a seed gives the values
  // torch::nn::Linear gave. The layers re-draw them with their scheme's init.
  ProjectionImpl(int64_t in_features, int64_t out_features, bool bias);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight, bias;  // [out, in] and [out] (undefined without a bias)
};
TORCH_MODULE(Projection);

}  // namespace normlab
