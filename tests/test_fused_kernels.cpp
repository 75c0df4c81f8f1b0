// The fused CPU kernels (speed levers) against the ATen compositions they replace: values,
// gradients and dropout masks (issue 13: each lever changes rounding only).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "model/counter_dropout.h"
#include "model/cpu_gemm.h"
#include "model/cuda/elementwise_bodies.h"
#include "model/cuda/fused_ops.h"
#include "model/fused_attention.h"
#include "model/fused_ffn.h"
#include "model/fused_linear.h"
#include "model/fused_residual_norm.h"
#include "normlab/model/attention.h"
#include "normlab/model/norm.h"
#include "normlab/runtime_env.h"
#include "run/label_smoothing.h"
#include "run/optimizer.h"
#include "speed_levers.h"
#include "test_support.h"
#include "torch_compat.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_fused_kernels {

using namespace normlab;

namespace {

// |a − b| ≤ tol · max(1, max|b|), and b is not all zeros (a vacuous comparison).
void check_close(const torch::Tensor& a, const torch::Tensor& b, double tol = 2e-6) {
  REQUIRE(a.sizes() == b.sizes());
  const double scale = std::max(1.0, b.abs().max().item<double>());
  CHECK(test::max_abs_diff(a, b) <= tol * scale);
  CHECK(b.abs().max().item<double>() > 0);
}

// Two bf16 GEMMs of the same operands, C = A·B summed over n terms in different orders (and
// with bf16 or fp32 products, as the CPU's kernels choose), each output rounded to bf16:
// elementwise |a − b| ≤ 2·(λ·√n·u·(|A|·|B|) + u·|b|), u = 2⁻⁸ (bf16's unit roundoff). √n·u is the
// probabilistic bound of a length-n sum (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019,
// Thm. 3.1). λ = 3: 3× the largest ratio seen (0.95, on an AVX2-only EPYC whose bf16 GEMM rounds
// partial sums to bf16; far less on CPUs with bf16 instructions). `bound` is |A|·|B|.
void check_bf16_gemm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& bound,
                     int64_t n) {
  REQUIRE(a.sizes() == b.sizes());
  const double u = std::ldexp(1.0, -8), lambda = 3.0;
  const auto tol = 2.0 * (lambda * std::sqrt(double(n)) * u * bound + u * b.abs());
  const auto excess = ((a - b).abs() - tol).max().item<double>();
  CAPTURE(test::max_abs_diff(a, b));
  CAPTURE(excess);
  CHECK(excess <= 0.0);
  CHECK(b.abs().max().item<double>() > 0);
  // Not vacuous: on average below the values it bounds (a block left out would not fit).
  CHECK((tol.mean() < b.abs().mean()).item<bool>());
}

// The same non-finite pattern (NaN where NaN, ±Inf where ±Inf) and, elsewhere, close values.
void check_same_nonfinite(const torch::Tensor& fused, const torch::Tensor& plain) {
  REQUIRE(fused.sizes() == plain.sizes());
  CHECK(torch::equal(fused.isnan(), plain.isnan()));
  CHECK(torch::equal(fused.isposinf(), plain.isposinf()));
  CHECK(torch::equal(fused.isneginf(), plain.isneginf()));
  const auto finite = plain.isfinite() & fused.isfinite();
  if (finite.any().item<bool>()) {
    const auto a = fused.masked_select(finite), b = plain.masked_select(finite);
    CHECK(test::max_abs_diff(a, b) <= 1e-4 * std::max(1.0, b.abs().max().item<double>()));
  }
}

// The blocked projected loss (the GPU path) against linear's logits and the composed loss, on
// `device`: fp32, and bf16 autocast's linear (the reference's logits under autocast, the blocked
// loss given bf16 products). Blocks of 4 rows: several, the last one partial.
void check_blocked_loss(const torch::Device& device) {
  torch::manual_seed(17);
  const int64_t B = 3, T = 11, D = 16, V = 301, pad = 0;
  auto h = torch::randn({B, T, D}).to(device).requires_grad_(true);
  auto w = (0.5 * torch::randn({V, D})).to(device).requires_grad_(true);
  auto target = torch::randint(1, V, {B, T}, torch::kLong);
  target.index_put_({0, torch::indexing::Slice(7, torch::indexing::None)}, pad);
  target.index_put_({2, torch::indexing::Slice(2, torch::indexing::None)}, pad);
  target = target.to(device);
  const bool fused_loss = speed_levers().fused_loss;
  speed_levers().fused_loss = false;  // the reference: ATen's log_softmax composition
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (double eps : {0.0, 0.1}) {
      CAPTURE(dtype);
      CAPTURE(eps);
      const bool bf16 = dtype == at::kBFloat16;
      std::vector<std::vector<torch::Tensor>> runs;
      for (bool blocked : {true, false}) {
        h.mutable_grad() = torch::Tensor();
        w.mutable_grad() = torch::Tensor();
        LossSums s;
        if (blocked) {
          s = blocked_projected_loss(h, w, target, eps, pad, dtype, /*block_rows=*/4);
        } else {
          torch::Tensor logits;
          {
            compat::AutocastGuard guard(bf16 ? compat::autocast_to(device.is_cuda(), dtype)
                                             : compat::autocast_state());
            logits = torch::linear(h, w);
          }
          s = label_smoothed_loss(logits.to(torch::kFloat), target, eps, pad);
        }
        (s.loss * 0.37).backward();  // an upstream gradient other than 1
        runs.push_back({s.loss.detach(), s.nll.detach(), h.grad().clone(), w.grad().clone()});
      }
      // fp32: rounding only. bf16: loss and nll come from the same bf16 logits (fp32 reductions).
      // The gradients are bf16 GEMMs in both (∂logits rounded to bf16, products in bf16 or fp32
      // depending on the CPU's kernels, the output rounded to bf16), summed in another order, so
      // they are compared elementwise against an error bound, not one machine's difference.
      const double tol[] = {1e-5, 1e-5, 1e-5, 1e-5};
      for (size_t i = 0; i < runs[0].size(); ++i) {
        CAPTURE(i);  // loss, nll, dh, dW
        if (bf16 && i >= 2) continue;
        check_close(runs[0][i].cpu(), runs[1][i].cpu(), tol[i]);
      }
      if (bf16) {
        // ∂logits of the reference loss (0.37 upstream), from the bf16 logits both compute.
        auto x = torch::linear(h.detach().to(dtype), w.detach().to(dtype)).to(torch::kFloat);
        x.requires_grad_(true);
        (label_smoothed_loss(x, target, eps, pad).loss * 0.37).backward();
        const auto g = x.grad().reshape({B * T, V}).abs().cpu();
        const auto hb = h.detach().to(dtype).to(torch::kFloat).reshape({B * T, D}).abs().cpu();
        const auto wb = w.detach().to(dtype).to(torch::kFloat).abs().cpu();
        check_bf16_gemm(runs[0][2].cpu().reshape({B * T, D}), runs[1][2].cpu().reshape({B * T, D}),
                        g.mm(wb), V);  // ∂h = ∂logits · W, over V
        check_bf16_gemm(runs[0][3].cpu(), runs[1][3].cpu(), g.t().mm(hb), B * T);  // ∂W, over rows
      }
      CHECK(runs[0][2][0].narrow(0, 7, T - 7).abs().max().item<double>() == 0.0);  // pad rows
      torch::NoGradGuard no_grad;  // validation: the same loss without a graph
      LossSums v = blocked_projected_loss(h, w, target, eps, pad, dtype, 4);
      CHECK(v.loss.item<double>() == doctest::Approx(runs[0][0].item<double>()).epsilon(1e-6));
    }
  // An Inf in a hidden state: the same NaN/Inf in loss, nll and both gradients.
  auto hi = h.detach().clone();
  hi[0][1][3] = INFINITY;
  hi.requires_grad_(true);
  std::vector<std::vector<torch::Tensor>> runs;
  for (bool blocked : {true, false}) {
    w.mutable_grad() = torch::Tensor();
    LossSums s = blocked ? blocked_projected_loss(hi, w, target, 0.1, pad, at::kFloat, 4)
                         : label_smoothed_loss(torch::linear(hi, w), target, 0.1, pad);
    s.loss.backward();
    runs.push_back({s.loss.detach(), s.nll.detach(), hi.grad().clone(), w.grad().clone()});
    hi.mutable_grad() = torch::Tensor();
  }
  speed_levers().fused_loss = fused_loss;
  CHECK_FALSE(runs[1][0].isfinite().item<bool>());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    CAPTURE(i);
    check_same_nonfinite(runs[0][i].cpu(), runs[1][i].cpu());
  }
}

