// The SDK's norm kinds (core/src/model/norm.cpp) against hand computations, the manifest's
// scheme.norm, and norms inside a sublayer (BranchPoint).
#include <cmath>
#include <fstream>

#include "normlab/manifest/experiment.h"
#include "normlab/model/attention.h"
#include "normlab/model/norm.h"
#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_norms {

using namespace normlab;
using torch::Tensor;

TEST_SUITE_BEGIN("norms");

namespace {

Tensor row(std::vector<float> v) { return torch::tensor(v).view({1, int64_t(v.size())}); }

void check_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-4) {
  REQUIRE(got.numel() == int64_t(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    CHECK(got.flatten()[int64_t(i)].item<double>() == doctest::Approx(want[i]).epsilon(tol));
}

}  // namespace

TEST_CASE("rmsnorm: g * a / RMS(a), eps inside the root, no bias (docs/schemes/norms.md)") {
  NormSpec spec = NormSpec::of(NormKind::RMSNorm);
  spec.eps = 0;
  Norm n(spec, 2);
  CHECK(n->bias.defined() == false);
  CHECK(n->named_parameters().size() == 1);
  // a = (3, 4): mean(a²) = 12.5, RMS = 3.5355 → (0.8485, 1.1314).
  check_close(n(row({3, 4})), {0.848528, 1.131371});
  spec.eps = 1.0;  // inside the root: 3 / sqrt(12.5 + 1)
  Norm m(spec, 2);
  check_close(m(row({3, 4})), {3 / std::sqrt(13.5), 4 / std::sqrt(13.5)});
}

TEST_CASE("layernorm: the previous parameter names and values") {
  Norm n(NormSpec::of(NormKind::LayerNorm), 3);
  CHECK(n->named_parameters().contains("weight"));
  CHECK(n->named_parameters().contains("bias"));
  // (1, 2, 6): mean 3, var 14/3.
  const double sd = std::sqrt(14.0 / 3 + 1e-5);
  check_close(n(row({1, 2, 6})), {-2 / sd, -1 / sd, 3 / sd});
}

TEST_CASE("scalenorm: one scalar g starting at sqrt(d), eps clamps the length") {
  Norm n(NormSpec::of(NormKind::ScaleNorm), 16);
  REQUIRE(n->weight.numel() == 1);
  CHECK(n->weight.item<double>() == doctest::Approx(4.0));
  // A vector of RMS 1 maps to itself at init (docs/schemes/norms.md).
  check_close(n(torch::ones({1, 16})), std::vector<double>(16, 1.0));
  Norm m(NormSpec::of(NormKind::ScaleNorm), 2);
  check_close(m(row({3, 4})), {std::sqrt(2.0) * 0.6, std::sqrt(2.0) * 0.8});
  check_close(m(row({0, 0})), {0, 0});  // clamped, not a division by zero
}

TEST_CASE("dyt: gamma * tanh(alpha * x) + beta, alpha0 = 0.5 (docs/schemes/norms.md)") {
  Norm n(NormSpec::of(NormKind::DyT), 3);
  REQUIRE(n->alpha.numel() == 1);
  CHECK(n->alpha.item<double>() == doctest::Approx(0.5));
  check_close(n(row({2, -1, 0.1f})), {0.761594, -0.462117, 0.049958});
  NormSpec spec = NormSpec::of(NormKind::DyT);
  spec.dyt_alpha0 = 0.2;
  Norm m(spec, 1);
  check_close(m(row({2})), {std::tanh(0.4)});
}

TEST_CASE(
    "l2 with a scaled gain: stored at gain_scale, acting as gain_init; out_scale multiplies") {
  NormSpec spec = NormSpec::of(NormKind::L2);
  spec.affine = true;
  spec.gain_init = 1.0;
  spec.gain_scale = 0.25;
  spec.out_scale = 8.0;
  Norm n(spec, 2);
  CHECK(n->weight[0].item<double>() == doctest::Approx(0.25));
  check_close(n(row({3, 4})), {8 * 0.6, 8 * 0.8});
  // The effective gain is weight * 4: its gradient is 4 times that of a plain gain.
  auto y = n(row({3, 4})).sum();
  y.backward();
  check_close(n->weight.grad(), {8 * 0.6 * 4, 8 * 0.8 * 4});
}

TEST_CASE("none: identity without parameters") {
  Norm n(NormSpec::of(NormKind::None), 4);
  CHECK(n->parameters().empty());
  auto x = torch::randn({2, 4});
  CHECK(torch::equal(n(x), x));
}

TEST_CASE("scheme.norm = rmsnorm: every norm a scheme places, final norm included, is an RMSNorm") {
  for (const std::string scheme : {"post-ln", "pre-ln", "deepnorm", "b2t"}) {
    CAPTURE(scheme);
    ModelConfig cfg = test::small_config(Arch::EncDec, 2, 2);
    cfg.norm = NormSpec::of(NormKind::RMSNorm);
    TransformerModel model = test::make_model(scheme, cfg);
    int norms = 0;
    for (const auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      const bool is_norm =
          name.find("_norm.") != std::string::npos || name.find("layer_norm.") != std::string::npos;
      if (!is_norm) continue;
      ++norms;
      CHECK_MESSAGE(name.substr(name.size() - 7) == ".weight",
                    name << ": an RMSNorm has a gain only");
    }
    CHECK(norms > 0);
    // The same weights with LayerNorm give another output: the kind really changed.
    ModelConfig ln_cfg = cfg;
    ln_cfg.norm = NormSpec::of(NormKind::LayerNorm);
    torch::manual_seed(1);
    TransformerModel a = test::make_model(scheme, cfg);
    torch::manual_seed(1);
    TransformerModel b = test::make_model(scheme, ln_cfg);
    a->eval();
    b->eval();
    auto src = torch::randint(4, 50, {2, 5}), tgt = torch::randint(4, 50, {2, 4});
    torch::NoGradGuard ng;
    CHECK(test::max_abs_diff(a->forward(src, tgt), b->forward(src, tgt)) > 1e-3);
  }
}

TEST_CASE("scheme.norm in a manifest: parsed, and a wrong kind names file, key and choices") {
  const auto dir = std::filesystem::temp_directory_path() / "normlab_test_norms";
  std::filesystem::create_directories(dir);
  const auto good = dir / "rms.toml";
  std::ofstream(good) << "[scheme]\nname = \"pre-ln\"\nnorm = \"rmsnorm\"\nnorm_eps = 1e-6\n";
  ExperimentSpec spec = load_manifest(good.string(), {}, &test::builtin_registry());
  CHECK(spec.scheme.norm == "rmsnorm");
  CHECK(spec.scheme.norm_eps == doctest::Approx(1e-6));
  CHECK(spec.scheme.params.count("norm") == 0);  // a core key, not a scheme parameter
  const auto bad = dir / "bad.toml";
  std::ofstream(bad) << "[scheme]\nname = \"pre-ln\"\nnorm = \"batchnorm\"\n";
  try {
    load_manifest(bad.string(), {}, &test::builtin_registry());
    FAIL("no error for norm = batchnorm");
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    CHECK(msg.find("bad.toml:3") != std::string::npos);
    CHECK(msg.find("norm") != std::string::npos);
    CHECK(msg.find("rmsnorm") != std::string::npos);
  }
}

TEST_CASE("branch norms: q/k/v per head and before out_proj, applied inside attention") {
  torch::manual_seed(3);
  const int64_t B = 2, T = 3, D = 8, H = 2, dh = D / H;
  MultiheadAttention attn(D, H, 0.0);
  NormSpec rms = NormSpec::of(NormKind::RMSNorm);
  attn->add_norm(BranchPoint::Query, rms);
  attn->add_norm(BranchPoint::Key, rms);
  attn->add_norm(BranchPoint::Value, NormSpec::of(NormKind::LayerNorm));
  attn->add_norm(BranchPoint::AttnInner, NormSpec::of(NormKind::LayerNorm));
  CHECK_THROWS(attn->add_norm(BranchPoint::Query, rms));  // one norm per point
  {
    torch::NoGradGuard ng;
    for (auto& p : attn->parameters()) p.add_(torch::randn_like(p) * 0.1);
  }
  CHECK(attn->named_parameters().contains("q_norm.weight"));
  CHECK(attn->q_norm->weight.numel() == dh);
  CHECK(attn->inner_norm->weight.numel() == D);
  attn->eval();
  auto x = torch::randn({B, T, D});
  torch::NoGradGuard ng;
  auto lin = [](const Projection& l, const Tensor& t) {
    return torch::matmul(t, l->weight.t()) + l->bias;
  };
  auto heads = [&](const Tensor& t) { return t.view({B, T, H, dh}).permute({0, 2, 1, 3}); };
  auto rmsn = [](const Tensor& t, const Tensor& g) {
    return t / torch::sqrt(t.pow(2).mean(-1, true) + 1e-5) * g;
  };
  auto lnorm = [](const Tensor& t, const Tensor& g, const Tensor& b) {
    auto m = t.mean(-1, true);
    return (t - m) / torch::sqrt((t - m).pow(2).mean(-1, true) + 1e-5) * g + b;
  };
  auto q = rmsn(heads(lin(attn->q_proj, x)), attn->q_norm->weight);
  auto k = rmsn(heads(lin(attn->k_proj, x)), attn->k_norm->weight);
  auto v = lnorm(heads(lin(attn->v_proj, x)), attn->v_norm->weight, attn->v_norm->bias);
  auto ctx =
      torch::matmul(
          torch::softmax(torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(dh)), -1), v)
          .permute({0, 2, 1, 3})
          .reshape({B, T, D});
  auto want = lin(attn->out_proj, lnorm(ctx, attn->inner_norm->weight, attn->inner_norm->bias));
  CHECK(test::max_abs_diff(attn->forward(x, x, {}, true), want) < 1e-5);
}

TEST_SUITE_END();

}  // namespace normlab_test_norms
