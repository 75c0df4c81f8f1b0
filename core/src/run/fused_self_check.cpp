#include "fused_self_check.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <torch/autograd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <string_view>

#include "model/cuda/fused_ops.h"
#include "normlab/model/attention.h"
#include "run/optimizer.h"
#include "speed_levers.h"
#include "torch_compat.h"

namespace normlab {
namespace {

// Per-dtype tolerance: |fused − reference| ≤ atol + rtol·|reference| (fp32: reassociation only;
// half precisions: one rounding of the result apart).
struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance(at::ScalarType t) {
  if (t == at::kBFloat16) return {2e-2, 2e-2};
  if (t == at::kHalf) return {2e-3, 2e-3};
  return {1e-5, 1e-5};
}

// Empty when `got` matches `want`: the same NaN / +Inf / −Inf places, the finite values within the
// tolerance; else the first difference.
std::string difference(const std::string& what, const at::Tensor& got_in, const at::Tensor& want_in,
                       Tolerance tol) {
  if (got_in.sizes() != want_in.sizes())
    return fmt::format("{}: shape {} against {}", what, c10::str(got_in.sizes()),
                       c10::str(want_in.sizes()));
  const at::Tensor got = got_in.detach().to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor want = want_in.detach().to(at::kCPU, at::kDouble).contiguous();
  const double* g = got.data_ptr<double>();
  const double* w = want.data_ptr<double>();
  for (int64_t i = 0; i < got.numel(); ++i) {
    const bool same_kind = (std::isnan(g[i]) == std::isnan(w[i])) &&
                           (std::isinf(g[i]) == std::isinf(w[i])) &&
                           (!std::isinf(w[i]) || (g[i] > 0) == (w[i] > 0));
    const bool close =
        !std::isfinite(w[i]) || std::abs(g[i] - w[i]) <= tol.atol + tol.rtol * std::abs(w[i]);
    if (!same_kind || !close)
      return fmt::format("{} element {}: {} against ATen's {}", what, i, g[i], w[i]);
  }
  return {};
}

// Random values of `dtype` on `device` with a NaN and a +Inf (and a −Inf in the second half).
at::Tensor probe(at::IntArrayRef sizes, at::ScalarType dtype, const at::Device& device,
                 at::Generator& gen, bool non_finite = true) {
  at::Tensor t = at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat));
  if (non_finite && t.numel() >= 4) {
    auto flat = t.view({-1});
    flat[1] = std::numeric_limits<float>::quiet_NaN();
    flat[flat.numel() - 2] = std::numeric_limits<float>::infinity();
    flat[flat.numel() / 2 + 1] = -std::numeric_limits<float>::infinity();
  }
  return t.to(device, dtype);
}

// ATen's composition itself failed (say, an operation this LibTorch lacks for the dtype on this
// device): nothing to compare with, and the model would take the fused operation anyway.
struct ReferenceFailed {
  std::string why;
};

// y = f(x…) and the inputs' gradients under one upstream gradient, for the fused and the reference.
using Op = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
std::string compare_op(const std::string& name, const Op& fused, const Op& reference,
                       const std::vector<at::Tensor>& inputs, const at::Tensor& upstream,
                       Tolerance tol) {
  auto run = [&](const Op& f, std::vector<at::Tensor>& grads) {
    std::vector<at::Tensor> xs;
    for (const at::Tensor& x : inputs) xs.push_back(x.detach().clone().requires_grad_(true));
    const at::Tensor y = f(xs);
    y.backward(upstream);
    for (const at::Tensor& x : xs) grads.push_back(x.grad());
    return y.detach();
  };
  std::vector<at::Tensor> gf, gr;
  at::Tensor yr;
  try {
    yr = run(reference, gr);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw ReferenceFailed{what.substr(0, what.find('\n'))};
  }
  const at::Tensor yf = run(fused, gf);
  if (std::string d = difference(name + " forward", yf, yr, tol); !d.empty()) return d;
  for (size_t i = 0; i < gf.size(); ++i)
    if (std::string d =
            difference(fmt::format("{} gradient of input {}", name, i), gf[i], gr[i], tol);
        !d.empty())
      return d;
  return {};
}

bool* lever_of(const std::string& op) {
  SpeedLevers& l = speed_levers();
  if (op == "rope") return &l.cuda_rope;
  if (op == "swiglu") return &l.cuda_swiglu;
  if (op == "rms_norm") return &l.cuda_rms_norm;
  if (op == "grouped_heads") return &l.sdpa_grouped_heads;
  return &l.cuda_adamw;
}

}  // namespace

FusedOpsUsed fused_ops_used(const ModelConfig& c) {
  FusedOpsUsed used;
  const bool llama = c.family == Family::Llama;
  used.rope = used.swiglu = llama;  // rotary positions and a gated FFN (attention.cpp)
  used.grouped_heads = llama && c.kv_head_count() < c.heads;
  used.rms_norm = c.norm.kind == NormKind::RMSNorm;
  used.adamw = true;
  return used;
}

