#include "fused_ffn.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include "counter_dropout.h"
#include "cpu_gemm.h"
#include "cpu_isa.h"
#include "cpu_rows.h"
#include "fp32_operand.h"
#include "normlab/model/attention.h"
#include "speed_levers.h"
#include "torch_api.h"

namespace normlab {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using cpu::column_sums;
using cpu::fill_rows;
using cpu::kRowGrain;

NORMLAB_ISA_KERNEL((), void, relu_span, (float* x, int64_t n), (x, n)) {
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] < 0.0f ? 0.0f : x[j];  // NaN stays NaN, as in ATen
}

// g = a <= 0 ? 0 : g (ReLU's backward through its output a, as ATen's threshold_backward).
NORMLAB_ISA_KERNEL((), void, relu_grad_span, (const float* a, float* g, int64_t n), (a, g, n)) {
  for (int64_t j = 0; j < n; ++j) g[j] = a[j] <= 0.0f ? 0.0f : g[j];  // NaN passes the gradient
}

// Dropout by counter-based mask over a whole [rows×n] buffer, in parallel (in may be out).
void dropout_rows(const float* in, float* out, int64_t rows, int64_t n, uint64_t seed, double p) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
    counter_dropout_span(in + b * n, out + b * n, b * n, (e - b) * n, seed, p);
  });
}

// C [m×n] = op(A)·op(B) + beta·C: fp32 operands by cpu::gemm, bf16 ones (run.dtype = "bf16") by
// oneDNN's bf16 GEMM with fp32 accumulation.
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const at::Tensor& a, int64_t lda,
             const at::Tensor& b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (a.scalar_type() == at::kBFloat16)
    cpu::gemm_bf16(ta, tb, m, n, k, 1.0f, a.data_ptr(), lda, b.data_ptr(), ldb, beta, c, ldc);
  else
    cpu::gemm(ta, tb, m, n, k, 1.0f, a.data_ptr<float>(), lda, b.data_ptr<float>(), ldb, beta, c,
              ldc);
}

// t as a GEMM operand: rounded to bf16 in bf16 mode (as autocast rounds), else itself.
at::Tensor operand(const at::Tensor& t, bool bf16) {
  return (bf16 ? t.to(at::kBFloat16) : t).contiguous();
}

struct FfnArgs {
  bool bf16;  // the products in bf16 (CPU bf16 autocast), the rest in fp32
  double p_act, p_out;
  torch::Tensor* act;  // where to put ReLU(W1·x + b1) for an observer, or null
};

