// The probes that see an instability coming (issue 67.4) against direct computations on the probe
// batch: attention logit maxima and entropies from the projections' weights (q·kᵀ/√dh by hand,
// rotary positions and grouped k/v heads by hand on the llama body), the output logits' log Z and
// |z|, the kurtosis of per-feature RMS and the massive activations from the layer outputs.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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
namespace normlab_test_instability_probes {

using namespace normlab;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kProbes = {"activation_kurtosis", "attn_entropy", "attn_logit_max",
                                          "massive_activations", "output_logits"};

// analysis.csv as (update, metric, stack, layer, sublayer) → value.
using Key = std::tuple<int64_t, std::string, std::string, int, std::string>;
std::map<Key, double> read_csv(const fs::path& run_dir) {
  std::map<Key, double> out;
  std::ifstream f(run_dir / "analysis.csv");
  std::string line;
  std::getline(f, line);
  REQUIRE(line == "update,metric,stack,layer,sublayer,value");
  while (std::getline(f, line)) {
    std::vector<std::string> c;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) c.push_back(x);
    REQUIRE(c.size() == 6);
    out[{std::stoll(c[0]), c[1], c[2], std::stoi(c[3]), c[4]}] = std::stod(c[5]);
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

// Every norm's output and every layer's input and output of one forward pass, in double.
struct Keep : ActivationObserver {
  TransformerModelImpl* model = nullptr;
  std::map<std::tuple<int, int, std::string>, torch::Tensor> norm_out;
  std::map<std::pair<int, int>, torch::Tensor> layer_in, layer_out;
  void on_layer_input(const LayerId& id, const torch::Tensor& in) override {
    layer_in[{int(id.stack), id.index}] = in.detach().to(torch::kDouble);
  }
  void on_norm(const LayerId& id, int norm_id, const torch::Tensor&,
               const torch::Tensor& out) override {
    TransformerStackImpl& stack = id.stack == Stack::Encoder ? *model->encoder : *model->decoder;
    const std::string name = stack.layer(size_t(id.index)).norm_names().at(size_t(norm_id));
    norm_out[{int(id.stack), id.index, name}] = out.detach().to(torch::kDouble);
  }
  void on_layer_output(const LayerId& id, const torch::Tensor& out) override {
    layer_out[{int(id.stack), id.index}] = out.detach().to(torch::kDouble);
  }
};

// x·Wᵀ + b of a projection as [B, heads, T, dh], in double.
torch::Tensor heads_of(const Projection& p, const torch::Tensor& x, int64_t heads) {
  torch::Tensor y = torch::matmul(x, p->weight.detach().to(torch::kDouble).t());
  if (p->bias.defined()) y = y + p->bias.detach().to(torch::kDouble);
  return y.view({x.size(0), x.size(1), heads, -1}).permute({0, 2, 1, 3});
}

// Rotary positions by hand (RoFormer, the half-split layout of HF's Llama): at position t the
// pair (x_i, x_{i+dh/2}) turns by t·θ^(−2i/dh).
torch::Tensor rope(const torch::Tensor& x, double theta) {
  torch::Tensor out = x.clone();
  const int64_t T = x.size(2), dh = x.size(3), half = dh / 2;
  auto in = x.accessor<double, 4>();
  auto o = out.accessor<double, 4>();
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t h = 0; h < x.size(1); ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = double(t) * std::pow(theta, -2.0 * double(i) / double(dh));
          const double c = std::cos(angle), s = std::sin(angle);
          o[b][h][t][i] = in[b][h][t][i] * c - in[b][h][t][i + half] * s;
          o[b][h][t][i + half] = in[b][h][t][i + half] * c + in[b][h][t][i] * s;
        }
  return out;
}

// Per head: max |logit| over the pairs a query (not padding) may attend to, and the mean entropy
// of its softmax over those keys (with a soft-cap s·tanh(x/s) when s > 0). `key_ok(b, q, k)`.
struct Direct {
  std::vector<double> max, entropy;
};
template <class KeyOk>
Direct direct_attention(const torch::Tensor& logits, const torch::Tensor& query_tokens,
                        KeyOk key_ok, double softcap = 0.0) {
  const auto z = logits.accessor<double, 4>();
  const auto tok = query_tokens.accessor<int64_t, 2>();
  const int64_t B = logits.size(0), H = logits.size(1), Tq = logits.size(2), Tk = logits.size(3);
  Direct d;
  for (int64_t h = 0; h < H; ++h) {
    double largest = 0, entropy = 0;
    int queries = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t q = 0; q < Tq; ++q) {
        if (tok[b][q] == 0) continue;  // a padding query
        std::vector<double> capped;
        for (int64_t k = 0; k < Tk; ++k) {
          if (!key_ok(b, q, k)) continue;
          largest = std::max(largest, std::abs(z[b][h][q][k]));
          capped.push_back(softcap > 0 ? softcap * std::tanh(z[b][h][q][k] / softcap)
                                       : z[b][h][q][k]);
        }
        const double m = *std::max_element(capped.begin(), capped.end());
        double sum = 0;
        for (double c : capped) sum += std::exp(c - m);
        for (double c : capped) {
          const double p = std::exp(c - m) / sum;
          entropy -= p * std::log(p);
        }
        ++queries;
      }
    d.max.push_back(largest);
    d.entropy.push_back(entropy / queries);
  }
  return d;
}

