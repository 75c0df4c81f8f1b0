// Every scheme: one encoder layer, one decoder layer and one LM layer against a reference written
// here from the equations in docs/schemes/ (same weights, eval mode, float32, 1e-5).
#include <cmath>
#include <functional>
#include <limits>

#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_scheme_equations {

using namespace normlab;
using torch::Tensor;

namespace {

constexpr double kTol = 1e-5;

Tensor ref_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  return torch::matmul(x, w.t()) + b;
}

Tensor ref_layer_norm(const Tensor& x, const Tensor& g, const Tensor& b) {
  auto mean = x.mean(-1, true);
  auto var = (x - mean).pow(2).mean(-1, true);
  return (x - mean) / torch::sqrt(var + 1e-5) * g + b;
}

// Reads the layer's parameters by their stable names and recomputes its pieces by hand.
struct Reference {
  TransformerLayerImpl& layer;
  int heads;
  Tensor self_mask, memory, memory_mask;

  Tensor P(const std::string& name) const {
    auto params = layer.named_parameters(true);
    const Tensor* t = params.find(name);
    REQUIRE_MESSAGE(t != nullptr, "layer has no parameter " << name);
    return *t;
  }
  Tensor lin(const std::string& prefix, const Tensor& x) const {
    return ref_linear(x, P(prefix + ".weight"), P(prefix + ".bias"));
  }
  Tensor attention(const std::string& p, const Tensor& x, const Tensor& kv,
                   const Tensor& mask) const {
    const int64_t B = x.size(0), Tq = x.size(1), Tk = kv.size(1), D = x.size(2), dh = D / heads;
    auto split = [&](const Tensor& t, int64_t T) {
      return t.view({B, T, heads, dh}).permute({0, 2, 1, 3});
    };
    auto q = split(lin(p + ".q_proj", x), Tq), k = split(lin(p + ".k_proj", kv), Tk),
         v = split(lin(p + ".v_proj", kv), Tk);
    auto scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(dh));
    if (mask.defined()) scores = scores + mask;
    auto o = torch::matmul(torch::softmax(scores, -1), v).permute({0, 2, 1, 3}).reshape({B, Tq, D});
    return lin(p + ".out_proj", o);
  }
  Tensor F(Sublayer s, const Tensor& h) const {
    switch (s) {
      case Sublayer::SelfAttn:
        return attention("self_attn", h, h, self_mask);
      case Sublayer::CrossAttn:
        return attention("cross_attn", h, memory, memory_mask);
      case Sublayer::FFN:
        return lin("ffn.fc2", torch::relu(lin("ffn.fc1", h)));
    }
    return {};
  }
  Tensor LN(Sublayer s, const Tensor& h) const {
    const std::string n = std::string(to_string(s)) + "_norm";
    return ref_layer_norm(h, P(n + ".weight"), P(n + ".bias"));
  }
  std::vector<Sublayer> sublayers() const {
    if (layer.geometry().has_cross_attn())
      return {Sublayer::SelfAttn, Sublayer::CrossAttn, Sublayer::FFN};
    return {Sublayer::SelfAttn, Sublayer::FFN};
  }
};

using RefFn = std::function<Tensor(const Reference&, const Tensor&)>;

enum class Kind { Encoder, Decoder, LM };

