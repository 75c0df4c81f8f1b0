#include "normlab/model/transformer_layer.h"

#include <cmath>
#include <optional>

#include "counter_dropout.h"
#include "fused_ffn.h"
#include "fused_residual_norm.h"
#include "normlab/model/projection.h"
#include "torch_api.h"
#include "torch_compat.h"

namespace normlab {

// Core services for the scheme's wiring, valid for one forward call of one layer.
class LayerOpsImpl final : public LayerOps {
 public:
  LayerOpsImpl(TransformerLayerImpl& layer, const LayerInputs& in) : l_(layer), in_(in) {}

  torch::Tensor branch(Sublayer s, const torch::Tensor& x) override {
    ActivationObserver* obs = l_.hooks_->observer;
    torch::Tensor y;
    // The attention scores, only for an observer that asks for this layer's (the probe pass).
    std::optional<AttentionScores> scores;
    if (obs && s != Sublayer::FFN && obs->wants_attention(l_.id_)) scores.emplace();
    switch (s) {
      case Sublayer::SelfAttn:
        y = l_.self_attn->forward(x, x, in_.self_mask, /*self_attention=*/true, in_.self_causal,
                                  in_.positions, scores ? &*scores : nullptr);
        break;
      case Sublayer::CrossAttn:
        TORCH_CHECK(l_.cross_attn, "cross-attention requested in a layer that has none");
        y = l_.cross_attn->forward(x, in_.memory, in_.memory_mask, /*self_attention=*/false,
                                   /*causal=*/false, {}, scores ? &*scores : nullptr);
        break;
      case Sublayer::FFN: {
        if (fused_ffn_applies(x, *l_.ffn, l_.dropout_, l_.is_training())) {
          torch::Tensor act;
          y = fused_ffn_branch(x, *l_.ffn, l_.dropout_, l_.is_training(), obs ? &act : nullptr);
          if (obs) {
            obs->on_ffn_activation(l_.id_, act);
            obs->on_branch(l_.id_, s, y);
          }
          return y;
        }
        torch::Tensor act = l_.ffn->activation(x);
        if (obs) obs->on_ffn_activation(l_.id_, act);
        y = l_.ffn->project(act);
        break;
      }
    }
    if (scores) obs->on_attention(l_.id_, s, *scores);
    y = counter_dropout(y, l_.dropout_, l_.is_training());
    if (obs) obs->on_branch(l_.id_, s, y);
    return y;
  }

  torch::Tensor norm(int id, const torch::Tensor& x) override {
    TORCH_CHECK(id >= 0 && size_t(id) < l_.norms_.size(), "no norm with id ", id, " in this layer");
    NormImpl& n = *l_.norms_[size_t(id)];
    // A norm on its own only for RMSNorm (~16 ATen operators; LLaMA 18L 63 vs 69 ms per step):
    // ATen's own LayerNorm kernel beats the fused one there (Pre-LN 18L-18L 96 vs 94 ms).
    const bool fused =
        n.spec().kind == NormKind::RMSNorm && fused_residual_norm_applies(x, torch::Tensor(), n);
    torch::Tensor y = fused ? fused_residual_norm(x, torch::Tensor(), 1.0, n) : n.forward(x);
    if (ActivationObserver* obs = l_.hooks_->observer) obs->on_norm(l_.id_, id, x, y);
    return y;
  }

  torch::Tensor residual_norm(int id, const torch::Tensor& x, const torch::Tensor& b,
                              double alpha) override {
    TORCH_CHECK(id >= 0 && size_t(id) < l_.norms_.size(), "no norm with id ", id, " in this layer");
    const NormImpl& n = *l_.norms_[size_t(id)];
    if (!fused_residual_norm_applies(x, b, n))
      return norm(id, alpha == 1.0 ? x + b : x * alpha + b);
    ActivationObserver* obs = l_.hooks_->observer;
    if (!obs) return fused_residual_norm(x, b, alpha, n);
    // Observers get the norm's input with its graph (act_grad_norm hooks its gradient), so the sum
    // is ATen's here; the kernel rounds it the same way, so results stay bitwise those without.
    const torch::Tensor sum = alpha == 1.0 ? x + b : x * alpha + b;
    torch::Tensor y = fused_residual_norm(sum, torch::Tensor(), 1.0, n);
    obs->on_norm(l_.id_, id, sum, y);
    return y;
  }