void check_attention(const std::map<Key, double>& rec, const std::string& stack, int layer,
                     const std::string& sub, const Direct& d) {
  CAPTURE(stack);
  CAPTURE(layer);
  CAPTURE(sub);
  double mean_entropy = 0;
  for (size_t h = 0; h < d.max.size(); ++h) {
    const std::string head = fmt::format("{}.head:{}", sub, h);
    CHECK(record(rec, {0, "attn_logit_max", stack, layer, head}) ==
          doctest::Approx(d.max[h]).epsilon(1e-5));
    CHECK(record(rec, {0, "attn_entropy", stack, layer, head}) ==
          doctest::Approx(d.entropy[h]).epsilon(1e-5));
    mean_entropy += d.entropy[h] / double(d.max.size());
  }
  CHECK(record(rec, {0, "attn_logit_max", stack, layer, sub}) ==
        doctest::Approx(*std::max_element(d.max.begin(), d.max.end())).epsilon(1e-5));
  CHECK(record(rec, {0, "attn_entropy", stack, layer, sub}) ==
        doctest::Approx(mean_entropy).epsilon(1e-5));
}

// Output logits, kurtosis and massive activations of every layer, by hand from the logits and the
// layer outputs of the probe batch (`tokens` of each stack: 0 is padding).
void check_outputs(const std::map<Key, double>& rec, const Keep& keep, const torch::Tensor& logits,
                   const std::map<int, torch::Tensor>& tokens) {
  {
    const auto z = logits.accessor<double, 3>();
    const auto tok = tokens.at(int(Stack::Decoder)).accessor<int64_t, 2>();
    double log_z = 0, abs_sum = 0, abs_max = 0;
    int64_t positions = 0;
    for (int64_t b = 0; b < logits.size(0); ++b)
      for (int64_t t = 0; t < logits.size(1); ++t) {
        if (tok[b][t] == 0) continue;
        double m = -INFINITY, sum = 0;
        for (int64_t v = 0; v < logits.size(2); ++v) m = std::max(m, z[b][t][v]);
        for (int64_t v = 0; v < logits.size(2); ++v) {
          sum += std::exp(z[b][t][v] - m);
          abs_sum += std::abs(z[b][t][v]);
          abs_max = std::max(abs_max, std::abs(z[b][t][v]));
        }
        log_z += m + std::log(sum);
        ++positions;
      }
    CHECK(record(rec, {0, "output_log_z", "model", -1, "logits"}) ==
          doctest::Approx(log_z / double(positions)).epsilon(1e-6));
    CHECK(record(rec, {0, "output_logit_mean_abs", "model", -1, "logits"}) ==
          doctest::Approx(abs_sum / double(positions * logits.size(2))).epsilon(1e-6));
    CHECK(record(rec, {0, "output_logit_max_abs", "model", -1, "logits"}) ==
          doctest::Approx(abs_max).epsilon(1e-6));
  }
  for (const auto& [where, out] : keep.layer_out) {
    const std::string stack = where.first == int(Stack::Encoder) ? "encoder" : "decoder";
    const int layer = where.second;
    CAPTURE(stack);
    CAPTURE(layer);
    const auto h = out.accessor<double, 3>();
    const auto tok = tokens.at(where.first).accessor<int64_t, 2>();
    const int64_t B = out.size(0), T = out.size(1), d = out.size(2);
    // He et al. 2024 eq. (1): s_j² = mean over tokens of X_ij²; Kurt = mean s⁴ / (mean s²)².
    std::vector<double> s2(size_t(d), 0.0);
    std::vector<double> all;
    double largest = -1;
    int64_t at_b = -1, at_t = -1, at_j = -1, n = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        if (tok[b][t] == 0) continue;
        ++n;
        for (int64_t j = 0; j < d; ++j) {
          s2[size_t(j)] += h[b][t][j] * h[b][t][j];
          all.push_back(std::abs(h[b][t][j]));
          if (std::abs(h[b][t][j]) > largest) {
            largest = std::abs(h[b][t][j]);
            at_b = b, at_t = t, at_j = j;
          }
        }
      }
    double m2 = 0, m4 = 0;
    for (double v : s2) {
      m2 += v / double(n) / double(d);
      m4 += (v / double(n)) * (v / double(n)) / double(d);
    }
    CHECK(record(rec, {0, "activation_kurtosis", stack, layer, "output"}) ==
          doctest::Approx(m4 / (m2 * m2)).epsilon(1e-7));
    std::sort(all.begin(), all.end());
    const double median = all[(all.size() - 1) / 2];
    CHECK(record(rec, {0, "massive_activation_max", stack, layer, "output"}) ==
          doctest::Approx(largest).epsilon(1e-7));
    CHECK(record(rec, {0, "massive_activation_ratio", stack, layer, "output"}) ==
          doctest::Approx(largest / median).epsilon(1e-7));
    CHECK(record(rec, {0, "massive_activation_sequence", stack, layer, "output"}) == double(at_b));
    CHECK(record(rec, {0, "massive_activation_position", stack, layer, "output"}) == double(at_t));
    CHECK(record(rec, {0, "massive_activation_feature", stack, layer, "output"}) == double(at_j));
  }
}

