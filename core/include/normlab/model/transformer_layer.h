// One Transformer layer: the core owns its sublayers; the scheme's LayerWiring combines them.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "normlab/model/attention.h"
#include "normlab/model/config.h"
#include "normlab/model/norm.h"
#include "normlab/model/observer.h"
#include "normlab/sdk/scheme.h"

namespace normlab {

// Per-forward inputs shared by all layers of a stack (built once per forward, not per layer).
struct LayerInputs {
  torch::Tensor self_mask;    // additive, [B|1,1,T,T] or [B,1,1,T]; undefined = none
  bool self_causal = false;   // self_mask is exactly the causal mask (no padding)
  torch::Tensor memory;       // encoder output for cross-attention
  torch::Tensor memory_mask;  // additive, [B,1,1,S]
  // [B,T] each token's position (undefined: 0 … T−1): sequences packed with a mask of their own,
  // as downstream tasks pack a context with its choices.
  torch::Tensor positions;
};

class TransformerLayerImpl : public torch::nn::Module, private LayerBuilder {
 public:
  // `keep_alive` holds the scheme's plugin library loaded for as long as the wiring lives.
  TransformerLayerImpl(const ModelConfig& cfg, const LayerGeometry& g, Scheme& scheme,
                       std::shared_ptr<const void> keep_alive, std::shared_ptr<ModelHooks> hooks);

  torch::Tensor forward(const torch::Tensor& x, const LayerInputs& in);
  // The layer on a stack's streams (several for schemes with a StackWiring).
  Streams forward_streams(Streams s, const LayerInputs& in);
  // forward_streams() that keeps no activations: the layer runs again in the backward pass.
  Streams forward_recomputed(const Streams& s, const LayerInputs& in);

  // Core's standard (fairseq) initialization, then the scheme's.
  void reset_parameters(Scheme& scheme);

  const LayerGeometry& geometry() const override { return geom_; }
  // A skipped layer passes its streams on unchanged (`normlab ablate`: the layer's residual
  // branches removed).
  void set_skipped(bool skipped) { skipped_ = skipped; }
  const std::vector<std::string>& norm_names() const { return norm_names_; }
  // The tensors the scheme declared with LayerBuilder::add_parameter.
  const std::vector<torch::Tensor>& scheme_parameters() const { return extra_params_; }

  MultiheadAttention self_attn{nullptr};
  MultiheadAttention cross_attn{nullptr};  // decoder layers of encoder-decoder models only
  FeedForward ffn{nullptr};

 private:
  friend class LayerOpsImpl;
  int add_layer_norm(const std::string& name) override;
  int add_norm(const std::string& name, const NormSpec& spec, int64_t dim) override;
  void add_branch_norm(Sublayer s, BranchPoint p, const NormSpec& spec) override;
  int add_parameter(const std::string& name, const torch::Tensor& init) override;

  LayerGeometry geom_;
  LayerId id_;
  double dropout_;
  double init_std_;   // Llama family
  bool scaled_init_;  // Llama family
  bool skipped_ = false;
  std::vector<Norm> norms_;
  std::vector<std::string> norm_names_;
  std::vector<torch::Tensor> extra_params_;
  std::shared_ptr<ModelHooks> hooks_;
  std::shared_ptr<LayerWiring> wiring_;
};
TORCH_MODULE(TransformerLayer);

}  // namespace normlab
