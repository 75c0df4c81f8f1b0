// Encoder-decoder (translation) and decoder-only (language model) Transformers of any depth.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <vector>

#include "normlab/model/config.h"
#include "normlab/model/observer.h"
#include "normlab/model/transformer_layer.h"
#include "normlab/plugins/scheme_handle.h"
#include "normlab/sdk/scheme.h"

namespace normlab {

class TransformerStackImpl : public torch::nn::Module, private StackBuilder {
 public:
  TransformerStackImpl(const ModelConfig& cfg, Stack stack, const SchemeHandle& scheme,
                       torch::nn::Embedding embed, bool owns_embedding,
                       std::shared_ptr<ModelHooks> hooks);

  // tokens [B,T] → hidden states [B,T,D] (before any output projection).
  torch::Tensor forward(const torch::Tensor& tokens, const LayerInputs& in);

  Stack stack() const { return stack_; }
  TransformerLayerImpl& layer(size_t i) { return *layers_[i]; }
  size_t num_layers() const { return layers_.size(); }
  bool has_final_norm() const { return !final_norm_.is_empty(); }
  // The scheme's stack wiring (streams), or null for one stream.
  bool has_stack_wiring() const { return wiring_ != nullptr; }
  const torch::Tensor& embedding_weight() const { return embed_tokens->weight; }
  // The tensors the scheme declared with StackBuilder::add_parameter (not its layers').
  const std::vector<torch::Tensor>& scheme_parameters() const { return stack_params_; }

  torch::nn::Embedding embed_tokens{nullptr};

 private:
  friend class StackOpsImpl;
  const ModelGeometry& model() const override { return geom_; }
  int add_norm(const std::string& name, const NormSpec& spec, int64_t dim) override;
  int add_parameter(const std::string& name, const torch::Tensor& init) override;

  Stack stack_;
  ModelGeometry geom_;
  int64_t d_model_;
  double embed_scale_;
  bool absolute_positions_;  // sinusoidal (Transformer family); the Llama family rotates q and k
                             // instead
  double dropout_;
  Norm final_norm_{nullptr};
  std::vector<Norm> stack_norms_;
  std::vector<torch::Tensor> stack_params_;
  std::shared_ptr<StackWiring> wiring_;
  std::vector<std::shared_ptr<TransformerLayerImpl>> layers_;
  std::shared_ptr<ModelHooks> hooks_;
  // The sinusoidal position table on the device of the last forward, grown as needed: not rebuilt
  // on the CPU and copied to the device in every forward (a host sync per step on a GPU).
  torch::Tensor positions_;
  torch::Tensor positions(int64_t T, const torch::TensorOptions& opts);
};
TORCH_MODULE(TransformerStack);

class TransformerModelImpl : public torch::nn::Module {
 public:
  TransformerModelImpl(const ModelConfig& cfg, SchemeHandle scheme);

  // `unpadded` (each below): the caller knows that tgt_in/tokens hold no pad, so the decoder's
  // self-attention mask is the causal one alone (a causal kernel on LibTorch 2.x).
  // Encoder-decoder: logits [B,T,V] for target inputs `tgt_in` given `src`.
  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& tgt_in,
                        bool unpadded = false);
  // Language model: logits [B,T,V] for `tokens`, causal.
  torch::Tensor forward_lm(const torch::Tensor& tokens, bool unpadded = false);
  // Either model's last decoder states [B,T,D], before the output projection (src undefined for a
  // language model): the trainer's fused loss projects them block by block.
  torch::Tensor final_hidden(const torch::Tensor& src, const torch::Tensor& tgt_in,
                             bool unpadded = false);
  // A language model's last states [B,T,D] for packed sequences: `positions` [B,T] and an additive
  // self-attention `mask` [B,1,T,T] of the caller's (downstream tasks: a context once, its choices
  // after it, each seeing the context and itself).
  torch::Tensor packed_hidden(const torch::Tensor& tokens, const torch::Tensor& positions,
                              const torch::Tensor& mask);
  // The output projection [V,D] (a registered parameter, or the tied embedding).
  const torch::Tensor& output_weight() const { return output_weight_; }
  // What the logits are computed with: output_weight(), its rows times the scheme's logit scale
  // when it has one (Scheme::logit_scale; z = s ⊙ (W h) = (diag(s) W) h).
  torch::Tensor output_projection();
  // model.final_logit_softcap s: s·tanh(logits/s) (Gemma 2), logits as they are when s is 0. The
  // logits of forward/forward_lm/decode have it already; a caller projecting final_hidden itself
  // applies it (the losses, downstream tasks).
  double final_logit_softcap() const { return cfg_.final_logit_softcap; }
  torch::Tensor cap_logits(const torch::Tensor& logits) const;

  // Pieces of forward() for decoding: encoder output and its key-padding mask.
  torch::Tensor encode(const torch::Tensor& src, torch::Tensor* src_mask_out);
  torch::Tensor decode(const torch::Tensor& tgt_in, const torch::Tensor& memory,
                       const torch::Tensor& memory_mask);

  // Scheme run hooks, called by the trainer (Scheme::on_update … on_validate).
  void on_update(int64_t updates_done) { scheme_.scheme->on_update(updates_done); }
  void after_backward();
  void after_step();
  void on_validate(int64_t updates_done, double valid_nll) {
    scheme_.scheme->on_validate(updates_done, valid_nll);
  }
  void run_setup_pass(const std::function<void()>& forward_first_batch);

  void set_observer(ActivationObserver* obs) { hooks_->observer = obs; }
  // Activation checkpointing: in training, each layer keeps only its input and is recomputed in
  // the backward pass (same results: dropout's random numbers and autocast are replayed).
  void set_activation_checkpointing(bool on) { hooks_->recompute_layers = on; }
  Scheme& scheme() { return *scheme_.scheme; }
  const std::string& scheme_name() const { return scheme_.name; }
  const SchemeHandle& scheme_handle() const { return scheme_; }
  const ModelConfig& config() const { return cfg_; }
  // Every tensor the scheme declared with add_parameter, on its stacks and layers.
  std::vector<torch::Tensor> scheme_parameters() const;

  TransformerStack encoder{nullptr};  // null for Arch::LM
  TransformerStack decoder{nullptr};

 private:
  torch::Tensor output_logits(const torch::Tensor& hidden);
  torch::Tensor decode_hidden(const torch::Tensor& tgt_in, const torch::Tensor& memory,
                              const torch::Tensor& memory_mask, bool unpadded = false);
  // The decoder's self-attention inputs: causal, plus the pads of tgt_in unless `unpadded`.
  LayerInputs self_inputs(const torch::Tensor& tgt_in, const torch::TensorOptions& opts,
                          bool unpadded) const;

  ModelConfig cfg_;
  SchemeHandle scheme_;
  std::shared_ptr<ModelHooks> hooks_;
  torch::Tensor output_weight_;  // the output projection (registered, or the tied embedding)
  Norm logit_scale_{nullptr};    // NormKind::Scale over the vocabulary, or none
};
TORCH_MODULE(TransformerModel);

// Additive masks (0 / -inf) built once per forward.
torch::Tensor key_padding_mask(const torch::Tensor& tokens, int64_t pad_id);  // [B,1,1,T]
torch::Tensor causal_mask(int64_t T, const torch::TensorOptions& opts);       // [1,1,T,T]

}  // namespace normlab
