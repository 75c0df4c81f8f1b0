#include "normlab/model/attention.h"

#include <torch/nn/functional/activation.h>
#include <torch/torch.h>

#include "torch_compat.h"

namespace normlab {

MultiheadAttentionImpl::MultiheadAttentionImpl(int64_t d_model, int64_t heads,
                                               double attention_dropout)
    : d_model_(d_model), heads_(heads), attention_dropout_(attention_dropout) {
  TORCH_CHECK(d_model % heads == 0, "d_model (", d_model, ") must be divisible by heads (", heads, ")");
  q_proj = register_module("q_proj", torch::nn::Linear(d_model, d_model));
  k_proj = register_module("k_proj", torch::nn::Linear(d_model, d_model));
  v_proj = register_module("v_proj", torch::nn::Linear(d_model, d_model));
  out_proj = register_module("out_proj", torch::nn::Linear(d_model, d_model));
}

torch::Tensor MultiheadAttentionImpl::forward(const torch::Tensor& query,
                                              const torch::Tensor& memory,
                                              const torch::Tensor& mask, bool self_attention) {
  const int64_t B = query.size(0), Tq = query.size(1), Tk = memory.size(1);
  const int64_t dh = d_model_ / heads_;
  torch::Tensor q, k, v;
  // One GEMM for the packed projections; the weight concat is O(d²), the GEMM O(B·T·d²).
  if (self_attention) {
    auto qkv = torch::linear(query, torch::cat({q_proj->weight, k_proj->weight, v_proj->weight}),
                             torch::cat({q_proj->bias, k_proj->bias, v_proj->bias}))
                   .view({B, Tq, 3, heads_, dh})
                   .permute({2, 0, 3, 1, 4});  // [3,B,H,T,dh]
    q = qkv[0];
    k = qkv[1];
    v = qkv[2];
  } else {
    q = q_proj(query).view({B, Tq, heads_, dh}).transpose(1, 2);
    auto kv = torch::linear(memory, torch::cat({k_proj->weight, v_proj->weight}),
                            torch::cat({k_proj->bias, v_proj->bias}))
                  .view({B, Tk, 2, heads_, dh})
                  .permute({2, 0, 3, 1, 4});
    k = kv[0];
    v = kv[1];
  }
  torch::Tensor ctx = compat::attention(q.contiguous(), k.contiguous(), v.contiguous(), mask,
                                        attention_dropout_, is_training());
  return out_proj(ctx.transpose(1, 2).reshape({B, Tq, d_model_}));
}

FeedForwardImpl::FeedForwardImpl(int64_t d_model, int64_t ffn_dim, double activation_dropout)
    : activation_dropout_(activation_dropout) {
  fc1 = register_module("fc1", torch::nn::Linear(d_model, ffn_dim));
  fc2 = register_module("fc2", torch::nn::Linear(ffn_dim, d_model));
}

torch::Tensor FeedForwardImpl::activation(const torch::Tensor& h) { return torch::relu(fc1(h)); }

torch::Tensor FeedForwardImpl::project(const torch::Tensor& act) {
  if (activation_dropout_ > 0 && is_training())
    return fc2(torch::dropout(act, activation_dropout_, true));
  return fc2(act);
}

}  // namespace normlab
