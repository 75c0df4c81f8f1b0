// The analysis probes against direct computations on tiny models, and analysis on/off identity.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "normlab/analysis/probes.h"
#include "normlab/manifest/experiment.h"
#include "normlab/train/trainer.h"
#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_analysis {

using namespace normlab;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("normlab_analysis_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// analysis.csv as (update, metric, stack, layer, sublayer) → value.
using Key = std::tuple<int64_t, std::string, std::string, int, std::string>;
std::map<Key, double> read_csv(const fs::path& run_dir) {
  std::map<Key, double> out;
  std::ifstream f(run_dir / "analysis.csv");
  std::string line;
  std::getline(f, line);
  REQUIRE(line == "update,metric,stack,layer,sublayer,value");
  while (std::getline(f, line)) {
    std::stringstream ss(line);
    std::string u, metric, stack, layer, sub, value;
    std::getline(ss, u, ',');
    std::getline(ss, metric, ',');
    std::getline(ss, stack, ',');
    std::getline(ss, layer, ',');
    std::getline(ss, sub, ',');
    std::getline(ss, value, ',');
    out[{std::stoll(u), metric, stack, std::stoi(layer), sub}] = std::stod(value);
  }
  return out;
}

double record(const std::map<Key, double>& m, const Key& k) {
  auto it = m.find(k);
  if (it == m.end()) {
    FAIL("no record ", std::get<0>(k), " ", std::get<1>(k), " ", std::get<2>(k), " ",
         std::get<3>(k), " ", std::get<4>(k));
    return 0;
  }
  return it->second;
}

AnalysisSection all_probes() {
  AnalysisSection a;
  a.probes = {"all"};
  a.tensorboard = false;
  a.dense_until = 1000;
  return a;
}

// A probe batch with padding: 3 sentences of different lengths.
analysis::ProbeBatch probe_batch(bool encdec) {
  // pad 0, BOS 2, EOS 3 (data::kPad, kBos, kEos)
  auto src = torch::tensor({{5, 6, 7, 8, 3}, {9, 10, 3, 0, 0}, {11, 3, 0, 0, 0}}, torch::kLong);
  auto tgt = torch::tensor({{2, 12, 13, 14}, {2, 15, 16, 0}, {2, 17, 0, 0}}, torch::kLong);
  return {encdec ? src : torch::Tensor(), tgt, 0};
}

torch::Tensor mean_token_distance(const torch::Tensor& a, const torch::Tensor& b,
                                  const torch::Tensor& tokens) {
  const auto mask = tokens.ne(0).to(torch::kDouble);
  return ((a - b).to(torch::kDouble).norm(2, -1) * mask).sum() / mask.sum();
}

}  // namespace

