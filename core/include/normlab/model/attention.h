// Multi-head attention with separate, stably named q/k/v/out projections.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "normlab/model/norm.h"
#include "normlab/sdk/scheme.h"

namespace normlab {

class MultiheadAttentionImpl : public torch::nn::Module {
 public:
  MultiheadAttentionImpl(int64_t d_model, int64_t heads, double attention_dropout);

  // query [B,Tq,D]; memory [B,Tk,D] (the query itself for self-attention); mask additive,
  // broadcastable to [B,H,Tq,Tk], or undefined.
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& memory,
                        const torch::Tensor& mask, bool self_attention);

  // A scheme's norm at Query/Key/Value (per head) or AttnInner (before out_proj).
  void add_norm(BranchPoint p, const NormSpec& spec);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  Norm q_norm{nullptr}, k_norm{nullptr}, v_norm{nullptr}, inner_norm{nullptr};  // null = none

 private:
  int64_t d_model_, heads_;
  double attention_dropout_;
};
TORCH_MODULE(MultiheadAttention);

// FFN(h) = W2 · Drop_act(ReLU(W1 · h)), split so the core can observe the activation.
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t d_model, int64_t ffn_dim, double activation_dropout);
  int64_t ffn_dim() const { return fc1->weight.size(0); }
  double activation_dropout() const { return activation_dropout_; }
  torch::Tensor activation(const torch::Tensor& h);    // ReLU(W1·h)
  torch::Tensor project(const torch::Tensor& act);     // W2 · Drop_act(act)
  torch::Tensor forward(const torch::Tensor& h) { return project(activation(h)); }
  // A scheme's norm over the activation, before fc2 (BranchPoint::FfnInner).
  void add_inner_norm(const NormSpec& spec);

  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Norm inner_norm{nullptr};

 private:
  double activation_dropout_;
};
TORCH_MODULE(FeedForward);

}  // namespace normlab
