// Schemes whose state spans a stack (several residual streams, stack ends, run hooks): ResiDual,
// Hyper-Connections (static, dynamic), mHC, nGPT. Each whole small model (encoder-decoder and LM,
// 2-3 layers, every parameter perturbed) against a reference written here from the equations in
// the plugins' headers (docs/schemes/residual.md, hyper_connections.md, mhc.md, ngpt.md), reading
// the parameters by their checkpoint names; plus the init properties the papers state (HC and mHC
// compute Pre-LN at init; nGPT's weights stay unit-norm) and docs/schemes/mhc.md's Sinkhorn-Knopp
// example.
#include <cmath>
#include <functional>
#include <limits>

#include "../plugins/mhc/sinkhorn.h"
#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_scheme_streams {

using namespace normlab;
using torch::Tensor;

namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

// The model's parameters by full name, and the core's pieces recomputed from them.
struct Net {
  torch::OrderedDict<std::string, Tensor> params;
  int64_t d = 16, heads = 2;

  Tensor P(const std::string& name) const {
    const Tensor* t = params.find(name);
    REQUIRE_MESSAGE(t != nullptr, "model has no parameter " << name);
    return *t;
  }
  bool has(const std::string& name) const { return params.find(name) != nullptr; }
  Tensor lin(const std::string& prefix, const Tensor& x) const {
    return torch::matmul(x, P(prefix + ".weight").t()) + P(prefix + ".bias");
  }
  Tensor layer_norm(const std::string& prefix, const Tensor& x, double eps = 1e-5) const {
    auto mean = x.mean(-1, true);
    auto var = (x - mean).pow(2).mean(-1, true);
    return (x - mean) / torch::sqrt(var + eps) * P(prefix + ".weight") + P(prefix + ".bias");
  }
  // √d·E[tok] + sinusoidal positions (fairseq layout: sines of all frequencies, then cosines).
  Tensor embed(const std::string& stack, const Tensor& tokens) const {
    const int64_t T = tokens.size(1), half = d / 2;
    auto freq =
        torch::exp(torch::arange(half, torch::kFloat) * (-std::log(10000.0) / double(half - 1)));
    auto angle = torch::arange(T, torch::kFloat).unsqueeze(1) * freq.unsqueeze(0);
    auto pe = torch::cat({torch::sin(angle), torch::cos(angle)}, 1);
    return P(stack + ".embed_tokens.weight")
                   .index_select(0, tokens.flatten())
                   .view({tokens.size(0), T, d}) *
               std::sqrt(double(d)) +
           pe.unsqueeze(0);
  }
  using HeadNorm = std::function<Tensor(const std::string& which, const Tensor&)>;
  Tensor attention(const std::string& p, const Tensor& x, const Tensor& kv, const Tensor& mask,
                   const HeadNorm& head_norm = {}) const {
    const int64_t B = x.size(0), Tq = x.size(1), Tk = kv.size(1), dh = d / heads;
    auto split = [&](const Tensor& t, int64_t T) {
      return t.view({B, T, heads, dh}).permute({0, 2, 1, 3});
    };
    auto q = split(lin(p + ".q_proj", x), Tq), k = split(lin(p + ".k_proj", kv), Tk),
         v = split(lin(p + ".v_proj", kv), Tk);
    if (head_norm) {
      q = head_norm(p + ".q_norm", q);
      k = head_norm(p + ".k_norm", k);
    }
    auto scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(dh)) + mask;
    auto o = torch::matmul(torch::softmax(scores, -1), v).permute({0, 2, 1, 3}).reshape({B, Tq, d});
    return lin(p + ".out_proj", o);
  }
  Tensor ffn(const std::string& p, const Tensor& x) const {
    return lin(p + ".fc2", torch::relu(lin(p + ".fc1", x)));
  }
  Tensor logits(const Tensor& h) const {
    return torch::matmul(h, P("decoder.output_projection.weight").t());
  }
};

// What one stack's sublayers see: the masks, the encoder memory (decoder of an encoder-decoder).
struct StackInput {
  std::string stack;  // "encoder" / "decoder"
  int layers = 0;
  Tensor self_mask, memory, memory_mask;
  std::vector<Sublayer> sublayers() const {
    if (memory.defined()) return {Sublayer::SelfAttn, Sublayer::CrossAttn, Sublayer::FFN};
    return {Sublayer::SelfAttn, Sublayer::FFN};
  }
  std::string layer(int l) const { return stack + ".layers." + std::to_string(l) + "."; }
};

