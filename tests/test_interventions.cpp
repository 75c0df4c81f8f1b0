// Issue 67.1: interventions orthogonal to the scheme, on both bodies: model.qk_norm (per head or
// over the whole projection, before RoPE), model.attn_logit_softcap and final_logit_softcap
// (Gemma 2), optim.z_loss (PaLM §5). Each against a computation in plain tensor ops written here.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "normlab/manifest/experiment.h"
#include "normlab/model/transformer_model.h"
#include "normlab/train/trainer.h"
#include "run/checkpoint.h"
#include "run/label_smoothing.h"
#include "run/model_assembly.h"
#include "run/optimizer.h"
#include "run/weight_decay.h"
#include "speed_levers.h"
#include "test_support.h"
#include "train/update_step.h"
#include "util/atomic_file.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_interventions {

using namespace normlab;
namespace fs = std::filesystem;

namespace {

const char* const kSchemes[] = {"pre-ln", "post-ln", "deepnorm"};

ModelConfig body(bool llama) {
  ModelConfig cfg = llama ? test::small_config(Arch::LM, 0, 2, 16, 4, 24)
                          : test::small_config(Arch::EncDec, 2, 2, 16, 4, 24);
  if (llama) {
    cfg.family = Family::Llama;
    cfg.kv_heads = 2;
    cfg.norm = NormSpec::of(NormKind::RMSNorm);
  }
  return cfg;
}

torch::Tensor linear_by_hand(const Projection& p, const torch::Tensor& x) {
  torch::Tensor y = torch::matmul(x, p->weight.t());
  return p->bias.defined() ? y + p->bias : y;
}

// model.qk_norm's formula over the last dimension with gain g: RMSNorm ε 1e-6, LayerNorm ε 1e-5
// (no bias).
torch::Tensor qk_norm_by_hand(QkNorm kind, const torch::Tensor& t, const torch::Tensor& g) {
  if (kind == QkNorm::RMS) return t / torch::sqrt(t.pow(2).mean(-1, true) + 1e-6) * g;
  const torch::Tensor centred = t - t.mean(-1, true);
  return centred / torch::sqrt(centred.pow(2).mean(-1, true) + 1e-5) * g;
}

// The attention module's output by hand: projections; q/k norms (over the whole projection, or
// per head) before RoPE; RoPE (rope_theta > 0: dims i and i + dh/2 rotated by t·θ^(−2i/dh));
// grouped k/v heads repeated; logits q·kᵀ/√dh, soft-capped s·tanh(x/s); the mask; softmax; ·v;
// out_proj.
torch::Tensor attention_by_hand(MultiheadAttentionImpl& a, const torch::Tensor& x,
                                const torch::Tensor& memory, const torch::Tensor& mask) {
  const AttentionOptions& o = a.options();
  const int64_t B = x.size(0), Tq = x.size(1), Tk = memory.size(1), D = o.d_model, H = o.heads;
  const int64_t Hkv = o.kv_heads > 0 ? o.kv_heads : H, dh = D / H;
  torch::Tensor q = linear_by_hand(a.q_proj, x), k = linear_by_hand(a.k_proj, memory),
                v = linear_by_hand(a.v_proj, memory);
  const bool qk = o.qk_norm != QkNorm::None;
  if (qk && o.qk_norm_all) {
    q = qk_norm_by_hand(o.qk_norm, q, a.q_qknorm->weight);
    k = qk_norm_by_hand(o.qk_norm, k, a.k_qknorm->weight);
  }
  q = q.view({B, Tq, H, dh});
  k = k.view({B, Tk, Hkv, dh});
  v = v.view({B, Tk, Hkv, dh});
  if (qk && !o.qk_norm_all) {
    q = qk_norm_by_hand(o.qk_norm, q, a.q_qknorm->weight);
    k = qk_norm_by_hand(o.qk_norm, k, a.k_qknorm->weight);
  }
  if (o.rope_theta > 0) {
    const auto i = torch::arange(dh / 2, torch::kDouble);
    const auto angles = torch::arange(Tq, torch::kDouble).unsqueeze(1) *
                        torch::pow(o.rope_theta, -2.0 * i / double(dh)).unsqueeze(0);
    const auto c = angles.cos().to(torch::kFloat).view({1, Tq, 1, dh / 2});
    const auto s = angles.sin().to(torch::kFloat).view({1, Tq, 1, dh / 2});
    auto rotate = [&](const torch::Tensor& t) {
      const auto x1 = t.narrow(-1, 0, dh / 2), x2 = t.narrow(-1, dh / 2, dh / 2);
      return torch::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
    };
    q = rotate(q);
    k = rotate(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2).repeat_interleave(H / Hkv, 1);
  v = v.transpose(1, 2).repeat_interleave(H / Hkv, 1);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(dh));
  if (o.logit_softcap > 0) scores = o.logit_softcap * torch::tanh(scores / o.logit_softcap);
  if (mask.defined()) scores = scores + mask;
  const torch::Tensor ctx =
      torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).reshape({B, Tq, D});
  return linear_by_hand(a.out_proj, ctx);
}

