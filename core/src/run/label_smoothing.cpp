#include "run/label_smoothing.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "model/cpu_gemm.h"
#include "model/cpu_isa.h"
#include "model/fp32_operand.h"
#include "speed_levers.h"
#include "torch_api.h"

namespace normlab {
namespace {

LossSums composed_loss(const torch::Tensor& logits, const torch::Tensor& target, double epsilon,
                       int64_t pad_id, double z_loss) {
  const int64_t V = logits.size(-1);
  const torch::Tensor flat = logits.reshape({-1, V}).to(torch::kFloat);
  auto lprobs = torch::log_softmax(flat, -1);
  auto tgt = target.reshape({-1, 1});
  auto keep = tgt.ne(pad_id).to(torch::kFloat).squeeze(1);
  auto nll = -lprobs.gather(-1, tgt).squeeze(1) * keep;
  LossSums s;
  s.nll = nll.sum();
  if (epsilon > 0) {
    auto smooth = -lprobs.sum(-1) * keep;
    const double eps_i = epsilon / double(V - 1);
    s.loss = (1.0 - epsilon - eps_i) * s.nll + eps_i * smooth.sum();
  } else {
    s.loss = s.nll;
  }
  if (z_loss > 0) {
    const torch::Tensor z = (torch::logsumexp(flat, -1).pow(2) * keep).sum();
    s.loss = s.loss + z_loss * z;
    s.z = z.detach();
  } else {
    s.z = torch::zeros({}, s.nll.options());
  }
  return s;
}

// take ? a : b, by bit masks: GCC 12 leaves a float select scalar and branchy in the AVX2 and
// default clones ("control flow in loop"; only the AVX-512 clone vectorized). Same result, NaN too.
inline float pick(bool take, float a, float b) {
  const uint32_t mask = 0u - uint32_t(take);
  return __builtin_bit_cast(
      float, (__builtin_bit_cast(uint32_t, a) & mask) | (__builtin_bit_cast(uint32_t, b) & ~mask));
}

// exp(x) for x ≤ 0 (≥ -87.3 after clamping): 2^n · p(r), r = x − n·ln2, |r| ≤ ln2/2, degree-6
// Taylor polynomial (relative error ~1e-7). Written so the loops below vectorize.
inline float exp_nonpositive(float x) {
  x = pick(x < -87.3f, -87.3f, x);
  // Round to nearest by the 1.5·2^23 trick: plain adds, so the loop vectorizes without libm.
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * __builtin_bit_cast(float, (int32_t(n) + 127) << 23);
}

struct RowStats {
  float max, sum, sumexp;
};

// Float reductions vectorize only with explicit lanes (no -ffast-math): 16 partial sums, added
// in a fixed order, so the result does not depend on the instruction set.
constexpr int kLanes = 16;

NORMLAB_ISA_KERNEL((), RowStats, row_stats, (const float* x, int64_t V), (x, V)) {
  float m[kLanes], s[kLanes] = {}, e[kLanes] = {};
  for (int k = 0; k < kLanes; ++k) m[k] = x[0];
  const int64_t body = V / kLanes * kLanes;
  for (int64_t j = 0; j < body; j += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      m[k] = pick(x[j + k] > m[k], x[j + k], m[k]);
      s[k] += x[j + k];
    }
  float max = x[0], sum = 0;
  for (int k = 0; k < kLanes; ++k) max = m[k] > max ? m[k] : max;
  for (int64_t j = body; j < V; ++j) max = x[j] > max ? x[j] : max;
  for (int64_t j = 0; j < body; j += kLanes)
    for (int k = 0; k < kLanes; ++k) e[k] += exp_nonpositive(x[j + k] - max);
  float sumexp = 0;
  for (int k = 0; k < kLanes; ++k) {
    sum += s[k];
    sumexp += e[k];
  }
  for (int64_t j = body; j < V; ++j) {
    sum += x[j];
    sumexp += exp_nonpositive(x[j] - max);
  }
  return {max, sum, sumexp};
}

// grad_j = c·exp(x_j − lse) − b
NORMLAB_ISA_KERNEL((), void, row_grad,
                   (const float* x, float* g, int64_t V, float lse, float c, float b),
                   (x, g, V, lse, c, b)) {
  for (int64_t j = 0; j < V; ++j) g[j] = c * exp_nonpositive(x[j] - lse) - b;
}

struct FusedLabelSmoothedLoss : public torch::autograd::Function<FusedLabelSmoothedLoss> {
  // Returns {loss, nll}; logits [N,V] contiguous float, target [N] long.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& logits, const at::Tensor& target,
                                                double epsilon, int64_t pad_id, double z_loss) {
    const int64_t N = logits.size(0), V = logits.size(1);
    const double eps_i = epsilon > 0 ? epsilon / double(V - 1) : 0.0, a = 1.0 - epsilon - eps_i;
    at::Tensor lse = at::empty({N}, logits.options());
    // nll_i, smooth_i, log²Z_i
    at::Tensor per_row = at::zeros({N, 3}, logits.options().dtype(at::kDouble));
    const float* x = logits.data_ptr<float>();
    const int64_t* t = target.data_ptr<int64_t>();
    float* l = lse.data_ptr<float>();
    double* r = per_row.data_ptr<double>();
    at::parallel_for(0, N, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const RowStats st = row_stats(x + i * V, V);
        l[i] = st.max + std::log(st.sumexp);
        if (t[i] == pad_id) continue;
        r[3 * i] = double(l[i]) - double(x[i * V + t[i]]);
        r[3 * i + 1] = double(V) * double(l[i]) - double(st.sum);
        r[3 * i + 2] = double(l[i]) * double(l[i]);
      }
    });
    // Summed in row order, whatever the thread count.
    at::Tensor sums = per_row.sum(0);
    const double nll = sums[0].item<double>(), smooth = sums[1].item<double>(),
                 z = sums[2].item<double>();
    at::Tensor loss = at::scalar_tensor(a * nll + eps_i * smooth + (z_loss > 0 ? z_loss * z : 0.0),
                                        logits.options());
    at::Tensor nll_t = at::scalar_tensor(nll, logits.options());
    at::Tensor z_t = at::scalar_tensor(z_loss > 0 ? z : 0.0, logits.options());
    ctx->save_for_backward({logits, target, lse});
    ctx->saved_data["a"] = a;
    ctx->saved_data["b"] = eps_i;
    ctx->saved_data["z_loss"] = z_loss;
    ctx->saved_data["pad"] = pad_id;
    ctx->mark_non_differentiable({nll_t, z_t});
    return {loss, nll_t, z_t};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &target = saved[1], &lse = saved[2];
    const int64_t N = logits.size(0), V = logits.size(1), pad_id = ctx->saved_data["pad"].toInt();
    const double a = ctx->saved_data["a"].toDouble(), b = ctx->saved_data["b"].toDouble(),
                 zc = ctx->saved_data["z_loss"].toDouble();
    const float g = grad[0].defined() ? grad[0].item<float>() : 0.0f;
    at::Tensor out = at::empty_like(logits);
    const float* x = logits.data_ptr<float>();
    const int64_t* t = target.data_ptr<int64_t>();
    const float* l = lse.data_ptr<float>();
    float* o = out.data_ptr<float>();
    // d/dx_j [a·(lse − x_t) + b·(V·lse − Σx) + c·lse²]
    //   = (a + bV + 2c·lse)·softmax_j − b − a·[j = t]
    at::parallel_for(0, N, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        if (t[i] == pad_id) {
          std::fill(o + i * V, o + (i + 1) * V, 0.0f);
          continue;
        }
        const double coef = a + b * double(V) + (zc > 0 ? 2 * zc * double(l[i]) : 0.0);
        row_grad(x + i * V, o + i * V, V, l[i], float(g * coef), float(g * b));
        o[i * V + t[i]] -= float(g * a);
      }
    });
    return {out, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Rows of logits computed, reduced and turned into gradients while they are in cache.
constexpr int64_t kProjectedRows = 32;

// The loss of logits = hidden·Wᵀ without the [N, V] logits: per block of non-pad rows one sgemm
// gives the block's logits, the row statistics give the loss, and (when a backward will come) the
// rows become ∂loss/∂logits in place and a second sgemm gives the hidden rows' gradient. The
// backward only scales those by the upstream gradient and computes ∂W = g·∂logitsᵀ·hidden in one
// multi-threaded sgemm. Pad rows get no logits at all (they carry no loss).
struct ProjectedLoss : public torch::autograd::Function<ProjectedLoss> {
  // hidden [N, D] and weight [V, D] contiguous float, target [N] long. Returns {loss, nll}.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& target, double epsilon,
                                                int64_t pad_id, bool want_grad, double z_loss) {
    const int64_t N = hidden.size(0), D = hidden.size(1), V = weight.size(0);
    const double eps_i = epsilon > 0 ? epsilon / double(V - 1) : 0.0, a = 1.0 - epsilon - eps_i;
    const int64_t* t = target.data_ptr<int64_t>();
    std::vector<int64_t> rows;  // the non-pad rows, in order
    for (int64_t i = 0; i < N; ++i)
      if (t[i] != pad_id) rows.push_back(i);
    const int64_t M = int64_t(rows.size());
    at::Tensor h = at::empty({M, D}, hidden.options());  // the non-pad rows of hidden, compacted
    const float* hs = hidden.data_ptr<float>();
    float* hp = h.data_ptr<float>();
    for (int64_t r = 0; r < M; ++r)
      std::copy(hs + rows[size_t(r)] * D, hs + (rows[size_t(r)] + 1) * D, hp + r * D);
    at::Tensor dlogits = want_grad ? at::empty({M, V}, hidden.options()) : at::Tensor();
    at::Tensor dh = want_grad ? at::empty({M, D}, hidden.options()) : at::Tensor();
    at::Tensor per_row =  // nll_i, smooth_i, log²Z_i
        at::zeros({std::max<int64_t>(M, 1), 3}, hidden.options().dtype(at::kDouble));
    double* pr = per_row.data_ptr<double>();
    const float* w = weight.data_ptr<float>();
    const float c = float(a + eps_i * double(V)), b = float(eps_i), at_target = float(a);
    const int64_t blocks = (M + kProjectedRows - 1) / kProjectedRows;
    at::parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> scratch(want_grad ? 0 : size_t(kProjectedRows * V));
      for (int64_t blk = lo; blk < hi; ++blk) {
        const int64_t r0 = blk * kProjectedRows, n = std::min(kProjectedRows, M - r0);
        float* lg = want_grad ? dlogits.data_ptr<float>() + r0 * V : scratch.data();
        cpu::gemm(false, true, n, V, D, 1.0f, hp + r0 * D, D, w, D, 0.0f, lg, V);
        for (int64_t i = 0; i < n; ++i) {
          float* x = lg + i * V;
          const int64_t tgt = t[rows[size_t(r0 + i)]];
          const RowStats st = row_stats(x, V);
          const float lse = st.max + std::log(st.sumexp);
          pr[3 * (r0 + i)] = double(lse) - double(x[tgt]);
          pr[3 * (r0 + i) + 1] = double(V) * double(lse) - double(st.sum);
          pr[3 * (r0 + i) + 2] = double(lse) * double(lse);
          if (!want_grad) continue;
          // d/dx_j [a·(lse − x_t) + b·(V·lse − Σx) + z·lse²]
          //   = (a + bV + 2z·lse)·softmax_j − b − a·[j = t]
          row_grad(x, x, V, lse, z_loss > 0 ? float(double(c) + 2 * z_loss * double(lse)) : c, b);
          x[tgt] -= at_target;
        }
        if (want_grad)
          cpu::gemm(false, false, n, D, V, 1.0f, lg, V, w, D, 0.0f, dh.data_ptr<float>() + r0 * D,
                    D);
      }
    });
    at::Tensor sums = per_row.sum(0);  // in row order, whatever the thread count
    const double nll = sums[0].item<double>(), smooth = sums[1].item<double>(),
                 z = sums[2].item<double>();
    at::Tensor loss = at::scalar_tensor(a * nll + eps_i * smooth + (z_loss > 0 ? z_loss * z : 0.0),
                                        hidden.options());
    at::Tensor nll_t = at::scalar_tensor(nll, hidden.options());
    at::Tensor z_t = at::scalar_tensor(z_loss > 0 ? z : 0.0, hidden.options());
    ctx->mark_non_differentiable({nll_t, z_t});
    if (want_grad) {
      ctx->save_for_backward({h, weight});
      ctx->saved_data["dlogits"] = dlogits;
      ctx->saved_data["dh"] = dh;
      ctx->saved_data["rows"] = rows;
      ctx->saved_data["n"] = N;
    }
    return {loss, nll_t, z_t};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    TORCH_CHECK(ctx->saved_data.count("dlogits"),
                "the fused projected loss was computed without gradients");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &weight = saved[1];
    const at::Tensor dlogits = ctx->saved_data["dlogits"].toTensor(),
                     dh = ctx->saved_data["dh"].toTensor();
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const int64_t N = ctx->saved_data["n"].toInt(), M = h.size(0), D = h.size(1),
                  V = weight.size(0);
    const float g = grad[0].defined() ? grad[0].item<float>() : 0.0f;
    at::Tensor dweight = at::empty_like(weight);
    if (M > 0)
      cpu::gemm(true, false, V, D, M, g, dlogits.data_ptr<float>(), V, h.data_ptr<float>(), D, 0.0f,
                dweight.data_ptr<float>(), D);
    else
      dweight.zero_();
    at::Tensor dhidden = at::zeros({N, D}, h.options());
    const float* src = dh.data_ptr<float>();
    float* dst = dhidden.data_ptr<float>();
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < D; ++j) dst[rows[size_t(r)] * D + j] = g * src[r * D + j];
    return {dhidden, dweight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The loss of logits = linear(hidden.to(dt), weight.to(dt)).float() (autocast's linear when dt is
// bf16 or fp16, plain fp32 otherwise) for any device, in ATen ops: blocks of rows are projected,
// reduced and turned into gradients in the forward, so neither the [N, V] logits nor their fp32
// copy, log-probabilities or gradient exist at once. No host synchronisation: pad rows are
// multiplied by 0 as in composed_loss, not compacted.
struct BlockedProjectedLoss : public torch::autograd::Function<BlockedProjectedLoss> {
  // hidden [N, D], weight [V, D], target [N] long. Returns {loss, nll} (fp32 scalars).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& target, double epsilon,
                                                int64_t pad_id, int64_t gemm_dtype,
                                                int64_t block_rows, bool want_grad, double z_loss,
                                                double softcap) {
    const auto dt = at::ScalarType(gemm_dtype);
    const int64_t N = hidden.size(0), V = weight.size(0);
    const double eps_i = epsilon > 0 ? epsilon / double(V - 1) : 0.0, a = 1.0 - epsilon - eps_i;
    const at::Tensor w = weight.to(dt);
    const at::Tensor keep = target.ne(pad_id).to(at::kFloat);
    at::Tensor nll = at::zeros({}, hidden.options().dtype(at::kFloat)),
               smooth = at::zeros_like(nll), z = at::zeros_like(nll);
    at::Tensor dh = want_grad ? at::empty_like(hidden) : at::Tensor();
    at::Tensor dw =
        want_grad ? at::zeros(weight.sizes(), weight.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t r0 = 0; r0 < N; r0 += block_rows) {
      const int64_t n = std::min(block_rows, N - r0);
      const at::Tensor h = hidden.narrow(0, r0, n).to(dt);
      const at::Tensor t = target.narrow(0, r0, n).unsqueeze(1), k = keep.narrow(0, r0, n);
      at::Tensor x = at::mm(h, w.t()).to(at::kFloat);  // the block's logits
      at::Tensor cap_slope;  // softcap: ∂(s·tanh(x/s))/∂x = 1 − tanh²(x/s)
      if (softcap > 0) {
        const at::Tensor th = x.div(softcap).tanh_();
        if (want_grad) cap_slope = 1 - th * th;
        x = th.mul_(softcap);
      }
      // As log_softmax computes it (at::logsumexp would make a row with +Inf +Inf, not NaN).
      const at::Tensor m = std::get<0>(x.max(-1, /*keepdim=*/true));
      const at::Tensor lse = (x - m).exp_().sum(-1, /*keepdim=*/true).log_().add_(m);
      nll += ((lse - x.gather(1, t)).squeeze(1) * k).sum();
      if (epsilon > 0) smooth += ((double(V) * lse.squeeze(1) - x.sum(-1)) * k).sum();
      if (z_loss > 0) z += (lse.squeeze(1).square() * k).sum();
      if (!want_grad) continue;
      // d/dx_j [a·(lse − x_t) + b·(V·lse − Σx) + c·lse²]
      //   = (a + bV + 2c·lse)·softmax_j − b − a·[j = t]
      at::Tensor g = x.sub_(lse).exp_();  // x is done
      if (z_loss > 0)
        g.mul_(lse * (2 * z_loss) + (a + eps_i * double(V))).sub_(eps_i);
      else
        g.mul_(a + eps_i * double(V)).sub_(eps_i);
      g.scatter_add_(1, t, at::full({n, 1}, -a, g.options()));
      g.mul_(k.unsqueeze(1));
      if (cap_slope.defined()) g.mul_(cap_slope);
      const at::Tensor gd = g.to(dt);
      dh.narrow(0, r0, n).copy_(at::mm(gd, w));
      dw.add_(at::mm(gd.t(), h));
    }
    at::Tensor loss = a * nll + eps_i * smooth;
    if (z_loss > 0) loss = loss + z_loss * z;
    ctx->mark_non_differentiable({nll, z});
    if (want_grad) {
      ctx->saved_data["dh"] = dh;
      ctx->saved_data["dw"] = dw.to(weight.scalar_type());
    }
    return {loss, nll, z};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    TORCH_CHECK(ctx->saved_data.count("dh"),
                "the blocked projected loss was computed without gradients");
    const at::Tensor g = grad[0].defined() ? grad[0] : at::zeros({});
    const at::Tensor dh = ctx->saved_data["dh"].toTensor(), dw = ctx->saved_data["dw"].toTensor();
    return {dh * g.to(dh.scalar_type()),
            dw * g.to(dw.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

bool blocked_loss_applies(const torch::Tensor& weight, at::ScalarType gemm_dtype) {
  // Not fp16: its gradients are made before the upstream gradient (the loss scale) is known, and
  // ∂logits of ~1e-5 would fall below fp16's range where the reference scales them first.
  return speed_levers().fused_loss && speed_levers().fused_projection &&
         !weight.device().is_cpu() && gemm_dtype != at::kHalf;
}

LossSums blocked_projected_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                const torch::Tensor& target, double epsilon, int64_t pad_id,
                                at::ScalarType gemm_dtype, int64_t block_rows, double z_loss,
                                double softcap) {
  const bool want_grad =
      torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  const int64_t V = weight.size(0);
  // About 32 M logits a block (128 MB in fp32), at least 64 rows.
  if (block_rows <= 0)
    block_rows = std::max<int64_t>(64, (int64_t(1) << 25) / std::max<int64_t>(V, 1));
  auto out = BlockedProjectedLoss::apply(
      hidden.reshape({-1, hidden.size(-1)}), weight, target.reshape({-1}).to(at::kLong), epsilon,
      pad_id, int64_t(gemm_dtype), block_rows, want_grad, z_loss, softcap);
  return {out[0], out[1], out[2]};
}

bool projected_loss_applies(const torch::Tensor& hidden, const torch::Tensor& weight) {
  return speed_levers().fused_loss && speed_levers().fused_projection &&
         cpu::blas_sgemm() != nullptr && cpu::fp32_operand(hidden) && cpu::fp32_operand(weight) &&
         weight.dim() == 2 && hidden.size(-1) == weight.size(1);
}

LossSums projected_label_smoothed_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& target, double epsilon, int64_t pad_id,
                                       double z_loss) {
  const bool want_grad =
      torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  auto out = ProjectedLoss::apply(
      hidden.reshape({-1, hidden.size(-1)}).contiguous(), weight.contiguous(),
      target.reshape({-1}).to(at::kLong).contiguous(), epsilon, pad_id, want_grad, z_loss);
  return {out[0], out[1], out[2]};
}

LossSums label_smoothed_loss(const torch::Tensor& logits, const torch::Tensor& target,
                             double epsilon, int64_t pad_id, double z_loss) {
  if (!speed_levers().fused_loss || !logits.device().is_cpu() || logits.scalar_type() != at::kFloat)
    return composed_loss(logits, target, epsilon, pad_id, z_loss);
  const int64_t V = logits.size(-1);
  auto out = FusedLabelSmoothedLoss::apply(logits.reshape({-1, V}).contiguous(),
                                           target.reshape({-1}).to(at::kLong).contiguous(), epsilon,
                                           pad_id, z_loss);
  return {out[0], out[1], out[2]};
}

}  // namespace normlab