// F(h) of sublayer s in layer prefix `lp` (dropout 0).
Tensor F(const Net& net, const StackInput& in, const std::string& lp, Sublayer s, const Tensor& h,
         const Net::HeadNorm& head_norm = {}) {
  switch (s) {
    case Sublayer::SelfAttn:
      return net.attention(lp + "self_attn", h, h, in.self_mask, head_norm);
    case Sublayer::CrossAttn:
      return net.attention(lp + "cross_attn", h, in.memory, in.memory_mask, head_norm);
    case Sublayer::FFN:
      return net.ffn(lp + "ffn", h);
  }
  return {};
}

// A scheme's reference: the stack from its embedded input to its output, final norm included.
using StackRef = std::function<Tensor(const Net&, const StackInput&, const Tensor& x)>;

enum class Kind { EncDec, LM };

struct Batch {
  Tensor src, tgt;
};

Batch make_batch(Kind kind) {
  const int64_t B = 3, S = 5, T = 6;
  auto tok = [&](int64_t len) { return torch::randint(1, 50, {B, len}, torch::kLong); };
  Batch b{kind == Kind::EncDec ? tok(S) : Tensor(), tok(T)};
  if (b.src.defined()) b.src.index_put_({0, torch::indexing::Slice(3, S)}, 0);  // padded source
  b.tgt.index_put_({1, torch::indexing::Slice(4, T)}, 0);
  return b;
}

Tensor pad_mask(const Tensor& tokens) {
  return torch::zeros(tokens.sizes())
      .masked_fill(tokens.eq(0), kNegInf)
      .view({tokens.size(0), 1, 1, tokens.size(1)});
}

Tensor causal(int64_t T) { return torch::full({T, T}, kNegInf).triu(1).view({1, 1, T, T}); }

// The whole model's logits, recomputed by `ref`.
Tensor reference_logits(const Net& net, Kind kind, const Batch& b, int N, int M,
                        const StackRef& ref) {
  StackInput dec{"decoder", M, causal(b.tgt.size(1)) + pad_mask(b.tgt), {}, {}};
  if (kind == Kind::EncDec) {
    StackInput enc{"encoder", N, pad_mask(b.src), {}, {}};
    dec.memory = ref(net, enc, net.embed("encoder", b.src));
    dec.memory_mask = enc.self_mask;
  }
  return net.logits(ref(net, dec, net.embed("decoder", b.tgt)));
}

TransformerModel build(const std::string& scheme, Kind kind, int N, int M,
                       const std::map<std::string, ParamValue>& params = {}) {
  return test::make_model(
      scheme, test::small_config(kind == Kind::EncDec ? Arch::EncDec : Arch::LM, N, M), params);
}

Tensor model_logits(TransformerModel& model, Kind kind, const Batch& b) {
  torch::NoGradGuard ng;
  return kind == Kind::EncDec ? model->forward(b.src, b.tgt) : model->forward_lm(b.tgt);
}

// Perturbs every parameter (so that a swapped index, a wrong init-only shortcut or an unused
// parameter shows) and compares the model's logits with the reference's.
void check_model(const std::string& scheme, Kind kind, const StackRef& ref,
                 const std::map<std::string, ParamValue>& params = {}, double noise = 0.3) {
  torch::manual_seed(11);
  const int N = 2, M = kind == Kind::EncDec ? 2 : 3;
  TransformerModel model = build(scheme, kind, N, M, params);
  model->eval();
  {
    torch::NoGradGuard ng;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * noise);
  }
  Net net{model->named_parameters(), 16, 2};
  Batch b = make_batch(kind);
  Tensor got = model_logits(model, kind, b);
  Tensor want;
  {
    torch::NoGradGuard ng;
    want = reference_logits(net, kind, b, N, M, ref);
  }
  const double diff = test::max_abs_diff(got, want),
               scale = std::max(1.0, want.abs().max().item<double>());
  INFO(scheme << (kind == Kind::EncDec ? " encoder-decoder" : " LM") << ": max |diff| = " << diff
              << ", max |logit| = " << scale);
  CHECK(diff < 1e-4 * scale);
}

