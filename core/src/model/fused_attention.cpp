#include "fused_attention.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <vector>

#include "counter_dropout.h"
#include "cpu_gemm.h"
#include "cpu_isa.h"
#include "fp32_operand.h"
#include "speed_levers.h"
#include "torch_api.h"

namespace normlab {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using cpu::blas_sgemm;
constexpr auto gemm = cpu::blas_gemm;  // per-head blocks: tiny products

// Rows of a packed projection [B, T, S, H, dh] (contiguous): row t of block (b, h) in slot s
// starts at data + b·sb + t·st + s·H·dh + h·dh.
struct Packed {
  float* data;
  int64_t sb, st, slot_stride;
  float* rows(int64_t b, int64_t h, int64_t slot, int64_t dh) const {
    return data + b * sb + slot * slot_stride + h * dh;
  }
};

Packed packed(const at::Tensor& t) {
  return {t.data_ptr<float>(), t.stride(0), t.stride(1), t.stride(2)};
}

struct Shape {
  int64_t B, H, Tq, Tk, dh;
};

// The additive mask broadcast to [B, H, Tq, Tk] (stride 0 where it broadcasts), or none.
struct Mask {
  const float* data = nullptr;
  int64_t sb = 0, sh = 0, sq = 0, sk = 0;
};

Mask mask_of(const at::Tensor& expanded) {
  if (!expanded.defined()) return {};
  return {expanded.data_ptr<float>(), expanded.stride(0), expanded.stride(1), expanded.stride(2),
          expanded.stride(3)};
}

// scale·ds = scale·p ⊙ (dp − rowsum(p ⊙ dp)), in place of dp (the softmax backward, per row).
NORMLAB_ISA_KERNEL((), void, softmax_backward_rows,
                   (const float* __restrict__ p, float* __restrict__ dp, int64_t rows, int64_t cols,
                    float scale),
                   (p, dp, rows, cols, scale)) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* pi = p + i * cols;
    float* di = dp + i * cols;
    float dot = 0.0f;
    for (int64_t j = 0; j < cols; ++j) dot += pi[j] * di[j];
    for (int64_t j = 0; j < cols; ++j) di[j] = pi[j] * (di[j] - dot) * scale;
  }
}

struct Operands {
  Packed q, kv;  // q's rows in slot q_slot of q; k's and v's in slots k_slot and v_slot of kv
  int64_t q_slot, k_slot, v_slot;
};

// Dropout on the probabilities: element i of p [B, H, Tq, Tk] is kept (scaled 1/(1 − rate)) where
// the counter-based hash of (seed, i) says so (counter_dropout.h), so the backward pass recomputes
// the mask from the seed instead of storing it. rate 0: none.
struct ProbDropout {
  double rate = 0.0;
  uint64_t seed = 0;
  // out = mask(in) over block bh's Tq·Tk probabilities (in may be out).
  void apply(const float* in, float* out, int64_t bh, int64_t block) const {
    counter_dropout_span(in, out, bh * block, block, seed, rate);
  }
};

