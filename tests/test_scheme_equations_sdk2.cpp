// The SDK 2 schemes (and Post-LN / Pre-LN with RMSNorm): one encoder layer, one decoder layer and
// one LM layer against a reference written here from the equations in each plugin's header and
// docs/schemes/ (same weights, eval mode, float32, 1e-5), plus their constants.
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "normlab/sdk/init.h"
#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_scheme_equations_sdk2 {

using namespace normlab;
using torch::Tensor;

namespace {

constexpr double kTol = 1e-5;
constexpr double kEps = 1e-5;  // NormSpec's default ε

Tensor ref_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  return torch::matmul(x, w.t()) + b;
}

// Reads the layer's parameters by their stable names and recomputes its pieces by hand. Every norm
// the reference applies is recorded, so a test also fails when the layer has a norm the equations
// do not (or lacks one they need).
struct Reference {
  TransformerLayerImpl& layer;
  int heads;
  NormKind kind;  // the kind of every norm of this layer
  std::set<std::string>
      branch_norms;  // in-branch norms the scheme declares, e.g. "self_attn.q_norm"
  Tensor self_mask, memory, memory_mask;
  mutable std::set<std::string> used;

  bool has(const std::string& name) const {
    return layer.named_parameters(true).find(name) != nullptr;
  }
  Tensor P(const std::string& name) const {
    auto params = layer.named_parameters(true);
    const Tensor* t = params.find(name);
    REQUIRE_MESSAGE(t != nullptr, "layer has no parameter " << name);
    return *t;
  }
  Tensor lin(const std::string& prefix, const Tensor& x) const {
    return ref_linear(x, P(prefix + ".weight"), P(prefix + ".bias"));
  }

  // The norm registered as `name`, over the last dim of x.
  Tensor norm(const std::string& name, const Tensor& x) const {
    used.insert(name);
    const Tensor g = P(name + ".weight");
    switch (kind) {
      case NormKind::LayerNorm: {
        auto mean = x.mean(-1, true);
        auto var = (x - mean).pow(2).mean(-1, true);
        return (x - mean) / torch::sqrt(var + kEps) * g + P(name + ".bias");
      }
      case NormKind::RMSNorm:
        CHECK_MESSAGE(!has(name + ".bias"), name << ": RMSNorm has no bias");
        return x * torch::rsqrt(x.pow(2).mean(-1, true) + kEps) * g;
      case NormKind::DyT:
        return torch::tanh(P(name + ".alpha") * x) * g + P(name + ".bias");
      default:
        FAIL("no reference for norm kind " << to_string(kind));
    }
    return {};
  }
  Tensor N(Sublayer s, const Tensor& x) const {
    return norm(std::string(to_string(s)) + "_norm", x);
  }
  bool branch(const std::string& name) const { return branch_norms.count(name) > 0; }

  Tensor attention(const std::string& p, const Tensor& x, const Tensor& kv,
                   const Tensor& mask) const {
    const int64_t B = x.size(0), Tq = x.size(1), Tk = kv.size(1), D = x.size(2), dh = D / heads;
    auto split = [&](const Tensor& t, int64_t T) {
      return t.view({B, T, heads, dh}).permute({0, 2, 1, 3});
    };
    auto q = split(lin(p + ".q_proj", x), Tq), k = split(lin(p + ".k_proj", kv), Tk),
         v = split(lin(p + ".v_proj", kv), Tk);
    // Per head, over head_dim.
    if (branch(p + ".q_norm")) q = norm(p + ".q_norm", q);
    if (branch(p + ".k_norm")) k = norm(p + ".k_norm", k);
    if (branch(p + ".v_norm")) v = norm(p + ".v_norm", v);
    auto scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(dh));
    if (mask.defined()) scores = scores + mask;
    auto o = torch::matmul(torch::softmax(scores, -1), v).permute({0, 2, 1, 3}).reshape({B, Tq, D});
    if (branch(p + ".inner_norm")) o = norm(p + ".inner_norm", o);  // concatenated heads
    return lin(p + ".out_proj", o);
  }
  Tensor F(Sublayer s, const Tensor& h) const {
    switch (s) {
      case Sublayer::SelfAttn:
        return attention("self_attn", h, h, self_mask);
      case Sublayer::CrossAttn:
        return attention("cross_attn", h, memory, memory_mask);
      case Sublayer::FFN: {
        auto a = torch::relu(lin("ffn.fc1", h));
        if (branch("ffn.inner_norm")) a = norm("ffn.inner_norm", a);
        return lin("ffn.fc2", a);
      }
    }
    return {};
  }
  std::vector<Sublayer> sublayers() const {
    if (layer.geometry().has_cross_attn())
      return {Sublayer::SelfAttn, Sublayer::CrossAttn, Sublayer::FFN};
    return {Sublayer::SelfAttn, Sublayer::FFN};
  }
  int index() const { return layer.geometry().index; }
};