void check_both(const std::string& scheme, const StackRef& ref,
                const std::map<std::string, ParamValue>& params = {}, double noise = 0.3) {
  for (Kind k : {Kind::EncDec, Kind::LM}) check_model(scheme, k, ref, params, noise);
}

// --- references, from the equations -------------------------------------------------------------

// ResiDual: o = F(x_a); x_d += o; x_a = LN(x_a + o); out = x_a + LN_final(x_d).
StackRef residual_ref(double final_eps) {
  return [final_eps](const Net& net, const StackInput& in, const Tensor& x) {
    Tensor xa = x, xd = x;
    for (int l = 0; l < in.layers; ++l)
      for (Sublayer s : in.sublayers()) {
        Tensor o = F(net, in, in.layer(l), s, xa);
        xd = xd + o;
        xa = net.layer_norm(in.layer(l) + to_string(s) + "_norm", xa + o);
      }
    return xa + net.layer_norm(in.stack + ".dual_norm", xd, final_eps);
  };
}

// Hyper-Connections, one stream at a time (no matrix products), n streams.
StackRef hc_ref(int n, bool dynamic) {
  return [n, dynamic](const Net& net, const StackInput& in, const Tensor& x) {
    std::vector<Tensor> H(size_t(n), x);
    for (int l = 0; l < in.layers; ++l)
      for (Sublayer s : in.sublayers()) {
        const std::string p = in.layer(l) + to_string(s) + "_hc_";
        Tensor am = net.P(p + "am"), ar = net.P(p + "ar"), b = net.P(p + "b");
        std::vector<Tensor> Am(static_cast<size_t>(n)), B(static_cast<size_t>(n));
        std::vector<std::vector<Tensor>> Ar(size_t(n), std::vector<Tensor>(static_cast<size_t>(n)));
        for (int i = 0; i < n; ++i) {
          Am[i] = am[i];
          B[i] = b[i];
          for (int j = 0; j < n; ++j) Ar[i][j] = ar[i][j];
        }
        if (dynamic) {
          const Tensor sa = net.P(p + "s_alpha"), sb = net.P(p + "s_beta");
          for (int i = 0; i < n; ++i) {
            Tensor hn = net.layer_norm(p + "norm", H[i]);  // [B,T,d]
            Am[i] = Am[i] + sa * torch::tanh((hn * net.P(p + "wm")).sum(-1, true));
            B[i] = B[i] + sb * torch::tanh((hn * net.P(p + "wb")).sum(-1, true));
            for (int j = 0; j < n; ++j)
              Ar[i][j] =
                  Ar[i][j] + sa * torch::tanh((hn * net.P(p + "wr").select(1, j)).sum(-1, true));
          }
        }
        Tensor h_in = torch::zeros_like(x);
        for (int i = 0; i < n; ++i) h_in = h_in + Am[i] * H[i];
        Tensor t =
            F(net, in, in.layer(l), s, net.layer_norm(in.layer(l) + to_string(s) + "_norm", h_in));
        std::vector<Tensor> next(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j) {
          next[j] = B[j] * t;
          for (int i = 0; i < n; ++i) next[j] = next[j] + Ar[i][j] * H[i];
        }
        H = next;
      }
    Tensor sum = torch::zeros_like(x);
    for (const Tensor& h : H) sum = sum + h;
    return net.layer_norm(in.stack + ".layer_norm", sum);
  };
}

// Sinkhorn-Knopp on one n×n matrix, written out with loops over rows and columns.
Tensor sinkhorn_loops(const Tensor& logits, int iterations) {
  Tensor m = logits.to(torch::kDouble).exp();
  const int64_t n = m.size(0);
  for (int it = 0; it < iterations; ++it) {
    for (int64_t i = 0; i < n; ++i) m[i] = m[i] / m[i].sum();
    for (int64_t j = 0; j < n; ++j) m.select(1, j).copy_(m.select(1, j) / m.select(1, j).sum());
  }
  return m;
}