  const torch::Tensor& param(int id) override {
    TORCH_CHECK(id >= 0 && size_t(id) < l_.extra_params_.size(), "no parameter with id ", id,
                " in this layer");
    return l_.extra_params_[size_t(id)];
  }
  bool training() const override { return l_.is_training(); }

 private:
  TransformerLayerImpl& l_;
  const LayerInputs& in_;
};

TransformerLayerImpl::TransformerLayerImpl(const ModelConfig& cfg, const LayerGeometry& g,
                                           Scheme& scheme, std::shared_ptr<const void> keep_alive,
                                           std::shared_ptr<ModelHooks> hooks)
    : geom_(g),
      id_{g.stack, g.index},
      dropout_(cfg.dropout),
      init_std_(cfg.init_std),
      scaled_init_(cfg.scaled_init),
      hooks_(std::move(hooks)) {
  const bool llama = cfg.family == Family::Llama;
  AttentionOptions attn;
  attn.d_model = cfg.d_model;
  attn.heads = cfg.heads;
  attn.attention_dropout = cfg.attention_dropout;
  attn.bias = !llama;
  attn.qk_norm = cfg.qk_norm;
  attn.qk_norm_all = cfg.qk_norm_all;
  attn.logit_softcap = cfg.attn_logit_softcap;
  if (llama) {
    attn.kv_heads = cfg.kv_head_count();
    attn.rope_theta = cfg.rope_theta;
    attn.qk_norm_before_rope = scheme.qk_norm_before_rope();
  }
  self_attn = register_module("self_attn", MultiheadAttention(attn));
  if (g.has_cross_attn()) {  // no rotary positions between a target and a source position
    AttentionOptions cross = attn;
    cross.rope_theta = 0;
    cross_attn = register_module("cross_attn", MultiheadAttention(cross));
  }
  ffn = register_module(
      "ffn", FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation_dropout, /*gated=*/llama,
                         /*bias=*/!llama));
  LayerWiring* raw = scheme.build_layer(*this).release();
  TORCH_CHECK(raw != nullptr, "scheme returned no wiring for ", to_string(g.stack), " layer ",
              g.index);
  // The deleter owns a reference to the scheme, so its plugin stays loaded while the wiring lives.
  wiring_ = std::shared_ptr<LayerWiring>(raw, [keep_alive](LayerWiring* w) { delete w; });
  if (cfg.qk_norm != QkNorm::None) {  // one q/k norm, not the scheme's and model.qk_norm's
    for (const MultiheadAttention* a : {&self_attn, &cross_attn})
      if (*a && ((*a)->q_norm || (*a)->k_norm || scheme.qk_norm_before_rope()))
        throw QkNormConflict(
            "the scheme normalizes q and k itself (its norms at the attention's query/key); "
            "expected qk_norm = \"none\" with it");
  }
  reset_parameters(scheme);
}

int TransformerLayerImpl::add_layer_norm(const std::string& name) {
  return add_norm(name, geom_.model.norm, 0);
}

int TransformerLayerImpl::add_norm(const std::string& name, const NormSpec& spec, int64_t dim) {
  norms_.push_back(register_module(name, Norm(spec, dim > 0 ? dim : geom_.model.d_model)));
  norm_names_.push_back(name);
  return int(norms_.size()) - 1;
}