// `nonzero`: `want` is not all zeros (a vacuous comparison); a parameter's gradient may be (a k
// bias: softmax ignores it).
void check_close(const torch::Tensor& got, const torch::Tensor& want, double tol = 2e-5,
                 bool nonzero = true) {
  REQUIRE(got.defined());
  REQUIRE(got.sizes() == want.sizes());
  if (nonzero) CHECK(want.abs().max().item<double>() > 0);
  CHECK(test::max_abs_diff(got, want) <= tol * std::max(1.0, want.abs().max().item<double>()));
}

// The module's output and its gradients (input, memory, q_proj, the qk gains) against the hand
// computation's, with the fused CPU attention on and off.
void check_attention(AttentionOptions o, bool cross) {
  torch::manual_seed(3);
  MultiheadAttention a(o);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : a->parameters())  // gains and all: none at its init value
      if (p.defined()) p.normal_(0.0, 0.5);
  }
  const int64_t B = 2, T = 5, S = cross ? 7 : T;
  const torch::Tensor x = torch::randn({B, T, o.d_model}).requires_grad_(true);
  const torch::Tensor memory = cross ? torch::randn({B, S, o.d_model}).requires_grad_(true) : x;
  const LayerInputs in = test::layer_test_inputs(/*encoder=*/false, false, B, T, S, o.d_model);
  torch::Tensor mask = in.self_mask;
  if (cross) {
    mask = torch::zeros({B, 1, 1, S});
    mask.index_put_({1, 0, 0, S - 1}, -std::numeric_limits<float>::infinity());
  }
  const torch::Tensor weight = torch::randn({B, T, o.d_model});
  std::vector<torch::Tensor> inputs = {x, a->q_proj->weight, a->k_proj->weight};
  if (cross) inputs.push_back(memory);
  if (a->q_qknorm) inputs.insert(inputs.end(), {a->q_qknorm->weight, a->k_qknorm->weight});
  const torch::Tensor want = attention_by_hand(*a, x, memory, mask);
  const auto want_grads = torch::autograd::grad({(want * weight).sum()}, inputs);
  const bool lever = speed_levers().fused_attention;
  for (const bool fused : {true, false}) {
    CAPTURE(fused);
    speed_levers().fused_attention = fused;
    const torch::Tensor got = a->forward(x, memory, mask, /*self_attention=*/!cross);
    const auto grads = torch::autograd::grad({(got * weight).sum()}, inputs);
    check_close(got, want);
    for (size_t i = 0; i < grads.size(); ++i) {
      CAPTURE(i);  // x, q_proj, k_proj, (memory), q gain, k gain
      check_close(grads[i], want_grads[i]);
    }
  }
  speed_levers().fused_attention = lever;
}

// The attention options a layer of `cfg` gets.
AttentionOptions options_of(const ModelConfig& cfg) {
  TransformerModel m = test::make_model("pre-ln", cfg);
  return m->decoder->layer(0).self_attn->options();
}

std::string write_manifest(const fs::path& dir, const std::string& model_keys,
                           const std::string& scheme = "pre-ln", const std::string& optim = "") {
  fs::create_directories(dir);
  std::ofstream(dir / "m.toml") << fmt::format(
      R"([model]
arch = "lm"
family = "llama"
d_model = 16
heads = 2
dec_layers = 1
ffn_multiple_of = 8
dropout = 0.0
{}
[scheme]
name = "{}"
[data]
task = "synthetic-lm"
synthetic_vocab = 16
lm_block = 8
synthetic_train = 40
synthetic_valid = 8
cache_dir = "{}/cache"
[optim]
lr = 0.01
warmup_updates = 0
max_tokens = 64
max_updates = 2
{}
[eval]
interval = 0
test_beam = 0
[run]
out_dir = "{}/run"
threads = 1
)",
      model_keys, scheme, dir.string(), optim, dir.string());
  return (dir / "m.toml").string();
}