// Issue 43.5: the GPU path's fused operations against the ATen compositions they replace, on
// `device`. On the CPU normlab's kernels run as their host twins (the same per-element functions
// over every index), on a GPU as the kernels. Tolerances: fp32 rounding only; half and bfloat16
// round once where the composition rounds after every operation (2^-11 and 2^-8 relative).
double low_precision_tol(at::ScalarType t) {
  return t == at::kFloat ? 2e-6 : t == at::kHalf ? 2e-3 : 1.6e-2;
}

void check_rope_kernel(const torch::Device& device) {
  const int64_t B = 2, T = 7, H = 3, dh = 8;
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    CAPTURE(dtype);
    torch::manual_seed(41);
    // x as attention has it: a transposed view into the packed projection [B, T, (H + 2)·dh].
    auto base = torch::randn({B, T, (H + 2) * dh}).to(device, dtype).requires_grad_(true);
    const auto upstream = torch::randn({B, H, T, dh}).to(device, dtype);
    torch::Tensor cos, sin;
    rope_tables(T, dh, 10000.0, torch::TensorOptions().dtype(dtype).device(device), &cos, &sin);
    std::vector<torch::Tensor> out, grads;
    for (const bool fused : {true, false}) {
      const auto x = base.view({B, T, H + 2, dh}).narrow(2, 0, H).transpose(1, 2);
      const auto y = fused ? fused_rope(x, cos, sin) : apply_rope(x, cos, sin);
      if (fused) CHECK(y.is_contiguous());
      (y * upstream).sum().backward();
      out.push_back(y.detach().to(torch::kFloat).cpu());
      grads.push_back(base.grad().to(torch::kFloat).cpu());
      base.mutable_grad() = torch::Tensor();
    }
    check_close(out[0], out[1], low_precision_tol(dtype));
    check_close(grads[0], grads[1], low_precision_tol(dtype));
    CHECK(grads[0].narrow(2, H * dh, 2 * dh).abs().max().item<double>() == 0.0);  // k, v: none
  }
  // NaN and ±Inf (fp32): where the rotation mixes them in, the same non-finite values.
  auto x = torch::randn({1, 2, 5, 8});
  x[0][0][0][1] = NAN;
  x[0][1][2][6] = INFINITY;
  x[0][1][3][0] = -INFINITY;
  x = x.to(device).requires_grad_(true);
  torch::Tensor cos, sin;
  rope_tables(5, 8, 10000.0, torch::TensorOptions().dtype(torch::kFloat).device(device), &cos,
              &sin);
  std::vector<torch::Tensor> runs;
  for (const bool fused : {true, false}) {
    const auto y = fused ? fused_rope(x, cos, sin) : apply_rope(x, cos, sin);
    (y * y.detach().nan_to_num(0, 0, 0)).sum().backward();
    runs.push_back(y.detach().cpu());
    runs.push_back(x.grad().cpu());
    x.mutable_grad() = torch::Tensor();
  }
  CHECK(runs[2].isnan().any().item<bool>());
  CHECK(runs[2].isinf().any().item<bool>());
  check_same_nonfinite(runs[0], runs[2]);
  check_same_nonfinite(runs[1], runs[3]);
}

void check_swiglu_kernel(const torch::Device& device) {
  const int64_t B = 3, T = 5, F = 12;
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    if (dtype == at::kHalf && device.is_cpu() && !NORMLAB_TORCH_2) continue;  // 1.13: no CPU silu
    CAPTURE(dtype);
    torch::manual_seed(43);
    auto packed = (3 * torch::randn({B, T, 2 * F})).to(device, dtype).requires_grad_(true);
    const auto upstream = torch::randn({B, T, F}).to(device, dtype);
    std::vector<torch::Tensor> out, grads;
    for (const bool fused : {true, false}) {
      torch::Tensor y;
      if (fused) {
        y = fused_swiglu(packed);
      } else {
        const auto parts = packed.split(F, -1);  // up, then gate
        y = torch::silu(parts[1]) * parts[0];
      }
      (y * upstream).sum().backward();
      out.push_back(y.detach().to(torch::kFloat).cpu());
      grads.push_back(packed.grad().to(torch::kFloat).cpu());
      packed.mutable_grad() = torch::Tensor();
    }
    check_close(out[0], out[1], low_precision_tol(dtype));
    check_close(grads[0], grads[1], 2 * low_precision_tol(dtype));
  }
  // NaN in an up value, ±Inf gates (silu(−∞) is NaN in both): the same non-finite pattern.
  auto packed = torch::randn({2, 3, 2 * F});
  packed[0][0][1] = NAN;
  packed[0][1][F + 2] = INFINITY;
  packed[1][0][F + 3] = -INFINITY;
  packed = packed.to(device).requires_grad_(true);
  std::vector<torch::Tensor> runs;
  for (const bool fused : {true, false}) {
    const auto parts = packed.split(F, -1);
    const auto y = fused ? fused_swiglu(packed) : torch::silu(parts[1]) * parts[0];
    y.sum().backward();
    runs.push_back(y.detach().cpu());
    runs.push_back(packed.grad().cpu());
    packed.mutable_grad() = torch::Tensor();
  }
  CHECK(runs[2].isnan().any().item<bool>());
  CHECK(runs[2].isinf().any().item<bool>());
  check_same_nonfinite(runs[0], runs[2]);
  check_same_nonfinite(runs[1], runs[3]);
}

