// normlab scheme SDK — what a residual/normalization scheme decides, and the core services it
// uses to do so. A scheme never owns attention, FFN or LayerNorm code: the core does, and
// instruments them, so every scheme gets all analysis probes for free.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "normlab/sdk/abi.h"
#include "normlab/sdk/geometry.h"
#include "normlab/sdk/params.h"

namespace normlab {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Core services inside one layer's forward pass.
class LayerOps {
 public:
  // Drop(F(x)): the sublayer (self-attention, cross-attention on the encoder output, or FFN)
  // followed by residual dropout.
  virtual torch::Tensor branch(Sublayer s, const torch::Tensor& x) = 0;
  // A LayerNorm declared with LayerBuilder::add_layer_norm.
  virtual torch::Tensor norm(int norm_id, const torch::Tensor& x) = 0;
  // A parameter declared with LayerBuilder::add_parameter.
  virtual const torch::Tensor& param(int param_id) = 0;
  virtual bool training() const = 0;

 protected:
  ~LayerOps() = default;
};

// Core services while one layer is built.
class LayerBuilder {
 public:
  virtual const LayerGeometry& geometry() const = 0;
  // A LayerNorm(d_model, eps 1e-5, γ=1, β=0) registered on the layer as `name`
  // (e.g. decoder.layers.7.<name>.weight). Returns its id for LayerOps::norm.
  virtual int add_layer_norm(const std::string& name) = 0;
  // A learnable tensor registered on the layer as `name`. Returns its id for LayerOps::param.
  virtual int add_parameter(const std::string& name, const torch::Tensor& init) = 0;

 protected:
  ~LayerBuilder() = default;
};

// How one layer wires its sublayers, LayerNorms and skip paths (layer level, so connections
// across sublayers such as B2T fit).
class LayerWiring {
 public:
  virtual ~LayerWiring() = default;
  virtual torch::Tensor forward(LayerOps& ops, const torch::Tensor& x) = 0;
};

// Runs the data-dependent setup pass: one forward pass of the model on the first training batch,
// in training mode, without gradients.
class SetupPass {
 public:
  virtual void forward_first_batch() = 0;

 protected:
  ~SetupPass() = default;
};

// A value a scheme derives from the geometry (shown by `normlab plugins show`).
struct DerivedValue {
  std::string name;   // "alpha", "beta", "omega", "alpha_t"
  std::string where;  // "encoder", "decoder", "t=1000", …
  double value = 0.0;
  std::string formula;
};

class Scheme {
 public:
  virtual ~Scheme() = default;

  // Wiring of one layer; declare its LayerNorms and parameters on `b`.
  virtual std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) = 0;
  // Whether the stack ends with a LayerNorm (registered as <stack>.layer_norm).
  virtual bool final_layer_norm(Stack stack) const = 0;
  // Called after the core's standard initialization of a layer; parameters are addressed by
  // name ("self_attn.v_proj.weight", "ffn.fc1.weight", …).
  virtual void init_layer(torch::nn::Module& /*layer*/, const LayerGeometry& /*g*/) {}
  // Called before each optimizer update's forward pass with the number of completed updates.
  virtual void on_update(int64_t /*updates_done*/) {}
  // Data-dependent setup before training (e.g. Admin profiling).
  virtual bool needs_setup_pass() const { return false; }
  virtual void setup(SetupPass& /*pass*/) {}
  // Saved with checkpoints and restored on resume.
  virtual NamedTensors state() const { return {}; }
  virtual void load_state(const NamedTensors& /*state*/) {}
  // Values derived for this geometry, for `plugins show` and run logs.
  virtual std::vector<DerivedValue> derive() const { return {}; }
  // Short live state for log lines, e.g. "alpha_t=0.25"; empty when there is none.
  virtual std::string status() const { return {}; }
};

// For schemes that treat each sublayer alike: implement build/forward of one sublayer.
class PerSublayerWiring : public LayerWiring {
 public:
  torch::Tensor forward(LayerOps& ops, const torch::Tensor& x) override {
    torch::Tensor h = x;
    for (int i = 0; i < num_sublayers_; ++i) h = sublayer(ops, i, sublayers_[i], h);
    return h;
  }

 protected:
  explicit PerSublayerWiring(const LayerGeometry& g) : num_sublayers_(g.num_sublayers()) {
    for (int i = 0; i < num_sublayers_; ++i) sublayers_[i] = g.sublayer(i);
  }
  virtual torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) = 0;

  int num_sublayers_;
  Sublayer sublayers_[3] = {Sublayer::SelfAttn, Sublayer::FFN, Sublayer::FFN};
};

// Conventional names for the LayerNorm after (Post-LN) or before (Pre-LN) each sublayer.
inline std::string norm_name(Sublayer s) { return std::string(to_string(s)) + "_norm"; }

// Post-LN wiring, y = LN(x + Drop(F(x))) per sublayer: for schemes that change only the init.
class PostLnWiring final : public PerSublayerWiring {
 public:
  explicit PostLnWiring(LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i) norms_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return ops.norm(norms_[i], x + ops.branch(s, x));
  }

 private:
  int norms_[3] = {0, 0, 0};
};

}  // namespace normlab