// Forward: the probabilities [B, H, Tq, Tk] (kept for the backward) and the context [B, Tq, H·dh].
std::pair<at::Tensor, at::Tensor> attention_forward(const Operands& x, const Shape& s,
                                                    const Mask& m, const ProbDropout& drop) {
  const float scale = float(1.0 / std::sqrt(double(s.dh)));
  at::Tensor scores = at::empty({s.B, s.H, s.Tq, s.Tk}, at::kFloat);
  float* sp = scores.data_ptr<float>();
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      float* sc = sp + bh * s.Tq * s.Tk;
      if (m.data) {  // s = mask, then s += scale·q·kᵀ
        const float* mb = m.data + b * m.sb + h * m.sh;
        for (int64_t i = 0; i < s.Tq; ++i)
          for (int64_t j = 0; j < s.Tk; ++j) sc[i * s.Tk + j] = mb[i * m.sq + j * m.sk];
      }
      gemm(false, true, s.Tq, s.Tk, s.dh, scale, x.q.rows(b, h, x.q_slot, s.dh), x.q.st,
           x.kv.rows(b, h, x.k_slot, s.dh), x.kv.st, m.data ? 1.0f : 0.0f, sc, s.Tk);
    }
  });
  at::Tensor probs = at::softmax(scores, -1);  // ATen's vectorised softmax, one call
  at::Tensor out = at::empty({s.B, s.Tq, s.H * s.dh}, at::kFloat);
  const float* pp = probs.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t block = s.Tq * s.Tk;
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> dropped(drop.rate > 0 ? static_cast<size_t>(block) : 0);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      const float* p = pp + bh * block;
      if (drop.rate > 0) {
        drop.apply(p, dropped.data(), bh, block);
        p = dropped.data();
      }
      gemm(false, false, s.Tq, s.dh, s.Tk, 1.0f, p, s.Tk, x.kv.rows(b, h, x.v_slot, s.dh), x.kv.st,
           0.0f, op + b * s.Tq * s.H * s.dh + h * s.dh, s.H * s.dh);
    }
  });
  return {probs, out};
}

// Backward into dq (shaped like q's source) and dkv (like kv's; the same tensor as dq for
// self-attention); every element of both is written.
//   dp = go·vᵀ, dv = pᵀ·go, ds = p ⊙ (dp − rowsum(p ⊙ dp)), dq = scale·ds·k, dk = scale·dsᵀ·q;
// with dropout p′ = mask(p) in the forward: dv = p′ᵀ·go and dp = mask(go·vᵀ), the same mask.
void attention_backward(const Operands& x, const Shape& s, const at::Tensor& probs,
                        const at::Tensor& grad_out, const Packed& dq, const Packed& dkv,
                        const ProbDropout& drop) {
  const float scale = float(1.0 / std::sqrt(double(s.dh)));
  const float* pp = probs.data_ptr<float>();
  const float* gp = grad_out.data_ptr<float>();
  const int64_t D = s.H * s.dh;
  const int64_t block = s.Tq * s.Tk;
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> ds(static_cast<size_t>(block));
    std::vector<float> dropped(drop.rate > 0 ? static_cast<size_t>(block) : 0);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      const float* p = pp + bh * block;
      const float* go = gp + b * s.Tq * D + h * s.dh;
      const float* q = x.q.rows(b, h, x.q_slot, s.dh);
      const float* k = x.kv.rows(b, h, x.k_slot, s.dh);
      const float* v = x.kv.rows(b, h, x.v_slot, s.dh);
      const float* p_used = p;  // what multiplied v in the forward
      if (drop.rate > 0) {
        drop.apply(p, dropped.data(), bh, block);
        p_used = dropped.data();
      }
      gemm(false, true, s.Tq, s.Tk, s.dh, 1.0f, go, D, v, x.kv.st, 0.0f, ds.data(), s.Tk);  // dp
      if (drop.rate > 0) drop.apply(ds.data(), ds.data(), bh, block);
      gemm(true, false, s.Tk, s.dh, s.Tq, 1.0f, p_used, s.Tk, go, D, 0.0f,
           dkv.rows(b, h, x.v_slot, s.dh), dkv.st);
      softmax_backward_rows(p, ds.data(), s.Tq, s.Tk, scale);
      gemm(false, false, s.Tq, s.dh, s.Tk, 1.0f, ds.data(), s.Tk, k, x.kv.st, 0.0f,
           dq.rows(b, h, x.q_slot, s.dh), dq.st);
      gemm(true, false, s.Tk, s.dh, s.Tq, 1.0f, ds.data(), s.Tk, q, x.q.st, 0.0f,
           dkv.rows(b, h, x.k_slot, s.dh), dkv.st);
    }
  });
}

at::Tensor expand_mask(const at::Tensor& mask, const Shape& s) {
  return mask.defined() ? mask.expand({s.B, s.H, s.Tq, s.Tk}) : at::Tensor();
}

// The mask is no autograd input (it may be undefined, which a custom function refuses).
struct MaskArg {
  at::Tensor mask;
};