// Every AdamW kernel there is for `device` takes the same three updates (weight decay on the first
// `decayed` elements only); the third has a NaN and an Inf gradient. After the first, by hand:
// m/bc₁ = g and √v/√bc₂ = |g|, so p = p₀(1 − lr·λ) − lr·g/(|g| + ε).
void check_adamw_kernels(const torch::Device& device) {
  const int64_t n = 3001, decayed = 1700;
  const AdamWHyper hyper{1e-2, 0.9, 0.999, 1e-8, 0.1, 0};
  torch::manual_seed(47);
  const torch::Tensor p0 = torch::randn({n});
  std::vector<torch::Tensor> grads;
  for (int step = 0; step < 3; ++step) grads.push_back(torch::randn({n}));
  grads[2][7] = NAN;
  grads[2][n - 5] = INFINITY;
  std::vector<AdamWKernel> kernels{AdamWKernel::AtenOps};
  if (device.is_cpu()) kernels.push_back(AdamWKernel::Loop);
#if NORMLAB_TORCH_2
  kernels.push_back(AdamWKernel::FusedAten);
#endif
  std::vector<std::vector<torch::Tensor>> after2, after3;
  for (const AdamWKernel kernel : kernels) {
    CAPTURE(int(kernel));
    torch::Tensor p = p0.to(device, /*non_blocking=*/false, /*copy=*/true),
                  m = torch::zeros({n}).to(device), v = torch::zeros({n}).to(device);
    for (int step = 1; step <= 3; ++step) {
      AdamWHyper h = hyper;
      h.step = step;
      adamw_update(kernel, p, grads[size_t(step - 1)].to(device), m, v, decayed, h);
      if (step == 1) {
        const torch::Tensor got = p.cpu();
        for (const int64_t i : {int64_t(0), decayed - 1, decayed, n - 1}) {
          CAPTURE(i);
          const double g = grads[0][i].item<double>();
          const double want = p0[i].item<double>() * (i < decayed ? 1 - 1e-2 * 0.1 : 1.0) -
                              1e-2 * g / (std::abs(g) + 1e-8);
          CHECK(got[i].item<double>() == doctest::Approx(want).epsilon(1e-6));
        }
      }
      if (step >= 2)
        (step == 2 ? after2 : after3)
            .push_back({p.cpu().clone(), m.cpu().clone(), v.cpu().clone()});
    }
  }
  for (size_t k = 1; k < kernels.size(); ++k)
    for (size_t j = 0; j < 3; ++j) {
      CAPTURE(k);
      CAPTURE(j);  // p, m, v
      check_close(after2[k][j], after2[0][j], 1e-6);
      check_same_nonfinite(after3[k][j], after3[0][j]);
    }
  CHECK(after3[0][0][7].isnan().item<bool>());
}

// RMSNorm through the GPU path (at::rms_norm, LibTorch 2.x) against NormImpl's own formula, with
// and without a gain, values and gradients.
void check_rms_norm_path(const torch::Device& device) {
  const bool on_cpu = speed_levers().gpu_paths_on_cpu;
  speed_levers().gpu_paths_on_cpu = true;
  for (const bool affine : {true, false}) {
    CAPTURE(affine);
    NormSpec spec = NormSpec::of(NormKind::RMSNorm);
    spec.affine = affine;
    spec.eps = 1e-6;
    torch::manual_seed(53);
    Norm norm(spec, 24);
    norm->to(device);
    if (affine) {
      torch::NoGradGuard no_grad;
      norm->weight.copy_(torch::rand({24}) + 0.5);
    }
    auto x = (5 * torch::randn({4, 3, 24})).to(device).requires_grad_(true);
    const auto upstream = torch::randn({4, 3, 24}).to(device);
    std::vector<torch::Tensor> runs;
    for (const bool fused : {true, false}) {
      speed_levers().cuda_fused = fused;
      const auto y = norm(x);
      (y * upstream).sum().backward();
      runs.push_back(y.detach().cpu());
      runs.push_back(x.grad().cpu());
      x.mutable_grad() = torch::Tensor();
      if (affine) {
        runs.push_back(norm->weight.grad().cpu());
        norm->weight.mutable_grad() = torch::Tensor();
      }
    }
    speed_levers().cuda_fused = true;
    const size_t half = runs.size() / 2;
    for (size_t i = 0; i < half; ++i) {
      CAPTURE(i);  // y, dx, dγ
      check_close(runs[i], runs[half + i], 1e-5);
    }
  }
  speed_levers().gpu_paths_on_cpu = on_cpu;
}
}  // namespace

// The GPU's fused paths on a GPU (ctest label `gpu`; SKIP without CUDA).
TEST_SUITE("gpu_kernels") {
  TEST_CASE("blocked projected loss on CUDA: linear's logits' loss and gradients, fp32 and bf16") {
    if (!torch::cuda::is_available()) {
      MESSAGE("SKIP: no CUDA device");
      return;
    }
    check_blocked_loss(torch::Device(torch::kCUDA, 0));
    // The trainer's choice: bf16 and fp32 products, not fp16 (its loss scale comes too late).
    const auto w = torch::zeros({4, 2}, torch::Device(torch::kCUDA, 0));
    CHECK(blocked_loss_applies(w, at::kBFloat16));
    CHECK(blocked_loss_applies(w, at::kFloat));
    CHECK_FALSE(blocked_loss_applies(w, at::kHalf));
  }

  TEST_CASE("normlab's CUDA kernels (rotary, SwiGLU) against ATen's composition on CUDA") {
    if (!torch::cuda::is_available()) {
      MESSAGE("SKIP: no CUDA device");
      return;
    }
    check_rope_kernel(torch::Device(torch::kCUDA, 0));
    check_swiglu_kernel(torch::Device(torch::kCUDA, 0));
  }

  TEST_CASE("AdamW on CUDA: at::_fused_adamw_ and the ATen ops agree, by hand after one step") {
    if (!torch::cuda::is_available()) {
      MESSAGE("SKIP: no CUDA device");
      return;
    }
    check_adamw_kernels(torch::Device(torch::kCUDA, 0));
  }

  TEST_CASE("RMSNorm on CUDA: LibTorch's fused kernel computes NormImpl's formula") {
    if (!torch::cuda::is_available()) {
      MESSAGE("SKIP: no CUDA device");
      return;
    }
    check_rms_norm_path(torch::Device(torch::kCUDA, 0));
  }
}

