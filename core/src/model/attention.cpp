#include "normlab/model/attention.h"

#include <torch/nn/functional/activation.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include "counter_dropout.h"
#include "fused_attention.h"
#include "fused_linear.h"

#include "torch_compat.h"

namespace normlab {
namespace {

// True when the tensors lie back to back in one buffer, as FlatAdamW lays out q/k/v.
bool back_to_back(const std::vector<torch::Tensor>& ts) {
  for (size_t i = 1; i < ts.size(); ++i) {
    const torch::Tensor &a = ts[i - 1], &b = ts[i];
    if (!a.is_contiguous() || !b.is_contiguous() || a.dtype() != b.dtype() || a.device() != b.device() ||
        !a.sizes().slice(1).equals(b.sizes().slice(1)) || !a.storage().is_alias_of(b.storage()) ||
        static_cast<const char*>(a.data_ptr()) + a.nbytes() != static_cast<const char*>(b.data_ptr()))
      return false;
  }
  return true;
}

// torch::cat along dim 0 of tensors that are back to back, without a copy: forward is a view of
// their memory, backward splits the gradient. (Two and three inputs: undefined inputs are not
// allowed in a custom autograd function.)
at::Tensor view_spanning(const std::vector<at::Tensor>& ts) {
  std::vector<int64_t> sizes = ts[0].sizes().vec();
  for (size_t i = 1; i < ts.size(); ++i) sizes[0] += ts[i].size(0);
  return ts[0].detach().as_strided(sizes, ts[0].strides(), ts[0].storage_offset());
}

torch::autograd::variable_list split_rows(torch::autograd::AutogradContext* ctx, const at::Tensor& grad) {
  torch::autograd::variable_list out;
  int64_t start = 0;
  for (int64_t r : ctx->saved_data["rows"].toIntVector()) {
    out.push_back(grad.narrow(0, start, r));
    start += r;
  }
  return out;
}

struct BackToBack2 : public torch::autograd::Function<BackToBack2> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->saved_data["rows"] = std::vector<int64_t>{a.size(0), b.size(0)};
    return view_spanning({a, b});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    return split_rows(ctx, grad[0]);
  }
};

struct BackToBack3 : public torch::autograd::Function<BackToBack3> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor& c) {
    ctx->saved_data["rows"] = std::vector<int64_t>{a.size(0), b.size(0), c.size(0)};
    return view_spanning({a, b, c});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    return split_rows(ctx, grad[0]);
  }
};

torch::Tensor packed(const std::vector<torch::Tensor>& ts) {
  if (!back_to_back(ts)) return torch::cat(ts);
  return ts.size() == 3 ? BackToBack3::apply(ts[0], ts[1], ts[2]) : BackToBack2::apply(ts[0], ts[1]);
}

}  // namespace

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
  // q/k/v norms change q, k or v between the projection and the attention: the unfused path.
  const bool plain = !q_norm && !k_norm && !v_norm;
  torch::Tensor q, k, v, ctx;
  // One GEMM for the packed projections; no weight copy when the optimizer keeps q/k/v back to back.
  if (self_attention) {
    auto qkv = fused_linear(query, packed({q_proj->weight, k_proj->weight, v_proj->weight}),
                             packed({q_proj->bias, k_proj->bias, v_proj->bias}))
                   .view({B, Tq, 3, heads_, dh});
    if (plain && fused_attention_applies(qkv, mask, attention_dropout_, is_training())) {
      ctx = fused_self_attention(qkv, mask);
    } else {
      // unbind, not qkv[i]: its backward stacks the three gradients in one copy, where three
      // selects each fill a zero [3,B,H,T,dh] tensor and two adds sum them.
      auto parts = qkv.permute({2, 0, 3, 1, 4}).unbind(0);  // [B,H,T,dh] each
      q = parts[0];
      k = parts[1];
      v = parts[2];
    }
  } else {
    auto q_rows = fused_linear(query, q_proj->weight, q_proj->bias).view({B, Tq, 1, heads_, dh});
    auto kv = fused_linear(memory, packed({k_proj->weight, v_proj->weight}),
                            packed({k_proj->bias, v_proj->bias}))
                  .view({B, Tk, 2, heads_, dh});
    if (plain && fused_attention_applies(kv, mask, attention_dropout_, is_training())) {
      ctx = fused_cross_attention(q_rows, kv, mask);
    } else {
      q = q_rows.select(2, 0).transpose(1, 2);
      auto parts = kv.permute({2, 0, 3, 1, 4}).unbind(0);
      k = parts[0];
      v = parts[1];
    }
  }
  if (!ctx.defined()) {
    if (q_norm) q = q_norm(q);
    if (k_norm) k = k_norm(k);
    if (v_norm) v = v_norm(v);
    ctx = compat::attention(q.contiguous(), k.contiguous(), v.contiguous(), mask, attention_dropout_, is_training());
    ctx = ctx.transpose(1, 2).reshape({B, Tq, d_model_});
  }
  if (inner_norm) ctx = inner_norm(ctx);
  return fused_linear(ctx, out_proj->weight, out_proj->bias);
}

void MultiheadAttentionImpl::add_norm(BranchPoint p, const NormSpec& spec) {
  const int64_t dh = d_model_ / heads_;
  auto add = [&](Norm& slot, const char* name, int64_t dim) {
    TORCH_CHECK(!slot, "a second norm at ", name);
    slot = register_module(name, Norm(spec, dim));
  };
  switch (p) {
    case BranchPoint::Query: add(q_norm, "q_norm", dh); break;
    case BranchPoint::Key: add(k_norm, "k_norm", dh); break;
    case BranchPoint::Value: add(v_norm, "v_norm", dh); break;
    case BranchPoint::AttnInner: add(inner_norm, "inner_norm", d_model_); break;
    case BranchPoint::FfnInner: TORCH_CHECK(false, "an FFN point on an attention sublayer");
  }
}

FeedForwardImpl::FeedForwardImpl(int64_t d_model, int64_t ffn_dim, double activation_dropout)
    : activation_dropout_(activation_dropout) {
  fc1 = register_module("fc1", torch::nn::Linear(d_model, ffn_dim));
  fc2 = register_module("fc2", torch::nn::Linear(ffn_dim, d_model));
}

torch::Tensor FeedForwardImpl::activation(const torch::Tensor& h) { return torch::relu(fc1(h)); }

torch::Tensor FeedForwardImpl::project(const torch::Tensor& act) {
  torch::Tensor h = activation_dropout_ > 0 && is_training() ? counter_dropout(act, activation_dropout_, true) : act;
  if (inner_norm) h = inner_norm(h);
  return fc2(h);
}

void FeedForwardImpl::add_inner_norm(const NormSpec& spec) {
  TORCH_CHECK(!inner_norm, "a second norm at ffn.inner_norm");
  inner_norm = register_module("inner_norm", Norm(spec, ffn_dim()));
}

}  // namespace normlab