// Draws the seed of one call's probability dropout (none at rate 0, so no generator draw).
ProbDropout prob_dropout(double rate) {
  ProbDropout d;
  if (rate > 0) {
    d.rate = rate;
    d.seed = draw_dropout_seed();
  }
  return d;
}

void save_dropout(AutogradContext* ctx, const ProbDropout& d) {
  ctx->saved_data["dropout"] = d.rate;
  ctx->saved_data["seed"] = int64_t(d.seed);
}

ProbDropout saved_dropout(AutogradContext* ctx) {
  return {ctx->saved_data["dropout"].toDouble(), uint64_t(ctx->saved_data["seed"].toInt())};
}

struct SelfAttentionFn : public torch::autograd::Function<SelfAttentionFn> {
  static Shape shape(const at::Tensor& qkv) {
    return {qkv.size(0), qkv.size(3), qkv.size(1), qkv.size(1), qkv.size(4)};
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, MaskArg m,
                            double dropout) {
    const Shape s = shape(qkv);
    const at::Tensor mask = expand_mask(m.mask, s);
    const ProbDropout drop = prob_dropout(dropout);
    auto [probs, out] =
        attention_forward({packed(qkv), packed(qkv), 0, 1, 2}, s, mask_of(mask), drop);
    save_dropout(ctx, drop);
    ctx->save_for_backward({qkv});
    ctx->saved_data["probs"] = probs;
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const at::Tensor qkv = ctx->get_saved_variables()[0];
    if (!grad[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    at::Tensor dqkv = at::empty_like(qkv);
    attention_backward({packed(qkv), packed(qkv), 0, 1, 2}, shape(qkv),
                       ctx->saved_data["probs"].toTensor(), grad[0].contiguous(), packed(dqkv),
                       packed(dqkv), saved_dropout(ctx));
    return {dqkv, at::Tensor(), at::Tensor()};
  }
};

struct CrossAttentionFn : public torch::autograd::Function<CrossAttentionFn> {
  static Shape shape(const at::Tensor& q, const at::Tensor& kv) {
    return {q.size(0), q.size(3), q.size(1), kv.size(1), q.size(4)};
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& kv,
                            MaskArg m, double dropout) {
    const Shape s = shape(q, kv);
    const at::Tensor mask = expand_mask(m.mask, s);
    const ProbDropout drop = prob_dropout(dropout);
    auto [probs, out] = attention_forward({packed(q), packed(kv), 0, 0, 1}, s, mask_of(mask), drop);
    save_dropout(ctx, drop);
    ctx->save_for_backward({q, kv});
    ctx->saved_data["probs"] = probs;
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &kv = saved[1];
    if (!grad[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    at::Tensor dq = at::empty_like(q), dkv = at::empty_like(kv);
    attention_backward({packed(q), packed(kv), 0, 0, 1}, shape(q, kv),
                       ctx->saved_data["probs"].toTensor(), grad[0].contiguous(), packed(dq),
                       packed(dkv), saved_dropout(ctx));
    return {dq, dkv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool fused_attention_applies(const torch::Tensor& projection, const torch::Tensor& mask,
                             double attention_dropout) {
  return speed_levers().fused_attention && blas_sgemm() != nullptr &&
         (cpu::fp32_operand(projection) ||
          (cpu::bf16_operand(projection) && projection.scalar_type() == at::kFloat)) &&
         attention_dropout < 1 &&
         (!mask.defined() ||
          (mask.device().is_cpu() && mask.scalar_type() == at::kFloat && mask.dim() <= 4));
}

torch::Tensor fused_self_attention(const torch::Tensor& qkv, const torch::Tensor& mask,
                                   double dropout) {
  return SelfAttentionFn::apply(qkv.contiguous(), MaskArg{mask}, dropout);
}

torch::Tensor fused_cross_attention(const torch::Tensor& q, const torch::Tensor& kv,
                                    const torch::Tensor& mask, double dropout) {
  return CrossAttentionFn::apply(q.contiguous(), kv.contiguous(), MaskArg{mask}, dropout);
}

}  // namespace normlab
