#include "normlab/model/transformer_model.h"

#include <cmath>
#include <limits>
#include <optional>

#include "counter_dropout.h"
#include "normlab/model/projection.h"
#include "torch_api.h"

namespace normlab {
namespace {

// Sinusoidal positions (Vaswani et al. §3.5, fairseq layout: sines then cosines), [T,D].
torch::Tensor sinusoidal_positions(int64_t T, int64_t d, const torch::TensorOptions& opts) {
  const int64_t half = d / 2;
  auto freq = torch::exp(torch::arange(half, torch::kFloat) *
                         -(std::log(10000.0) / double(std::max<int64_t>(half - 1, 1))));
  auto pos = torch::arange(T, torch::kFloat).unsqueeze(1) * freq.unsqueeze(0);
  auto table = torch::cat({torch::sin(pos), torch::cos(pos)}, 1);
  if (d % 2 == 1) table = torch::cat({table, torch::zeros({T, 1})}, 1);
  return table.to(opts);
}

class ForwardPass final : public SetupPass {
 public:
  explicit ForwardPass(const std::function<void()>& fn) : fn_(fn) {}
  void forward_first_batch() override { fn_(); }

 private:
  const std::function<void()>& fn_;
};

}  // namespace

// Core services for the scheme's stack wiring, valid for one forward call.
class StackOpsImpl final : public StackOps {
 public:
  explicit StackOpsImpl(TransformerStackImpl& s) : s_(s) {}
  torch::Tensor norm(int id, const torch::Tensor& x) override {
    TORCH_CHECK(id >= 0 && size_t(id) < s_.stack_norms_.size(), "no stack norm with id ", id);
    return s_.stack_norms_[size_t(id)]->forward(x);
  }
  const torch::Tensor& param(int id) override {
    TORCH_CHECK(id >= 0 && size_t(id) < s_.stack_params_.size(), "no stack parameter with id ", id);
    return s_.stack_params_[size_t(id)];
  }
  bool training() const override { return s_.is_training(); }

