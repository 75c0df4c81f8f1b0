#include "normlab/model/attention.h"

#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/nn/functional/activation.h>

#include "counter_dropout.h"
#include "cuda/fused_ops.h"
#include "fused_attention.h"
#include "fused_linear.h"
#include "normlab/model/transformer_model.h"
#include "torch_api.h"
#include "torch_compat.h"

namespace normlab {
namespace {

// True when the tensors lie back to back in one buffer, as FlatAdamW lays out q/k/v.
bool back_to_back(const std::vector<torch::Tensor>& ts) {
  for (size_t i = 1; i < ts.size(); ++i) {
    const torch::Tensor &a = ts[i - 1], &b = ts[i];
    if (!a.is_contiguous() || !b.is_contiguous() || a.dtype() != b.dtype() ||
        a.device() != b.device() || !a.sizes().slice(1).equals(b.sizes().slice(1)) ||
        !a.storage().is_alias_of(b.storage()) ||
        static_cast<const char*>(a.data_ptr()) + a.nbytes() !=
            static_cast<const char*>(b.data_ptr()))
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

torch::autograd::variable_list split_rows(torch::autograd::AutogradContext* ctx,
                                          const at::Tensor& grad) {
  torch::autograd::variable_list out;
  int64_t start = 0;
  for (int64_t r : ctx->saved_data["rows"].toIntVector()) {
    out.push_back(grad.narrow(0, start, r));
    start += r;
  }
  return out;
}

struct BackToBack2 : public torch::autograd::Function<BackToBack2> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b) {
    ctx->saved_data["rows"] = std::vector<int64_t>{a.size(0), b.size(0)};
    return view_spanning({a, b});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    return split_rows(ctx, grad[0]);
  }
};

struct BackToBack3 : public torch::autograd::Function<BackToBack3> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b, const at::Tensor& c) {
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
  return ts.size() == 3 ? BackToBack3::apply(ts[0], ts[1], ts[2])
                        : BackToBack2::apply(ts[0], ts[1]);
}

}  // namespace

MultiheadAttentionImpl::MultiheadAttentionImpl(const AttentionOptions& o)
    : o_(o),
      d_model_(o.d_model),
      heads_(o.heads),
      kv_heads_(o.kv_heads > 0 ? o.kv_heads : o.heads),
      attention_dropout_(o.attention_dropout) {
  TORCH_CHECK(d_model_ % heads_ == 0, "d_model (", d_model_, ") must be divisible by heads (",
              heads_, ")");
  TORCH_CHECK(heads_ % kv_heads_ == 0, "heads (", heads_, ") must be divisible by kv_heads (",
              kv_heads_, ")");
  TORCH_CHECK(o.rope_theta <= 0 || (d_model_ / heads_) % 2 == 0,
              "rotary positions need an even head width, got ", d_model_ / heads_);
  const int64_t kv_dim = kv_heads_ * (d_model_ / heads_);
  auto linear = [&](int64_t in, int64_t out) { return Projection(in, out, o.bias); };
  q_proj = register_module("q_proj", linear(d_model_, d_model_));
  k_proj = register_module("k_proj", linear(d_model_, kv_dim));
  v_proj = register_module("v_proj", linear(d_model_, kv_dim));
  out_proj = register_module("out_proj", linear(d_model_, d_model_));
  if (o.qk_norm != QkNorm::None) {
    // A gain and no bias, as OLMo 2's and Qwen3's RMSNorm (ε 1e-6); LayerNorm keeps its 1e-5.
    NormSpec spec =
        NormSpec::of(o.qk_norm == QkNorm::RMS ? NormKind::RMSNorm : NormKind::LayerNorm);
    spec.bias = false;
    spec.eps = o.qk_norm == QkNorm::RMS ? 1e-6 : 1e-5;
    const int64_t dh = d_model_ / heads_;
    q_qknorm = register_module("q_qknorm", Norm(spec, o.qk_norm_all ? d_model_ : dh));
    k_qknorm = register_module("k_qknorm", Norm(spec, o.qk_norm_all ? kv_dim : dh));
  }
}

torch::Tensor soft_cap(const torch::Tensor& x, double s) { return torch::tanh(x / s) * s; }

