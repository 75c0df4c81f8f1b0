#include "fused_residual_norm.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <vector>

#include "cpu_isa.h"
#include "cpu_rows.h"
#include "fp32_operand.h"
#include "normlab/model/norm.h"
#include "speed_levers.h"
#include "torch_api.h"

namespace normlab {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RowNorm {
  bool rms;  // RMSNorm: no centring, no bias
  float alpha, eps;
  const float *w, *bias;  // ones and zeros where the norm has none
};

// One row forward: h = α·x + b; x̂ = (h − mean)·rstd (kept for the backward); out = x̂·w + bias.
// RMSNorm: mean 0, so rstd = 1/√(mean(h²) + ε), as NormImpl's (ε inside the root).
// No fused multiply-add: h must round as the unfused path's x * α + b does (what observers see).
NORMLAB_ISA_KERNEL((optimize("fp-contract=off")), float, residual_norm_row,
                   (const float* __restrict__ x, const float* __restrict__ b, const RowNorm& n,
                    int64_t D, float* __restrict__ xhat, float* __restrict__ out),
                   (x, b, n, D, xhat, out)) {
  const float* __restrict__ w = n.w;
  const float* __restrict__ bias = n.bias;
  const float alpha = n.alpha;
  float s = 0;
  if (b) {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < D; ++j) {
      xhat[j] = alpha * x[j] + b[j];
      s += xhat[j];
    }
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < D; ++j) {
      xhat[j] = alpha * x[j];
      s += xhat[j];
    }
  }
  const float mean = n.rms ? 0.0f : s / float(D);
  float v = 0;
#pragma omp simd reduction(+ : v)
  for (int64_t j = 0; j < D; ++j) v += (xhat[j] - mean) * (xhat[j] - mean);
  const float rstd = 1.0f / std::sqrt(v / float(D) + n.eps);
#pragma omp simd
  for (int64_t j = 0; j < D; ++j) {
    xhat[j] = (xhat[j] - mean) * rstd;
    out[j] = xhat[j] * w[j] + bias[j];
  }
  return rstd;
}

// One row backward: gx̂ = g·w; dh = rstd·(gx̂ − mean(gx̂) − x̂·mean(gx̂·x̂)); dw += g·x̂, dbias += g.
// RMSNorm: without the mean(gx̂) term.
NORMLAB_ISA_KERNEL((), void, residual_norm_row_grad,
                   (bool rms, const float* __restrict__ g, const float* __restrict__ xhat,
                    float rstd, const float* __restrict__ w, int64_t D, float* __restrict__ dh,
                    float* __restrict__ dw, float* __restrict__ dbias),
                   (rms, g, xhat, rstd, w, D, dh, dw, dbias)) {
  float m1 = 0, m2 = 0;
#pragma omp simd reduction(+ : m1, m2)
  for (int64_t j = 0; j < D; ++j) {
    m1 += g[j] * w[j];
    m2 += g[j] * w[j] * xhat[j];
  }
  m1 = rms ? 0.0f : m1 / float(D);
  m2 /= float(D);
#pragma omp simd
  for (int64_t j = 0; j < D; ++j) {
    dh[j] = rstd * (g[j] * w[j] - m1 - xhat[j] * m2);
    dw[j] += g[j] * xhat[j];
    dbias[j] += g[j];
  }
}

// Which of b, the gain and the bias are real (autograd takes no undefined input, so x stands in),
// and whether the norm is RMSNorm.
struct Present {
  bool b, weight, bias, rms;
};