TEST_SUITE("fused_kernels") {
  TEST_CASE("blocked projected loss (the GPU path, here on the CPU): linear's logits' loss") {
    CHECK_FALSE(blocked_loss_applies(torch::zeros({4, 2}), at::kFloat));  // the CPU has its own
    check_blocked_loss(torch::kCPU);
  }

  TEST_CASE(
      "cpu::gemm: every transpose case equals ATen's matmul, through oneDNN and through the BLAS") {
    torch::manual_seed(3);
    const int64_t m = 37, n = 29, k = 45;  // odd sizes: the kernels' edge paths
    for (bool onednn : {true, false}) {
      speed_levers().onednn_gemm = onednn;
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          CAPTURE(onednn);
          CAPTURE(ta);
          CAPTURE(tb);
          auto a = ta ? torch::randn({k, m}) : torch::randn({m, k});
          auto b = tb ? torch::randn({n, k}) : torch::randn({k, n});
          auto c = torch::randn({m, n});
          const auto want = 0.5 * torch::matmul(ta ? a.t() : a, tb ? b.t() : b) + 2.0 * c;
          cpu::gemm(ta, tb, m, n, k, 0.5f, a.data_ptr<float>(), a.size(1), b.data_ptr<float>(),
                    b.size(1), 2.0f, c.data_ptr<float>(), n);
          check_close(c, want, 1e-5);
        }
    }
    speed_levers().onednn_gemm = true;
    MESSAGE("layer GEMMs by " << std::string(cpu::gemm_library()));
  }

  TEST_CASE(
      "cpu_gemm: the system's oneDNN and OpenBLAS run the kernels' products where they are "
      "installed, also beside the PyPI wheel's MKL") {
    // The wheel hides its oneDNN and exports MKL's sgemm_: without the system's libraries its
    // layer GEMMs ran MKL's generic kernels (124 against 100 ms per 18L-18L step, cpu_gemm.h).
    const auto installed = [](std::initializer_list<const char*> sonames) {
      for (const char* soname : sonames)
        if (void* lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) {
          dlclose(lib);
          return true;
        }
      return false;
    };
    MESSAGE("layer GEMMs by " << std::string(cpu::gemm_library()) << ", attention blocks by "
                              << std::string(cpu::small_gemm().library));
    if (installed({"libdnnl.so.3", "libdnnl.so.2"}))
      CHECK(std::string(cpu::gemm_library()) == "oneDNN dnnl_sgemm");
    if (installed({"libopenblas.so.0"})) {
      CHECK(std::string(cpu::small_gemm().library).find("OpenBLAS") != std::string::npos);
      CHECK(blas_info().library.find("openblas") != std::string::npos);  // found though private
      CHECK(!blas_info().corename.empty());  // read from the OpenBLAS loaded beside MKL too
    }
  }

  TEST_CASE("fused linear: torch::linear's values and gradients") {
    torch::manual_seed(5);
    auto x = torch::randn({3, 7, 16}).requires_grad_(true);
    auto w = torch::randn({24, 16}).requires_grad_(true);
    auto b = torch::randn({24}).requires_grad_(true);
    const auto weight = torch::randn({3, 7, 24});
    std::vector<std::vector<torch::Tensor>> runs;
    for (bool fused : {true, false}) {
      for (auto* t : {&x, &w, &b}) t->mutable_grad() = torch::Tensor();
      speed_levers().fused_linear = fused;
      auto y = fused_linear(x, w, b);
      (y * weight).sum().backward();
      runs.push_back({y.detach(), x.grad().clone(), w.grad().clone(), b.grad().clone()});
    }
    speed_levers().fused_linear = true;
    for (size_t i = 0; i < runs[0].size(); ++i) {
      CAPTURE(i);  // output, dx, dW, db
      check_close(runs[0][i], runs[1][i], 1e-5);
    }
  }

  TEST_CASE(
      "fused residual norm: LN(a*x + b) by hand, and ATen's values and gradients for Post-LN, "
      "DeepNorm's alpha, no affine, no b, LayerNorm and RMSNorm") {
    // By hand: x = (1, 2, 3, 4), b = 0, a = 2: h = (2, 4, 6, 8), mean 5, variance 5, so
    // LN(h) = (h - 5)/sqrt(5 + eps) with gain 1 and bias 0.
    {
      Norm ln(NormSpec{}, 4);
      const auto x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 4});
      REQUIRE(fused_residual_norm_applies(x, torch::zeros({1, 4}), *ln));
      const auto y = fused_residual_norm(x, torch::zeros({1, 4}), 2.0, *ln);
      const double s = std::sqrt(5.0 + 1e-5);
      check_close(y, torch::tensor({-3 / s, -1 / s, 1 / s, 3 / s}).view({1, 4}).to(torch::kFloat));
      // RMSNorm of x itself: mean(x^2) = 30/4, so y = x/sqrt(7.5 + eps).
      Norm rms(NormSpec::of(NormKind::RMSNorm), 4);
      const double r = std::sqrt(7.5 + 1e-5);
      check_close(fused_residual_norm(x, torch::Tensor(), 1.0, *rms),
                  torch::tensor({1 / r, 2 / r, 3 / r, 4 / r}).view({1, 4}).to(torch::kFloat));
    }
    const int64_t B = 5, T = 29, D = 24;  // 145 rows: three row blocks, the last one partial
    // alpha: Post-LN's 1; DeepNorm's encoder alpha at 6L-6L, 0.81 (6^4 6)^(1/16) = 1.418.
    for (NormKind kind : {NormKind::LayerNorm, NormKind::RMSNorm})
      for (double alpha : {1.0, 1.418}) {
        for (bool affine : {true, false}) {
          for (bool with_b : {true, false}) {
            CAPTURE(to_string(kind));
            CAPTURE(alpha);
            CAPTURE(affine);
            CAPTURE(with_b);
            NormSpec spec = NormSpec::of(kind);
            spec.affine = affine;
            Norm ln(spec, D);
            torch::manual_seed(17);
            if (affine) {
              torch::NoGradGuard no_grad;
              ln->weight.uniform_(0.5, 1.5);
              if (ln->bias.defined()) ln->bias.uniform_(-0.5, 0.5);
            }
            auto x = (torch::randn({B, T, D}) * 3 + 1).requires_grad_(true);
            auto b = torch::randn({B, T, D}).requires_grad_(true);
            const auto weight = torch::randn({B, T, D});
            const torch::Tensor none;
            REQUIRE(fused_residual_norm_applies(x, with_b ? b : none, *ln));
            std::vector<std::vector<torch::Tensor>> runs;
            for (bool fused : {true, false}) {
              ln->zero_grad();
              for (auto* t : {&x, &b}) t->mutable_grad() = torch::Tensor();
              const auto y = fused ? fused_residual_norm(x, with_b ? b : none, alpha, *ln)
                                   : ln->forward(with_b ? x * alpha + b : x * alpha);
              (y * weight).sum().backward();
              std::vector<torch::Tensor> r{y.detach(), x.grad().clone()};
              if (with_b) r.push_back(b.grad().clone());
              if (affine) r.push_back(ln->weight.grad().clone());
              if (ln->bias.defined()) r.push_back(ln->bias.grad().clone());
              runs.push_back(r);
            }
            for (size_t i = 0; i < runs[0].size(); ++i) {
              CAPTURE(i);  // output, dx, (db), (dgain, dbias)
              check_close(runs[0][i], runs[1][i], 1e-5);
            }
          }
        }
      }
  }

  TEST_CASE(
      "fused residual norm: the same bits for 1 and 2 threads; falls back where it does not "
      "apply") {
    Norm ln(NormSpec{}, 32);
    torch::manual_seed(23);
    const auto x0 = torch::randn({300, 32}), b0 = torch::randn({300, 32});
    const auto weight = torch::randn({300, 32});
    std::vector<std::vector<torch::Tensor>> runs;
    const int threads = at::get_num_threads();
    for (int n : {1, 2}) {
      at::set_num_threads(n);
      ln->zero_grad();
      auto x = x0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
      const auto y = fused_residual_norm(x, b, 0.7, *ln);
      (y * weight).sum().backward();
      runs.push_back(
          {y.detach(), x.grad(), b.grad(), ln->weight.grad().clone(), ln->bias.grad().clone()});
    }
    at::set_num_threads(threads);
    for (size_t i = 0; i < runs[0].size(); ++i) {
      CAPTURE(i);
      CHECK(torch::equal(runs[0][i], runs[1][i]));
    }
    // Not for: another norm kind, a shape mismatch (broadcasting), a per-head gain, the lever off.
    CHECK_FALSE(fused_residual_norm_applies(x0, b0, *Norm(NormSpec::of(NormKind::ScaleNorm), 32)));
    CHECK_FALSE(fused_residual_norm_applies(x0, b0[0], *ln));
    NormSpec per_head;
    per_head.gain_per_head = true;
    CHECK_FALSE(fused_residual_norm_applies(x0, b0, *Norm(per_head, 32, 2)));
    CHECK_FALSE(fused_residual_norm_applies(x0.to(torch::kDouble), b0.to(torch::kDouble), *ln));
    speed_levers().fused_residual_norm = false;
    CHECK_FALSE(fused_residual_norm_applies(x0, b0, *ln));
    speed_levers().fused_residual_norm = true;
  }

  TEST_CASE(
      "fused FFN: the unfused branch's values, gradients and dropout masks (both dropouts on)") {
    const int64_t B = 4, T = 9, D = 16, F = 40;
    const double p = 0.3, p_act = 0.2;
    FeedForward ffn(D, F, p_act);
    ffn->train();
    torch::manual_seed(11);
    auto x = torch::randn({B, T, D}).requires_grad_(true);
    const auto weight = torch::randn({B, T, D});
    REQUIRE(fused_ffn_applies(x, *ffn, p, true));
    std::vector<std::vector<torch::Tensor>> runs;
    for (bool fused : {true, false}) {
      ffn->zero_grad();
      x.mutable_grad() = torch::Tensor();
      torch::manual_seed(99);  // the same dropout seeds for both paths
      torch::Tensor y, act;
      if (fused) {
        y = fused_ffn_branch(x, *ffn, p, true, &act);
      } else {
        act = ffn->activation(x);
        y = counter_dropout(ffn->project(act), p, true);
      }
      (y * weight).sum().backward();
      std::vector<torch::Tensor> r = {y.detach(), act.detach(), x.grad().clone()};
      for (const auto& q : ffn->parameters()) r.push_back(q.grad().clone());
      runs.push_back(std::move(r));
    }
    for (size_t i = 0; i < runs[0].size(); ++i) {
      CAPTURE(i);  // output, activation, dx, then fc1.weight, fc1.bias, fc2.weight, fc2.bias
      check_close(runs[0][i], runs[1][i], 1e-5);
    }
    // The same masks: an output element is dropped in one path exactly where it is in the other.
    CHECK(torch::equal(runs[0][0].eq(0), runs[1][0].eq(0)));
    const double dropped = runs[0][0].eq(0).to(torch::kDouble).mean().item<double>();
    CHECK(dropped > 0.2);
    CHECK(dropped < 0.4);
    // Evaluation: no dropout, the plain FFN.
    ffn->eval();
    torch::NoGradGuard no_grad;
    check_close(fused_ffn_branch(x, *ffn, p, false), ffn->forward(x), 1e-5);
  }

  // Issue 31: attention dropout turned the fused kernel off, so the user path (attention and
  // activation dropout 0.1) ran a third slower than the benchmark, which never used it.
  TEST_CASE(
      "fused attention with dropout on the probabilities: values and gradients of Drop(P)·V with "
      "the counter mask, recomputed in the backward; the same masks after reseeding") {
    const int64_t B = 2, T = 7, S = 5, H = 3, dh = 4;
    const double rate = 0.3;
    for (bool self : {true, false}) {
      CAPTURE(self);
      torch::manual_seed(21);
      const int64_t Tk = self ? T : S;
      auto q = torch::randn({B, T, 1, H, dh}).requires_grad_(true);
      auto kv = torch::randn({B, Tk, 2, H, dh}).requires_grad_(true);
      auto qkv = torch::randn({B, T, 3, H, dh}).requires_grad_(true);
      const torch::Tensor mask =
          self ? torch::full({T, T}, -INFINITY).triu(1).view({1, 1, T, T}) : torch::Tensor();
      const torch::Tensor weight = torch::randn({B, T, H * dh});
      REQUIRE(fused_attention_applies(self ? qkv : kv, mask, rate));
      // Fused, with the seed its one generator draw will take.
      torch::manual_seed(99);
      const uint64_t seed = draw_dropout_seed();
      torch::manual_seed(99);
      torch::Tensor y =
          self ? fused_self_attention(qkv, mask, rate) : fused_cross_attention(q, kv, mask, rate);
      (y * weight).sum().backward();
      // Reference in ATen: the mask is counter_dropout_span of ones, element (b, h, i, j) at its
      // flat index in [B, H, Tq, Tk].
      auto qr = (self ? qkv.select(2, 0) : q.select(2, 0)).detach().requires_grad_(true);
      auto kr = (self ? qkv.select(2, 1) : kv.select(2, 0)).detach().requires_grad_(true);
      auto vr = (self ? qkv.select(2, 2) : kv.select(2, 1)).detach().requires_grad_(true);
      torch::Tensor keep = torch::ones({B, H, T, Tk});
      counter_dropout_span(keep.data_ptr<float>(), keep.data_ptr<float>(), 0, keep.numel(), seed,
                           rate);
      torch::Tensor scores =
          torch::matmul(qr.transpose(1, 2), kr.transpose(1, 2).transpose(-1, -2)) / 2.0;  // √dh
      if (mask.defined()) scores = scores + mask;
      const torch::Tensor ref = torch::matmul(torch::softmax(scores, -1) * keep, vr.transpose(1, 2))
                                    .transpose(1, 2)
                                    .reshape({B, T, H * dh});
      (ref * weight).sum().backward();
      check_close(y, ref, 1e-5);
      const torch::Tensor dq = self ? qkv.grad().select(2, 0) : q.grad().select(2, 0);
      const torch::Tensor dk = self ? qkv.grad().select(2, 1) : kv.grad().select(2, 0);
      const torch::Tensor dv = self ? qkv.grad().select(2, 2) : kv.grad().select(2, 1);
      check_close(dq, qr.grad(), 1e-5);
      check_close(dk, kr.grad(), 1e-5);
      check_close(dv, vr.grad(), 1e-5);
      // About `rate` of the probabilities dropped, the rest scaled 1/(1 − rate).
      const double dropped = keep.eq(0).to(torch::kDouble).mean().item<double>();
      CHECK(dropped > 0.15);
      CHECK(dropped < 0.45);
      CHECK(keep.max().item<double>() == doctest::Approx(1 / (1 - rate)));
      // Resume: the same generator state gives the same output, bit for bit.
      torch::manual_seed(99);
      torch::NoGradGuard no_grad;
      CHECK(torch::equal(
          self ? fused_self_attention(qkv, mask, rate) : fused_cross_attention(q, kv, mask, rate),
          y.detach()));
    }
  }

  // Issue 70.1: the AVX2 clone of the mask loop was scalar and branchy (a float select GCC 12 does
  // not vectorize); now it clears dropped lanes with a bit mask. Whichever clone this CPU runs
  // (AVX-512, AVX2, default), each element is the documented hash's choice, bit for bit.
  TEST_CASE(
      "counter dropout mask: lowbias32 by hand, bit for bit, NaN/Inf/-0 and an unaligned span") {
    const auto lowbias32 = [](uint32_t x) {
      x ^= x >> 16;
      x *= 0x7feb352dU;
      x ^= x >> 15;
      x *= 0x846ca68bU;
      x ^= x >> 16;
      return x;
    };
    const uint64_t seed = 0x0123456789abcdefULL;
    const double p = 0.3;
    const int64_t begin = 1000003, n = 1237;  // odd start and length: vector body and tail
    std::vector<float> in(n), out(n, 7.0f);
    torch::manual_seed(5);
    const torch::Tensor r = torch::randn({n});
    for (int64_t j = 0; j < n; ++j) in[j] = r[j].item<float>();
    in[0] = NAN, in[1] = INFINITY, in[2] = -INFINITY, in[3] = -0.0f, in[n - 1] = NAN;
    counter_dropout_span(in.data(), out.data(), begin, n, seed, p);
    const uint32_t threshold = uint32_t(p * 4294967296.0);
    const float scale = float(1.0 / (1.0 - p));
    int64_t mismatched = 0, dropped = 0;
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t h =
          lowbias32(lowbias32(uint32_t(begin + j) ^ uint32_t(seed)) + uint32_t(seed >> 32));
      const float want = h >= threshold ? in[j] * scale : 0.0f;
      dropped += h < threshold;
      uint32_t a, b;
      std::memcpy(&a, &out[j], 4);
      std::memcpy(&b, &want, 4);
      mismatched += a != b && !(std::isnan(want) && std::isnan(out[j]));
    }
    CHECK(mismatched == 0);
    CHECK(dropped > n / 5);  // ~30 %
    CHECK(dropped < n * 2 / 5);
  }

  // Found by the bf16 benchmark: under autocast the fp32 kernels took the fp32 inputs and ran fp32
  // GEMMs, so run.dtype = "bf16" trained its FFN and attention in fp32 (and no faster).
  TEST_CASE(
      "under CPU bf16 autocast (run.dtype = \"bf16\") without a bf16 GEMM (--disable bf16) the "
      "fp32 "
      "kernels step aside for ATen's bf16 products") {
    torch::manual_seed(17);
    FeedForward ffn(16, 40, 0.0);
    ffn->train();
    const auto x = torch::randn({2, 5, 16});
    const auto w = torch::randn({24, 16}), b = torch::randn({24});
    const auto qkv = torch::randn({2, 5, 48});
    const auto h = torch::randn({2, 5, 16}), out = torch::randn({30, 16});
    // Off autocast every kernel applies (so the checks below can fail).
    REQUIRE(fused_ffn_applies(x, *ffn, 0.1, true));
    REQUIRE(fused_attention_applies(qkv, torch::Tensor(), 0.0));
    REQUIRE(projected_loss_applies(h, out));
    REQUIRE((fused_linear(x, w, b).scalar_type() == torch::kFloat));
    compat::AutocastGuard bf16(compat::autocast_to(false, at::kBFloat16));
    speed_levers().bf16_gemm = false;
    CHECK_FALSE(fused_ffn_applies(x, *ffn, 0.1, true));
    CHECK_FALSE(fused_attention_applies(qkv, torch::Tensor(), 0.0));
    CHECK(
        (fused_linear(x, w, b).scalar_type() == torch::kBFloat16));  // ATen's linear under autocast
    speed_levers().bf16_gemm = true;
    // With it, attention's per-head blocks take the fp32 q/k/v of the bf16 projections in fp32;
    // a bf16 input still goes to ATen. The loss's projection always does.
    CHECK(fused_attention_applies(qkv, torch::Tensor(), 0.0) ==
          (cpu::onednn_gemm_bf16() != nullptr));
    CHECK_FALSE(fused_attention_applies(qkv.to(torch::kBFloat16), torch::Tensor(), 0.0));
    CHECK_FALSE(projected_loss_applies(h, out));
  }

  TEST_CASE(
      "under CPU bf16 autocast the fused linear and FFN multiply bf16-rounded operands with fp32 "
      "accumulation") {
    if (!cpu::onednn_gemm_bf16()) {
      MESSAGE("no oneDNN bf16 GEMM runs here: the fused kernels step aside (test above)");
      return;
    }
    const auto r = [](const torch::Tensor& t) {
      return t.detach().to(torch::kBFloat16).to(torch::kFloat);
    };
    torch::manual_seed(19);
    // Linear: y = r(x)·r(W)ᵀ + b; dx = r(g)·r(W), dW = r(g)ᵀ·r(x), db = Σ g.
    auto x = torch::randn({3, 7, 16}).requires_grad_(true);
    auto w = torch::randn({24, 16}).requires_grad_(true);
    auto b = torch::randn({24}).requires_grad_(true);
    const auto g = torch::randn({3, 7, 24});
    torch::Tensor y;
    {
      compat::AutocastGuard bf16(compat::autocast_to(false, at::kBFloat16));
      y = fused_linear(x, w, b);
    }
    REQUIRE((y.scalar_type() == torch::kFloat));  // the fused kernel, not ATen's bf16 linear
    check_close(y.detach(), torch::matmul(r(x), r(w).t()) + b.detach(), 1e-5);
    y.backward(g);
    check_close(x.grad(), torch::matmul(r(g), r(w)), 1e-5);
    check_close(w.grad(), torch::matmul(r(g).reshape({-1, 24}).t(), r(x).reshape({-1, 16})), 1e-5);
    check_close(b.grad(), g.reshape({-1, 24}).sum(0), 1e-5);
    // FFN without dropout: y = r(ReLU(r(x)·r(W1)ᵀ + b1))·r(W2)ᵀ + b2; gradients within bf16's
    // rounding of the fp32 ones.
    FeedForward ffn(16, 40, 0.0);
    ffn->train();
    auto xf = torch::randn({2, 5, 16}).requires_grad_(true);
    const auto gf = torch::randn({2, 5, 16});
    torch::Tensor yf;
    {
      compat::AutocastGuard bf16(compat::autocast_to(false, at::kBFloat16));
      REQUIRE(fused_ffn_applies(xf, *ffn, 0.0, true));
      yf = fused_ffn_branch(xf, *ffn, 0.0, true);
    }
    const auto act =
        torch::relu(torch::matmul(r(xf), r(ffn->fc1->weight).t()) + ffn->fc1->bias.detach());
    check_close(yf.detach(),
                torch::matmul(r(act), r(ffn->fc2->weight).t()) + ffn->fc2->bias.detach(), 1e-5);
    yf.backward(gf);
    const std::vector<torch::Tensor> fused{xf.grad().clone(), ffn->fc1->weight.grad().clone(),
                                           ffn->fc2->weight.grad().clone()};
    ffn->zero_grad();
    xf.mutable_grad() = torch::Tensor();
    fused_ffn_branch(xf, *ffn, 0.0, true).backward(gf);  // fp32
    check_close(fused[0], xf.grad(), 3e-2);
    check_close(fused[1], ffn->fc1->weight.grad(), 3e-2);
    check_close(fused[2], ffn->fc2->weight.grad(), 3e-2);
  }

  TEST_CASE(
      "projected loss: the logits' label-smoothed loss, nll and gradients without the logits (pad "
      "rows)") {
    torch::manual_seed(13);
    const int64_t B = 3, T = 11, D = 16, V = 301;
    const int64_t pad = 0;
    auto h = torch::randn({B, T, D}).requires_grad_(true);
    auto w = (0.5 * torch::randn({V, D})).requires_grad_(true);
    auto target = torch::randint(1, V, {B, T}, torch::kLong);
    target.index_put_({0, torch::indexing::Slice(7, torch::indexing::None)},
                      pad);  // padded sentences
    target.index_put_({2, torch::indexing::Slice(2, torch::indexing::None)}, pad);
    REQUIRE(projected_loss_applies(h, w));
    for (double eps : {0.0, 0.1}) {
      CAPTURE(eps);
      std::vector<std::vector<torch::Tensor>> runs;
      for (bool fused : {true, false}) {
        h.mutable_grad() = torch::Tensor();
        w.mutable_grad() = torch::Tensor();
        LossSums s = fused ? projected_label_smoothed_loss(h, w, target, eps, pad)
                           : label_smoothed_loss(torch::linear(h, w), target, eps, pad);
        (s.loss * 0.37).backward();  // an upstream gradient other than 1
        runs.push_back({s.loss.detach(), s.nll.detach(), h.grad().clone(), w.grad().clone()});
      }
      for (size_t i = 0; i < runs[0].size(); ++i) {
        CAPTURE(i);  // loss, nll, dh, dW
        check_close(runs[0][i], runs[1][i], 1e-5);
      }
      // Pad rows get no gradient.
      CHECK(runs[0][2][0].narrow(0, 7, T - 7).abs().max().item<double>() == 0.0);
      // Without a graph (validation) the same loss.
      torch::NoGradGuard no_grad;
      LossSums v = projected_label_smoothed_loss(h, w, target, eps, pad);
      CHECK(v.loss.item<double>() == doctest::Approx(runs[0][0].item<double>()).epsilon(1e-6));
    }
  }

  // Issue 42.9: with a decoder fc1.weight of +Inf, eval and forward reported a finite nll (the
  // fused FFN's ReLU made NaN a 0) where the exported PyTorch model gave NaN.
  TEST_CASE("fused kernels propagate NaN and Inf as the unfused path does (values and gradients)") {
    torch::manual_seed(29);
    SUBCASE("FFN: fc1.weight +Inf in a row, an input NaN") {
      FeedForward ffn(16, 40, 0.0);
      ffn->train();
      {
        torch::NoGradGuard no_grad;
        ffn->fc1->weight[3].fill_(INFINITY);
      }
      auto x = torch::randn({2, 5, 16});
      x[1][2][7] = NAN;
      x.requires_grad_(true);
      const auto weight = torch::randn({2, 5, 16});
      REQUIRE(fused_ffn_applies(x, *ffn, 0.0, true));
      std::vector<std::vector<torch::Tensor>> runs;
      for (bool fused : {true, false}) {
        ffn->zero_grad();
        x.mutable_grad() = torch::Tensor();
        const auto y =
            fused ? fused_ffn_branch(x, *ffn, 0.0, true) : ffn->project(ffn->activation(x));
        (y * weight).sum().backward();
        runs.push_back({y.detach(), x.grad().clone(), ffn->fc1->weight.grad().clone(),
                        ffn->fc2->weight.grad().clone()});
      }
      CHECK(runs[1][0].isnan().any().item<bool>());  // the case is not vacuous
      for (size_t i = 0; i < runs[0].size(); ++i) {
        CAPTURE(i);  // output, dx, dW1, dW2
        check_same_nonfinite(runs[0][i], runs[1][i]);
      }
    }
    SUBCASE("linear: an input NaN, a weight -Inf") {
      auto x = torch::randn({3, 4, 16});
      x[0][1][2] = NAN;
      auto w = torch::randn({24, 16});
      w[5][0] = -INFINITY;
      x.requires_grad_(true), w.requires_grad_(true);
      auto b = torch::randn({24}).requires_grad_(true);
      const auto weight = torch::randn({3, 4, 24});
      std::vector<std::vector<torch::Tensor>> runs;
      for (bool fused : {true, false}) {
        for (auto* t : {&x, &w, &b}) t->mutable_grad() = torch::Tensor();
        speed_levers().fused_linear = fused;
        const auto y = fused_linear(x, w, b);
        (y * weight).sum().backward();
        runs.push_back({y.detach(), x.grad().clone(), w.grad().clone(), b.grad().clone()});
      }
      speed_levers().fused_linear = true;
      CHECK(runs[1][0].isnan().any().item<bool>());
      for (size_t i = 0; i < runs[0].size(); ++i) {
        CAPTURE(i);
        check_same_nonfinite(runs[0][i], runs[1][i]);
      }
    }
    SUBCASE("residual norm, LayerNorm and RMSNorm: a NaN and an Inf in x") {
      for (NormKind kind : {NormKind::LayerNorm, NormKind::RMSNorm}) {
        CAPTURE(to_string(kind));
        Norm ln(NormSpec::of(kind), 8);
        auto x = torch::randn({6, 8});
        x[1][3] = NAN;
        x[4][0] = INFINITY;
        x.requires_grad_(true);
        auto b = torch::randn({6, 8}).requires_grad_(true);
        const auto weight = torch::randn({6, 8});
        REQUIRE(fused_residual_norm_applies(x, b, *ln));
        std::vector<std::vector<torch::Tensor>> runs;
        for (bool fused : {true, false}) {
          ln->zero_grad();
          for (auto* t : {&x, &b}) t->mutable_grad() = torch::Tensor();
          const auto y = fused ? fused_residual_norm(x, b, 1.5, *ln) : ln->forward(x * 1.5 + b);
          (y * weight).sum().backward();
          runs.push_back(
              {y.detach(), x.grad().clone(), b.grad().clone(), ln->weight.grad().clone()});
        }
        CHECK(runs[1][0].isnan().any().item<bool>());
        for (size_t i = 0; i < runs[0].size(); ++i) {
          CAPTURE(i);
          check_same_nonfinite(runs[0][i], runs[1][i]);
        }
      }
    }
    SUBCASE("self-attention: a NaN in a key") {
      const int64_t B = 2, T = 5, H = 2, dh = 4;
      auto qkv = torch::randn({B, T, 3, H, dh});
      qkv[1][2][1][0][1] = NAN;
      qkv.requires_grad_(true);
      const auto weight = torch::randn({B, T, H * dh});
      REQUIRE(fused_attention_applies(qkv, torch::Tensor(), 0.0));
      const auto y = fused_self_attention(qkv, torch::Tensor(), 0.0);
      (y * weight).sum().backward();
      const auto fused_grad = qkv.grad().clone();
      auto qr = qkv.select(2, 0).detach().requires_grad_(true);
      auto kr = qkv.select(2, 1).detach().requires_grad_(true);
      auto vr = qkv.select(2, 2).detach().requires_grad_(true);
      const auto scores =
          torch::matmul(qr.transpose(1, 2), kr.transpose(1, 2).transpose(-1, -2)) / 2.0;
      const auto ref = torch::matmul(torch::softmax(scores, -1), vr.transpose(1, 2))
                           .transpose(1, 2)
                           .reshape({B, T, H * dh});
      (ref * weight).sum().backward();
      CHECK(ref.isnan().any().item<bool>());
      check_same_nonfinite(y.detach(), ref.detach());
      check_same_nonfinite(fused_grad.select(2, 0), qr.grad());
      check_same_nonfinite(fused_grad.select(2, 1), kr.grad());
      check_same_nonfinite(fused_grad.select(2, 2), vr.grad());
    }
    SUBCASE("projected loss: an Inf in a hidden state") {
      const int64_t B = 2, T = 4, D = 8, V = 50;
      auto h = torch::randn({B, T, D});
      h[0][1][3] = INFINITY;
      h.requires_grad_(true);
      auto w = torch::randn({V, D}).requires_grad_(true);
      const auto target = torch::randint(1, V, {B, T}, torch::kLong);
      REQUIRE(projected_loss_applies(h, w));
      std::vector<std::vector<torch::Tensor>> runs;
      for (bool fused : {true, false}) {
        h.mutable_grad() = torch::Tensor();
        w.mutable_grad() = torch::Tensor();
        LossSums s = fused ? projected_label_smoothed_loss(h, w, target, 0.1, 0)
                           : label_smoothed_loss(torch::linear(h, w), target, 0.1, 0);
        s.loss.backward();
        runs.push_back({s.loss.detach(), s.nll.detach(), h.grad().clone(), w.grad().clone()});
      }
      CHECK_FALSE(runs[1][0].isfinite().item<bool>());
      for (size_t i = 0; i < runs[0].size(); ++i) {
        CAPTURE(i);
        check_same_nonfinite(runs[0][i], runs[1][i]);
      }
    }
  }

  // Issue 43.5: the GPU path's operations, checked here through their host twins.
  TEST_CASE("rotary kernel (host twin): apply_rope's values and gradients, strided, three dtypes") {
    check_rope_kernel(torch::kCPU);
  }

  TEST_CASE(
      "the CUDA kernels' offsets: by hand, and 32-bit index arithmetic gives the 64-bit one") {
    // x [B=2, H=3, T=5, dh=8] as a transposed view (strides of [B, T, H, dh]) into contiguous
    // output.
    const kernels::RopeGeometry g{2, 3, 5, 8, {120, 8, 24, 1}, {120, 40, 8, 1}};
    REQUIRE(g.pairs() == 120);
    for (int64_t i = 0; i < g.pairs(); ++i) {
      const kernels::RopeOffsets a = kernels::rope_offsets(g, uint32_t(i)),
                                 b = kernels::rope_offsets(g, int64_t(i));
      REQUIRE((a.in1 == b.in1 && a.in2 == b.in2 && a.out1 == b.out1 && a.out2 == b.out2 &&
               a.table1 == b.table1 && a.table2 == b.table2));
    }
    // Pair 119: batch 1, head 2, time 4, channels 3 and 7.
    const kernels::RopeOffsets last = kernels::rope_offsets(g, uint32_t(119));
    CHECK(last.in1 == 120 + 2 * 8 + 4 * 24 + 3);
    CHECK(last.in2 == last.in1 + 4);
    CHECK(last.out1 == 120 + 2 * 40 + 4 * 8 + 3);
    CHECK(last.out2 == last.out1 + 4);
    CHECK(last.table1 == 4 * 8 + 3);
    CHECK(last.table2 == 4 * 8 + 7);
    const kernels::SwigluGeometry s{6, 5, 12};  // rows of 2·5 values, stride 12
    const kernels::SwigluOffsets o = kernels::swiglu_offsets(s, uint32_t(29));  // row 5, column 4
    CHECK(o.up == 5 * 12 + 4);
    CHECK(o.gate == 5 * 12 + 5 + 4);
    CHECK(o.out == 29);
    CHECK(kernels::fits_u32(int64_t(0xffffffff)));
    CHECK_FALSE(kernels::fits_u32(int64_t(1) << 32));
  }

  TEST_CASE("SwiGLU kernel (host twin): silu(gate)·up's values and gradients, three dtypes") {
    check_swiglu_kernel(torch::kCPU);
  }

  TEST_CASE("AdamW kernels: the CPU loop, the ATen ops and at::_fused_adamw_ (2.x) agree") {
    check_adamw_kernels(torch::kCPU);
  }