void MultiheadAttentionImpl::normalize_qk(torch::Tensor& q, torch::Tensor& k) {
  if (!o_.qk_norm_all) {
    q = q_qknorm(q);
    k = k_qknorm(k);
    return;
  }
  auto whole = [](Norm& n, const torch::Tensor& x) {  // over [B,T,H·dh], back to [B,H,T,dh]
    const int64_t B = x.size(0), H = x.size(1), T = x.size(2), dh = x.size(3);
    return n(x.transpose(1, 2).reshape({B, T, H * dh})).view({B, T, H, dh}).transpose(1, 2);
  };
  q = whole(q_qknorm, q);
  k = whole(k_qknorm, k);
}

// The Key norm, with the Query norm's gain where it has none of its own
// (NormSpec::gain_from_query).
// Drop(softmax(q·kᵀ/√dh + mask))·v for q [B, H, Tq, dh], k and v [B, H, Tk, dh], as [B, Tq, H·dh]:
// the fused kernel where it applies (q and k/v packed once, as cross-attention's projections),
// else ATen's attention. `drop` is the rate in effect (0 in evaluation); `causal`: the mask is
// exactly the causal one (compat::attention).
// With model.attn_logit_softcap (`softcap` > 0): ATen's explicit composition, the one path that
// caps the logits (neither the fused CPU kernel nor SDPA can):
// Drop(softmax(s·tanh((q·kᵀ/√dh)/s) + mask))·v.
static torch::Tensor capped_attention(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, torch::Tensor mask, double drop,
                                      bool causal, double softcap) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), dh = q.size(3);
  if (on_gpu_path(q)) {
    static FallbackSite site;
    note_gpu_fallback(site, 0, [] {
      return std::string(
          "attention with model.attn_logit_softcap: ATen's explicit attention (SDPA and flash "
          "attention cannot cap the logits)");
    });
  }
  if (!mask.defined() && causal) mask = causal_mask(Tq, q.options());
  torch::Tensor scores =
      soft_cap(torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(dh))), softcap);
  if (mask.defined()) scores = scores + mask;
  torch::Tensor probs = torch::softmax(scores, -1);
  if (drop > 0) probs = counter_dropout(probs, drop, true);
  return torch::matmul(probs.to(v.scalar_type()), v)
      .transpose(1, 2)
      .reshape({B, Tq, H * v.size(3)});
}

static torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& mask, double drop, bool causal,
                            double softcap = 0.0) {
  if (softcap > 0) return capped_attention(q, k, v, mask, drop, causal, softcap);
  if (fused_attention_applies(q, mask, drop))
    return fused_cross_attention(q.transpose(1, 2).unsqueeze(2),
                                 torch::stack({k.transpose(1, 2), v.transpose(1, 2)}, 2), mask,
                                 drop);
  const int64_t B = q.size(0), Tq = q.size(2);
  return compat::attention(q.contiguous(), k.contiguous(), v.contiguous(), mask, drop, drop > 0,
                           causal)
      .transpose(1, 2)
      .reshape({B, Tq, q.size(1) * q.size(3)});
}

static torch::Tensor key_norm(Norm k_norm, const Norm& q_norm, const torch::Tensor& k) {
  if (!k_norm->spec().gain_from_query) return k_norm(k);
  return k_norm->forward_with_gain(k, q_norm->weight);
}