// The norms a layer has: its parameters named *norm*.{weight,bias,alpha}, without the suffix.
std::set<std::string> layer_norms(TransformerLayerImpl& layer) {
  std::set<std::string> out;
  for (const auto& item : layer.named_parameters(true)) {
    const std::string& n = item.key();
    const auto dot = n.rfind('.');
    if (n.find("norm") != std::string::npos && dot != std::string::npos)
      out.insert(n.substr(0, dot));
  }
  return out;
}

using RefFn = std::function<Tensor(Reference&, const Tensor&)>;

enum class Kind { Encoder, Decoder, LM };
const char* to_string(Kind k) {
  return k == Kind::Encoder ? "encoder" : k == Kind::Decoder ? "decoder" : "lm";
}

struct Case {
  std::map<std::string, ParamValue> params;
  NormKind norm = NormKind::LayerNorm;             // the manifest's `scheme.norm`
  NormKind layer_norm_kind = NormKind::LayerNorm;  // what the reference computes for every norm
  std::set<std::string> branch_norms;
  std::set<std::string> branch_norms_decoder;  // added in encoder-decoder decoder layers (CA)
  size_t layer = 1;
};

// Builds a model (N=3, M=2, d=16, 2 heads), perturbs every parameter of the chosen layer (so a
// wrong norm or a swapped projection shows), and compares the layer's output with `ref`.
void check_layer(const std::string& scheme, Kind kind, const RefFn& ref, const Case& c) {
  torch::manual_seed(7);
  const int N = 3, M = 2, B = 3, T = 5, S = 4, D = 16;
  ModelConfig cfg = test::small_config(kind == Kind::LM ? Arch::LM : Arch::EncDec, N, M, D);
  cfg.norm = NormSpec::of(c.norm);
  TransformerModel model = test::make_model(scheme, cfg, c.params);
  model->eval();
  TransformerStackImpl& stack = kind == Kind::Encoder ? *model->encoder : *model->decoder;
  TransformerLayerImpl& layer = stack.layer(c.layer);
  {
    torch::NoGradGuard ng;
    for (auto& p : layer.parameters()) p.add_(torch::randn_like(p) * 0.1);
  }
  Reference r{layer, 2, c.layer_norm_kind, c.branch_norms, {}, {}, {}, {}};
  if (kind == Kind::Decoder)
    r.branch_norms.insert(c.branch_norms_decoder.begin(), c.branch_norms_decoder.end());
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
  INFO(scheme << " " << to_string(kind) << " layer " << c.layer << ": max |diff| = " << diff);
  CHECK(diff < kTol);
  CHECK(r.used == layer_norms(layer));
}

void check_all_kinds(const std::string& scheme, const std::function<RefFn(Kind)>& ref_for_kind,
                     const Case& c = {}) {
  for (Kind k : {Kind::Encoder, Kind::Decoder, Kind::LM})
    check_layer(scheme, k, ref_for_kind(k), c);
}