struct FusedFfnFn : public torch::autograd::Function<FusedFfnFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w1,
                            const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2,
                            FfnArgs args) {
    const at::Tensor x = operand(x_in, args.bf16), w1b = operand(w1, args.bf16),
                     w2b = operand(w2, args.bf16);
    const int64_t D = x.size(-1), F = w1.size(0), N = x.numel() / D;
    // act = ReLU(b1 + x·W1ᵀ)
    at::Tensor act = at::empty({N, F}, w1.options());
    float* a = act.data_ptr<float>();
    fill_rows(a, b1.data_ptr<float>(), N, F);
    product(false, true, N, F, D, x, D, w1b, D, 1.0f, a, F);
    at::parallel_for(0, N, kRowGrain,
                     [&](int64_t b, int64_t e) { relu_span(a + b * F, (e - b) * F); });
    // Seeds in the unfused path's order: activation dropout, then the branch's.
    const uint64_t seed_act = args.p_act > 0 ? draw_dropout_seed() : 0;
    at::Tensor dropped = act;
    if (args.p_act > 0) {
      dropped = at::empty_like(act);
      dropout_rows(a, dropped.data_ptr<float>(), N, F, seed_act, args.p_act);
    }
    at::Tensor out = at::empty(x.sizes(), w1.options());
    float* y = out.data_ptr<float>();
    fill_rows(y, b2.data_ptr<float>(), N, D);
    product(false, true, N, D, F, operand(dropped, args.bf16), F, w2b, F, 1.0f, y, D);
    const uint64_t seed_out = args.p_out > 0 ? draw_dropout_seed() : 0;
    if (args.p_out > 0) dropout_rows(y, y, N, D, seed_out, args.p_out);

    ctx->save_for_backward({x, args.bf16 ? w1b : w1, args.bf16 ? w2b : w2});
    ctx->saved_data["x_dtype"] = int64_t(x_in.scalar_type());
    ctx->saved_data["act"] = act;
    ctx->saved_data["seed_act"] = int64_t(seed_act);
    ctx->saved_data["seed_out"] = int64_t(seed_out);
    ctx->saved_data["p_act"] = args.p_act;
    ctx->saved_data["p_out"] = args.p_out;
    if (args.act) {  // shaped like the unfused path's [..., F]
      std::vector<int64_t> sizes = x.sizes().vec();
      sizes.back() = F;
      *args.act = act.view(sizes);
    }
    return out;
  }

  // dy = Drop(g); db2 = Σ dy; dW2 = dyᵀ·a'; da = ReLU'·Drop_act(dy·W2); db1 = Σ da; dW1 = daᵀ·x;
  // dx = da·W1 (a' = Drop_act(act), recomputed from its seed).
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    if (!grad[0].defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w1 = saved[1], &w2 = saved[2];
    const at::Tensor act = ctx->saved_data["act"].toTensor();
    const double p_act = ctx->saved_data["p_act"].toDouble(),
                 p_out = ctx->saved_data["p_out"].toDouble();
    const auto seed_act = uint64_t(ctx->saved_data["seed_act"].toInt());
    const auto seed_out = uint64_t(ctx->saved_data["seed_out"].toInt());
    const int64_t D = x.size(-1), F = w1.size(0), N = x.numel() / D;

    at::Tensor dy = grad[0].contiguous();
    if (p_out > 0) {
      at::Tensor masked = at::empty({N, D}, dy.options());
      dropout_rows(dy.data_ptr<float>(), masked.data_ptr<float>(), N, D, seed_out, p_out);
      dy = masked;
    }
    const bool bf16 =
        w1.scalar_type() == at::kBFloat16;  // w1, w2 and x saved as the products' operands
    const at::TensorOptions f32 = act.options();
    const float* g = dy.data_ptr<float>();
    const at::Tensor gb = operand(dy, bf16);
    at::Tensor db2 = at::empty({D}, f32);
    column_sums(g, N, D, db2.data_ptr<float>());
    at::Tensor dropped = act;
    if (p_act > 0) {
      dropped = at::empty_like(act);
      dropout_rows(act.data_ptr<float>(), dropped.data_ptr<float>(), N, F, seed_act, p_act);
    }
    at::Tensor dw2 = at::empty({D, F}, f32);
    product(true, false, D, F, N, gb, D, operand(dropped, bf16), F, 0.0f, dw2.data_ptr<float>(), F);
    at::Tensor da = p_act > 0 ? dropped : at::empty_like(act);  // a' is no longer needed: reuse it
    float* d = da.data_ptr<float>();
    product(false, false, N, F, D, gb, D, w2, F, 0.0f, d, F);
    const float* a = act.data_ptr<float>();
    at::parallel_for(0, N, kRowGrain, [&](int64_t b, int64_t e) {
      if (p_act > 0)
        counter_dropout_span(d + b * F, d + b * F, b * F, (e - b) * F, seed_act, p_act);
      relu_grad_span(a + b * F, d + b * F, (e - b) * F);
    });
    at::Tensor db1 = at::empty({F}, f32);
    column_sums(d, N, F, db1.data_ptr<float>());
    const at::Tensor dab = operand(da, bf16);
    at::Tensor dw1 = at::empty({F, D}, f32);
    product(true, false, F, D, N, dab, F, x, D, 0.0f, dw1.data_ptr<float>(), D);
    at::Tensor dx = at::empty(x.sizes(), f32);
    product(false, false, N, D, F, dab, F, w1, D, 0.0f, dx.data_ptr<float>(), D);
    if (bf16) dx = dx.to(at::ScalarType(ctx->saved_data["x_dtype"].toInt()));
    return {dx, dw1, db1, dw2, db2, at::Tensor()};
  }
};

}  // namespace

bool fused_ffn_applies(const torch::Tensor& x, const FeedForwardImpl& ffn, double dropout,
                       bool training) {
  const bool any_dropout = training && (dropout > 0 || ffn.activation_dropout() > 0);
  return speed_levers().fused_ffn && cpu::blas_sgemm() != nullptr && !ffn.inner_norm && !ffn.gate &&
         ffn.fc1->bias.defined() && (cpu::fp32_operand(x) || cpu::bf16_operand(x)) &&
         cpu::fp32_param(ffn.fc1->weight) && cpu::fp32_param(ffn.fc2->weight) &&
         ffn.fc1->weight.is_contiguous() && ffn.fc2->weight.is_contiguous() && dropout < 1 &&
         ffn.activation_dropout() < 1 && (!any_dropout || speed_levers().counter_dropout);
}

torch::Tensor fused_ffn_branch(const torch::Tensor& x, const FeedForwardImpl& ffn, double dropout,
                               bool training, torch::Tensor* act) {
  const FfnArgs args{cpu::bf16_operand(x), training ? ffn.activation_dropout() : 0.0,
                     training ? dropout : 0.0, act};
  // The kernel trusts these shapes (leading dimensions come from x): never let a mismatch through.
  const int64_t D = x.size(-1), F = ffn.fc1->weight.size(0);
  TORCH_CHECK(ffn.fc1->weight.dim() == 2 && ffn.fc1->weight.size(1) == D &&
                  ffn.fc1->bias.numel() == F && ffn.fc2->weight.dim() == 2 &&
                  ffn.fc2->weight.size(0) == D && ffn.fc2->weight.size(1) == F &&
                  ffn.fc2->bias.numel() == D,
              "fused FFN: fc1 ", ffn.fc1->weight.sizes(), " / fc2 ", ffn.fc2->weight.sizes(),
              " do not fit an input of width ", D);
  return FusedFfnFn::apply(x, ffn.fc1->weight, ffn.fc1->bias, ffn.fc2->weight, ffn.fc2->bias, args);
}

}  // namespace normlab