void TransformerLayerImpl::add_branch_norm(Sublayer s, BranchPoint p, const NormSpec& spec) {
  if (s == Sublayer::FFN) {
    ffn->add_norm(p, spec);
    return;
  }
  MultiheadAttention& attn = s == Sublayer::SelfAttn ? self_attn : cross_attn;
  TORCH_CHECK(attn, "a norm in ", to_string(s), " of a layer that has none");
  attn->add_norm(p, spec);
}

int TransformerLayerImpl::add_parameter(const std::string& name, const torch::Tensor& init) {
  extra_params_.push_back(
      register_parameter(name, init.detach().to(torch::device(parameter_device()),
                                                /*non_blocking=*/false, /*copy=*/true)));
  return int(extra_params_.size()) - 1;
}

void TransformerLayerImpl::reset_parameters(Scheme& scheme) {
  torch::NoGradGuard no_grad;
  if (geom_.model.family == Family::Llama) {
    // Hugging Face's LlamaPreTrainedModel._init_weights: every projection ~ N(0, 0.02²) (init_std);
    // with scaled_init, the projections into the residual stream (out_proj, fc2) get
    // std/√(2L) (GPT-2 §2.3, Megatron, OLMo), L = the stack's layers.
    const double out_std = init_std_ / (scaled_init_ ? std::sqrt(2.0 * geom_.stack_layers()) : 1.0);
    for (const auto& item : named_parameters(/*recurse=*/true)) {
      const std::string& name = item.key();
      const bool projection = name.rfind("self_attn.", 0) == 0 ||
                              name.rfind("cross_attn.", 0) == 0 || name.rfind("ffn.", 0) == 0;
      if (!projection || name.find("norm") != std::string::npos) continue;
      const bool into_residual =
          name.find("out_proj.") != std::string::npos || name.find("fc2.") != std::string::npos;
      torch::nn::init::normal_(item.value(), 0.0, into_residual ? out_std : init_std_);
    }
    scheme.init_layer(*this, geom_);
    return;
  }
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
  return forward_streams({x}, in)[0];
}