RefFn post_ln_ref() {
  return [](Reference& r, const Tensor& x) {
    Tensor h = x;
    for (Sublayer s : r.sublayers()) h = r.N(s, h + r.F(s, h));
    return h;
  };
}
RefFn pre_ln_ref() {
  return [](Reference& r, const Tensor& x) {
    Tensor h = x;
    for (Sublayer s : r.sublayers()) h = h + r.F(s, r.N(s, h));
    return h;
  };
}

ModelGeometry geometry(Arch arch, int N, int M) {
  return ModelGeometry{arch, arch == Arch::LM ? 0 : N, M, 16, 2, 32};
}

double derived(const std::string& scheme, const ModelGeometry& g, const std::string& name,
               const std::string& where, const std::map<std::string, ParamValue>& params = {}) {
  auto s = test::builtin_registry().create(scheme, params, g);
  for (const auto& d : s.scheme->derive())
    if (d.name == name && d.where == where) return d.value;
  FAIL("scheme " << scheme << " derives no " << name << " @ " << where);
  return 0;
}

bool has_param(TransformerModelImpl& m, const std::string& name) {
  return m.named_parameters().find(name) != nullptr;
}

double xavier_std(const Tensor& w, double gain) {
  return gain * std::sqrt(2.0 / double(w.size(0) + w.size(1)));
}

}  // namespace

