#include "fused_ffn.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include "counter_dropout.h"
#include "cpu_gemm.h"
#include "cpu_rows.h"
#include "fp32_operand.h"
#include "normlab/model/attention.h"
#include "speed_levers.h"

namespace normlab {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using cpu::column_sums;
using cpu::fill_rows;
using cpu::kRowGrain;

__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_span(float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] > 0.0f ? x[j] : 0.0f;
}

// g = a > 0 ? g : 0 (ReLU's backward through its output a, as ATen's threshold_backward).
__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_grad_span(const float* a,
                                                                                 float* g,
                                                                                 int64_t n) {
  for (int64_t j = 0; j < n; ++j) g[j] = a[j] > 0.0f ? g[j] : 0.0f;
}

// Dropout by counter-based mask over a whole [rows×n] buffer, in parallel (in may be out).
void dropout_rows(const float* in, float* out, int64_t rows, int64_t n, uint64_t seed, double p) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t b, int64_t e) {
    counter_dropout_span(in + b * n, out + b * n, b * n, (e - b) * n, seed, p);
  });
}

struct FfnArgs {
  double p_act, p_out;
  torch::Tensor* act;  // where to put ReLU(W1·x + b1) for an observer, or null
};

struct FusedFfnFn : public torch::autograd::Function<FusedFfnFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w1,
                            const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2,
                            FfnArgs args) {
    const at::Tensor x = x_in.contiguous();
    const int64_t D = x.size(-1), F = w1.size(0), N = x.numel() / D;
    // act = ReLU(b1 + x·W1ᵀ)
    at::Tensor act = at::empty({N, F}, x.options());
    float* a = act.data_ptr<float>();
    fill_rows(a, b1.data_ptr<float>(), N, F);
    cpu::gemm(false, true, N, F, D, 1.0f, x.data_ptr<float>(), D, w1.data_ptr<float>(), D, 1.0f, a,
              F);
    at::parallel_for(0, N, kRowGrain,
                     [&](int64_t b, int64_t e) { relu_span(a + b * F, (e - b) * F); });
    // Seeds in the unfused path's order: activation dropout, then the branch's.
    const uint64_t seed_act = args.p_act > 0 ? draw_dropout_seed() : 0;
    at::Tensor dropped = act;
    if (args.p_act > 0) {
      dropped = at::empty_like(act);
      dropout_rows(a, dropped.data_ptr<float>(), N, F, seed_act, args.p_act);
    }
    at::Tensor out = at::empty(x.sizes(), x.options());
    float* y = out.data_ptr<float>();
    fill_rows(y, b2.data_ptr<float>(), N, D);
    cpu::gemm(false, true, N, D, F, 1.0f, dropped.data_ptr<float>(), F, w2.data_ptr<float>(), F,
              1.0f, y, D);
    const uint64_t seed_out = args.p_out > 0 ? draw_dropout_seed() : 0;
    if (args.p_out > 0) dropout_rows(y, y, N, D, seed_out, args.p_out);

    ctx->save_for_backward({x, w1, w2});
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
    const float* g = dy.data_ptr<float>();
    at::Tensor db2 = at::empty({D}, x.options());
    column_sums(g, N, D, db2.data_ptr<float>());
    at::Tensor dropped = act;
    if (p_act > 0) {
      dropped = at::empty_like(act);
      dropout_rows(act.data_ptr<float>(), dropped.data_ptr<float>(), N, F, seed_act, p_act);
    }
    at::Tensor dw2 = at::empty_like(w2);
    cpu::gemm(true, false, D, F, N, 1.0f, g, D, dropped.data_ptr<float>(), F, 0.0f,
              dw2.data_ptr<float>(), F);
    at::Tensor da = p_act > 0 ? dropped : at::empty_like(act);  // a' is no longer needed: reuse it
    float* d = da.data_ptr<float>();
    cpu::gemm(false, false, N, F, D, 1.0f, g, D, w2.data_ptr<float>(), F, 0.0f, d, F);
    const float* a = act.data_ptr<float>();
    at::parallel_for(0, N, kRowGrain, [&](int64_t b, int64_t e) {
      if (p_act > 0)
        counter_dropout_span(d + b * F, d + b * F, b * F, (e - b) * F, seed_act, p_act);
      relu_grad_span(a + b * F, d + b * F, (e - b) * F);
    });
    at::Tensor db1 = at::empty({F}, x.options());
    column_sums(d, N, F, db1.data_ptr<float>());
    at::Tensor dw1 = at::empty_like(w1);
    cpu::gemm(true, false, F, D, N, 1.0f, d, F, x.data_ptr<float>(), D, 0.0f, dw1.data_ptr<float>(),
              D);
    at::Tensor dx = at::empty(x.sizes(), x.options());
    cpu::gemm(false, false, N, D, F, 1.0f, d, F, w1.data_ptr<float>(), D, 0.0f,
              dx.data_ptr<float>(), D);
    return {dx, dw1, db1, dw2, db2, at::Tensor()};
  }
};

}  // namespace

bool fused_ffn_applies(const torch::Tensor& x, const FeedForwardImpl& ffn, double dropout,
                       bool training) {
  const bool any_dropout = training && (dropout > 0 || ffn.activation_dropout() > 0);
  return speed_levers().fused_ffn && cpu::blas_sgemm() != nullptr && !ffn.inner_norm && !ffn.gate &&
         ffn.fc1->bias.defined() && cpu::fp32_operand(x) && cpu::fp32_operand(ffn.fc1->weight) &&
         cpu::fp32_operand(ffn.fc2->weight) && ffn.fc1->weight.is_contiguous() &&
         ffn.fc2->weight.is_contiguous() && dropout < 1 && ffn.activation_dropout() < 1 &&
         (!any_dropout || speed_levers().counter_dropout);
}

torch::Tensor fused_ffn_branch(const torch::Tensor& x, const FeedForwardImpl& ffn, double dropout,
                               bool training, torch::Tensor* act) {
  const FfnArgs args{training ? ffn.activation_dropout() : 0.0, training ? dropout : 0.0, act};
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