Streams TransformerLayerImpl::forward_streams(Streams s, const LayerInputs& in) {
  if (skipped_) return s;
  LayerOpsImpl ops(*this, in);
  const size_t n = s.size();
  if (ActivationObserver* obs = hooks_->observer) obs->on_layer_input(id_, s[0]);
  wiring_->forward_streams(ops, s);
  TORCH_CHECK(s.size() == n, to_string(geom_.stack), " layer ", geom_.index, ": the scheme turned ",
              n, " streams into ", s.size());
  if (ActivationObserver* obs = hooks_->observer) obs->on_layer_output(id_, s[0]);
  return s;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a layer's forward depends on besides its inputs: the generators dropout draws from and the
// autocast state. Captured in the forward, replayed for the recomputation.
struct ForwardContext {
  at::Tensor cpu_rng,
      cuda_rng;  // cuda_rng: the generator of the layer input's GPU (not the thread's current one)
  compat::AutocastState autocast;
  at::Device device{at::kCPU};

  static ForwardContext now(const at::Device& device) {
    return {compat::cpu_rng_state(), compat::cuda_rng_state(device), compat::autocast_state(),
            device};
  }
  void save(AutogradContext* ctx) const {
    ctx->saved_data["cpu_rng"] = cpu_rng;
    ctx->saved_data["cuda_rng"] = cuda_rng;
    ctx->saved_data["device"] = device;
    ctx->saved_data["autocast_cpu"] = autocast.cpu;
    ctx->saved_data["autocast_cuda"] = autocast.cuda;
    ctx->saved_data["autocast_cpu_dtype"] = int64_t(autocast.cpu_dtype);
    ctx->saved_data["autocast_cuda_dtype"] = int64_t(autocast.cuda_dtype);
  }
  static ForwardContext saved(AutogradContext* ctx) {
    ForwardContext c;
    c.cpu_rng = ctx->saved_data["cpu_rng"].toTensor();
    c.cuda_rng = ctx->saved_data["cuda_rng"].toTensor();
    c.device = ctx->saved_data["device"].toDevice();
    c.autocast.cpu = ctx->saved_data["autocast_cpu"].toBool();
    c.autocast.cuda = ctx->saved_data["autocast_cuda"].toBool();
    c.autocast.cpu_dtype = at::ScalarType(ctx->saved_data["autocast_cpu_dtype"].toInt());
    c.autocast.cuda_dtype = at::ScalarType(ctx->saved_data["autocast_cuda_dtype"].toInt());
    return c;
  }
  void set_generators() const {
    compat::set_cpu_rng_state(cpu_rng);
    compat::set_cuda_rng_state(device, cuda_rng);
  }
};

// LibTorch's C++ API has no torch.utils.checkpoint: this is its reentrant variant. The forward
// runs without a graph (autograd calls it in no-grad mode) and saves the layer's inputs; the
// backward runs the layer again with the same random numbers and precision, then back-propagates
// through that graph, which adds the parameters' gradients and gives those of the inputs.
struct RecomputedLayer : public torch::autograd::Function<RecomputedLayer> {
  // inputs: the streams, then the encoder output for a decoder layer with cross-attention.
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs,
                               TransformerLayerImpl* layer, const LayerInputs* in,
                               int64_t streams) {
    ForwardContext::now(inputs[0].device()).save(ctx);
    ctx->saved_data["layer"] =
        int64_t(reinterpret_cast<intptr_t>(layer));  // the model outlives its graph
    ctx->saved_data["self_mask"] = in->self_mask;
    ctx->saved_data["self_causal"] = in->self_causal;
    ctx->saved_data["memory_mask"] = in->memory_mask;
    ctx->saved_data["streams"] = streams;
    ctx->save_for_backward(inputs.vec());
    return layer->forward_streams(Streams(inputs.begin(), inputs.begin() + streams), *in);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto* layer =
        reinterpret_cast<TransformerLayerImpl*>(intptr_t(ctx->saved_data["layer"].toInt()));
    const int64_t n = ctx->saved_data["streams"].toInt();
    const variable_list saved = ctx->get_saved_variables();
    LayerInputs in;
    in.self_mask = ctx->saved_data["self_mask"].toTensor();
    in.self_causal = ctx->saved_data["self_causal"].toBool();
    in.memory_mask = ctx->saved_data["memory_mask"].toTensor();
    Streams x;
    for (int64_t i = 0; i < n; ++i) x.push_back(saved[size_t(i)].detach().requires_grad_(true));
    if (int64_t(saved.size()) > n) in.memory = saved[size_t(n)].detach().requires_grad_(true);
    Streams y;
    {
      const ForwardContext then = ForwardContext::saved(ctx);
      const ForwardContext before = ForwardContext::now(x[0].device());
      then.set_generators();
      {
        compat::AutocastGuard autocast(then.autocast);
        torch::AutoGradMode grad_mode(true);
        y = layer->forward_streams(x, in);
      }
      before.set_generators();  // the training run's generators go on as without recomputation
    }
    variable_list outs, grads;
    for (size_t i = 0; i < y.size(); ++i)
      if (grad[i].defined() && y[i].requires_grad()) {
        outs.push_back(y[i]);
        grads.push_back(grad[i]);
      }
    if (!outs.empty()) torch::autograd::backward(outs, grads);
    variable_list out;
    for (const auto& t : x) out.push_back(t.grad());
    if (in.memory.defined()) out.push_back(in.memory.grad());
    out.emplace_back();  // layer
    out.emplace_back();  // in
    out.emplace_back();  // streams
    return out;
  }
};

}  // namespace

Streams TransformerLayerImpl::forward_recomputed(const Streams& s, const LayerInputs& in) {
  std::vector<torch::Tensor> inputs = s;
  if (in.memory.defined()) inputs.push_back(in.memory);
  return RecomputedLayer::apply(at::TensorList(inputs), this, &in, int64_t(s.size()));
}

}  // namespace normlab
