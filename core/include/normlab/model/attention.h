// Multi-head attention with separate, stably named q/k/v/out projections.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace normlab {

class MultiheadAttentionImpl : public torch::nn::Module {
 public:
  MultiheadAttentionImpl(int64_t d_model, int64_t heads, double attention_dropout);

  // query [B,Tq,D]; memory [B,Tk,D] (the query itself for self-attention); mask additive,
  // broadcastable to [B,H,Tq,Tk], or undefined.
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& memory,
                        const torch::Tensor& mask, bool self_attention);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};

 private:
  int64_t d_model_, heads_;
  double attention_dropout_;
};
TORCH_MODULE(MultiheadAttention);

// FFN(h) = W2 · Drop_act(ReLU(W1 · h)), split so the core can observe the activation.
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t d_model, int64_t ffn_dim, double activation_dropout);
  torch::Tensor activation(const torch::Tensor& h);    // ReLU(W1·h)
  torch::Tensor project(const torch::Tensor& act);     // W2 · Drop_act(act)
  torch::Tensor forward(const torch::Tensor& h) { return project(activation(h)); }

  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  double activation_dropout_;
};
TORCH_MODULE(FeedForward);

}  // namespace normlab