struct ResidualNormFn : public torch::autograd::Function<ResidualNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& b_in,
                            const at::Tensor& weight, const at::Tensor& bias, double alpha,
                            double eps, Present has) {
    const at::Tensor x = x_in.contiguous(), b = has.b ? b_in.contiguous() : at::Tensor();
    const int64_t D = x.size(-1), N = x.numel() / D;
    at::Tensor xhat = at::empty({N, D}, x.options()), rstd = at::empty({N}, x.options());
    at::Tensor out = at::empty(x.sizes(), x.options());
    const std::vector<float> ones(size_t(D), 1.0f), zeros(size_t(D), 0.0f);
    const RowNorm n{has.rms, float(alpha), float(eps),
                    has.weight ? weight.data_ptr<float>() : ones.data(),
                    has.bias ? bias.data_ptr<float>() : zeros.data()};
    const float *px = x.data_ptr<float>(), *pb = has.b ? b.data_ptr<float>() : nullptr;
    float *ph = xhat.data_ptr<float>(), *po = out.data_ptr<float>(), *pr = rstd.data_ptr<float>();
    at::parallel_for(0, N, cpu::kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        pr[i] =
            residual_norm_row(px + i * D, pb ? pb + i * D : nullptr, n, D, ph + i * D, po + i * D);
    });
    ctx->save_for_backward({weight});
    ctx->saved_data["xhat"] = xhat;
    ctx->saved_data["rstd"] = rstd;
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["has_weight"] = has.weight;
    ctx->saved_data["has_bias"] = has.bias;
    ctx->saved_data["has_b"] = has.b;
    ctx->saved_data["rms"] = has.rms;
    return out;
  }

  // Gradients of x (α·dh), b (dh), weight and bias. The parameters' sums go by fixed blocks of
  // rows, added in block order: the same bits for any thread count.
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    if (!grad[0].defined()) return variable_list(7);
    const at::Tensor weight = ctx->get_saved_variables()[0];
    const at::Tensor xhat = ctx->saved_data["xhat"].toTensor();
    const at::Tensor rstd = ctx->saved_data["rstd"].toTensor();
    const double alpha = ctx->saved_data["alpha"].toDouble();
    const bool rms = ctx->saved_data["rms"].toBool();
    const at::Tensor g = grad[0].contiguous();
    const int64_t D = xhat.size(1), N = xhat.size(0);
    const int64_t blocks = (N + cpu::kRowGrain - 1) / cpu::kRowGrain;
    at::Tensor dh = at::empty(g.sizes(), g.options());
    std::vector<float> partial(size_t(2 * blocks * D), 0.0f);  // per block: dw, then dbias
    const float *pg = g.data_ptr<float>(), *ph = xhat.data_ptr<float>(),
                *pr = rstd.data_ptr<float>();
    const std::vector<float> ones(size_t(D), 1.0f);
    const float* w =
        ctx->saved_data["has_weight"].toBool() ? weight.data_ptr<float>() : ones.data();
    float* pd = dh.data_ptr<float>();
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        float* dw = partial.data() + 2 * k * D;
        for (int64_t i = k * cpu::kRowGrain; i < std::min(N, (k + 1) * cpu::kRowGrain); ++i)
          residual_norm_row_grad(rms, pg + i * D, ph + i * D, pr[i], w, D, pd + i * D, dw, dw + D);
      }
    });
    std::vector<double> sums(size_t(2 * D), 0.0);
    for (int64_t k = 0; k < blocks; ++k)
      for (int64_t j = 0; j < 2 * D; ++j) sums[size_t(j)] += partial[size_t(2 * k * D + j)];
    at::Tensor dweight, dbias;
    if (ctx->saved_data["has_weight"].toBool()) {
      dweight = at::empty({D}, g.options());
      for (int64_t j = 0; j < D; ++j) dweight.data_ptr<float>()[j] = float(sums[size_t(j)]);
    }
    if (ctx->saved_data["has_bias"].toBool()) {
      dbias = at::empty({D}, g.options());
      for (int64_t j = 0; j < D; ++j) dbias.data_ptr<float>()[j] = float(sums[size_t(D + j)]);
    }
    const at::Tensor dx = alpha == 1.0 ? dh : dh * alpha;
    return {dx,           ctx->saved_data["has_b"].toBool() ? dh : at::Tensor(),
            dweight,      dbias,
            at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

bool fused_residual_norm_applies(const torch::Tensor& x, const torch::Tensor& b,
                                 const NormImpl& norm) {
  const NormSpec& s = norm.spec();
  const int64_t D = x.dim() > 0 ? x.size(-1) : 0;
  const auto per_channel = [D](const torch::Tensor& t) {
    return !t.defined() || (cpu::fp32_operand(t) && t.dim() == 1 && t.size(0) == D);
  };
  return speed_levers().fused_residual_norm &&
         (s.kind == NormKind::LayerNorm || s.kind == NormKind::RMSNorm) && !s.gain_per_head &&
         !s.gain_from_query && s.out_scale == 1.0 && norm.gain_factor() == 1.0 && D > 0 &&
         cpu::fp32_operand(x) &&
         (!b.defined() || (cpu::fp32_operand(b) && x.sizes() == b.sizes())) &&
         per_channel(norm.weight) && per_channel(norm.bias);
}

torch::Tensor fused_residual_norm(const torch::Tensor& x, const torch::Tensor& b, double alpha,
                                  const NormImpl& norm) {
  TORCH_CHECK(fused_residual_norm_applies(x, b, norm), "fused residual norm: inputs ", x.sizes(),
              " and ", b.defined() ? b.sizes() : x.sizes(), " do not fit its kernel");
  const Present has{b.defined(), norm.weight.defined(), norm.bias.defined(),
                    norm.spec().kind == NormKind::RMSNorm};
  return ResidualNormFn::apply(x, has.b ? b : x, has.weight ? norm.weight : x,
                               has.bias ? norm.bias : x, alpha, norm.spec().eps, has);
}

}  // namespace normlab