// mHC, per token (the mixing matrices depend on the token), with the loop Sinkhorn above.
StackRef mhc_ref(int n, int t_max) {
  return [n, t_max](const Net& net, const StackInput& in, const Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), d = x.size(2);
    std::vector<Tensor> H(size_t(n), x);
    for (int l = 0; l < in.layers; ++l)
      for (Sublayer s : in.sublayers()) {
        const std::string p = in.layer(l) + to_string(s) + "_mhc_";
        Tensor v = torch::cat(H, -1);  // vec(x_l) = [x_1 … x_n], [B,T,n·d]
        Tensor xt = v * torch::rsqrt(v.pow(2).mean(-1, true) + 1e-6);
        Tensor pre = torch::sigmoid(
            net.P(p + "alpha_pre") * torch::matmul(xt, net.P(p + "phi_pre")) + net.P(p + "b_pre"));
        Tensor post =
            2 * torch::sigmoid(net.P(p + "alpha_post") * torch::matmul(xt, net.P(p + "phi_post")) +
                               net.P(p + "b_post"));
        Tensor res = net.P(p + "alpha_res") *
                     torch::matmul(xt, net.P(p + "phi_res"));  // [B,T,n²], row-major
        Tensor h_in = torch::zeros_like(x);
        for (int j = 0; j < n; ++j) h_in = h_in + pre.select(-1, j).unsqueeze(-1) * H[j];
        Tensor t =
            F(net, in, in.layer(l), s, net.layer_norm(in.layer(l) + to_string(s) + "_norm", h_in));
        std::vector<Tensor> next(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) next[i] = post.select(-1, i).unsqueeze(-1) * t;
        for (int64_t bb = 0; bb < B; ++bb)
          for (int64_t tt = 0; tt < T; ++tt) {
            Tensor Hres = sinkhorn_loops(res[bb][tt].view({n, n}) + net.P(p + "b_res"), t_max)
                              .to(torch::kFloat);
            for (int i = 0; i < n; ++i)
              for (int j = 0; j < n; ++j) next[i][bb][tt] += Hres[i][j] * H[j][bb][tt];
          }
        H = next;
      }
    (void)d;
    Tensor sum = torch::zeros_like(x);
    for (const Tensor& h : H) sum = sum + h;
    return net.layer_norm(in.stack + ".layer_norm", sum);
  };
}

Tensor l2(const Tensor& x) { return x / x.norm(2, {-1}, true).clamp_min(1e-12); }

// nGPT: h = Norm(h + α(Norm(F(h)) − h)), α = stored·0.05·√d; q, k: (stored/scale)·Norm per head,
// q also × d_k; h₀ = Norm(embedded); decoder ends with the scaled-gain L2 norm (logit scale).
StackRef ngpt_ref() {
  return [](const Net& net, const StackInput& in, const Tensor& x) {
    const double scale = 1.0 / std::sqrt(double(net.d)), d_k = double(net.d / net.heads);
    auto head_norm = [&](const std::string& which, const Tensor& q) {
      Tensor g = net.P(which + ".weight") / scale;
      Tensor out = g * l2(q);
      return which.size() >= 6 && which.compare(which.size() - 6, 6, "q_norm") == 0 ? out * d_k
                                                                                    : out;
    };
    Tensor h = l2(x);
    for (int l = 0; l < in.layers; ++l)
      for (Sublayer s : in.sublayers()) {
        Tensor alpha = net.P(in.layer(l) + to_string(s) + "_alpha") * (0.05 / scale);
        Tensor hf = l2(F(net, in, in.layer(l), s, h, head_norm));
        h = l2(h + alpha * (hf - h));
      }
    if (in.stack == "decoder") h = net.P("decoder.layer_norm.weight") / scale * l2(h);
    return h;
  };
}

// Pre-LN, for the init-equivalence checks.
Tensor pre_ln_stack(const Net& net, const StackInput& in, const Tensor& x) {
  Tensor h = x;
  for (int l = 0; l < in.layers; ++l)
    for (Sublayer s : in.sublayers())
      h = h + F(net, in, in.layer(l), s, net.layer_norm(in.layer(l) + to_string(s) + "_norm", h));
  return net.layer_norm(in.stack + ".layer_norm", h);
}