TEST_SUITE("scheme_equations_sdk2") {
  TEST_CASE("post-ln with scheme.norm = rmsnorm: y = RMSNorm(x + F(x)), no bias") {
    Case c;
    c.norm = c.layer_norm_kind = NormKind::RMSNorm;
    check_all_kinds(
        "post-ln", [](Kind) { return post_ln_ref(); }, c);
  }

  TEST_CASE("pre-ln with scheme.norm = rmsnorm: y = x + F(RMSNorm(x)), final RMSNorm") {
    Case c;
    c.norm = c.layer_norm_kind = NormKind::RMSNorm;
    check_all_kinds(
        "pre-ln", [](Kind) { return pre_ln_ref(); }, c);
    ModelConfig cfg = test::small_config(Arch::EncDec, 2, 2);
    cfg.norm = NormSpec::of(NormKind::RMSNorm);
    auto model = test::make_model("pre-ln", cfg);
    CHECK(has_param(*model, "decoder.layer_norm.weight"));
    CHECK_FALSE(has_param(*model, "decoder.layer_norm.bias"));
  }

  TEST_CASE("peri-ln: y = x + Norm_out(F(Norm_in(x))), final norm") {
    auto ref = [](Kind) -> RefFn {
      return [](Reference& r, const Tensor& x) {
        Tensor h = x;
        for (Sublayer s : r.sublayers())
          h = h + r.norm(std::string(to_string(s)) + "_out_norm", r.F(s, r.N(s, h)));
        return h;
      };
    };
    check_all_kinds("peri-ln", ref);
    Case rms;
    rms.norm = rms.layer_norm_kind = NormKind::RMSNorm;
    check_all_kinds("peri-ln", ref, rms);
    auto off = test::make_model("peri-ln", test::small_config(Arch::EncDec, 2, 2));
    CHECK(has_param(*off, "encoder.layer_norm.weight"));
    CHECK(has_param(*off, "decoder.layer_norm.weight"));
    CHECK_FALSE(has_param(*off, "decoder.embed_norm.weight"));
  }

  TEST_CASE("peri-ln embedding_norm: layer 1 reads Norm(embedding)") {
    // With the embedding norm's γ = β = 0 every position enters layer 1 as 0, so a causal LM's
    // logits no longer depend on the tokens; without the flag they do.
    auto logits_differ = [](bool flag) {
      torch::manual_seed(3);
      auto model = test::make_model("peri-ln", test::small_config(Arch::LM, 0, 2),
                                    {{"embedding_norm", ParamValue::of_bool(flag)}});
      model->eval();
      CHECK(has_param(*model, "decoder.embed_norm.weight") == flag);
      torch::NoGradGuard ng;
      if (flag)
        for (const char* p : {"decoder.embed_norm.weight", "decoder.embed_norm.bias"})
          model->named_parameters()[p].zero_();
      auto a = model->forward_lm(torch::tensor({{5, 6, 7}}, torch::kLong));
      auto b = model->forward_lm(torch::tensor({{9, 12, 20}}, torch::kLong));
      return test::max_abs_diff(a, b) > 1e-4;
    };
    CHECK(logits_differ(false));
    CHECK_FALSE(logits_differ(true));
  }

  TEST_CASE("reordered-norm (OLMo 2): y = x + Norm(F(x)), no input norm, final norm") {
    auto ref = [](Kind) -> RefFn {
      return [](Reference& r, const Tensor& x) {
        Tensor h = x;
        for (Sublayer s : r.sublayers())
          h = h + r.norm(std::string(to_string(s)) + "_out_norm", r.F(s, h));
        return h;
      };
    };
    check_all_kinds("reordered-norm", ref);
    Case rms;  // OLMo 2's kind
    rms.norm = rms.layer_norm_kind = NormKind::RMSNorm;
    check_all_kinds("reordered-norm", ref, rms);
    auto m = test::make_model("reordered-norm", test::small_config(Arch::EncDec, 2, 2));
    CHECK(has_param(*m, "encoder.layer_norm.weight"));
    CHECK(has_param(*m, "decoder.layer_norm.weight"));
  }

  TEST_CASE("reordered-norm on the llama body: the core's rotary attention and SwiGLU as F") {
    // The wiring by hand around the layer's own branches (tested against their equations in suite
    // llama), RMSNorm by hand: x + RMSNorm(SA(x)), then + RMSNorm(SwiGLU(h)); a final RMSNorm.
    torch::manual_seed(8);
    ModelConfig cfg = test::small_config(Arch::LM, 0, 2, /*d=*/16, /*heads=*/4, /*ffn=*/24);
    cfg.family = Family::Llama;
    cfg.kv_heads = 2;
    cfg.norm = NormSpec::of(NormKind::RMSNorm);
    TransformerModel model = test::make_model("reordered-norm", cfg);
    model->eval();
    TransformerLayerImpl& layer = model->decoder->layer(1);
    torch::NoGradGuard ng;
    for (auto& p : layer.parameters()) p.add_(torch::randn_like(p) * 0.1);
    Reference r{layer, 4, NormKind::RMSNorm, {}, {}, {}, {}, {}};
    const LayerInputs in = test::layer_test_inputs(false, false, 3, 5, 4, 16);
    const Tensor x = torch::randn({3, 5, 16});
    const Tensor h = x + r.norm("self_attn_out_norm",
                                layer.self_attn->forward(x, x, in.self_mask, true, in.self_causal));
    const Tensor want = h + r.norm("ffn_out_norm", layer.ffn->forward(h));
    CHECK(test::max_abs_diff(layer.forward(x, in), want) < kTol);
    CHECK(r.used == layer_norms(layer));
    CHECK(has_param(*model, "decoder.layer_norm.weight"));
    CHECK_FALSE(has_param(*model, "decoder.layers.0.self_attn_norm.weight"));
  }

  TEST_CASE("dyt: y = x + F(DyT(x)), DyT = g*tanh(alpha*x) + b, per-position alpha0") {
    Case c;
    c.layer_norm_kind = NormKind::DyT;
    c.norm = NormKind::RMSNorm;  // scheme.norm does not apply: every norm is a DyT
    check_all_kinds(
        "dyt", [](Kind) { return pre_ln_ref(); }, c);

    auto alpha = [](TransformerModelImpl& m, const std::string& name) {
      return m.named_parameters()[name + ".alpha"].item<double>();
    };
    auto def = test::make_model("dyt", test::small_config(Arch::EncDec, 2, 2));
    for (const char* n : {"encoder.layers.0.self_attn_norm", "decoder.layers.1.cross_attn_norm",
                          "decoder.layers.1.ffn_norm", "encoder.layer_norm", "decoder.layer_norm"})
      CHECK(alpha(*def, n) == doctest::Approx(0.5));  // the paper's default α₀
    auto llm = test::make_model("dyt", test::small_config(Arch::EncDec, 2, 2),
                                {{"alpha0_attn", ParamValue::of_float(0.8)},
                                 {"alpha0_ffn", ParamValue::of_float(0.2)},
                                 {"alpha0_final", ParamValue::of_float(0.3)}});
    CHECK(alpha(*llm, "encoder.layers.1.self_attn_norm") == doctest::Approx(0.8));
    CHECK(alpha(*llm, "decoder.layers.0.cross_attn_norm") == doctest::Approx(0.8));
    CHECK(alpha(*llm, "decoder.layers.0.ffn_norm") == doctest::Approx(0.2));
    CHECK(alpha(*llm, "encoder.layer_norm") == doctest::Approx(0.3));
    CHECK(alpha(*llm, "decoder.layer_norm") == doctest::Approx(0.3));
    CHECK(llm->named_parameters()["decoder.layer_norm.weight"].sum().item<double>() ==
          doctest::Approx(16));
    CHECK(llm->named_parameters()["decoder.layer_norm.bias"].abs().sum().item<double>() == 0.0);
  }

  TEST_CASE("dyt: the example of docs/schemes/dyt.md, (2, -1, 0.1) -> (0.7616, -0.4621, 0.05)") {
    // An LM layer whose attention branch is zero and whose FFN is the identity on its input
    // (fc1 = [I; -I], fc2 = [I, -I]: relu(u) - relu(-u) = u), so y - x = DyT_ffn(x) at init.
    auto model = test::make_model(
        "dyt", test::small_config(Arch::LM, 0, 1, /*d=*/3, /*heads=*/1, /*ffn=*/6));
    model->eval();
    torch::NoGradGuard ng;
    TransformerLayerImpl& layer = model->decoder->layer(0);
    auto eye = torch::eye(3);
    for (auto& item : layer.named_parameters(true)) {
      const std::string& n = item.key();
      if (n.rfind("self_attn.out_proj", 0) == 0 || n.rfind("ffn.", 0) == 0) item.value().zero_();
    }
    layer.named_parameters(true)["ffn.fc1.weight"].copy_(torch::cat({eye, -eye}, 0));
    layer.named_parameters(true)["ffn.fc2.weight"].copy_(torch::cat({eye, -eye}, 1));
    auto x = torch::tensor({2.0f, -1.0f, 0.1f}).view({1, 1, 3});
    auto y = layer.forward(x, LayerInputs{});
    auto want = torch::tensor({0.7616f, -0.4621f, 0.0500f}).view({1, 1, 3});
    CHECK(test::max_abs_diff(y - x, want) < 1e-4);
  }

  TEST_CASE("mix-ln: Post-LN in layers l <= floor(alpha*L), Pre-LN above") {
    // α = 0.25 with N = 3, M = 2: k = 0 everywhere, layer 2 (index 1) Pre-LN.
    check_all_kinds("mix-ln", [](Kind) { return pre_ln_ref(); });
    // α = 0.7: encoder k = floor(2.1) = 2 → layer 2 Post-LN; decoder/LM k = floor(1.4) = 1 →
    // Pre-LN.
    Case c;
    c.params = {{"alpha", ParamValue::of_float(0.7)}};
    check_all_kinds(
        "mix-ln", [](Kind k) { return k == Kind::Encoder ? post_ln_ref() : pre_ln_ref(); }, c);
    // … and layer 1 is Post-LN in every stack.
    c.layer = 0;
    check_all_kinds(
        "mix-ln", [](Kind) { return post_ln_ref(); }, c);
    // With RMSNorm.
    c.layer = 1;
    c.norm = c.layer_norm_kind = NormKind::RMSNorm;
    check_all_kinds(
        "mix-ln", [](Kind k) { return k == Kind::Encoder ? post_ln_ref() : pre_ln_ref(); }, c);
    auto m = test::make_model("mix-ln", test::small_config(Arch::LM, 0, 2));
    CHECK(has_param(*m, "decoder.layer_norm.weight"));  // final norm always
  }

  TEST_CASE("ln-scaling: y = x + F(Norm(x)/sqrt(l)), l 1-based in its stack") {
    for (size_t layer : {0, 1, 2}) {
      Case c;
      c.layer = layer;
      auto ref = [](Kind) -> RefFn {
        return [](Reference& r, const Tensor& x) {
          const double scale = 1.0 / std::sqrt(double(r.index() + 1));
          Tensor h = x;
          for (Sublayer s : r.sublayers()) h = h + r.F(s, r.N(s, h) * scale);
          return h;
        };
      };
      if (layer == 2) {
        check_layer("ln-scaling", Kind::Encoder, ref(Kind::Encoder),
                    c);  // only the encoder has 3 layers
      } else {
        check_all_kinds("ln-scaling", ref, c);
      }
    }
    // The final norm is not scaled: each position of the stack's output has variance γ² = 1.
    torch::manual_seed(5);
    auto m = test::make_model("ln-scaling", test::small_config(Arch::LM, 0, 4));
    m->eval();
    torch::NoGradGuard ng;
    auto tokens = torch::tensor({{5, 6, 7, 8}}, torch::kLong);
    auto hidden = m->decoder->forward(tokens, LayerInputs{torch::zeros({1, 1, 4, 4}), {}, {}});
    auto var = hidden.var(-1, /*unbiased=*/false);
    CHECK(test::max_abs_diff(var, torch::ones_like(var)) < 1e-3);
  }

  TEST_CASE("magneto: Pre-LN plus a norm before out_proj (SA) and fc2 (FFN); CA plain by default") {
    Case c;
    c.branch_norms = {"self_attn.inner_norm", "ffn.inner_norm"};
    check_all_kinds(
        "magneto", [](Kind) { return pre_ln_ref(); }, c);
    c.params = {{"cross_attn_subln", ParamValue::of_bool(true)}};
    c.branch_norms_decoder = {"cross_attn.inner_norm"};
    check_all_kinds(
        "magneto", [](Kind) { return pre_ln_ref(); }, c);
    c.norm = c.layer_norm_kind = NormKind::RMSNorm;
    check_all_kinds(
        "magneto", [](Kind) { return pre_ln_ref(); }, c);
  }

  TEST_CASE("hybridnorm: QKV-norm attention without input norm, n = Norm(a), y = n + FFN(n)") {
    auto hybrid = [](Reference& r, const Tensor& x) {
      Tensor h = x;
      for (Sublayer s : r.sublayers()) {
        if (s != Sublayer::FFN) {
          h = h + r.F(s, h);
        } else {
          Tensor n = r.N(s, h);
          h = n + r.F(s, n);
        }
      }
      return h;
    };
    Case c;
    c.branch_norms = {"self_attn.q_norm", "self_attn.k_norm", "self_attn.v_norm"};
    c.branch_norms_decoder = {"cross_attn.q_norm", "cross_attn.k_norm", "cross_attn.v_norm"};
    check_all_kinds(
        "hybridnorm", [&](Kind) -> RefFn { return hybrid; }, c);
    c.norm = c.layer_norm_kind = NormKind::RMSNorm;  // the paper's recipe
    check_all_kinds(
        "hybridnorm", [&](Kind) -> RefFn { return hybrid; }, c);

    // HybridNorm*: layer 1 Pre-Norm in every sublayer (QKV-norm kept); the others unchanged.
    c.params = {{"first_layer_prenorm", ParamValue::of_bool(true)}};
    c.layer = 0;
    check_all_kinds(
        "hybridnorm", [](Kind) { return pre_ln_ref(); }, c);
    c.layer = 1;
    check_all_kinds(
        "hybridnorm", [&](Kind) -> RefFn { return hybrid; }, c);
  }

}  // TEST_SUITE