// Builds a model, perturbs every parameter of the chosen layer (so a wrong LayerNorm or a
// swapped projection shows), and compares the layer's output with `ref`.
void check_layer(const std::string& scheme, Kind kind, const RefFn& ref,
                 const std::map<std::string, ParamValue>& params = {},
                 const std::function<void(TransformerModelImpl&)>& prepare = {}) {
  torch::manual_seed(7);
  const int N = 3, M = 2, B = 3, T = 5, S = 4, D = 16;
  ModelConfig cfg = test::small_config(kind == Kind::LM ? Arch::LM : Arch::EncDec, N, M, D);
  TransformerModel model = test::make_model(scheme, cfg, params);
  model->eval();
  if (prepare) prepare(*model);
  TransformerStackImpl& stack = kind == Kind::Encoder ? *model->encoder : *model->decoder;
  TransformerLayerImpl& layer = stack.layer(1);
  {
    torch::NoGradGuard ng;
    for (auto& p : layer.parameters()) p.add_(torch::randn_like(p) * 0.1);
  }
  Reference r{layer, 2, {}, {}, {}};
  const LayerInputs in =
      test::layer_test_inputs(kind == Kind::Encoder, kind == Kind::Decoder, B, T, S, D);
  r.self_mask = in.self_mask;
  r.memory = in.memory;
  r.memory_mask = in.memory_mask;
  auto x = torch::randn({B, T, D});
  torch::NoGradGuard ng;
  auto got = layer.forward(x, in);
  auto want = ref(r, x);
  const double diff = test::max_abs_diff(got, want);
  INFO(scheme << " "
              << (kind == Kind::Encoder   ? "encoder"
                  : kind == Kind::Decoder ? "decoder"
                                          : "lm")
              << " layer: max |diff| = " << diff);
  CHECK(diff < kTol);
}

void check_all_kinds(const std::string& scheme, const std::function<RefFn(Kind)>& ref_for_kind,
                     const std::map<std::string, ParamValue>& params = {},
                     const std::function<void(TransformerModelImpl&)>& prepare = {}) {
  for (Kind k : {Kind::Encoder, Kind::Decoder, Kind::LM})
    check_layer(scheme, k, ref_for_kind(k), params, prepare);
}

}  // namespace