// A freshly built `scheme` given Pre-LN's (perturbed) weights computes Pre-LN's logits.
void check_equals_pre_ln_at_init(const std::string& scheme,
                                 const std::map<std::string, ParamValue>& params = {}) {
  for (Kind kind : {Kind::EncDec, Kind::LM}) {
    torch::manual_seed(5);
    const int N = 2, M = 3;  // decoder: 9 (enc-dec) or 6 (LM) sublayers, so k mod 4 wraps
    TransformerModel pre = build("pre-ln", kind, N, M), other = build(scheme, kind, N, M, params);
    pre->eval();
    other->eval();
    {
      torch::NoGradGuard ng;
      auto theirs = other->named_parameters();
      for (auto& item : pre->named_parameters()) {
        const std::string& name = item.key();
        Tensor& p = item.value();
        p.add_(torch::randn_like(p) * 0.3);
        Tensor* t = theirs.find(name);
        REQUIRE_MESSAGE(t != nullptr, scheme << " lacks Pre-LN's parameter " << name);
        t->copy_(p);
      }
    }
    Batch b = make_batch(kind);
    Tensor want = model_logits(pre, kind, b), got = model_logits(other, kind, b);
    const double diff = test::max_abs_diff(got, want);
    INFO(scheme << (kind == Kind::EncDec ? " encoder-decoder" : " LM")
                << " vs pre-ln at init: max |diff| = " << diff);
    CHECK(diff < 1e-4 * std::max(1.0, want.abs().max().item<double>()));
    // The test has teeth: Pre-LN's own reference agrees with it too.
    Net net{pre->named_parameters(), 16, 2};
    torch::NoGradGuard ng;
    CHECK(test::max_abs_diff(reference_logits(net, kind, b, N, M, pre_ln_stack), want) < 1e-4);
  }
}

// Largest |‖w‖ − 1| over nGPT's matrices, along their embedding dimension; counts what it checked.
double ngpt_unit_norm_error(TransformerModel& model, int* checked) {
  double worst = 0.0;
  *checked = 0;
  auto ends = [](const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
  };
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const Tensor& p = item.value();
    int64_t dim = -1;
    for (const char* suf : {"embed_tokens.weight", "output_projection.weight", "q_proj.weight",
                            "k_proj.weight", "v_proj.weight", "fc1.weight"})
      if (ends(name, suf)) dim = 1;
    for (const char* suf : {"out_proj.weight", "fc2.weight"})
      if (ends(name, suf)) dim = 0;
    if (dim < 0) continue;
    Tensor norms = p.detach().norm(2, {dim});
    if (ends(name, "embed_tokens.weight")) norms = norms.slice(0, 1);  // row 0 = padding, all zero
    worst = std::max(worst, (norms - 1).abs().max().item<double>());
    ++*checked;
  }
  return worst;
}

}  // namespace