#if NORMLAB_TORCH_RMS_NORM
  TEST_CASE("RMSNorm through at::rms_norm (the GPU path) computes NormImpl's formula") {
    check_rms_norm_path(torch::kCPU);
  }
#endif

  TEST_CASE(
      "a fallback site builds its note once per variant, and again after the notes are "
      "forgotten") {
    forget_gpu_fallback_notes();
    static FallbackSite site;
    int built = 0;
    auto say = [&](uint32_t variant) {
      note_gpu_fallback(site, variant, [&] {
        ++built;
        return "test site, variant " + std::to_string(variant);
      });
    };
    for (int i = 0; i < 5; ++i) say(1);
    CHECK(built == 1);
    say(2);
    CHECK(built == 2);
    CHECK(take_gpu_fallback_notes() ==
          std::vector<std::string>{"test site, variant 1", "test site, variant 2"});
    say(2);
    CHECK(built == 2);
    forget_gpu_fallback_notes();  // a new process, as far as the notes go: said again
    say(2);
    CHECK(built == 3);
    CHECK(take_gpu_fallback_notes() == std::vector<std::string>{"test site, variant 2"});
  }

  // Issue 67.1: optim.z_loss in every loss kernel, model.final_logit_softcap in the blocked one,
  // against ATen's composition of the (capped) logits: loss, nll, Σlog²Z and both gradients.
  TEST_CASE("z-loss and the final soft-cap: the fused, projected and blocked losses equal ATen's") {
    torch::manual_seed(23);
    const int64_t B = 3, T = 7, D = 16, V = 97, pad = 0;
    const auto h = torch::randn({B, T, D}).requires_grad_(true);
    const auto w = torch::randn({V, D}).requires_grad_(true);
    auto target = torch::randint(1, V, {B, T}, torch::kLong);
    target.index_put_({1, torch::indexing::Slice(4, torch::indexing::None)}, pad);
    const bool lever = speed_levers().fused_loss;
    for (const double z_loss : {0.0, 0.02})
      for (const double cap : {0.0, 3.0})
        for (const int path : {0, 1, 2}) {  // fused logits' loss, projected (CPU), blocked (GPU's)
          if (path == 1 && cap > 0) continue;  // the projected kernel does not cap: callers route
          CAPTURE(z_loss);
          CAPTURE(cap);
          CAPTURE(path);
          std::vector<std::vector<torch::Tensor>> runs;
          for (const bool reference : {false, true}) {
            h.mutable_grad() = torch::Tensor();
            w.mutable_grad() = torch::Tensor();
            speed_levers().fused_loss = !reference;
            LossSums s;
            torch::Tensor logits = torch::linear(h, w);
            if (cap > 0) logits = soft_cap(logits, cap);
            if (reference || path == 0)
              s = label_smoothed_loss(logits, target, 0.1, pad, z_loss);
            else if (path == 1)
              s = projected_label_smoothed_loss(h, w, target, 0.1, pad, z_loss);
            else
              s = blocked_projected_loss(h, w, target, 0.1, pad, at::kFloat, 4, z_loss, cap);
            (s.loss * 0.37).backward();
            runs.push_back({s.loss.detach(), s.nll.detach(), s.z.detach(), h.grad().clone(),
                            w.grad().clone()});
          }
          for (size_t i = 0; i < runs[0].size(); ++i) {
            CAPTURE(i);  // loss, nll, z, dh, dW
            if (i == 2 && z_loss == 0) {
              CHECK(runs[0][i].item<double>() == 0.0);
              continue;
            }
            check_close(runs[0][i], runs[1][i], 1e-5);
          }
        }
    speed_levers().fused_loss = lever;
  }

  // ctest runs this suite three times: as the CPU allows, and with NORMLAB_CPU_ISA=avx2 and
  // =baseline, so every build of the elementwise kernels meets the references above on one machine.
  TEST_CASE("the kernels' build: the best this CPU executes, capped by NORMLAB_CPU_ISA") {
    const char* cap = std::getenv("NORMLAB_CPU_ISA");
    const KernelIsa best = best_kernel_isa();
    INFO("NORMLAB_CPU_ISA=" << (cap ? cap : "(unset)") << ", CPU: " << kernel_isa_name(best));
    if (!cap) CHECK(kernel_isa() == best);
    if (cap && std::strcmp(cap, "baseline") == 0) CHECK(kernel_isa() == KernelIsa::baseline);
    if (cap && std::strcmp(cap, "avx2") == 0)
      CHECK(kernel_isa() == std::min(KernelIsa::avx2, best));
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) CHECK(best >= KernelIsa::avx2);
    if (__builtin_cpu_supports("avx512f")) CHECK(best == KernelIsa::avx512);