TEST_SUITE("scheme_equations") {
  TEST_CASE("post-ln: y = LN(x + F(x)) per sublayer") {
    check_all_kinds("post-ln", [](Kind) -> RefFn {
      return [](const Reference& r, const Tensor& x) {
        Tensor h = x;
        for (Sublayer s : r.sublayers()) h = r.LN(s, h + r.F(s, h));
        return h;
      };
    });
  }

  TEST_CASE("pre-ln: y = x + F(LN(x)) per sublayer, final LayerNorm per stack") {
    check_all_kinds("pre-ln", [](Kind) -> RefFn {
      return [](const Reference& r, const Tensor& x) {
        Tensor h = x;
        for (Sublayer s : r.sublayers()) h = h + r.F(s, r.LN(s, h));
        return h;
      };
    });
    auto model = test::make_model("pre-ln", test::small_config(Arch::EncDec, 2, 2));
    auto names = model->named_parameters().keys();
    CHECK(std::count(names.begin(), names.end(), "encoder.layer_norm.weight") == 1);
    CHECK(std::count(names.begin(), names.end(), "decoder.layer_norm.weight") == 1);
    auto post = test::make_model("post-ln", test::small_config(Arch::EncDec, 2, 2));
    auto post_names = post->named_parameters().keys();
    CHECK(std::count(post_names.begin(), post_names.end(), "encoder.layer_norm.weight") == 0);
  }

  TEST_CASE("deepnorm: y = LN(alpha*x + F(x)), alpha on the skip path") {
    // N=3, M=2 (see check_layer): alpha written out from DeepNet sec. III-C.
    const double enc = 0.81 * std::pow(std::pow(3.0, 4) * 2.0, 1.0 / 16),
                 dec = std::pow(3.0 * 2, 0.25), lm = std::pow(2.0 * 2, 0.25);
    check_all_kinds("deepnorm", [&](Kind k) -> RefFn {
      const double a = k == Kind::Encoder ? enc : k == Kind::Decoder ? dec : lm;
      return [a](const Reference& r, const Tensor& x) {
        Tensor h = x;
        for (Sublayer s : r.sublayers()) h = r.LN(s, a * h + r.F(s, h));
        return h;
      };
    });
  }

  TEST_CASE("branchnorm: y = LN(x + alpha_t*F(x)), alpha_t on the branch") {
    // T=1000, linear: the forward pass after 249 completed updates is update 250, alpha = 0.25.
    std::map<std::string, ParamValue> params{{"T", ParamValue::of_int(1000)}};
    check_all_kinds(
        "branchnorm",
        [](Kind) -> RefFn {
          return [](const Reference& r, const Tensor& x) {
            Tensor h = x;
            for (Sublayer s : r.sublayers()) h = r.LN(s, h + 0.25 * r.F(s, h));
            return h;
          };
        },
        params, [](TransformerModelImpl& m) { m.on_update(249); });
  }

  TEST_CASE("b2t: layer input added before the last LayerNorm") {
    check_all_kinds("b2t", [](Kind) -> RefFn {
      return [](const Reference& r, const Tensor& x) {
        Tensor h = r.LN(Sublayer::SelfAttn, x + r.F(Sublayer::SelfAttn, x));
        if (r.layer.geometry().has_cross_attn())
          h = r.LN(Sublayer::CrossAttn, h + r.F(Sublayer::CrossAttn, h));
        return r.LN(Sublayer::FFN, h + r.F(Sublayer::FFN, h) + x);
      };
    });
  }

  TEST_CASE("admin: y = LN(omega_i * x + F(x)) with a per-sublayer vector omega_i") {
    check_all_kinds("admin", [](Kind) -> RefFn {
      return [](const Reference& r, const Tensor& x) {
        Tensor h = x;
        for (Sublayer s : r.sublayers())
          h = r.LN(s, r.P(std::string(to_string(s)) + "_omega") * h + r.F(s, h));
        return h;
      };
    });
  }

  TEST_CASE("rezero: y = x + g*F(x), no LayerNorm") {
    check_all_kinds("rezero", [](Kind) -> RefFn {
      return [](const Reference& r, const Tensor& x) {
        Tensor h = x;
        for (Sublayer s : r.sublayers())
          h = h + r.P(std::string(to_string(s)) + "_gate") * r.F(s, h);
        return h;
      };
    });
    auto m = test::make_model("rezero", test::small_config(Arch::LM, 0, 2));
    CHECK(m->named_parameters()["decoder.layers.1.ffn_gate"].item<double>() ==
          0.0);  // g = 0 at init
  }

  TEST_CASE("sandwich-ln: y = x + LN_out(F(LN_in(x))), final LayerNorm") {
    check_all_kinds("sandwich-ln", [](Kind) -> RefFn {
      return [](const Reference& r, const Tensor& x) {
        Tensor h = x;
        for (Sublayer s : r.sublayers()) {
          const std::string out = std::string(to_string(s)) + "_out_norm";
          h = h + ref_layer_norm(r.F(s, r.LN(s, h)), r.P(out + ".weight"), r.P(out + ".bias"));
        }
        return h;
      };
    });
  }

  TEST_CASE("ds-init and post-ln-init compute Post-LN") {
    for (const char* scheme : {"ds-init", "post-ln-init"})
      check_all_kinds(scheme, [](Kind) -> RefFn {
        return [](const Reference& r, const Tensor& x) {
          Tensor h = x;
          for (Sublayer s : r.sublayers()) h = r.LN(s, h + r.F(s, h));
          return h;
        };
      });
  }

  TEST_CASE("masks: key padding and causal masks are additive 0/-inf") {
    auto tokens = torch::tensor({{5, 6, 0}, {7, 0, 0}}, torch::kLong);
    auto m = key_padding_mask(tokens, 0);
    CHECK(m.sizes() == torch::IntArrayRef({2, 1, 1, 3}));
    CHECK(m[0][0][0][1].item<float>() == 0.0f);
    CHECK(std::isinf(m[0][0][0][2].item<float>()));
    CHECK(std::isinf(m[1][0][0][1].item<float>()));
    auto c = causal_mask(3, torch::TensorOptions());
    CHECK(c[0][0][0][0].item<float>() == 0.0f);
    CHECK(std::isinf(c[0][0][0][1].item<float>()));
    CHECK(c[0][0][2][1].item<float>() == 0.0f);
  }

}  // TEST_SUITE

}  // namespace normlab_test_scheme_equations