// The probe batch: 3 sentences of different lengths (pad 0).
torch::Tensor probe_src() {
  return torch::tensor({{5, 6, 7, 8, 3}, {9, 10, 3, 0, 0}, {11, 3, 0, 0, 0}}, torch::kLong);
}
torch::Tensor probe_tgt() {
  return torch::tensor({{2, 12, 13, 14}, {2, 15, 16, 0}, {2, 17, 0, 0}}, torch::kLong);
}

// Records of a probe session with the instability probes at update 0, and the direct pass: the
// logits and the norm and layer outputs of the same forward in evaluation mode.
std::map<Key, double> probe_records(TransformerModelImpl& model, const torch::Tensor& src,
                                    const torch::Tensor& tgt, const std::string& name, Keep* keep,
                                    torch::Tensor* logits) {
  keep->model = &model;
  model.eval();
  model.set_observer(keep);
  {
    torch::NoGradGuard no_grad;
    *logits = (src.defined() ? model.forward(src, tgt) : model.forward_lm(tgt)).to(torch::kDouble);
  }
  model.set_observer(nullptr);
  model.train();
  const fs::path dir = test::fresh_dir("normlab_instability", name);
  AnalysisSection a;
  a.probes = kProbes;
  a.tensorboard = false;
  analysis::ProbeSession probes(a, 10, model, {src, tgt, 0}, dir, 0);
  auto rec = read_csv(dir);
  fs::remove_all(dir);
  return rec;
}

}  // namespace