 private:
  TransformerStackImpl& s_;
};

torch::Tensor key_padding_mask(const torch::Tensor& tokens, int64_t pad_id) {
  auto m = torch::zeros(tokens.sizes(),
                        torch::TensorOptions().dtype(torch::kFloat).device(tokens.device()));
  m.masked_fill_(tokens.eq(pad_id), -std::numeric_limits<float>::infinity());
  return m.view({tokens.size(0), 1, 1, tokens.size(1)});
}

torch::Tensor causal_mask(int64_t T, const torch::TensorOptions& opts) {
  return torch::full({T, T}, -std::numeric_limits<float>::infinity(), opts.dtype(torch::kFloat))
      .triu(1)
      .view({1, 1, T, T});
}

TransformerStackImpl::TransformerStackImpl(const ModelConfig& cfg, Stack stack,
                                           const SchemeHandle& scheme, torch::nn::Embedding embed,
                                           bool owns_embedding, std::shared_ptr<ModelHooks> hooks)
    : stack_(stack),
      geom_(cfg.geometry()),
      d_model_(cfg.d_model),
      embed_scale_(cfg.family == Family::Llama ? 1.0 : std::sqrt(double(cfg.d_model))),
      absolute_positions_(cfg.family == Family::Transformer),
      dropout_(cfg.dropout),
      hooks_(std::move(hooks)) {
  embed_tokens = owns_embedding ? register_module("embed_tokens", embed) : embed;
  const ModelGeometry geom = cfg.geometry();
  auto layers = register_module("layers", torch::nn::ModuleList());
  const int n = geom.layers(stack);
  layers_.reserve(size_t(n));
  for (int i = 0; i < n; ++i) {
    LayerGeometry g{geom, stack, i};
    auto layer = std::make_shared<TransformerLayerImpl>(
        cfg, g, *scheme.scheme, std::shared_ptr<const void>(scheme.scheme), hooks_);
    layers->push_back(layer);
    layers_.push_back(layer);
  }
  if (StackWiring* raw = scheme.scheme->build_stack(*this).release()) {
    std::shared_ptr<const void> keep_alive(scheme.scheme);
    wiring_ = std::shared_ptr<StackWiring>(raw, [keep_alive](StackWiring* w) { delete w; });
  }
  if (std::optional<NormSpec> spec = scheme.scheme->final_norm(stack, geom.norm))
    if (spec->kind != NormKind::None)
      final_norm_ = register_module("layer_norm", Norm(*spec, cfg.d_model));
}

int TransformerStackImpl::add_norm(const std::string& name, const NormSpec& spec, int64_t dim) {
  stack_norms_.push_back(register_module(name, Norm(spec, dim > 0 ? dim : d_model_)));
  return int(stack_norms_.size()) - 1;
}

std::vector<torch::Tensor> TransformerModelImpl::scheme_parameters() const {
  std::vector<torch::Tensor> out;
  for (TransformerStack stack : {encoder, decoder}) {
    if (!stack) continue;
    for (const auto& t : stack->scheme_parameters()) out.push_back(t);
    for (size_t i = 0; i < stack->num_layers(); ++i)
      for (const auto& t : stack->layer(i).scheme_parameters()) out.push_back(t);
  }
  return out;
}

int TransformerStackImpl::add_parameter(const std::string& name, const torch::Tensor& init) {
  stack_params_.push_back(
      register_parameter(name, init.detach().to(torch::device(parameter_device()),
                                                /*non_blocking=*/false, /*copy=*/true)));
  return int(stack_params_.size()) - 1;
}

torch::Tensor TransformerStackImpl::positions(int64_t T, const torch::TensorOptions& opts) {
  // Row t of the table does not depend on its length: the first T rows of a longer one are the
  // same.
  if (!positions_.defined() || positions_.size(0) < T || positions_.device() != opts.device() ||
      positions_.scalar_type() != c10::typeMetaToScalarType(opts.dtype()))
    positions_ = sinusoidal_positions(std::max<int64_t>(T, 256), d_model_, opts);
  return positions_.narrow(0, 0, T);
}

torch::Tensor TransformerStackImpl::forward(const torch::Tensor& tokens, const LayerInputs& in) {
  auto x = embed_tokens(tokens);
  if (embed_scale_ != 1.0) x = x * embed_scale_;
  if (absolute_positions_ && in.positions.defined())  // each token's own row: [B,T,D]
    x = x + positions(in.positions.max().item<int64_t>() + 1, x.options()).index({in.positions});
  else if (absolute_positions_)
    x = x + positions(tokens.size(1), x.options()).unsqueeze(0);
  x = counter_dropout(x, dropout_, is_training());
  const bool recompute = hooks_->recompute_layers && is_training() && torch::GradMode::is_enabled();
  StackOpsImpl ops(*this);
  Streams s = wiring_ ? wiring_->begin(ops, x) : Streams{x};
  TORCH_CHECK(!s.empty(), to_string(stack_), ": the scheme's stack wiring began no stream");
  for (auto& layer : layers_)
    s = recompute ? layer->forward_recomputed(s, in) : layer->forward_streams(std::move(s), in);
  x = wiring_ ? wiring_->end(ops, s) : s[0];
  if (!final_norm_.is_empty()) x = final_norm_(x);
  return x;
}

TransformerModelImpl::TransformerModelImpl(const ModelConfig& cfg, SchemeHandle scheme)
    : cfg_(cfg), scheme_(std::move(scheme)), hooks_(std::make_shared<ModelHooks>()) {
  TORCH_CHECK(scheme_.scheme, "no scheme given");
  TORCH_CHECK(cfg.tgt_vocab > 0, "target vocabulary size must be positive");
  const bool encdec = cfg.arch == Arch::EncDec;
  TORCH_CHECK(!encdec || cfg.src_vocab > 0, "source vocabulary size must be positive");
  TORCH_CHECK(!(encdec && cfg.sharing == EmbeddingSharing::All && cfg.src_vocab != cfg.tgt_vocab),
              "sharing all embeddings needs one joint vocabulary (src_vocab == tgt_vocab)");

  TORCH_CHECK(cfg.family == Family::Transformer || !encdec,
              "the llama family is decoder-only here (arch = lm)");
  // fairseq: N(0, 1/d) (the √d scale brings rows to unit RMS); Llama: N(0, init_std²), unscaled.
  const double embed_std =
      cfg.family == Family::Llama ? cfg.init_std : std::pow(double(cfg.d_model), -0.5);
  auto make_embedding = [&](int64_t vocab) {
    // pad_id -1 (token shards): every id is a token, none is kept at zero.
    auto options = torch::nn::EmbeddingOptions(vocab, cfg.d_model);
    if (cfg.pad_id >= 0) options.padding_idx(cfg.pad_id);
    // Off the CPU the table is allocated where it will live, skipping Embedding's own N(0, 1)
    // draw; on the CPU that draw stays, so that a seed gives the weights it gave.
    if (!parameter_device().is_cpu())
      options._weight(torch::empty({vocab, cfg.d_model}, torch::device(parameter_device())));
    auto e = torch::nn::Embedding(options);
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(e->weight, 0.0, embed_std);
    if (cfg.pad_id >= 0) e->weight[cfg.pad_id].zero_();
    return e;
  };
  torch::nn::Embedding tgt_embed = make_embedding(cfg.tgt_vocab);
  if (encdec) {
    const bool shared = cfg.sharing == EmbeddingSharing::All;
    torch::nn::Embedding src_embed = shared ? tgt_embed : make_embedding(cfg.src_vocab);
    encoder = register_module("encoder", TransformerStack(cfg, Stack::Encoder, scheme_, src_embed,
                                                          /*owns_embedding=*/true, hooks_));
    decoder = register_module("decoder", TransformerStack(cfg, Stack::Decoder, scheme_, tgt_embed,
                                                          /*owns_embedding=*/!shared, hooks_));
  } else {
    decoder = register_module("decoder", TransformerStack(cfg, Stack::Decoder, scheme_, tgt_embed,
                                                          /*owns_embedding=*/true, hooks_));
  }
  if (cfg.sharing == EmbeddingSharing::None) {
    auto proj = decoder->register_module("output_projection",
                                         Projection(cfg.d_model, cfg.tgt_vocab, /*bias=*/false));
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(proj->weight, 0.0, embed_std);
    output_weight_ = proj->weight;
  } else {
    output_weight_ = tgt_embed->weight;
  }
  if (std::optional<NormSpec> spec = scheme_.scheme->logit_scale()) {
    TORCH_CHECK(spec->kind == NormKind::Scale, "a scheme's logit scale must be of kind scale, got ",
                to_string(spec->kind));
    logit_scale_ = decoder->register_module("logit_scale", Norm(*spec, cfg.tgt_vocab));
  }
  after_step();  // a scheme's projection of the weights holds from the start (Scheme::after_step)
}

torch::Tensor TransformerModelImpl::output_projection() {
  if (logit_scale_.is_empty()) return output_weight_;
  return logit_scale_->forward(output_weight_.t()).t();  // row v times s_v
}

void TransformerModelImpl::after_backward() {
  scheme_.scheme->after_backward(named_parameters(/*recurse=*/true).pairs());
}

void TransformerModelImpl::after_step() {
  torch::NoGradGuard no_grad;
  scheme_.scheme->after_step(named_parameters(/*recurse=*/true).pairs());
}

torch::Tensor TransformerModelImpl::cap_logits(const torch::Tensor& logits) const {
  return cfg_.final_logit_softcap > 0 ? soft_cap(logits, cfg_.final_logit_softcap) : logits;
}

torch::Tensor TransformerModelImpl::output_logits(const torch::Tensor& hidden) {
  return cap_logits(torch::linear(hidden, output_projection()));
}

torch::Tensor TransformerModelImpl::encode(const torch::Tensor& src, torch::Tensor* src_mask_out) {
  TORCH_CHECK(encoder, "encode() needs an encoder-decoder model");
  LayerInputs in;
  in.self_mask = key_padding_mask(src, cfg_.pad_id);
  auto memory = encoder->forward(src, in);
  if (src_mask_out) *src_mask_out = in.self_mask;
  return memory;
}

LayerInputs TransformerModelImpl::self_inputs(const torch::Tensor& tgt_in,
                                              const torch::TensorOptions& opts,
                                              bool unpadded) const {
  LayerInputs in;
  in.self_mask = causal_mask(tgt_in.size(1), opts);
  in.self_causal = unpadded;
  if (!unpadded) in.self_mask = in.self_mask + key_padding_mask(tgt_in, cfg_.pad_id);
  return in;
}

torch::Tensor TransformerModelImpl::decode_hidden(const torch::Tensor& tgt_in,
                                                  const torch::Tensor& memory,
                                                  const torch::Tensor& memory_mask, bool unpadded) {
  LayerInputs in = self_inputs(tgt_in, memory.options(), unpadded);
  in.memory = memory;
  in.memory_mask = memory_mask;
  return decoder->forward(tgt_in, in);
}

torch::Tensor TransformerModelImpl::decode(const torch::Tensor& tgt_in, const torch::Tensor& memory,
                                           const torch::Tensor& memory_mask) {
  return output_logits(decode_hidden(tgt_in, memory, memory_mask));
}

torch::Tensor TransformerModelImpl::final_hidden(const torch::Tensor& src,
                                                 const torch::Tensor& tgt_in, bool unpadded) {
  if (src.defined()) {
    torch::Tensor src_mask;
    auto memory = encode(src, &src_mask);
    return decode_hidden(tgt_in, memory, src_mask, unpadded);
  }
  TORCH_CHECK(!encoder, "an encoder-decoder model needs a source");
  return decoder->forward(
      tgt_in, self_inputs(tgt_in, torch::TensorOptions().device(tgt_in.device()), unpadded));
}

torch::Tensor TransformerModelImpl::packed_hidden(const torch::Tensor& tokens,
                                                  const torch::Tensor& positions,
                                                  const torch::Tensor& mask) {
  TORCH_CHECK(!encoder, "packed_hidden() needs a decoder-only model");
  LayerInputs in;
  in.self_mask = mask;
  in.positions = positions;
  return decoder->forward(tokens, in);
}

torch::Tensor TransformerModelImpl::forward(const torch::Tensor& src, const torch::Tensor& tgt_in,
                                            bool unpadded) {
  TORCH_CHECK(encoder, "forward() needs an encoder-decoder model");
  return output_logits(final_hidden(src, tgt_in, unpadded));
}

torch::Tensor TransformerModelImpl::forward_lm(const torch::Tensor& tokens, bool unpadded) {
  TORCH_CHECK(!encoder, "forward_lm() needs a decoder-only model");
  return output_logits(final_hidden(torch::Tensor(), tokens, unpadded));
}

void TransformerModelImpl::run_setup_pass(const std::function<void()>& forward_first_batch) {
  if (!scheme_.scheme->needs_setup_pass()) return;
  torch::NoGradGuard no_grad;
  const bool was_training = is_training();
  train(true);
  ForwardPass pass(forward_first_batch);
  scheme_.scheme->setup(pass);
  train(was_training);
}

}  // namespace normlab