FusedSelfCheck self_check_fused_ops(const at::Device& device, at::ScalarType dtype,
                                    const FusedOpsUsed& used) {
  FusedSelfCheck result;
  const at::TensorOptions on = at::TensorOptions().device(device);
  if (!on_gpu_path(at::empty({0}, on))) return result;
  if (const char* v = std::getenv("NORMLAB_FUSED_SELF_CHECK"); v && std::string_view(v) == "0") {
    result.skipped = "NORMLAB_FUSED_SELF_CHECK=0";
    return result;
  }
  const auto start = std::chrono::steady_clock::now();
  result.ran = true;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(57);
  const Tolerance tol = tolerance(dtype);
  auto check = [&](const std::string& op, const std::function<std::string()>& body) {
    FusedOpCheck c{op, true, {}, {}};
    try {
      c.error = body();
    } catch (const ReferenceFailed& r) {  // kept on, unchecked
      c.unchecked = "ATen's composition failed: " + r.why;
    } catch (const std::exception& e) {
      // A kernel that fails to launch is as wrong as one that lies.
      const std::string what = e.what();
      c.error = what.substr(0, what.find('\n'));
    }
    c.ok = c.error.empty();
    if (!c.ok) *lever_of(op) = false;
    result.ops.push_back(std::move(c));
  };
  if (used.rope)
    check("rope", [&] {
      const int64_t T = 6, dh = 8;
      at::Tensor cos, sin;
      rope_tables(T, dh, 10000, on.dtype(dtype), &cos, &sin);
      const at::Tensor x = probe({2, 3, T, dh}, dtype, device, gen);
      return compare_op(
          "rope", [&](const auto& in) { return fused_rope(in[0], cos, sin); },
          [&](const auto& in) { return apply_rope(in[0], cos, sin); }, {x},
          probe({2, 3, T, dh}, dtype, device, gen, false), tol);
    });
  if (used.swiglu)
    check("swiglu", [&] {
      const at::Tensor packed = probe({5, 16}, dtype, device, gen);
      return compare_op(
          "swiglu", [&](const auto& in) { return fused_swiglu(in[0]); },
          [&](const auto& in) {
            const auto up_gate = in[0].split(8, -1);
            return at::silu(up_gate[1]) * up_gate[0];
          },
          {packed}, probe({5, 8}, dtype, device, gen, false), tol);
    });
#if NORMLAB_TORCH_RMS_NORM
  if (used.rms_norm)
    check("rms_norm", [&] {
      const at::Tensor x = probe({5, 16}, dtype, device, gen),
                       gain = probe({16}, dtype, device, gen, false);
      return compare_op(
          "rms_norm", [&](const auto& in) { return at::rms_norm(in[0], {16}, in[1], 1e-6); },
          [&](const auto& in) {  // norm.cpp's composition: statistics in fp32
            const at::Tensor xf = in[0].to(at::kFloat);
            return (xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-6)).to(dtype) * in[1];
          },
          {x, gain}, probe({5, 16}, dtype, device, gen, false), tol);
    });
#endif
#if NORMLAB_TORCH_SDPA_GQA
  if (used.grouped_heads && sdpa_grouped_heads_apply(at::empty({1, 4, 6, 8}, on.dtype(dtype))))
    check("grouped_heads", [&] {
      // No NaN here: one would reach every later query of its head, the same in both.
      const at::Tensor q = probe({1, 4, 6, 8}, dtype, device, gen, false),
                       k = probe({1, 2, 6, 8}, dtype, device, gen, false),
                       v = probe({1, 2, 6, 8}, dtype, device, gen, false);
      return compare_op(
          "grouped_heads",
          [&](const auto& in) { return compat::causal_grouped_attention(in[0], in[1], in[2], 0); },
          [&](const auto& in) {
            return at::scaled_dot_product_attention(in[0], in[1].repeat_interleave(2, 1),
                                                    in[2].repeat_interleave(2, 1), std::nullopt,
                                                    0.0, /*is_causal=*/true);
          },
          {q, k, v}, probe({1, 4, 6, 8}, dtype, device, gen, false), tol);
    });
#endif
#if NORMLAB_TORCH_2
  if (used.adamw && device.is_cuda())
    check("adamw", [&] {
      const at::Tensor p = probe({37}, at::kFloat, device, gen),
                       g = probe({37}, at::kFloat, device, gen),
                       m = probe({37}, at::kFloat, device, gen, false),
                       v = probe({37}, at::kFloat, device, gen, false).abs();
      const AdamWHyper h{1e-3, 0.9, 0.98, 1e-8, 0.1, 3};
      at::Tensor pf = p.clone(), mf = m.clone(), vf = v.clone();
      at::Tensor pr = p.clone(), mr = m.clone(), vr = v.clone();
      adamw_update(AdamWKernel::FusedAten, pf, g, mf, vf, 20, h);
      adamw_update(AdamWKernel::AtenOps, pr, g, mr, vr, 20, h);
      const Tolerance fp32 = tolerance(at::kFloat);
      std::string d = difference("adamw parameters", pf, pr, fp32);
      if (d.empty()) d = difference("adamw first moment", mf, mr, fp32);
      if (d.empty()) d = difference("adamw second moment", vf, vr, fp32);
      return d;
    });
#endif
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void report_fused_self_check(const FusedSelfCheck& check, const at::Device& device,
                             std::ostream& out) {
  for (const FusedOpCheck& op : check.ops)
    if (!op.ok)
      fmt::print(out, "fused self-check: {} is off for this run on {}: {}\n", op.op, device.str(),
                 op.error);
}

}  // namespace normlab