TEST_SUITE("instability_probes") {
  TEST_CASE(
      "encoder-decoder: attention logit max and entropy of encoder self, decoder self and cross "
      "attention from the weights; output logits, kurtosis, massive activations by hand") {
    torch::manual_seed(11);
    // Post-LN (fairseq's body): self-attention sees the layer's input, cross-attention the
    // self-attention sublayer's norm output.
    auto model = test::make_model("post-ln", test::small_config(Arch::EncDec, 2, 2));
    {
      // Large padding rows: pairs with a padding key or query have larger logits than the rest,
      // where layer 0 sees the embeddings unnormalized.
      torch::NoGradGuard no_grad;
      model->encoder->embed_tokens->weight[0].normal_(0.0, 3.0);
      model->decoder->embed_tokens->weight[0].normal_(0.0, 3.0);
    }
    const torch::Tensor src_tokens = probe_src(), tgt_tokens = probe_tgt();
    Keep keep;
    torch::Tensor logits;
    const auto rec = probe_records(*model, src_tokens, tgt_tokens, "encdec", &keep, &logits);
    torch::Tensor memory;
    {
      torch::NoGradGuard no_grad;
      model->eval();
      memory = model->encode(src_tokens, nullptr).to(torch::kDouble);
      model->train();
    }
    const auto src = src_tokens.accessor<int64_t, 2>();
    const auto tgt = tgt_tokens.accessor<int64_t, 2>();
    const double scale = 1.0 / std::sqrt(8.0);  // d 16, 2 heads
    bool max_differs = false;
    for (int l = 0; l < 2; ++l) {
      auto& enc = *model->encoder->layer(size_t(l)).self_attn;
      const torch::Tensor xe = keep.layer_in.at({int(Stack::Encoder), l});
      const torch::Tensor enc_logits =
          torch::matmul(heads_of(enc.q_proj, xe, 2),
                        heads_of(enc.k_proj, xe, 2).transpose(-2, -1)) *
          scale;
      const auto src_key = [&](int64_t b, int64_t, int64_t k) { return src[b][k] != 0; };
      const Direct e = direct_attention(enc_logits, src_tokens, src_key);
      check_attention(rec, "encoder", l, "self_attn", e);
      // The check is sharp: counting every pair, padding too, gives other values.
      const Direct every = direct_attention(enc_logits, torch::ones_like(src_tokens),
                                            [](int64_t, int64_t, int64_t) { return true; });
      for (size_t h = 0; h < 2; ++h) {
        max_differs = max_differs || every.max[h] > 1.001 * e.max[h];
        CHECK(std::abs(every.entropy[h] - e.entropy[h]) > 1e-3);
      }

      auto& dec = *model->decoder->layer(size_t(l)).self_attn;
      const torch::Tensor xd = keep.layer_in.at({int(Stack::Decoder), l});
      const Direct d = direct_attention(
          torch::matmul(heads_of(dec.q_proj, xd, 2),
                        heads_of(dec.k_proj, xd, 2).transpose(-2, -1)) *
              scale,
          tgt_tokens, [&](int64_t b, int64_t q, int64_t k) { return k <= q && tgt[b][k] != 0; });
      check_attention(rec, "decoder", l, "self_attn", d);

      auto& cross = *model->decoder->layer(size_t(l)).cross_attn;
      const torch::Tensor xc = keep.norm_out.at({int(Stack::Decoder), l, "self_attn_norm"});
      const Direct c =
          direct_attention(torch::matmul(heads_of(cross.q_proj, xc, 2),
                                         heads_of(cross.k_proj, memory, 2).transpose(-2, -1)) *
                               scale,
                           tgt_tokens, src_key);
      check_attention(rec, "decoder", l, "cross_attn", c);
    }
    CHECK(max_differs);
    REQUIRE(keep.layer_out.size() == 4);
    check_outputs(rec, keep, logits,
                  {{int(Stack::Encoder), src_tokens}, {int(Stack::Decoder), tgt_tokens}});
  }

  TEST_CASE(
      "decoder-only llama body: logits after rotary positions, grouped k/v heads; the maximum "
      "before the soft-cap, the entropy after it") {
    auto cfg = test::small_config(Arch::LM, 0, 2, /*d=*/16, /*heads=*/2, /*ffn=*/32);
    cfg.family = Family::Llama;
    cfg.kv_heads = 1;  // one k/v head serves both query heads
    const torch::Tensor tgt_tokens = probe_tgt();
    for (double softcap : {0.0, 1.0}) {
      CAPTURE(softcap);
      torch::manual_seed(12);
      cfg.attn_logit_softcap = softcap;
      auto model = test::make_model("pre-ln", cfg);
      {
        // Logits of order 1-10 (they are ~0.01 at the llama initialization): the cap of 1 bites.
        torch::NoGradGuard no_grad;
        for (size_t l = 0; l < 2; ++l) model->decoder->layer(l).self_attn->q_proj->weight.mul_(300);
      }
      Keep keep;
      torch::Tensor logits;
      const auto rec = probe_records(*model, torch::Tensor(), tgt_tokens, "llama", &keep, &logits);
      const auto tgt = tgt_tokens.accessor<int64_t, 2>();
      for (int l = 0; l < 2; ++l) {
        auto& attn = *model->decoder->layer(size_t(l)).self_attn;
        const torch::Tensor x = keep.norm_out.at({int(Stack::Decoder), l, "self_attn_norm"});
        const torch::Tensor q = rope(heads_of(attn.q_proj, x, 2), cfg.rope_theta);
        const torch::Tensor k =
            rope(heads_of(attn.k_proj, x, 1), cfg.rope_theta).expand({-1, 2, -1, -1});
        const Direct d = direct_attention(
            torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0), tgt_tokens,
            [&](int64_t b, int64_t q, int64_t k) { return k <= q && tgt[b][k] != 0; }, softcap);
        check_attention(rec, "decoder", l, "self_attn", d);
        if (softcap > 0) CHECK(*std::max_element(d.max.begin(), d.max.end()) > 2 * softcap);
      }
      check_outputs(rec, keep, logits, {{int(Stack::Decoder), tgt_tokens}});
    }
  }

  TEST_CASE("a run with the instability probes records every metric and trains as without them") {
    const fs::path dir = test::fresh_dir("normlab_instability", "run");
    auto run = [&](const std::string& name, bool probes) {
      fs::create_directories(dir / name);
      const fs::path m = test::tiny_llama_manifest(dir / name, "pre-ln", 2, 6, 0.0);
      if (probes)
        std::ofstream(m, std::ios::app) << "[analysis]\nprobes = [\"activation_kurtosis\", "
                                           "\"attn_entropy\", \"attn_logit_max\", "
                                           "\"massive_activations\", \"output_logits\"]\n"
                                           "interval = 3\ndense_until = 0\n";
      std::ostringstream sink;
      REQUIRE(train(load_manifest(m.string(), {}, &test::builtin_registry()),
                    test::builtin_registry(), sink)
                  .status == "completed");
      std::vector<double> losses;
      std::ifstream f(dir / name / "run" / "train.jsonl");
      for (std::string line; std::getline(f, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j.value("kind", "") == "train") losses.push_back(j["loss"].get<double>());
      }
      return losses;
    };
    const auto without = run("off", false), with = run("on", true);
    CHECK(!without.empty());
    CHECK(with == without);  // bitwise: the probes read, they never change the training
    std::map<std::string, std::set<int64_t>> updates;
    for (const auto& [k, v] : read_csv(dir / "on" / "run"))
      updates[std::get<1>(k)].insert(std::get<0>(k));
    for (const char* metric :
         {"attn_logit_max", "attn_entropy", "output_log_z", "output_logit_mean_abs",
          "output_logit_max_abs", "activation_kurtosis", "massive_activation_max",
          "massive_activation_ratio", "massive_activation_sequence", "massive_activation_position",
          "massive_activation_feature"}) {
      CAPTURE(metric);
      CHECK(updates[metric] == std::set<int64_t>{0, 3, 6});
    }
    CHECK(updates.size() == 11);
    fs::remove_all(dir);
  }
}

}  // namespace normlab_test_instability_probes