TEST_SUITE("scheme_streams") {
  TEST_CASE("residual: x_a Post-LN stream, x_d dual stream, out = x_a + LN_final(x_d)") {
    check_both("residual", residual_ref(1e-7));
    // The final eps is the parameter's (1e-7 vs 1e-5 would hide under the tolerance).
    check_both("residual", residual_ref(0.5), {{"final_ln_eps", ParamValue::of_float(0.5)}});
    auto m = build("residual", Kind::EncDec, 2, 2);
    CHECK(m->named_parameters().find("encoder.layer_norm.weight") == nullptr);
    CHECK(m->named_parameters().find("decoder.dual_norm.weight") != nullptr);
  }

  TEST_CASE("hyper-connections: static, n = 4 and n = 3, whole stack") {
    check_both("hyper-connections", hc_ref(4, false));
    check_both("hyper-connections", hc_ref(3, false), {{"n", ParamValue::of_int(3)}});
  }

  TEST_CASE("hyper-connections: dynamic (DHC), both plugin names") {
    check_both("hyper-connections", hc_ref(4, true), {{"dynamic", ParamValue::of_bool(true)}});
    check_both("hyper-connections-dynamic", hc_ref(4, true));
  }

  TEST_CASE("hyper-connections: init computes Pre-LN (A_m = e_(k mod n), A_r = I, B = 1, W = 0)") {
    check_equals_pre_ln_at_init("hyper-connections");
    check_equals_pre_ln_at_init("hyper-connections-dynamic");
    auto m = build("hyper-connections", Kind::LM, 0, 3);
    auto p = m->named_parameters();
    // Sublayer k = 5 (layer 2's FFN, LM: 2 per layer) reads stream 5 mod 4 = 1.
    CHECK(torch::equal(p["decoder.layers.2.ffn_hc_am"], torch::tensor({0.f, 1.f, 0.f, 0.f})));
  }

  TEST_CASE("mhc: Sinkhorn-Knopp, the docs/schemes/mhc.md example") {
    const Tensor h = torch::tensor({{1.0, 0.0}, {0.0, 0.0}}, torch::kDouble);
    const Tensor want = torch::tensor({{0.6225, 0.3775}, {0.3775, 0.6225}}, torch::kDouble);
    const Tensor one = torch::tensor({{0.594, 0.350}, {0.406, 0.650}}, torch::kDouble);
    CHECK(test::max_abs_diff(mhc::sinkhorn_knopp(h, 20), want) < 1e-4);  // the plugin's
    CHECK(test::max_abs_diff(mhc::sinkhorn_knopp(h, 1), one) < 1e-3);
    CHECK(test::max_abs_diff(sinkhorn_loops(h, 20), want) < 1e-4);  // the reference's
    // Batched over leading dims and shift-invariant (large logits do not overflow).
    Tensor batch = torch::stack({h, h + 1000.0}).unsqueeze(0);
    Tensor got = mhc::sinkhorn_knopp(batch, 20);
    CHECK(test::max_abs_diff(got[0][0], want) < 1e-4);
    CHECK(test::max_abs_diff(got[0][1], want) < 1e-4);
  }

  TEST_CASE("mhc: whole stack, H_res by Sinkhorn per token") {
    check_both("mhc", mhc_ref(4, 20), {}, 0.5);
    check_both("mhc", mhc_ref(3, 5),
               {{"n", ParamValue::of_int(3)}, {"t_max", ParamValue::of_int(5)}}, 0.5);
  }

  TEST_CASE(
      "mhc: init computes Pre-LN (phi = 0, distinct read weights summing to 1, b_post = 0, b_res = "
      "0)") {
    check_equals_pre_ln_at_init("mhc");
    auto p = build("mhc", Kind::LM, 0, 2)->named_parameters();
    CHECK(std::abs(torch::sigmoid(p["decoder.layers.0.self_attn_mhc_b_pre"]).sum().item<double>() -
                   1.0) < 1e-6);
    // Distinct: 0.1, 0.2, 0.3, 0.4 for n = 4, so the streams can separate.
    CHECK(test::max_abs_diff(torch::sigmoid(p["decoder.layers.0.self_attn_mhc_b_pre"]),
                             torch::tensor({0.1f, 0.2f, 0.3f, 0.4f})) < 1e-6);
  }

  // Trains a small mHC LM for `updates` Adam steps on random next-token data; returns its
  // parameters.
  torch::OrderedDict<std::string, Tensor> train_mhc(int updates, bool equal_read_weights) {
    torch::manual_seed(11);
    TransformerModel m = build("mhc", Kind::LM, 0, 2);
    auto params = m->named_parameters();
    if (equal_read_weights) {  // docs/schemes/mhc.md's first proposal: b_pre = −ln(n−1) each
      torch::NoGradGuard ng;
      for (auto& item : params)
        if (item.key().find("_mhc_b_pre") != std::string::npos) item.value().fill_(-std::log(3.0));
    }
    torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(1e-2));
    for (int u = 0; u < updates; ++u) {
      const Tensor tokens = torch::randint(4, 50, {8, 12}, torch::kLong);
      const Tensor logits = m->forward_lm(tokens.narrow(1, 0, 11));
      const Tensor loss = torch::nn::functional::cross_entropy(
          logits.reshape({-1, 50}), tokens.narrow(1, 1, 11).reshape({-1}));
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    return m->named_parameters();
  }

  // Spread of a tensor's entries (0: all equal).
  double spread(const Tensor& t) { return (t.max() - t.min()).item<double>(); }

  TEST_CASE(
      "mhc: the streams separate in training (distinct read weights; equal ones are a fixed "
      "point)") {
    // A middle sublayer: the first one's input streams are the n copies of the embedding and the
    // last one's outputs are summed, so their H_res gets no gradient that tells the streams apart.
    const std::string at = "decoder.layers.1.self_attn_mhc_";
    const auto p = train_mhc(30, /*equal_read_weights=*/false);
    // H_res learns a non-uniform mixing (b_res, φ_res move, differently per entry) and the streams
    // get their own write gates (b_post differs across them).
    CHECK(spread(p[at + "b_res"]) > 1e-3);
    CHECK(spread(p[at + "phi_res"]) > 1e-3);
    CHECK(spread(p[at + "b_post"]) > 1e-3);
    const Tensor phi_post = p[at + "phi_post"];
    CHECK(test::max_abs_diff(phi_post.select(1, 0), phi_post.select(1, 1)) > 1e-4);
    // The same training from equal read weights: every stream stays a copy, bit for bit,
    // everywhere.
    const auto q = train_mhc(30, /*equal_read_weights=*/true);
    for (const auto& item : q) {
      CAPTURE(item.key());
      if (item.key().find("_mhc_b_res") != std::string::npos ||
          item.key().find("_mhc_b_post") != std::string::npos)
        CHECK(spread(item.value()) == 0.0);
      if (item.key().find("_mhc_phi_post") != std::string::npos)
        CHECK(torch::equal(item.value().select(1, 0), item.value().select(1, 3)));
    }
  }

  TEST_CASE("ngpt: whole stack on the hypersphere") {
    check_both("ngpt", ngpt_ref(), {}, 0.1);
    auto p = build("ngpt", Kind::EncDec, 2, 2)->named_parameters();
    for (const char* name : {"encoder.layers.0.self_attn_norm.weight",
                             "decoder.layers.1.ffn_norm.bias", "encoder.layer_norm.weight"})
      CHECK_MESSAGE(p.find(name) == nullptr, name);  // no LayerNorm parameters anywhere
    // alpha stored at 1/sqrt(d) (scaled parametrization), acting as 0.05.
    CHECK(std::abs(p["decoder.layers.0.cross_attn_alpha"][3].item<double>() - 0.25) < 1e-7);
  }

  TEST_CASE("ngpt: weights unit-norm after build and after an optimizer step, biases held at 0") {
    torch::manual_seed(3);
    auto model = build("ngpt", Kind::LM, 0, 2);
    int checked = 0;
    CHECK(ngpt_unit_norm_error(model, &checked) < 1e-5);  // the core's after_step at build
    CHECK(checked == 2 * 6 + 2);
    Tensor alpha0 = model->named_parameters()["decoder.layers.1.ffn_alpha"].clone();
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.05));
    Batch b = make_batch(Kind::LM);
    model->train();
    Tensor logits = model->forward_lm(b.tgt);
    Tensor loss =
        torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), b.tgt.view({-1}));
    loss.backward();
    opt.step();
    CHECK(ngpt_unit_norm_error(model, &checked) > 1e-3);  // the step left the sphere
    model->after_step();  // what the trainer calls after each optimizer step
    CHECK(ngpt_unit_norm_error(model, &checked) < 1e-5);
    auto p = model->named_parameters();
    CHECK(p["decoder.layers.0.self_attn.q_proj.bias"].abs().max().item<double>() == 0.0);
    CHECK(p["decoder.layers.1.ffn.fc2.bias"].abs().max().item<double>() == 0.0);
    CHECK(test::max_abs_diff(p["decoder.layers.1.ffn_alpha"], alpha0) >
          1e-3);  // α trains, not projected
    auto values = model->scheme().values();
    REQUIRE(values.size() == 1);
    CHECK(values[0].name == "alpha_mean");
    CHECK(std::abs(values[0].value - 0.05) < 0.05);
    // The mean of the effective α = stored · 0.05·√d over every α entry (read when asked, not per
    // step).
    double sum = 0;
    int64_t count = 0;
    for (const auto& item : p)
      if (item.key().size() > 6 && item.key().compare(item.key().size() - 6, 6, "_alpha") == 0)
        sum += item.value().sum().item<double>(), count += item.value().numel();
    REQUIRE(count > 0);
    CHECK(values[0].value ==
          doctest::Approx(sum / double(count) * 0.05 * std::sqrt(16.0)).epsilon(1e-5));
  }

}  // TEST_SUITE

}  // namespace normlab_test_scheme_streams