void rope_tables(int64_t T, int64_t dh, double theta, const torch::TensorOptions& opts,
                 torch::Tensor* cos, torch::Tensor* sin) {
  // In double, then rounded once: the angles t·θ^(−2i/dh) reach T radians.
  const auto d = torch::TensorOptions().dtype(torch::kDouble);
  auto inv_freq = torch::pow(theta, -torch::arange(0, dh, 2, d) / double(dh));  // [dh/2]
  auto angles = torch::arange(T, d).unsqueeze(1) * inv_freq.unsqueeze(0);       // [T,dh/2]
  angles = torch::cat({angles, angles}, 1);
  *cos = angles.cos().to(opts);
  *sin = angles.sin().to(opts);
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

torch::Tensor MultiheadAttentionImpl::rotate(const torch::Tensor& x,
                                             const torch::Tensor& positions) {
  const int64_t T = x.size(2), dh = x.size(3);
  const int64_t rows = positions.defined() ? positions.max().item<int64_t>() + 1 : T;
  if (!rope_cos_.defined() || rope_cos_.size(0) < rows || rope_cos_.device() != x.device() ||
      rope_cos_.scalar_type() != x.scalar_type())
    rope_tables(std::max<int64_t>(rows, 256), dh, o_.rope_theta, x.options(), &rope_cos_,
                &rope_sin_);
  if (positions.defined())  // each token's own row of the tables: [B,1,T,dh]
    return apply_rope(x, rope_cos_.index({positions}).unsqueeze(1),
                      rope_sin_.index({positions}).unsqueeze(1));
  const torch::Tensor cos = rope_cos_.narrow(0, 0, T), sin = rope_sin_.narrow(0, 0, T);
  if (cuda_rope_applies(x, cos)) return fused_rope(x, cos, sin);
  if (on_gpu_path(x)) {
    static FallbackSite site;
    note_gpu_fallback(site, uint32_t(x.scalar_type()), [&] {
      return fmt::format("rotary positions on {} q/k: ATen's composition",
                         c10::toString(x.scalar_type()));
    });
  }
  return apply_rope(x, cos, sin);
}

// Self-attention with rotary positions (Llama family): q/k/v projections, RoPE on q and k (before
// or after the scheme's q/k norms), key/value heads repeated for grouped-query attention (or read
// in place by SDPA on the GPU path).
torch::Tensor MultiheadAttentionImpl::forward_rotary(const torch::Tensor& query,
                                                     const torch::Tensor& mask, bool causal,
                                                     const torch::Tensor& positions,
                                                     AttentionScores* scores) {
  const int64_t B = query.size(0), T = query.size(1), dh = d_model_ / heads_;
  auto heads = [&](const torch::Tensor& y, int64_t h) {
    return y.view({B, T, h, dh}).transpose(1, 2);
  };
  // One GEMM for q, k and v, without a weight copy when the optimizer keeps them back to back;
  // split, not narrow: its backward is one concatenation of the three gradients.
  const int64_t kv_dim = kv_heads_ * dh;
  const auto qkv =
      fused_linear(query, packed({q_proj->weight, k_proj->weight, v_proj->weight}),
                   o_.bias ? packed({q_proj->bias, k_proj->bias, v_proj->bias}) : torch::Tensor())
          .split_with_sizes({d_model_, kv_dim, kv_dim}, -1);
  torch::Tensor q = heads(qkv[0], heads_);
  torch::Tensor k = heads(qkv[1], kv_heads_);
  torch::Tensor v = heads(qkv[2], kv_heads_);
  if (q_qknorm) normalize_qk(q, k);  // before RoPE, as OLMo 2, Qwen3 and Gemma 3
  // kv head j serves q heads j·r … j·r + r − 1 (HF's repeat_kv). A k norm with a gain per (query)
  // head needs k per query head before it: k is repeated first then.
  const int64_t r = heads_ / kv_heads_;
  const bool k_first = r > 1 && k_norm && k_norm->spec().gain_per_head;
  if (k_first) k = k.repeat_interleave(r, 1);
  if (o_.qk_norm_before_rope) {
    if (q_norm) q = q_norm(q);
    if (k_norm) k = key_norm(k_norm, q_norm, k);
  }
  q = rotate(q, positions);
  k = rotate(k, positions);
  if (!o_.qk_norm_before_rope) {
    if (q_norm) q = q_norm(q);
    if (k_norm) k = key_norm(k_norm, q_norm, k);
  }
  if (v_norm) v = v_norm(v);
  if (scores)
    *scores = {q,
               r > 1 && !k_first ? k.repeat_interleave(r, 1) : k,
               mask,
               causal,
               1.0 / std::sqrt(double(dh)),
               o_.logit_softcap};
  const double drop = is_training() ? attention_dropout_ : 0.0;
  torch::Tensor ctx;
#if NORMLAB_TORCH_SDPA_GQA
  // On the GPU path, unpadded batches attend to the grouped heads as they are (issue 43.5): no
  // [B, H, T, dh] copies of k and v, forward or backward. Padded batches keep the repeat, whose
  // memory-efficient kernel takes a mask; SDPA's grouped heads would take the math kernel there.
  if (r > 1 && !k_first && causal && o_.logit_softcap == 0 && on_gpu_path(q) &&
      sdpa_grouped_heads_apply(q)) {
    ctx = compat::causal_grouped_attention(q, k, v, drop).transpose(1, 2).reshape({B, T, d_model_});
  }
#endif
  if (!ctx.defined() && r > 1 && o_.logit_softcap == 0 && on_gpu_path(q)) {
    static FallbackSite site;
    const bool flash = sdpa_grouped_heads_apply(q);
    note_gpu_fallback(site, uint32_t(k_first) << 2 | uint32_t(causal) << 1 | uint32_t(flash), [&] {
      return std::string("grouped k/v heads repeated before attention: ") +
             (k_first   ? "the scheme's k norm has a gain per query head"
              : !causal ? "a padded batch (a mask tensor)"
              : !flash ? "SDPA takes them in place only in its flash kernel (fp16/bf16, head width "
                         "a multiple of 8 up to 256, compute capability 8.0+)"
                       : "this LibTorch's SDPA has no enable_gqa (2.5+)");
    });
  }
  if (!ctx.defined()) {
    if (r > 1) {
      if (!k_first) k = k.repeat_interleave(r, 1);
      v = v.repeat_interleave(r, 1);
    }
    ctx = attend(q, k, v, mask, drop, causal, o_.logit_softcap);
  }
  if (inner_norm) ctx = inner_norm(ctx);
  return fused_linear(ctx, out_proj->weight, out_proj->bias);
}

torch::Tensor MultiheadAttentionImpl::forward(const torch::Tensor& query,
                                              const torch::Tensor& memory,
                                              const torch::Tensor& mask, bool self_attention,
                                              bool causal, const torch::Tensor& positions,
                                              AttentionScores* scores) {
  TORCH_CHECK(o_.rope_theta <= 0 || self_attention, "rotary positions are for self-attention only");
  causal = causal && self_attention;
  if (o_.rope_theta > 0 || kv_heads_ != heads_ || !o_.bias)
    return forward_rotary(query, mask, causal, positions, scores);
  const int64_t B = query.size(0), Tq = query.size(1), Tk = memory.size(1);
  const int64_t dh = d_model_ / heads_;
  // q/k/v norms change q, k or v between the projection and the attention: the unfused path.
  // So do model.qk_norm's; a soft-cap needs the explicit attention (attend).
  // Scores kept for the probes: q and k apart, so not the fused kernel either.
  const bool plain = !q_norm && !k_norm && !v_norm && !q_qknorm && o_.logit_softcap == 0 && !scores;
  const double drop = is_training() ? attention_dropout_ : 0.0;
  torch::Tensor q, k, v, ctx;
  // One GEMM for the packed projections; no weight copy when the optimizer keeps q/k/v back to
  // back.
  if (self_attention) {
    auto qkv = fused_linear(query, packed({q_proj->weight, k_proj->weight, v_proj->weight}),
                            packed({q_proj->bias, k_proj->bias, v_proj->bias}))
                   .view({B, Tq, 3, heads_, dh});
    if (plain && fused_attention_applies(qkv, mask, drop)) {
      ctx = fused_self_attention(qkv, mask, drop);
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
    if (plain && fused_attention_applies(kv, mask, drop)) {
      ctx = fused_cross_attention(q_rows, kv, mask, drop);
    } else {
      q = q_rows.select(2, 0).transpose(1, 2);
      auto parts = kv.permute({2, 0, 3, 1, 4}).unbind(0);
      k = parts[0];
      v = parts[1];
    }
  }
  if (!ctx.defined()) {
    if (q_qknorm) normalize_qk(q, k);
    if (q_norm) q = q_norm(q);
    if (k_norm) k = key_norm(k_norm, q_norm, k);
    if (v_norm) v = v_norm(v);
    if (scores) *scores = {q, k, mask, causal, 1.0 / std::sqrt(double(dh)), o_.logit_softcap};
    ctx = attend(q, k, v, mask, drop, causal, o_.logit_softcap);
  }
  if (inner_norm) ctx = inner_norm(ctx);
  return fused_linear(ctx, out_proj->weight, out_proj->bias);
}

void MultiheadAttentionImpl::add_norm(BranchPoint p, const NormSpec& spec) {
  const int64_t dh = d_model_ / heads_;
  auto add = [&](Norm& slot, const char* name, int64_t dim, int64_t heads = 0) {
    TORCH_CHECK(!slot, "a second norm at ", name);
    slot = register_module(name, Norm(spec, dim, heads));
  };
  TORCH_CHECK(!spec.gain_per_head || p == BranchPoint::Query || p == BranchPoint::Key,
              "a per-head gain is for the q and k norms");
  TORCH_CHECK(
      !spec.gain_from_query || (p == BranchPoint::Key && q_norm && q_norm->weight.defined()),
      "a k norm with the q norm's gain needs a q norm with a gain, declared first");
  switch (p) {
    case BranchPoint::Query:
      add(q_norm, "q_norm", dh, heads_);
      break;
    case BranchPoint::Key:
      add(k_norm, "k_norm", dh, heads_);
      break;
    case BranchPoint::Value:
      add(v_norm, "v_norm", dh);
      break;
    case BranchPoint::AttnInner:
      add(inner_norm, "inner_norm", d_model_);
      break;
    case BranchPoint::FfnInner:
    case BranchPoint::FfnUp:
    case BranchPoint::FfnGate:
      TORCH_CHECK(false, "an FFN point on an attention sublayer");
  }
}

FeedForwardImpl::FeedForwardImpl(int64_t d_model, int64_t ffn_dim, double activation_dropout,
                                 bool gated, bool bias)
    : activation_dropout_(activation_dropout) {
  auto linear = [&](int64_t in, int64_t out) { return Projection(in, out, bias); };
  fc1 = register_module("fc1", linear(d_model, ffn_dim));
  if (gated) gate = register_module("gate", linear(d_model, ffn_dim));
  fc2 = register_module("fc2", linear(ffn_dim, d_model));
}

torch::Tensor FeedForwardImpl::activation(const torch::Tensor& h) {
  if (gate) {
    // One GEMM for the up and gate projections (fc1 then gate: back to back in the optimizer's
    // buffer).
    const torch::Tensor projected =
        fused_linear(h, packed({fc1->weight, gate->weight}),
                     fc1->bias.defined() ? packed({fc1->bias, gate->bias}) : torch::Tensor());
    const bool scheme_norms = gate_norm || up_norm;
    if (!scheme_norms && cuda_swiglu_applies(projected)) return fused_swiglu(projected);
    if (on_gpu_path(projected)) {
      static FallbackSite site;
      note_gpu_fallback(site, uint32_t(projected.scalar_type()) << 1 | scheme_norms, [&] {
        return scheme_norms ? std::string(
                                  "SwiGLU: the scheme's norm at ffn.up/ffn.gate sits "
                                  "between the projection and the activation: ATen's "
                                  "composition")
                            : fmt::format("SwiGLU on {} projections: ATen's composition",
                                          c10::toString(projected.scalar_type()));
      });
    }
    const auto up_gate = projected.split(ffn_dim(), -1);
    torch::Tensor u = up_gate[0], g = up_gate[1];
    if (gate_norm) g = gate_norm(g);
    if (up_norm) u = up_norm(u);
    return torch::silu(g) * u;
  }
  return torch::relu(fc1(h));
}

torch::Tensor FeedForwardImpl::project(const torch::Tensor& act) {
  torch::Tensor h = activation_dropout_ > 0 && is_training()
                        ? counter_dropout(act, activation_dropout_, true)
                        : act;
  if (inner_norm) h = inner_norm(h);
  return fc2(h);
}

void FeedForwardImpl::add_norm(BranchPoint p, const NormSpec& spec) {
  TORCH_CHECK(p == BranchPoint::FfnInner || p == BranchPoint::FfnUp || p == BranchPoint::FfnGate,
              "the FFN has no point ", to_string(p));
  TORCH_CHECK(p == BranchPoint::FfnInner || gate, "a norm at ffn.", to_string(p),
              " needs a gated FFN (family llama)");
  Norm& slot = p == BranchPoint::FfnInner ? inner_norm
               : p == BranchPoint::FfnUp  ? up_norm
                                          : gate_norm;
  TORCH_CHECK(!slot, "a second norm at ffn.", to_string(p));
  slot = register_module(to_string(p), Norm(spec, ffn_dim()));
}

}  // namespace normlab