#endif
    // What each value of the variable means: a cap, never more than the CPU has; anything else
    // is refused with the variable's name, the values it takes and the one it got.
    const std::string saved = cap ? cap : "";
    const auto with_env = [](const char* value) {
      ::setenv("NORMLAB_CPU_ISA", value, 1);
      return kernel_isa_from_env();
    };
    CHECK(with_env("avx512") == best);
    CHECK(with_env("avx2") == std::min(KernelIsa::avx2, best));
    CHECK(with_env("baseline") == KernelIsa::baseline);
    for (const char* bad : {"AVX2", "avx", "", "avx2 "}) {
      CAPTURE(bad);
      try {
        with_env(bad);
        FAIL("accepted");
      } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        CHECK(what.find("NORMLAB_CPU_ISA") != std::string::npos);
        CHECK(what.find("avx512, avx2 or baseline") != std::string::npos);
        CHECK(what.find(std::string("'") + bad + "'") != std::string::npos);
      }
    }
    // Shown escaped and short: a control character or a pasted screenful stays one short line.
    try {
      with_env("avx2\n\x1b[2J");
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("got 'avx2\\x0a\\x1b[2J'") != std::string::npos);
    }
    try {
      with_env(std::string(5000, 'a').c_str());
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("got '" + std::string(40, 'a') + "...'") !=
            std::string::npos);
      CHECK(std::string(e.what()).size() < 200);
    }
    if (cap)
      ::setenv("NORMLAB_CPU_ISA", saved.c_str(), 1);
    else
      ::unsetenv("NORMLAB_CPU_ISA");
    // Tests may switch builds, never to one the CPU lacks.
    const KernelIsa now = kernel_isa();
    set_kernel_isa(KernelIsa::baseline);
    CHECK(kernel_isa() == KernelIsa::baseline);
    if (best < KernelIsa::avx512)
      CHECK_THROWS_AS(set_kernel_isa(KernelIsa::avx512), std::invalid_argument);
    set_kernel_isa(now);
  }

}  // TEST_SUITE

}  // namespace normlab_test_fused_kernels