TEST_SUITE("analysis") {
  TEST_CASE("probe schedule: dense window, interval, last update; layer selection") {
    AnalysisSection a;
    a.probes = {"grad_norm"};
    a.interval = 10;
    a.dense_until = 3;
    const auto plan = analysis::make_probe_plan(a, 45);
    std::vector<int64_t> due;
    for (int64_t u = 1; u <= 45; ++u)
      if (plan.due(u)) due.push_back(u);
    CHECK(due == std::vector<int64_t>{1, 2, 3, 10, 20, 30, 40, 45});
    CHECK(analysis::make_probe_plan(AnalysisSection{}, 45).any() == false);
    CHECK(analysis::select_layers("auto", 6) == std::vector<int>{0, 1, 2, 3, 4, 5});
    CHECK(analysis::select_layers("auto", 100) == std::vector<int>{0, 1, 25, 50, 75, 98, 99});
    CHECK(analysis::select_layers("0,1,-1,-2,7,40", 8) == std::vector<int>{0, 1, 6, 7});
  }

  TEST_CASE("parameter gradient norms equal autograd's, per layer and sublayer") {
    torch::manual_seed(3);
    auto cfg = test::small_config(Arch::EncDec, 2, 2);
    auto model = test::make_model("pre-ln", cfg);
    const fs::path dir = fresh_dir("gradnorm");
    AnalysisSection a = all_probes();
    analysis::ProbeSession probes(a, 10, *model, probe_batch(true), dir, 0);
    auto batch = probe_batch(true);
    probes.before_forward(1);
    auto logits = model->forward(batch.src, batch.tgt_in);
    torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                         torch::randint(0, 50, {12}))
        .backward();
    probes.after_backward(1);

    // Direct: √(Σ ‖∂L/∂p‖²) over the parameters of one group, from the stable names.
    auto direct = [&](const std::string& prefix) {
      double s = 0;
      for (const auto& p : model->named_parameters())
        if (p.key().rfind(prefix, 0) == 0)
          s += p.value().grad().to(torch::kDouble).pow(2).sum().item<double>();
      return std::sqrt(s);
    };
    probes.after_step(1);
    const auto rec = read_csv(dir);
    for (const char* stack : {"encoder", "decoder"})
      for (int layer : {0, 1}) {
        CAPTURE(stack);
        CAPTURE(layer);
        const std::string base = fmt::format("{}.layers.{}.", stack, layer);
        CHECK(record(rec, {1, "grad_norm", stack, layer, "all"}) ==
              doctest::Approx(direct(base)).epsilon(1e-6));
        CHECK(record(rec, {1, "grad_norm", stack, layer, "ffn"}) ==
              doctest::Approx(direct(base + "ffn.")).epsilon(1e-6));
        CHECK(record(rec, {1, "grad_norm", stack, layer, "self_attn"}) ==
              doctest::Approx(direct(base + "self_attn.")).epsilon(1e-6));
      }
    CHECK(record(rec, {1, "grad_norm", "decoder", 1, "cross_attn"}) ==
          doctest::Approx(direct("decoder.layers.1.cross_attn.")).epsilon(1e-6));
    CHECK(record(rec, {1, "grad_norm", "encoder", -1, "embeddings"}) ==
          doctest::Approx(direct("encoder.embed_tokens.")).epsilon(1e-6));
    // Activation gradients were recorded at layer boundaries and at LayerNorm inputs/outputs.
    CHECK(record(rec, {1, "act_grad_norm", "encoder", 0, "output"}) > 0);
    CHECK(rec.count({1, "act_grad_norm", "decoder", 1, "output"}) == 1);
    const auto norms = model->encoder->layer(0).norm_names();
    REQUIRE(!norms.empty());
    CHECK(record(rec, {1, "act_grad_norm", "encoder", 0, norms[0] + ".in"}) > 0);
    CHECK(record(rec, {1, "act_grad_norm", "encoder", 0, norms[0] + ".out"}) > 0);
  }

  TEST_CASE("activation-gradient norm of a layer output equals autograd's") {
    torch::manual_seed(4);
    auto cfg = test::small_config(Arch::LM, 0, 2);
    auto model = test::make_model("post-ln", cfg);
    const fs::path dir = fresh_dir("actgrad");
    AnalysisSection a;
    a.probes = {"act_grad_norm"};
    a.tensorboard = false;
    analysis::ProbeSession probes(a, 10, *model, probe_batch(false), dir, 0);
    auto batch = probe_batch(false);
    // The direct computation: keep layer 0's output and ask autograd for its gradient.
    struct Keep : ActivationObserver {
      torch::Tensor out;
      void on_layer_output(const LayerId& id, const torch::Tensor& t) override {
        if (id.index == 0) out = t;
      }
    } keep;
    model->set_observer(&keep);
    auto loss = model->forward_lm(batch.tgt_in).pow(2).mean();
    model->set_observer(nullptr);
    const auto g = torch::autograd::grad({loss}, {keep.out})[0];
    probes.before_forward(1);
    model->forward_lm(batch.tgt_in).pow(2).mean().backward();
    probes.after_backward(1);
    probes.after_step(1);
    CHECK(record(read_csv(dir), {1, "act_grad_norm", "decoder", 0, "output"}) ==
          doctest::Approx(g.norm().item<double>()).epsilon(1e-6));
  }

  TEST_CASE("model update: 0 at update 0, the direct ||F(x,θ1) - F(x,θ0)|| after one SGD step") {
    for (bool encdec : {true, false}) {
      CAPTURE(encdec);
      torch::manual_seed(5);
      auto cfg = test::small_config(encdec ? Arch::EncDec : Arch::LM, 2, 2);
      auto model = test::make_model("deepnorm", cfg);
      const fs::path dir = fresh_dir(encdec ? "update_encdec" : "update_lm");
      auto batch = probe_batch(encdec);
      auto run = [&] {
        torch::NoGradGuard ng;
        model->eval();
        auto f = encdec ? model->forward(batch.src, batch.tgt_in) : model->forward_lm(batch.tgt_in);
        model->train();
        return f;
      };
      const torch::Tensor f0 = run();
      analysis::ProbeSession probes(all_probes(), 10, *model, batch, dir, 0);
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5));
      sgd.zero_grad();
      probes.before_forward(1);
      (encdec ? model->forward(batch.src, batch.tgt_in) : model->forward_lm(batch.tgt_in))
          .logsumexp(-1)
          .mean()
          .backward();
      probes.after_backward(1);
      probes.before_step(1);
      std::vector<torch::Tensor> theta0;
      for (const auto& p : model->parameters()) theta0.push_back(p.detach().clone());
      sgd.step();
      probes.after_step(1);
      const torch::Tensor f1 = run();
      const auto rec = read_csv(dir);
      CHECK(record(rec, {0, "update_norm", "model", -1, "logits"}) == 0.0);
      const double direct = mean_token_distance(f1, f0, batch.tgt_in).item<double>();
      CHECK(direct > 1e-3);
      CHECK(record(rec, {1, "update_norm", "model", -1, "logits"}) ==
            doctest::Approx(direct).epsilon(1e-5));
      CHECK(record(rec, {0, "update_norm", "decoder", 1, "output"}) == 0.0);
      CHECK(record(rec, {1, "update_norm", "decoder", 1, "output"}) > 0.0);
      // Relative parameter update of the whole model: ‖θ1 − θ0‖ / ‖θ0‖.
      double num = 0, den = 0;
      size_t i = 0;
      for (const auto& p : model->parameters()) {
        num += (p.detach() - theta0[i]).to(torch::kDouble).pow(2).sum().item<double>();
        den += theta0[i++].to(torch::kDouble).pow(2).sum().item<double>();
      }
      CHECK(record(rec, {1, "param_update", "model", -1, "total"}) ==
            doctest::Approx(std::sqrt(num / den)).epsilon(1e-5));
    }
  }

  TEST_CASE("FFN sparsity of a constructed activation; LayerNorm input norm of a known input") {
    torch::manual_seed(6);
    auto cfg = test::small_config(Arch::LM, 0, 2, /*d=*/16, /*heads=*/2, /*ffn=*/32);
    auto model = test::make_model("pre-ln", cfg);
    {
      torch::NoGradGuard ng;
      // Layer 1's FFN: ReLU(0·h + b) with 12 of 32 biases ≤ 0 → exactly 12/32 zeros at every
      // position.
      auto& ffn = *model->decoder->layer(1).ffn;
      ffn.fc1->weight.zero_();
      ffn.fc1->bias.copy_(torch::cat({-torch::ones({10}), torch::zeros({2}), torch::ones({20})}));
      // Zero token embeddings: layer 0's first LayerNorm (Pre-LN) sees only the sinusoidal
      // positions, whose norm is √(d/2) at every position (one sin² + cos² = 1 per frequency).
      model->decoder->embed_tokens->weight.zero_();
    }
    const fs::path dir = fresh_dir("sparsity");
    AnalysisSection a;
    a.probes = {"sparsity", "ln_input_norm"};
    a.tensorboard = false;
    analysis::ProbeSession probes(a, 10, *model, probe_batch(false), dir, 0);
    const auto rec = read_csv(dir);
    CHECK(record(rec, {0, "ffn_zero_fraction", "decoder", 1, "ffn"}) ==
          doctest::Approx(12.0 / 32.0));
    CHECK(record(rec, {0, "ffn_nonzero_fraction", "decoder", 1, "ffn"}) ==
          doctest::Approx(20.0 / 32.0));
    const std::string first_norm = model->decoder->layer(0).norm_names().at(0);
    CHECK(record(rec, {0, "ln_input_norm", "decoder", 0, first_norm}) ==
          doctest::Approx(std::sqrt(8.0)).epsilon(1e-5));
  }

  TEST_CASE(
      "hidden-state norm and layer angular distance: by hand on the probe batch; 0 for a layer "
      "that adds nothing") {
    for (Family family : {Family::Transformer, Family::Llama}) {
      CAPTURE(to_string(family));
      torch::manual_seed(8);
      auto cfg = test::small_config(Arch::LM, 0, 3, /*d=*/16, /*heads=*/2, /*ffn=*/32);
      cfg.family = family;
      auto model = test::make_model("pre-ln", cfg);
      {
        // Layer 1's branches output zeros: its output is its input (angular distance 0).
        torch::NoGradGuard ng;
        auto& layer = model->decoder->layer(1);
        for (const auto& p : layer.named_parameters())
          if (p.key().find("out_proj") != std::string::npos ||
              p.key().find("fc2") != std::string::npos)
            p.value().zero_();
      }
      // The direct computation: the layers' inputs and outputs on the probe batch, in eval mode.
      struct Keep : ActivationObserver {
        std::map<int, torch::Tensor> in, out;
        void on_layer_input(const LayerId& id, const torch::Tensor& t) override {
          in[id.index] = t.detach().to(torch::kDouble);
        }
        void on_layer_output(const LayerId& id, const torch::Tensor& t) override {
          out[id.index] = t.detach().to(torch::kDouble);
        }
      } keep;
      const auto batch = probe_batch(false);
      model->eval();
      model->set_observer(&keep);
      {
        torch::NoGradGuard ng;
        model->forward_lm(batch.tgt_in);
      }
      model->set_observer(nullptr);
      model->train();
      const fs::path dir = fresh_dir(std::string("hidden_") + to_string(family));
      AnalysisSection a;
      a.probes = {"hidden_state_norm", "layer_angular_distance"};
      a.tensorboard = false;
      analysis::ProbeSession probes(a, 10, *model, batch, dir, 0);
      const auto rec = read_csv(dir);  // 9 significant digits
      for (int l = 0; l < 3; ++l) {
        CAPTURE(l);
        double angle = 0, sq = 0, max_abs = 0;
        int positions = 0;
        for (int b = 0; b < 3; ++b)
          for (int t = 0; t < 4; ++t) {
            if (batch.tgt_in[b][t].item<int64_t>() == 0) continue;  // padding
            const torch::Tensor x = keep.in[l][b][t], y = keep.out[l][b][t];
            const double c =
                x.dot(y).item<double>() / (x.norm().item<double>() * y.norm().item<double>());
            angle += std::acos(std::min(1.0, std::max(-1.0, c))) / M_PI;
            sq += y.pow(2).sum().item<double>();
            max_abs = std::max(max_abs, y.abs().max().item<double>());
            ++positions;
          }
        CHECK(positions == 9);
        CHECK(record(rec, {0, "layer_angular_distance", "decoder", l, "layer"}) ==
              doctest::Approx(angle / positions).epsilon(1e-7));
        CHECK(record(rec, {0, "hidden_rms", "decoder", l, "output"}) ==
              doctest::Approx(std::sqrt(sq / (positions * 16.0))).epsilon(1e-7));
        CHECK(record(rec, {0, "hidden_max_abs", "decoder", l, "output"}) ==
              doctest::Approx(max_abs).epsilon(1e-7));
        if (l == 1)
          CHECK(record(rec, {0, "layer_angular_distance", "decoder", l, "layer"}) < 1e-6);
        else
          CHECK(record(rec, {0, "layer_angular_distance", "decoder", l, "layer"}) > 1e-3);
      }
    }
  }

  TEST_CASE("layer cosine similarity: symmetric, unit diagonal, in [-1, 1]; scheme state") {
    torch::manual_seed(7);
    auto cfg = test::small_config(Arch::EncDec, 3, 3);
    auto model = test::make_model("branchnorm", cfg, {{"T", ParamValue::of_int(100)}});
    const fs::path dir = fresh_dir("cosine");
    analysis::ProbeSession probes(all_probes(), 10, *model, probe_batch(true), dir, 0);
    const auto rec = read_csv(dir);
    for (const char* stack : {"encoder", "decoder"})
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
          const double c = record(rec, {0, "layer_cosine", stack, i, fmt::format("layer:{}", j)});
          CHECK(c == doctest::Approx(
                         record(rec, {0, "layer_cosine", stack, j, fmt::format("layer:{}", i)})));
          CHECK(c <= 1.0 + 1e-9);
          CHECK(c >= -1.0 - 1e-9);
          if (i == j) CHECK(c == doctest::Approx(1.0));
        }
    // BranchNorm's α_t at update 0 is α for the first update: 1/T.
    CHECK(record(rec, {0, "scheme_state", "model", -1, "alpha_t"}) == doctest::Approx(0.01));
  }

  TEST_CASE("analysis on or off: identical training losses; records flushed as the run goes") {
    const fs::path off = fresh_dir("off"), on = fresh_dir("on");
    auto manifest = [](const fs::path& dir, bool analysis) {
      std::string text = fmt::format(R"([model]
d_model = 32
ffn_dim = 64
heads = 2
enc_layers = 2
dec_layers = 2
dropout = 0.1
attention_dropout = 0.1
[scheme]
name = "b2t"
[data]
task = "reverse"
synthetic_vocab = 12
synthetic_min_len = 3
synthetic_max_len = 8
synthetic_train = 2000
synthetic_valid = 40
cache_dir = "{0}/cache"
[optim]
lr = 2e-3
warmup_updates = 5
max_tokens = 256
max_updates = 25
clip_norm = 0.5
[eval]
interval = 0
bleu = false
[run]
out_dir = "{0}/run"
log_interval = 1
threads = 1
)",
                                     dir.string());
      if (analysis)
        text +=
            "[analysis]\nprobes = [\"all\"]\ninterval = 4\ndense_until = 3\ncosine_at = [0, 8]\n"
            "formats = [\"csv\", \"jsonl\", \"tensorboard\"]\n";
      std::ofstream(dir / "m.toml") << text;
      return load_manifest((dir / "m.toml").string(), {}, &test::builtin_registry());
    };
    std::ostringstream sink;
    REQUIRE(train(manifest(off, false), test::builtin_registry(), sink).status == "completed");
    REQUIRE(train(manifest(on, true), test::builtin_registry(), sink).status == "completed");
    auto losses = [](const fs::path& run) {
      std::vector<double> out;
      std::ifstream f(run / "train.jsonl");
      for (std::string line; std::getline(f, line);) {
        auto j = nlohmann::json::parse(line);
        if (j["kind"] == "train") out.push_back(j["loss"].get<double>());
      }
      return out;
    };
    const auto a = losses(off / "run"), b = losses(on / "run");
    REQUIRE(a.size() == 25);
    CHECK(a == b);  // bitwise
    CHECK(!fs::exists(off / "run" / "analysis.csv"));
    const auto rec = read_csv(on / "run");
    std::set<int64_t> updates;
    std::set<std::string> metrics;
    for (const auto& [k, v] : rec) {
      updates.insert(std::get<0>(k));
      metrics.insert(std::get<1>(k));
    }
    CHECK(updates == std::set<int64_t>{0, 1, 2, 3, 4, 8, 12, 16, 20, 24, 25});
    CHECK(metrics == std::set<std::string>{"act_grad_norm",
                                           "activation_kurtosis",
                                           "attn_entropy",
                                           "attn_logit_max",
                                           "ffn_nonzero_fraction",
                                           "ffn_zero_fraction",
                                           "grad_norm",
                                           "hidden_max_abs",
                                           "hidden_rms",
                                           "layer_angular_distance",
                                           "layer_cosine",
                                           "ln_input_norm",
                                           "massive_activation_feature",
                                           "massive_activation_max",
                                           "massive_activation_position",
                                           "massive_activation_ratio",
                                           "massive_activation_sequence",
                                           "output_log_z",
                                           "output_logit_max_abs",
                                           "output_logit_mean_abs",
                                           "param_update",
                                           "update_norm"});
    CHECK(rec.count({8, "layer_cosine", "encoder", 1, "layer:0"}) == 1);
    CHECK(rec.count({12, "layer_cosine", "encoder", 1, "layer:0"}) == 0);
    // JSONL holds the same rows.
    std::ifstream jf(on / "run" / "analysis.jsonl");
    size_t rows = 0;
    for (std::string line; std::getline(jf, line);) ++rows;
    CHECK(rows == rec.size());
    CHECK(fs::exists(on / "run" / "tensorboard"));
  }

  // Issue 12.1: a probe advanced BranchNorm's clock, so its validation loss and α_t depended on
  // whether analysis was on. Every built-in scheme: every train and valid record (losses, gradient
  // norm, scheme status, BLEU) bitwise equal with all probes on and off.
  TEST_CASE("analysis never changes a result, for every built-in scheme") {
    auto manifest = [](const fs::path& dir, const std::string& scheme, bool analysis) {
      fs::create_directories(dir);
      std::string text = fmt::format(R"([model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 2
dec_layers = 2
dropout = 0.1
[scheme]
name = "{1}"
{2}
[data]
task = "reverse"
synthetic_vocab = 10
synthetic_min_len = 3
synthetic_max_len = 6
synthetic_train = 400
synthetic_valid = 16
cache_dir = "{0}/cache"
[optim]
lr = 3e-3
warmup_updates = 3
max_tokens = 128
max_updates = 9
[eval]
interval = 3
bleu = true
[run]
out_dir = "{0}/run"
log_interval = 1
threads = 1
)",
                                     dir.string(), scheme, scheme == "branchnorm" ? "T = 6" : "");
      if (analysis)
        text +=
            "[analysis]\nprobes = [\"all\"]\ninterval = 2\ndense_until = 2\ncosine_at = [0, 4]\n";
      std::ofstream(dir / "m.toml") << text;
      return load_manifest((dir / "m.toml").string(), {}, &test::builtin_registry());
    };
    // Everything a run reports except wall-clock figures.
    auto results = [](const fs::path& run) {
      std::vector<std::string> out;
      std::ifstream f(run / "train.jsonl");
      for (std::string line; std::getline(f, line);) {
        auto j = nlohmann::json::parse(line);
        for (const char* k :
             {"elapsed_s", "tokens_per_s", "ms_per_update", "data_ms_per_update", "seconds"})
          j.erase(k);
        out.push_back(j.dump());
      }
      return out;
    };
    const fs::path root = fresh_dir("every_scheme");
    std::vector<std::string> schemes;
    for (const PluginInfo* p : test::builtin_registry().plugins()) schemes.push_back(p->name);
    REQUIRE(schemes.size() >= 10);
    for (const std::string& scheme : schemes) {
      CAPTURE(scheme);
      std::ostringstream sink;
      REQUIRE(
          train(manifest(root / (scheme + "_off"), scheme, false), test::builtin_registry(), sink)
              .status == "completed");
      REQUIRE(train(manifest(root / (scheme + "_on"), scheme, true), test::builtin_registry(), sink)
                  .status == "completed");
      const auto off = results(root / (scheme + "_off") / "run"),
                 on = results(root / (scheme + "_on") / "run");
      auto count = [&](const char* kind) {
        return std::count_if(off.begin(), off.end(), [&](const std::string& r) {
          return nlohmann::json::parse(r)["kind"] == kind;
        });
      };
      REQUIRE(count("train") == 9);
      REQUIRE(count("valid") == 3);
      REQUIRE(count("test") == 1);  // the synthetic task's test set, decoded at the end
      REQUIRE(on.size() == off.size());
      for (size_t i = 0; i < off.size(); ++i) CHECK(off[i] == on[i]);
      CHECK(fs::exists(root / (scheme + "_on") / "run" / "analysis.csv"));
    }
    fs::remove_all(root);
  }

  TEST_CASE("resumed run: analysis records neither lost nor repeated") {
    const fs::path dir = fresh_dir("resume");
    std::string text = fmt::format(R"([model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 2
dec_layers = 2
[scheme]
name = "pre-ln"
[data]
task = "copy"
synthetic_vocab = 10
synthetic_train = 500
synthetic_valid = 20
cache_dir = "{0}/cache"
[optim]
max_tokens = 128
max_updates = 12
[eval]
interval = 0
bleu = false
[run]
out_dir = "{0}/run"
log_interval = 1
checkpoint_interval = 4
threads = 1
[analysis]
probes = ["all"]
interval = 2
dense_until = 0
tensorboard = false
)",
                                   dir.string());
    std::ofstream(dir / "m.toml") << text;
    std::ostringstream sink;
    // First part: 6 updates (checkpoint at 4), then pretend the run was killed after update 6.
    REQUIRE(train(load_manifest((dir / "m.toml").string(), {"optim.max_updates=6"},
                                &test::builtin_registry()),
                  test::builtin_registry(), sink)
                .status == "completed");
    fs::copy_file(dir / "run/checkpoints/step_4.safetensors",
                  dir / "run/checkpoints/last.safetensors", fs::copy_options::overwrite_existing);
    REQUIRE(train(load_manifest((dir / "m.toml").string(), {}, &test::builtin_registry()),
                  test::builtin_registry(), sink)
                .status == "completed");
    const auto rec = read_csv(dir / "run");
    std::map<int64_t, int> total_rows;
    std::ifstream f(dir / "run" / "analysis.csv");
    std::string line;
    std::getline(f, line);
    while (std::getline(f, line))
      if (line.find(",grad_norm,model,-1,total,") != std::string::npos)
        ++total_rows[std::stoll(line)];
    CHECK(total_rows == std::map<int64_t, int>{{2, 1}, {4, 1}, {6, 1}, {8, 1}, {10, 1}, {12, 1}});
    // ‖ΔF‖ after the resume is still measured against θ_0.
    CHECK(record(rec, {0, "update_norm", "model", -1, "logits"}) == 0.0);
    CHECK(record(rec, {12, "update_norm", "model", -1, "logits"}) > 0.0);
    // Issue 19.4: no file keeps F(x, θ_0) (1.5 to 35 MB); the resumed run measures it again from
    // the same initialization, and its ‖ΔF‖ is what the first run measured, bitwise.
    CHECK(!fs::exists(dir / "run" / "analysis_reference.pt"));
    // One canonical table by default (analysis.formats = ["csv"]); JSONL and TensorBoard are
    // opt-in.
    CHECK(!fs::exists(dir / "run" / "analysis.jsonl"));
    CHECK(!fs::exists(dir / "run" / "tensorboard"));
    std::ifstream discarded(dir / "run" / "analysis.discarded.csv");
    std::map<std::string, std::string>
        first_run;  // update 5 and 6 rows the resumed run logged again
    for (std::string row; std::getline(discarded, row);)
      if (row.find(",update_norm,") != std::string::npos)
        first_run[row.substr(0, row.rfind(','))] = row.substr(row.rfind(',') + 1);
    REQUIRE(!first_run.empty());
    std::ifstream again(dir / "run" / "analysis.csv");
    size_t same = 0;
    for (std::string row; std::getline(again, row);) {
      auto it = first_run.find(row.substr(0, row.rfind(',')));
      if (it == first_run.end()) continue;
      CHECK(it->second == row.substr(row.rfind(',') + 1));
      ++same;
    }
    CHECK(same == first_run.size());
  }

  TEST_CASE("writes a run with analysis for the TensorBoard read-back check" *
            doctest::skip(std::getenv("NORMLAB_ANALYSIS_OUT") == nullptr)) {
    const fs::path dir = std::getenv("NORMLAB_ANALYSIS_OUT");
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "m.toml") << fmt::format(R"([model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 2
dec_layers = 2
[scheme]
name = "admin"
[data]
task = "reverse"
synthetic_vocab = 10
synthetic_train = 500
synthetic_valid = 20
cache_dir = "{0}/cache"
[optim]
max_tokens = 128
max_updates = 6
[eval]
interval = 3
bleu = false
[run]
out_dir = "{0}/run"
log_interval = 2
threads = 1
[analysis]
probes = ["all"]
dense_until = 2
interval = 3
formats = ["csv", "tensorboard"]
)",
                                                 dir.string());
    std::ostringstream sink;
    REQUIRE(train(load_manifest((dir / "m.toml").string(), {}, &test::builtin_registry()),
                  test::builtin_registry(), sink)
                .status == "completed");
    CHECK(fs::exists(dir / "run" / "analysis.csv"));
  }

}  // TEST_SUITE

}  // namespace normlab_test_analysis