std::string manifest_error(const std::string& path) {
  try {
    load_manifest(path, {}, &test::builtin_registry());
  } catch (const ManifestError& e) {
    return e.what();
  }
  return "";
}

// A batch of both bodies: targets with pads (id 0) in row 0.
DeviceBatch batch_of(const ModelConfig& cfg) {
  DeviceBatch b;
  const int64_t B = 2, T = 6;
  if (cfg.arch == Arch::EncDec) b.src = torch::randint(1, cfg.src_vocab, {B, 5}, torch::kLong);
  b.tgt_in = torch::randint(1, cfg.tgt_vocab, {B, T}, torch::kLong);
  b.tgt_out = torch::randint(1, cfg.tgt_vocab, {B, T}, torch::kLong);
  b.tgt_out.index_put_({0, torch::indexing::Slice(4, T)}, 0);
  b.tgt_in.index_put_({0, torch::indexing::Slice(5, T)}, 0);
  b.tokens = (b.tgt_out != 0).sum().item<int64_t>();
  return b;
}

}  // namespace

TEST_SUITE("interventions") {
  TEST_CASE("qk_norm and attn_logit_softcap: the attention by hand, values and gradients") {
    for (const QkNorm kind : {QkNorm::None, QkNorm::RMS, QkNorm::Layer})
      for (const bool all : {false, true})
        for (const double cap : {0.0, 0.7}) {
          if (kind == QkNorm::None && all) continue;
          CAPTURE(int(kind));
          CAPTURE(all);
          CAPTURE(cap);
          AttentionOptions fairseq;  // the transformer family: biases, no RoPE
          fairseq.d_model = 16;
          fairseq.heads = 4;
          fairseq.qk_norm = kind;
          fairseq.qk_norm_all = all;
          fairseq.logit_softcap = cap;
          check_attention(fairseq, /*cross=*/false);
          check_attention(fairseq, /*cross=*/true);
          AttentionOptions llama = fairseq;  // no biases, RoPE, grouped k/v heads
          llama.bias = false;
          llama.rope_theta = 10000;
          llama.kv_heads = 2;
          check_attention(llama, /*cross=*/false);
        }
  }

  TEST_CASE("the soft-cap bites: capped attention differs from the uncapped one") {
    AttentionOptions o;
    o.d_model = 16;
    o.heads = 4;
    torch::manual_seed(5);
    MultiheadAttention plain(o);
    o.logit_softcap = 0.7;
    MultiheadAttention capped(o);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : plain->parameters()) p.normal_(0.0, 0.5);
      const auto from = plain->named_parameters();
      for (auto& p : capped->named_parameters()) p.value().copy_(from[p.key()]);
    }
    const auto x = torch::randn({2, 5, 16});
    CHECK(test::max_abs_diff(plain->forward(x, x, {}, true), capped->forward(x, x, {}, true)) >
          1e-2);
  }

  TEST_CASE(
      "every layer of both bodies and schemes pre-ln, post-ln, deepnorm carries the options") {
    for (const bool llama : {false, true})
      for (const char* scheme : kSchemes) {
        CAPTURE(llama);
        CAPTURE(scheme);
        ModelConfig cfg = body(llama);
        cfg.qk_norm = llama ? QkNorm::RMS : QkNorm::Layer;
        cfg.qk_norm_all = llama;
        cfg.attn_logit_softcap = 3.0;
        TransformerModel m = test::make_model(scheme, cfg);
        int attentions = 0;
        for (TransformerStack stack : {m->encoder, m->decoder}) {
          if (!stack) continue;
          for (size_t i = 0; i < stack->num_layers(); ++i)
            for (MultiheadAttention a : {stack->layer(i).self_attn, stack->layer(i).cross_attn}) {
              if (!a) continue;
              ++attentions;
              CHECK(a->options().qk_norm == cfg.qk_norm);
              CHECK(a->options().qk_norm_all == cfg.qk_norm_all);
              CHECK(a->options().logit_softcap == 3.0);
              REQUIRE_FALSE(a->q_qknorm.is_empty());
              REQUIRE_FALSE(a->k_qknorm.is_empty());
              // All: over the projection (k: kv_heads·dh); per head: over dh.
              CHECK(a->q_qknorm->weight.numel() == (llama ? 16 : 4));
              CHECK(a->k_qknorm->weight.numel() == (llama ? 8 : 4));
              CHECK_FALSE(a->q_qknorm->bias.defined());  // a gain only
              CHECK(a->q_qknorm->spec().kind == (llama ? NormKind::RMSNorm : NormKind::LayerNorm));
            }
        }
        CHECK(attentions == (llama ? 2 : 6));
        // A step reaches the gains.
        torch::manual_seed(9);
        const DeviceBatch b = batch_of(cfg);
        fp32_batch_loss(*m, b, 0.1, 0).loss.backward();
        for (const auto& p : m->named_parameters())
          if (p.key().find("qknorm") != std::string::npos) {
            CAPTURE(p.key());
            REQUIRE(p.value().grad().defined());
            CHECK(p.value().grad().abs().sum().item<double>() > 0);
          }
      }
  }

  TEST_CASE("final_logit_softcap: s·tanh(logits/s) of the same model, values and gradients") {
    for (const bool llama : {false, true})
      for (const char* scheme : kSchemes) {
        CAPTURE(llama);
        CAPTURE(scheme);
        ModelConfig cfg = body(llama);
        torch::manual_seed(11);
        TransformerModel plain = test::make_model(scheme, cfg);
        plain->eval();
        const DeviceBatch b = batch_of(cfg);
        auto logits = [&](TransformerModel& m) {
          return llama ? m->forward_lm(b.tgt_in) : m->forward(b.src, b.tgt_in);
        };
        const torch::Tensor raw = logits(plain);
        const double s = 0.5 * raw.abs().max().item<double>();  // the cap bites
        cfg.final_logit_softcap = s;
        TransformerModel capped = test::make_model(scheme, cfg);
        {
          torch::NoGradGuard no_grad;
          const auto from = plain->named_parameters();
          for (auto& p : capped->named_parameters()) p.value().copy_(from[p.key()]);
        }
        capped->eval();
        const torch::Tensor want = s * torch::tanh(raw / s);
        const torch::Tensor got = logits(capped);
        check_close(got, want);
        CHECK(got.abs().max().item<double>() <= s);
        const torch::Tensor w = torch::randn(got.sizes());
        (want * w).sum().backward();
        (got * w).sum().backward();
        const auto want_grads = plain->named_parameters();
        int compared = 0;
        for (const auto& p : capped->named_parameters()) {
          if (!p.value().grad().defined()) continue;
          CAPTURE(p.key());
          check_close(p.value().grad(), want_grads[p.key()].grad(), 5e-5, false);
          ++compared;
        }
        CHECK(compared > 10);
        // Decoding steps (evaluation, generation) get the capped logits too.
        if (!llama) {
          torch::NoGradGuard no_grad;
          torch::Tensor mask;
          const auto memory = capped->encode(b.src, &mask);
          check_close(capped->decode(b.tgt_in, memory, mask), want.detach());
        }
      }
  }

  TEST_CASE("z_loss: c·Σlog²Z in the loss, not in the nll; with label smoothing and the soft-cap") {
    for (const bool llama : {false, true})
      for (const bool fused : {true, false})
        for (const double cap : {0.0, 1.5}) {
          CAPTURE(llama);
          CAPTURE(fused);
          CAPTURE(cap);
          const double c = 0.05, eps = 0.1;
          ModelConfig cfg = body(llama);
          cfg.final_logit_softcap = cap;
          torch::manual_seed(13);
          TransformerModel m = test::make_model("pre-ln", cfg);
          const DeviceBatch b = batch_of(cfg);
          const bool lever = speed_levers().fused_loss;
          speed_levers().fused_loss = fused;  // the projected CPU loss, or ATen's composition
          m->zero_grad();
          const LossSums got = fp32_batch_loss(*m, b, eps, 0, c);
          got.loss.backward();
          std::vector<torch::Tensor> got_grads;
          for (const auto& p : m->parameters())
            got_grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
          speed_levers().fused_loss = lever;
          // By hand, from the model's logits.
          m->zero_grad();
          torch::Tensor x = llama ? m->forward_lm(b.tgt_in) : m->forward(b.src, b.tgt_in);
          x = x.reshape({-1, x.size(-1)});
          const int64_t V = x.size(1);
          const auto t = b.tgt_out.reshape({-1});
          const auto keep = (t != 0).to(torch::kFloat);
          const auto lse = torch::log(torch::exp(x).sum(-1));
          const auto nll = ((lse - x.gather(1, t.unsqueeze(1)).squeeze(1)) * keep).sum();
          const auto smooth = ((double(V) * lse - x.sum(-1)) * keep).sum();
          const auto z = (lse * lse * keep).sum();
          const double eps_i = eps / double(V - 1);
          const auto loss = (1 - eps - eps_i) * nll + eps_i * smooth + c * z;
          loss.backward();
          CHECK(got.nll.item<double>() == doctest::Approx(nll.item<double>()).epsilon(1e-5));
          CHECK(got.z.item<double>() == doctest::Approx(z.item<double>()).epsilon(1e-5));
          CHECK(got.loss.item<double>() == doctest::Approx(loss.item<double>()).epsilon(1e-5));
          CHECK(z.item<double>() > 0.5);  // the term is not negligible here
          size_t i = 0;
          for (const auto& p : m->parameters()) {
            CAPTURE(i);
            if (p.grad().defined()) check_close(got_grads[i], p.grad(), 5e-5, false);
            ++i;
          }
          // Off: nothing of it in the loss.
          const LossSums off = fp32_batch_loss(*m, b, eps, 0);
          CHECK(off.loss.item<double>() ==
                doctest::Approx((loss - c * z).item<double>()).epsilon(1e-5));
        }
  }

  TEST_CASE("z_loss in an update: its own sum, the nll without it") {
    const ModelConfig cfg = body(true);
    torch::manual_seed(17);
    TransformerModel m = test::make_model("pre-ln", cfg);
    const DeviceBatch b = batch_of(cfg);
    UpdateOptions o;
    o.label_smoothing = 0.0;
    const UpdateLoss without = accumulate_gradients(*m, {b}, o);
    o.z_loss = 0.01;
    const UpdateLoss with = accumulate_gradients(*m, {b}, o);
    const LossSums sums = fp32_batch_loss(*m, b, 0.0, 0, 0.01);
    CHECK(with.nll == doctest::Approx(without.nll).epsilon(1e-6));
    CHECK(without.z == 0.0);
    CHECK(with.z == doctest::Approx(0.01 * sums.z.item<double>()).epsilon(1e-6));
    CHECK(with.loss == doctest::Approx(without.loss + with.z).epsilon(1e-5));
    CHECK(with.z > 0);
  }

  TEST_CASE("the new gains are exempt from weight decay by role") {
    ModelConfig cfg = body(true);
    cfg.qk_norm = QkNorm::RMS;
    TransformerModel m = test::make_model("pre-ln", cfg);
    for (const char* rule : {"vectors", "vectors+scheme", "nothing"}) {
      CAPTURE(rule);
      const DecayPlan plan = plan_weight_decay(*m, rule);
      size_t i = 0, gains = 0;
      for (const auto& p : m->named_parameters()) {
        if (p.key().find("qknorm") != std::string::npos) {
          ++gains;
          CHECK(bool(plan.decays[i]) == (std::string(rule) == "nothing"));
        }
        ++i;
      }
      CHECK(gains == 4);  // q and k gains of 2 layers
    }
  }

  TEST_CASE("a scheme that normalizes q and k itself refuses model.qk_norm") {
    for (const bool llama : {false, true})
      for (const char* scheme : {"hybridnorm", "ngpt"}) {
        CAPTURE(llama);
        CAPTURE(scheme);
        ModelConfig cfg = body(llama);
        cfg.qk_norm = QkNorm::RMS;
        CHECK_THROWS_AS(test::make_model(scheme, cfg), QkNormConflict);
        cfg.qk_norm = QkNorm::None;
        CHECK_NOTHROW(test::make_model(scheme, cfg));
      }
    // Through a run: the manifest and the key named.
    const fs::path d = test::fresh_dir("interventions", "hybridnorm");
    const std::string path = write_manifest(d, "qk_norm = \"rms\"", "hybridnorm");
    const ExperimentSpec spec = load_manifest(path, {}, &test::builtin_registry());
    std::ostringstream sink;
    std::string why;
    try {
      train(spec, test::builtin_registry(), sink);
    } catch (const ManifestError& e) {
      why = e.what();
    }
    CHECK(why.find(path) != std::string::npos);
    CHECK(why.find("[model] qk_norm") != std::string::npos);
    CHECK(why.find("hybridnorm") != std::string::npos);
    fs::remove_all(d);
  }

  TEST_CASE("manifest: the keys resolved into the model, bad values named with the key") {
    const fs::path d = test::fresh_dir("interventions", "manifest");
    const std::string good =
        write_manifest(d / "good",
                       "qk_norm = \"layer\"\nqk_norm_scope = \"all\"\nattn_logit_softcap = 50.0\n"
                       "final_logit_softcap = 30.0",
                       "pre-ln", "z_loss = 1e-4");
    const ExperimentSpec spec = load_manifest(good, {}, &test::builtin_registry());
    CHECK(spec.optim.z_loss == 1e-4);
    data::Dataset ds;
    ds.tgt_vocab = 16;
    const ModelConfig cfg = model_config(spec, ds);
    CHECK(cfg.qk_norm == QkNorm::Layer);
    CHECK(cfg.qk_norm_all);
    CHECK(cfg.attn_logit_softcap == 50.0);
    CHECK(cfg.final_logit_softcap == 30.0);
    struct Bad {
      std::string model, optim, key;
    };
    for (const Bad& bad :
         {Bad{"qk_norm = \"l2\"", "", "[model] qk_norm"},
          Bad{"qk_norm_scope = \"all\"", "", "[model] qk_norm_scope"},
          Bad{"qk_norm_scope = \"rows\"\nqk_norm = \"rms\"", "", "[model] qk_norm_scope"},
          Bad{"attn_logit_softcap = -1.0", "", "[model] attn_logit_softcap"},
          Bad{"final_logit_softcap = nan", "", "[model] final_logit_softcap"},
          Bad{"", "z_loss = -0.1", "[optim] z_loss"}, Bad{"", "z_loss = nan", "[optim] z_loss"}}) {
      CAPTURE(bad.model);
      CAPTURE(bad.optim);
      const std::string path = write_manifest(d / "bad", bad.model, "pre-ln", bad.optim);
      const std::string why = manifest_error(path);
      CHECK(why.find(path) != std::string::npos);
      CHECK(why.find(bad.key) != std::string::npos);
    }
    fs::remove_all(d);
  }

  TEST_CASE("a checkpoint with an intervention on is refused by a model without it, and back") {
    const fs::path d = test::fresh_dir("interventions", "identity");
    ModelConfig on = body(true);
    on.final_logit_softcap = 30;
    on.attn_logit_softcap = 50;
    TransformerModel a = test::make_model("pre-ln", on);
    FlatAdamW opt(a->parameters(), torch::optim::AdamWOptions(1e-3));
    {
      util::AtomicFile f(d / "a.safetensors");
      write_checkpoint(f, *a, opt, TrainingState{});
      f.commit();
    }
    auto refusal = [&](const ModelConfig& cfg) -> std::string {
      TransformerModel m = test::make_model("pre-ln", cfg);
      try {
        load_model_weights(d / "a.safetensors", *m);
      } catch (const CheckpointError& e) {
        return e.what();
      }
      return "";
    };
    CHECK(refusal(on) == "");
    CHECK(refusal(body(true)).find("final_logit_softcap 30.0 in the checkpoint, absent") !=
          std::string::npos);
    ModelConfig other = on;
    other.attn_logit_softcap = 20;
    CHECK(refusal(other).find("attn_logit_softcap 50.0 in the checkpoint, 20.0") !=
          std::string::npos);
    // The other way: a checkpoint without, a model with.
    TransformerModel plain = test::make_model("pre-ln", body(true));
    FlatAdamW opt2(plain->parameters(), torch::optim::AdamWOptions(1e-3));
    {
      util::AtomicFile f(d / "b.safetensors");
      write_checkpoint(f, *plain, opt2, TrainingState{});
      f.commit();
    }
    TransformerModel capped = test::make_model("pre-ln", on);
    std::string why;
    try {
      load_model_weights(d / "b.safetensors", *capped);
    } catch (const CheckpointError& e) {
      why = e.what();
    }
    CHECK(why.find("final_logit_softcap absent in the checkpoint, 30.0") != std::string::npos);
    fs::remove_all(d);
  }
}

}  // namespace normlab_test_interventions