TEST_SUITE("scheme_constants_sdk2") {
  TEST_CASE("mix-ln: k = floor(0.25 L) Post-LN layers") {
    for (auto [L, k] :
         std::vector<std::pair<int, int>>{{1, 0}, {6, 1}, {12, 3}, {24, 6}, {32, 8}}) {
      CAPTURE(L);
      CHECK(derived("mix-ln", geometry(Arch::LM, 0, L), "post_ln_layers", "decoder") == k);
    }
    CHECK(derived("mix-ln", geometry(Arch::EncDec, 12, 6), "post_ln_layers", "encoder") == 3);
    CHECK(derived("mix-ln", geometry(Arch::EncDec, 12, 6), "post_ln_layers", "decoder") == 1);
    CHECK(derived("mix-ln", geometry(Arch::EncDec, 10, 6), "post_ln_layers", "encoder",
                  {{"alpha", ParamValue::of_float(0.3)}}) == 3);  // 0.3·10 is 2.9999… in binary
  }

  TEST_CASE("ln-scaling: factors 1/sqrt(l)") {
    const ModelGeometry g = geometry(Arch::EncDec, 6, 3);
    CHECK(derived("ln-scaling", g, "scale", "encoder layer 1") == doctest::Approx(1.0));
    CHECK(derived("ln-scaling", g, "scale", "encoder layer 2") ==
          doctest::Approx(0.7071).epsilon(1e-4));
    CHECK(derived("ln-scaling", g, "scale", "encoder layer 6") ==
          doctest::Approx(0.4082).epsilon(1e-4));
    CHECK(derived("ln-scaling", g, "scale", "decoder layer 3") ==
          doctest::Approx(0.5774).epsilon(1e-4));
  }

  TEST_CASE("magneto: gamma = sqrt(ln 2M) (LM), sqrt(ln(3M) ln(2N)/3) / sqrt(ln 3M) (enc-dec)") {
    CHECK(derived("magneto", geometry(Arch::EncDec, 6, 6), "gamma", "encoder") ==
          doctest::Approx(1.5473).epsilon(1e-4));
    CHECK(derived("magneto", geometry(Arch::EncDec, 6, 6), "gamma", "decoder") ==
          doctest::Approx(1.7001).epsilon(1e-4));
    CHECK(derived("magneto", geometry(Arch::LM, 0, 6), "gamma", "decoder") ==
          doctest::Approx(1.5764).epsilon(1e-4));
    CHECK(derived("magneto", geometry(Arch::EncDec, 12, 12), "gamma", "encoder") ==
          doctest::Approx(1.9484).epsilon(1e-4));
    CHECK(derived("magneto", geometry(Arch::EncDec, 12, 12), "gamma", "decoder") ==
          doctest::Approx(1.8930).epsilon(1e-4));
    CHECK(derived("magneto", geometry(Arch::LM, 0, 12), "gamma", "decoder") ==
          doctest::Approx(1.7827).epsilon(1e-4));
  }

  TEST_CASE("magneto init: xavier_normal gain gamma on v/out/fc1/fc2, gain 1 on q/k and on CA") {
    for (bool ca : {false, true}) {
      CAPTURE(ca);
      torch::manual_seed(3);
      const int N = 6, M = 6;
      ModelConfig cfg = test::small_config(Arch::EncDec, N, M, /*d=*/128, /*heads=*/4, /*ffn=*/256);
      auto model =
          test::make_model("magneto", cfg, {{"cross_attn_subln", ParamValue::of_bool(ca)}});
      const double g_enc = std::sqrt(std::log(3.0 * M) * std::log(2.0 * N) / 3.0),
                   g_dec = std::sqrt(std::log(3.0 * M));
      auto params = model->named_parameters();
      auto check_std = [&](const std::string& name, double gain) {
        const Tensor& w = params[name];
        const double want = xavier_std(w, gain), got = w.std().item<double>();
        INFO(name << ": std " << got << ", expected " << want);
        CHECK(std::abs(got / want - 1) < 0.03);  // 16k–32k samples: 3 % is about six sigma
      };
      for (const char* p : {"v_proj", "out_proj"}) {
        check_std(std::string("encoder.layers.2.self_attn.") + p + ".weight", g_enc);
        check_std(std::string("decoder.layers.4.self_attn.") + p + ".weight", g_dec);
        check_std(std::string("decoder.layers.4.cross_attn.") + p + ".weight", ca ? g_dec : 1.0);
      }
      for (const char* p : {"q_proj", "k_proj"}) {
        check_std(std::string("encoder.layers.0.self_attn.") + p + ".weight", 1.0);
        check_std(std::string("decoder.layers.5.cross_attn.") + p + ".weight", 1.0);
      }
      check_std("encoder.layers.1.ffn.fc1.weight", g_enc);
      check_std("decoder.layers.1.ffn.fc2.weight", g_dec);
      CHECK(params["decoder.layers.1.ffn.fc2.bias"].abs().sum().item<double>() == 0.0);
      CHECK(has_param(*model, "decoder.layers.3.cross_attn.inner_norm.weight") == ca);
    }
  }

  TEST_CASE("magneto torchscale_init: the standard init times gamma on v/out/fc1/fc2") {
    // The core's standard init is fairseq's: Xavier-uniform, gain 1/sqrt(2) on q/k/v, 1 on out_proj
    // and the FFN, biases 0 (a Xavier-uniform std has the same formula as a Xavier-normal one).
    torch::manual_seed(4);
    const int N = 6, M = 6;
    ModelConfig cfg = test::small_config(Arch::EncDec, N, M, /*d=*/128, /*heads=*/4, /*ffn=*/256);
    auto model = test::make_model("magneto", cfg, {{"torchscale_init", ParamValue::of_bool(true)}});
    const double g_dec = std::sqrt(std::log(3.0 * M)), r2 = 1.0 / std::sqrt(2.0);
    auto params = model->named_parameters();
    auto check_std = [&](const std::string& name, double gain) {
      const Tensor& w = params[name];
      const double want = xavier_std(w, gain), got = w.std().item<double>();
      INFO(name << ": std " << got << ", expected " << want);
      CHECK(std::abs(got / want - 1) < 0.03);
    };
    check_std("decoder.layers.2.self_attn.v_proj.weight", g_dec * r2);
    check_std("decoder.layers.2.self_attn.out_proj.weight", g_dec);
    check_std("decoder.layers.2.self_attn.q_proj.weight", r2);
    check_std("decoder.layers.2.cross_attn.v_proj.weight", r2);  // torchscale leaves CA alone
    check_std("decoder.layers.2.ffn.fc2.weight", g_dec);
  }

  TEST_CASE("dyt: derive() prints alpha0 per position") {
    const ModelGeometry g = geometry(Arch::LM, 0, 2);
    CHECK(derived("dyt", g, "alpha0", "attention inputs") == 0.5);
    CHECK(derived("dyt", g, "alpha0", "final norm",
                  {{"alpha0_final", ParamValue::of_float(0.2)}}) == 0.2);
    CHECK(derived("dyt", g, "alpha0", "ffn inputs", {{"alpha0", ParamValue::of_float(0.7)}}) ==
          0.7);
  }

}  // TEST_SUITE

}  // namespace normlab_test_scheme_equations_sdk2
