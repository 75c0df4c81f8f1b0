#include "normlab/model/transformer_layer.h"

#include <torch/torch.h>

#include "counter_dropout.h"

#include <cmath>

namespace normlab {

// Core services for the scheme's wiring, valid for one forward call of one layer.
class LayerOpsImpl final : public LayerOps {
 public:
  LayerOpsImpl(TransformerLayerImpl& layer, const LayerInputs& in) : l_(layer), in_(in) {}

  torch::Tensor branch(Sublayer s, const torch::Tensor& x) override {
    ActivationObserver* obs = l_.hooks_->observer;
    torch::Tensor y;
    switch (s) {
      case Sublayer::SelfAttn:
        y = l_.self_attn->forward(x, x, in_.self_mask, /*self_attention=*/true);
        break;
      case Sublayer::CrossAttn:
        TORCH_CHECK(l_.cross_attn, "cross-attention requested in a layer that has none");
        y = l_.cross_attn->forward(x, in_.memory, in_.memory_mask, /*self_attention=*/false);
        break;
      case Sublayer::FFN: {
        torch::Tensor act = l_.ffn->activation(x);
        if (obs) obs->on_ffn_activation(l_.id_, act);
        y = l_.ffn->project(act);
        break;
      }
    }
    y = counter_dropout(y, l_.dropout_, l_.is_training());
    if (obs) obs->on_branch(l_.id_, s, y);
    return y;
  }

  torch::Tensor norm(int id, const torch::Tensor& x) override {
    torch::Tensor y = torch::layer_norm(x, {x.size(-1)}, l_.norm_weights_[id], l_.norm_biases_[id],
                                        1e-5, /*cudnn_enable=*/true);
    if (ActivationObserver* obs = l_.hooks_->observer) obs->on_norm(l_.id_, id, x, y);
    return y;
  }

  const torch::Tensor& param(int id) override { return l_.extra_params_[id]; }
  bool training() const override { return l_.is_training(); }

 private:
  TransformerLayerImpl& l_;
  const LayerInputs& in_;
};

TransformerLayerImpl::TransformerLayerImpl(const ModelConfig& cfg, const LayerGeometry& g,
                                           Scheme& scheme, std::shared_ptr<const void> keep_alive,
                                           std::shared_ptr<ModelHooks> hooks)
    : geom_(g), id_{g.stack, g.index}, dropout_(cfg.dropout), hooks_(std::move(hooks)) {
  self_attn = register_module("self_attn", MultiheadAttention(cfg.d_model, cfg.heads,
                                                              cfg.attention_dropout));
  if (g.has_cross_attn())
    cross_attn = register_module("cross_attn", MultiheadAttention(cfg.d_model, cfg.heads,
                                                                  cfg.attention_dropout));
  ffn = register_module("ffn", FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation_dropout));
  LayerWiring* raw = scheme.build_layer(*this).release();
  TORCH_CHECK(raw != nullptr, "scheme returned no wiring for ", to_string(g.stack), " layer ", g.index);
  // The deleter owns a reference to the scheme, so its plugin stays loaded while the wiring lives.
  wiring_ = std::shared_ptr<LayerWiring>(raw, [keep_alive](LayerWiring* w) { delete w; });
  reset_parameters(scheme);
}

int TransformerLayerImpl::add_layer_norm(const std::string& name) {
  auto ln = register_module(name, torch::nn::LayerNorm(
                                      torch::nn::LayerNormOptions({geom_.model.d_model}).eps(1e-5)));
  norm_weights_.push_back(ln->weight);
  norm_biases_.push_back(ln->bias);
  norm_names_.push_back(name);
  return int(norm_weights_.size()) - 1;
}

int TransformerLayerImpl::add_parameter(const std::string& name, const torch::Tensor& init) {
  extra_params_.push_back(register_parameter(name, init.detach().clone()));
  return int(extra_params_.size()) - 1;
}

void TransformerLayerImpl::reset_parameters(Scheme& scheme) {
  torch::NoGradGuard no_grad;
  // fairseq: q/k/v Xavier-uniform with gain 1/√2 (they are one packed matrix there), out_proj
  // and the FFN Xavier-uniform with gain 1, every bias 0.
  for (auto* attn : {&self_attn, &cross_attn}) {
    if (!*attn) continue;
    for (auto* lin : {&(*attn)->q_proj, &(*attn)->k_proj, &(*attn)->v_proj})
      torch::nn::init::xavier_uniform_((*lin)->weight, 1.0 / std::sqrt(2.0));
    torch::nn::init::xavier_uniform_((*attn)->out_proj->weight, 1.0);
    for (auto* lin : {&(*attn)->q_proj, &(*attn)->k_proj, &(*attn)->v_proj, &(*attn)->out_proj})
      torch::nn::init::zeros_((*lin)->bias);
  }
  for (auto* lin : {&ffn->fc1, &ffn->fc2}) {
    torch::nn::init::xavier_uniform_((*lin)->weight, 1.0);
    torch::nn::init::zeros_((*lin)->bias);
  }
  scheme.init_layer(*this, geom_);
}

torch::Tensor TransformerLayerImpl::forward(const torch::Tensor& x, const LayerInputs& in) {
  LayerOpsImpl ops(*this, in);
  torch::Tensor y = wiring_->forward(ops, x);
  if (ActivationObserver* obs = hooks_->observer) obs->on_layer_output(id_, y);
  return y;
}

}  // namespace normlab
