// Scaling levers (issue 14): gradient accumulation (optim.update_freq), activation checkpointing
// (run.activation_checkpointing), mixed precision (run.dtype) and the 1000-layer manifest.
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "normlab/data/dataset.h"
#include "normlab/manifest/experiment.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "run/optimizer.h"
#include "test_support.h"
#include "torch_compat.h"
#include "train/graphed_update.h"
#include "train/loss_scaler.h"
#include "train/memory_estimate.h"
#include "train/update_step.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_scale {

using namespace normlab;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("normlab_scale_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Sentences of 3..12 tokens: sub-batches pad to other lengths than the whole batch.
data::Dataset copy_task(Arch arch, const fs::path& cache) {
  data::DataConfig c;
  c.task = arch == Arch::EncDec ? "copy" : "synthetic-lm";
  c.synthetic_vocab = 20;
  c.synthetic_min_len = 3;
  c.synthetic_max_len = 12;
  c.synthetic_train = 64;
  c.synthetic_valid = 8;
  c.lm_block = 12;
  c.cache_dir = cache.string();
  std::ostringstream log;
  return data::load_dataset(c, log);
}

ModelConfig config_for(Arch arch, const data::Dataset& ds, double dropout) {
  ModelConfig cfg = test::small_config(arch, 2, 2, 32, 4, 64);
  cfg.src_vocab = arch == Arch::EncDec ? ds.src_vocab : 0;
  cfg.tgt_vocab = ds.tgt_vocab;
  cfg.dropout = cfg.attention_dropout = cfg.activation_dropout = dropout;
  return cfg;
}

// Two models with the same initial parameters.
std::pair<TransformerModel, TransformerModel> twin_models(const std::string& scheme,
                                                          const ModelConfig& cfg) {
  torch::manual_seed(11);
  TransformerModel a = test::make_model(scheme, cfg);
  torch::manual_seed(11);
  TransformerModel b = test::make_model(scheme, cfg);
  return {a, b};
}

std::string tiny_manifest(const fs::path& dir, const std::string& extra, int layers = 2,
                          int64_t max_updates = 12) {
  return fmt::format(R"([model]
d_model = 32
ffn_dim = 64
heads = 2
enc_layers = {0}
dec_layers = {0}
dropout = 0.1
attention_dropout = 0.1

[scheme]
name = "pre-ln"

[data]
task = "copy"
synthetic_vocab = 12
synthetic_min_len = 3
synthetic_max_len = 8
synthetic_train = 400
synthetic_valid = 50
cache_dir = "{1}/cache"

[optim]
lr = 2e-3
warmup_updates = 10
max_tokens = 128
max_updates = {2}

[eval]
interval = 0
bleu = false

[run]
out_dir = "{1}/run"
log_interval = 1
checkpoint_interval = 1000
threads = 1
{3}
)",
                     layers, dir.string(), max_updates, extra);
}

ExperimentSpec spec_of(const fs::path& dir, const std::string& text,
                       const std::vector<std::string>& sets = {}) {
  fs::path p = dir / "m.toml";
  std::ofstream(p) << text;
  return load_manifest(p.string(), sets, &test::builtin_registry());
}

std::vector<json> records(const fs::path& run_dir, const std::string& kind) {
  std::vector<json> out;
  std::ifstream f(run_dir / "train.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j["kind"] == kind) out.push_back(j);
  }
  return out;
}

std::vector<torch::Tensor> grads_of(TransformerModel& m) {
  std::vector<torch::Tensor> g;
  for (const auto& p : m->parameters())
    g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return g;
}

// Counts layer outputs, and those that are part of a graph (recomputed with gradients).
struct LayerOutputCounter : ActivationObserver {
  int outputs = 0, with_grad = 0;
  void on_layer_output(const LayerId&, const torch::Tensor& out) override {
    ++outputs;
    with_grad += out.requires_grad() ? 1 : 0;
  }
};

}  // namespace

TEST_SUITE("scale") {
  TEST_CASE("update_freq: 4 batches of a quarter of the sentences give the update of one batch") {
    const fs::path dir = fresh_dir("accum");
    for (Arch arch : {Arch::EncDec, Arch::LM}) {
      CAPTURE(int(arch));
      const data::Dataset ds = copy_task(arch, dir / "cache");
      data::BatchPlan plan(ds.train, 1 << 20, 1, /*shuffle=*/false);
      std::vector<int32_t> all;
      for (int32_t i = 0; i < 16; ++i) all.push_back(i);
      const std::vector<DeviceBatch> one = {to_device(plan.make(all), torch::kCPU)};
      std::vector<DeviceBatch> four;
      for (int q = 0; q < 4; ++q)
        four.push_back(
            to_device(plan.make(std::vector<int32_t>(all.begin() + 4 * q, all.begin() + 4 * q + 4)),
                      torch::kCPU));
      // Translation: the quarters really pad to other lengths than the whole.
      if (arch == Arch::EncDec) CHECK(four[0].tgt_in.size(1) != one[0].tgt_in.size(1));

      auto [a, b] = twin_models("pre-ln", config_for(arch, ds, /*dropout=*/0.0));
      UpdateOptions o;
      o.label_smoothing = 0.1;
      int calls = 0;
      const UpdateLoss la = accumulate_gradients(*a, one, o);
      const UpdateLoss lb = accumulate_gradients(*b, four, o, [&] { ++calls; });
      CHECK(calls == 1);
      CHECK(la.tokens == lb.tokens);
      CHECK(la.loss / double(la.tokens) ==
            doctest::Approx(lb.loss / double(lb.tokens)).epsilon(1e-6));
      const auto ga = grads_of(a), gb = grads_of(b);
      double worst = 0, largest = 0;
      for (size_t i = 0; i < ga.size(); ++i) {
        worst = std::max(worst, test::max_abs_diff(ga[i], gb[i]));
        largest = std::max(largest, ga[i].abs().max().item<double>());
      }
      INFO("largest gradient difference " << worst << ", largest gradient " << largest);
      CHECK(worst <=
            1e-6 * largest);  // float rounding: the token losses are summed in another order
      // The update itself (SGD, so that it is the gradient's image; Adam's first step is the
      // gradient's sign, which rounding flips where a gradient is ~0).
      torch::optim::SGD sgd_a(a->parameters(), 0.5), sgd_b(b->parameters(), 0.5);
      sgd_a.step();
      sgd_b.step();
      const auto pa = a->parameters(), pb = b->parameters();
      double moved = 0, differ = 0;
      for (size_t i = 0; i < pa.size(); ++i)
        differ = std::max(differ, test::max_abs_diff(pa[i], pb[i]));
      CHECK(differ <= 1e-6);
      // The first quarter alone gives another update (the comparison can fail).
      sgd_b.zero_grad();
      accumulate_gradients(*b, {four[0]}, o);
      sgd_b.step();
      for (size_t i = 0; i < pa.size(); ++i)
        moved = std::max(moved, test::max_abs_diff(pa[i], pb[i]));
      CHECK(moved > 1e-4);
    }
  }

  TEST_CASE("update_freq: updates, lr schedule and resume count updates, not batches") {
    const fs::path a = fresh_dir("freq_straight"), b = fresh_dir("freq_resumed"),
                   c = fresh_dir("freq_one");
    std::ostringstream sink;
    TrainOutcome straight = train(spec_of(a, tiny_manifest(a, ""), {"optim.update_freq=3"}),
                                  test::builtin_registry(), sink);
    REQUIRE(straight.status == "completed");
    REQUIRE(train(spec_of(b, tiny_manifest(b, ""), {"optim.update_freq=3", "optim.max_updates=5"}),
                  test::builtin_registry(), sink)
                .updates == 5);
    TrainOutcome resumed = train(spec_of(b, tiny_manifest(b, ""), {"optim.update_freq=3"}),
                                 test::builtin_registry(), sink);
    CHECK(resumed.updates == 12);
    const auto ra = records(a / "run", "train"), rb = records(b / "run", "train");
    REQUIRE(ra.size() == 12);
    REQUIRE(rb.size() == 12);
    for (size_t i = 0; i < ra.size(); ++i) {
      CAPTURE(i);
      CHECK(ra[i]["update"].get<int64_t>() == int64_t(i + 1));
      if (i < 10)
        CHECK(ra[i]["lr"].get<double>() ==
              doctest::Approx(2e-3 * double(i + 1) / 10).epsilon(1e-12));  // warm-up in updates
      CHECK(ra[i]["loss"].get<double>() ==
            rb[i]["loss"].get<double>());  // bitwise across the resume
    }
    // Three batches per update: the data runs out three times as fast as with update_freq = 1.
    TrainOutcome one =
        train(spec_of(c, tiny_manifest(c, "", 2, 36)), test::builtin_registry(), sink);
    REQUIRE(one.status == "completed");
    const auto r1 = records(c / "run", "train");
    auto first_update_of_epoch = [](const std::vector<json>& r, int64_t epoch) {
      for (const auto& j : r)
        if (j["epoch"].get<int64_t>() >= epoch) return j["update"].get<int64_t>();
      return int64_t(-1);
    };
    const int64_t e1_k1 = first_update_of_epoch(r1, 1), e1_k3 = first_update_of_epoch(ra, 1);
    REQUIRE(e1_k1 > 0);
    REQUIRE(e1_k3 > 0);
    CHECK(std::abs(double(e1_k1) - 3.0 * double(e1_k3)) <= 3.0);
    CHECK(ra[0]["tokens_per_s"].get<double>() > 0);
  }

  TEST_CASE(
      "activation checkpointing: same loss and gradients with dropout on, layers recomputed in "
      "backward") {
    const fs::path dir = fresh_dir("ckpt");
    // One stream (DeepNorm), two (ResiDual) and four (Hyper-Connections) through every layer.
    for (const std::string scheme : {"deepnorm", "residual", "hyper-connections"})
      for (Arch arch : {Arch::LM, Arch::EncDec}) {
        CAPTURE(scheme);
        CAPTURE(int(arch));
        const data::Dataset ds = copy_task(arch, dir / "cache");
        data::BatchPlan plan(ds.train, 1 << 20, 1, false);
        const std::vector<DeviceBatch> batch = {
            to_device(plan.make({0, 1, 2, 3, 4, 5, 6, 7}), torch::kCPU)};
        auto [plain, recomputed] = twin_models(scheme, config_for(arch, ds, /*dropout=*/0.2));
        recomputed->set_activation_checkpointing(true);
        plain->train();
        recomputed->train();
        UpdateOptions o;
        o.label_smoothing = 0.1;
        torch::manual_seed(5);
        const UpdateLoss lp = accumulate_gradients(*plain, batch, o);
        const torch::Tensor rng_plain = compat::cpu_rng_state();
        torch::manual_seed(5);
        LayerOutputCounter counter;
        recomputed->set_observer(&counter);
        const UpdateLoss lr = accumulate_gradients(*recomputed, batch, o);
        recomputed->set_observer(nullptr);
        // The loss is bitwise the same: the forward did the same operations with the same masks.
        CHECK(lp.loss == lr.loss);
        // The generator ends where it would without recomputation (training goes on identically).
        CHECK(torch::equal(rng_plain, compat::cpu_rng_state()));
        // Each layer ran twice: without a graph, then again with one in the backward pass.
        const int layers = arch == Arch::EncDec ? 4 : 2;
        CHECK(counter.outputs == 2 * layers);
        CHECK(counter.with_grad == layers);
        const auto gp = grads_of(plain), gr = grads_of(recomputed);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < gp.size(); ++i) {
          worst = std::max(worst, test::max_abs_diff(gp[i], gr[i]));
          scale = std::max(scale, gp[i].abs().max().item<double>());
        }
        INFO("largest gradient difference " << worst << " (largest gradient " << scale << ")");
        if (scheme == "deepnorm") {
          CHECK(worst ==
                0.0);  // bitwise: the same kernels on the same values, summed in the same order
        } else {
          // Several streams: a stream's gradient adds contributions of the layer above in another
          // order when each layer back-propagates on its own (measured: 3e-8 for ResiDual); the
          // loss is bitwise.
          CHECK(worst <= 1e-6 * scale);
        }
      }
  }

  TEST_CASE(
      "activation checkpointing: a training run logs the losses of the run without it, bitwise") {
    const fs::path a = fresh_dir("ckpt_off"), b = fresh_dir("ckpt_on");
    std::ostringstream sink;
    REQUIRE(train(spec_of(a, tiny_manifest(a, "", 3)), test::builtin_registry(), sink).status ==
            "completed");
    REQUIRE(train(spec_of(b, tiny_manifest(b, "activation_checkpointing = true", 3)),
                  test::builtin_registry(), sink)
                .status == "completed");
    const auto ra = records(a / "run", "train"), rb = records(b / "run", "train");
    REQUIRE(ra.size() == rb.size());
    for (size_t i = 0; i < ra.size(); ++i) {
      CAPTURE(i);
      CHECK(rb[i]["loss"].get<double>() == ra[i]["loss"].get<double>());  // bitwise
      CHECK(rb[i]["gnorm"].get<double>() == ra[i]["gnorm"].get<double>());
    }
  }

  TEST_CASE(
      "activation checkpointing: the gradient probes record the same values (hooks set in the "
      "recomputation)") {
    std::map<std::string, double> seen[2];
    for (int ckpt = 0; ckpt < 2; ++ckpt) {
      const fs::path d = fresh_dir(ckpt ? "probe_ckpt" : "probe_plain");
      std::ostringstream sink;
      const std::string extra = ckpt ? "activation_checkpointing = true\n" : "";
      REQUIRE(train(spec_of(d, tiny_manifest(
                                   d,
                                   extra + "[analysis]\nprobes = [\"act_grad_norm\", "
                                           "\"grad_norm\"]\ninterval = 1\nformats = [\"jsonl\"]",
                                   2, 4)),
                    test::builtin_registry(), sink)
                  .status == "completed");
      std::ifstream f(d / "run" / "analysis.jsonl");
      std::string line;
      while (std::getline(f, line)) {
        const json j = json::parse(line);
        seen[ckpt][fmt::format("{} {} {} {} {}", j["metric"].get<std::string>(),
                               j["update"].get<int64_t>(), j["stack"].get<std::string>(),
                               j["layer"].get<int64_t>(), j["sublayer"].get<std::string>())] =
            j["value"].get<double>();
      }
    }
    int act = 0;
    for (const auto& [key, value] : seen[0]) act += key.rfind("act_grad_norm", 0) == 0 ? 1 : 0;
    CHECK(act >= 4 * 4);  // every update, both stacks' layers
    CHECK(seen[0].size() == seen[1].size());
    for (const auto& [key, value] : seen[0]) {
      CAPTURE(key);
      REQUIRE(seen[1].count(key) == 1);
      CHECK(seen[1][key] == value);
    }
  }

  TEST_CASE("bf16: autocast forward, fp32 weights and gradients; a tiny model learns") {
    const fs::path dir = fresh_dir("bf16");
    const data::Dataset ds = copy_task(Arch::EncDec, dir / "cache");
    data::BatchPlan plan(ds.train, 1 << 20, 1, false);
    const std::vector<DeviceBatch> batch = {
        to_device(plan.make({0, 1, 2, 3, 4, 5, 6, 7}), torch::kCPU)};
    auto [fp32, bf16] = twin_models("pre-ln", config_for(Arch::EncDec, ds, 0.0));
    UpdateOptions o;
    const UpdateLoss l32 = accumulate_gradients(*fp32, batch, o);
    o.dtype = "bf16";
    const UpdateLoss l16 = accumulate_gradients(*bf16, batch, o);
    CHECK(!compat::autocast_state().cpu);  // switched off again after the forward
    CHECK(l16.loss != l32.loss);           // the forward did run in bf16 …
    CHECK(l16.loss == doctest::Approx(l32.loss).epsilon(2e-2));  // … close to fp32
    for (const auto& p : bf16->parameters()) {
      CHECK((p.scalar_type() == torch::kFloat));  // master weights
      CHECK((p.grad().scalar_type() == torch::kFloat));
    }

    // End to end: the loss falls.
    std::ostringstream sink;
    const fs::path d = fresh_dir("bf16_run");
    TrainOutcome out = train(spec_of(d, tiny_manifest(d, "dtype = \"bf16\"", 2, 40)),
                             test::builtin_registry(), sink);
    REQUIRE(out.status == "completed");
    const auto r = records(d / "run", "train");
    REQUIRE(r.size() == 40);
    double first = 0, last = 0;
    for (size_t i = 0; i < 5; ++i)
      first += r[i]["loss"].get<double>() / 5,
          last += r[r.size() - 1 - i]["loss"].get<double>() / 5;
    INFO("mean loss of the first 5 updates " << first << ", of the last 5 " << last);
    CHECK(last < first - 0.3);
  }

  TEST_CASE("bf16: divergence still names the first non-finite module") {
    const fs::path d = fresh_dir("bf16_nan");
    std::ostringstream sink;
    ExperimentSpec spec =
        spec_of(d, tiny_manifest(d, "dtype = \"bf16\"\nactivation_checkpointing = true", 2));
    spec.scheme.name = "post-ln";
    spec.optim.lr = 1e30;
    spec.optim.warmup_updates = 0;
    spec.run.divergence_loss = 1e30;
    TrainOutcome o = train(spec, test::builtin_registry(), sink);
    INFO(sink.str());
    CHECK(o.status == "diverged");
    CHECK(o.note.find("first non-finite: output of encoder.layers.0.") != std::string::npos);
  }

  TEST_CASE("fp16 on the CPU and bad values are one clear manifest error") {
    const fs::path d = fresh_dir("fp16");
    auto error_of = [&](const std::string& extra) {
      try {
        spec_of(d, tiny_manifest(d, extra));
      } catch (const ManifestError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const std::string fp16 = error_of("dtype = \"fp16\"");
    CHECK(fp16.find((d / "m.toml").string() + ":") == 0);
    CHECK(fp16.find("[run] dtype: fp16") != std::string::npos);
    CHECK(fp16.find("cuda") != std::string::npos);
    CHECK(error_of("dtype = \"fp8\"")
              .find("[run] dtype: expected one of fp32 | bf16 | fp16, got string \"fp8\"") !=
          std::string::npos);
    CHECK(error_of("activation_checkpointing = 1")
              .find("[run] activation_checkpointing: expected bool") != std::string::npos);
    const std::string freq = [&] {
      try {
        spec_of(d, tiny_manifest(d, ""), {"optim.update_freq=0"});
      } catch (const ManifestError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    }();
    CHECK(freq.find("[optim] update_freq: expected integer in [1, 65536], got integer 0") !=
          std::string::npos);
    // With a CUDA device fp16 is accepted.
    CHECK(error_of("dtype = \"fp16\"\ndevice = \"cuda\"") == "no error");
  }

  TEST_CASE("fp16 loss scaler: halves and skips on overflow, grows after N good updates") {
    DynamicLossScaler s(1024.0, /*growth_interval=*/3, /*min_scale=*/1.0);
    CHECK(s.update(true));
    CHECK(s.update(true));
    CHECK(s.scale() == 1024.0);
    CHECK(!s.update(false));  // overflow: skip the step
    CHECK(s.scale() == 512.0);
    CHECK(s.update(true));
    CHECK(s.update(true));
    CHECK(s.scale() == 512.0);  // the overflow restarted the count
    CHECK(s.update(true));
    CHECK(s.scale() == 1024.0);
    for (int i = 0; i < 10; ++i) s.update(false);
    CHECK(s.scale() == 1.0);
    CHECK(!s.exhausted());
    s.update(false);
    CHECK(s.exhausted());
    s.restore(256.0, 2);
    CHECK(s.update(true));
    CHECK(s.scale() == 512.0);
  }

  TEST_CASE(
      "experiments/deepnet-1000L.toml: DeepNorm 500L-500L d512, bf16 and checkpointing fit 80 GB" *
      doctest::test_suite("shared_data")) {
    if (!std::filesystem::exists(std::filesystem::path(NORMLAB_TEST_SHARED_DATA) / "multi30k" /
                                 "train.en")) {
      MESSAGE("SKIP: " NORMLAB_TEST_SHARED_DATA " is absent");
      return;
    }
    const std::string path =
        std::string(NORMLAB_TEST_SOURCE_DIR) + "/experiments/deepnet-1000L.toml";
    const ExperimentSpec spec =
        load_manifest(path, test::shared_multi30k_overrides(), &test::builtin_registry());
    CHECK(spec.scheme.name == "deepnorm");
    CHECK(spec.model.enc_layers == 500);
    CHECK(spec.model.dec_layers == 500);
    CHECK(spec.model.d_model == 512);
    CHECK(spec.run.device == "cuda");
    CHECK(spec.run.dtype == "bf16");
    CHECK(spec.run.activation_checkpointing);
    ModelConfig cfg;
    cfg.arch = Arch::EncDec;
    cfg.d_model = spec.model.d_model;
    cfg.ffn_dim = spec.model.ffn_dim;
    cfg.heads = spec.model.heads;
    cfg.enc_layers = spec.model.enc_layers;
    cfg.dec_layers = spec.model.dec_layers;
    cfg.src_vocab = cfg.tgt_vocab = spec.data.tokenizer.vocab_size;
    cfg.sharing =
        spec.model.share_embeddings == "all" ? EmbeddingSharing::All : EmbeddingSharing::None;
    const double gpu = 79.0 * (1 << 30);  // what an 80 GB H100 has free
    // run.shard_optimizer over 8 ranks: each keeps 1/8 of the moments (and sends a 1/8 copy).
    TrainingMemoryOptions sharded;
    sharded.moment_shards = 8;
    const MemoryEstimate alone = estimate_training_memory(cfg, spec.optim.max_tokens);
    CHECK(estimate_training_memory(cfg, spec.optim.max_tokens, sharded).state_bytes ==
          doctest::Approx(alone.state_bytes * (2 + 3.0 / 8) / 4));
    // On a GPU: no host-side runtime term (on_cpu false).
    const TrainingMemoryOptions gpu_ckpt{true, true, 0, 1, false},
        gpu_full{false, true, 0, 1, false};
    const MemoryEstimate with = estimate_training_memory(cfg, spec.optim.max_tokens, gpu_ckpt);
    const MemoryEstimate without = estimate_training_memory(cfg, spec.optim.max_tokens, gpu_full);
    INFO("estimate " << with.total() / double(1 << 30) << " GiB, without checkpointing "
                     << without.total() / double(1 << 30) << " GiB");
    CHECK(with.parameters > 3'000'000'000LL);
    CHECK(with.runtime_bytes == 0);
    CHECK(oversize_problem(path, cfg, spec.optim.max_tokens, gpu, "cuda", gpu_ckpt) == "");
    const std::string refused =
        oversize_problem(path, cfg, spec.optim.max_tokens, gpu, "cuda", gpu_full);
    CHECK(refused.find("run.activation_checkpointing = true") != std::string::npos);
  }

  TEST_CASE(
      "run.cuda_graph: the graph path's update (eager on the CPU) is run_update's, bit for bit; "
      "watched and diverging updates are left to run_update with nothing changed") {
    // What a CUDA graph records is GraphedUpdate's update body: on the CPU (capture = false) the
    // same body runs eagerly, so every difference from run_update but the recording shows here.
    struct Watch final : RunObserver {
      std::set<int64_t> updates;
      bool watches_update(int64_t u) const override { return updates.count(u) > 0; }
    };
    struct Case {
      Arch arch;
      Family family;
      std::string scheme;
      double dropout;
    };
    const fs::path dir = fresh_dir("graphed");
    for (const Case& c : {Case{Arch::EncDec, Family::Transformer, "pre-ln", 0.1},
                          Case{Arch::EncDec, Family::Transformer, "branchnorm", 0.0},
                          Case{Arch::LM, Family::Llama, "pre-ln", 0.1},
                          Case{Arch::LM, Family::Llama, "ngpt", 0.0}}) {
      CAPTURE(c.scheme);
      CAPTURE(int(c.arch));
      const data::Dataset ds = copy_task(c.arch, dir / "cache");
      ModelConfig cfg = config_for(c.arch, ds, c.dropout);
      cfg.family = c.family;
      // BranchNorm's α rises over 4 updates: a host number each update's forward must see.
      const std::map<std::string, ParamValue> params =
          c.scheme == "branchnorm" ? std::map<std::string, ParamValue>{{"T", ParamValue::of_int(4)}}
                                   : std::map<std::string, ParamValue>{};
      torch::manual_seed(11);
      TransformerModel a = test::make_model(c.scheme, cfg, params);
      torch::manual_seed(11);
      TransformerModel b = test::make_model(c.scheme, cfg, params);
      a->train();
      b->train();
      torch::optim::AdamWOptions opts(3e-3);
      opts.weight_decay(0.01);
      FlatAdamW oa(a->parameters(), opts), ob(b->parameters(), opts);
      REQUIRE(ob.flat());
      DynamicLossScaler scaler;
      RunObserver plain;  // watches every update, does nothing
      Watch watch;
      watch.updates = {3};
      GraphedUpdate graphed(*b, ob, /*capture=*/false);
      data::BatchPlan plan(ds.train, 1 << 20, 1, /*shuffle=*/false);
      StepSettings st;
      st.forward.label_smoothing = 0.1;
      st.forward.pad_id = ds.pad_id;
      auto same_parameters = [&] {
        double worst = 0;
        const auto pa = a->parameters(), pb = b->parameters();
        for (size_t i = 0; i < pa.size(); ++i)
          worst = std::max(worst, test::max_abs_diff(pa[i], pb[i]));
        return worst;
      };
      int clipped = 0, unclipped = 0;
      for (int64_t u = 1; u <= 7; ++u) {
        CAPTURE(u);
        std::vector<int32_t> rows;
        for (int32_t i = 0; i < 8; ++i) rows.push_back(int32_t(8 * u) + i);
        const std::vector<DeviceBatch> batches = {
            to_device(plan.make(rows), torch::kCPU, ds.pad_id)};
        st.lr = 1e-3 * double(u);
        st.clip_norm = u % 2 ? 0.05 : 100.0;  // clipped and not
        st.divergence_nll = u == 7 ? 0.0 : std::numeric_limits<double>::infinity();
        st.scheme_updated = false;
        torch::manual_seed(100 + u);
        const UpdateResult ra = run_update(*a, oa, scaler, batches, st, u, plain);
        torch::manual_seed(100 + u);
        const torch::Tensor rng_before = compat::cpu_rng_state();
        const std::vector<torch::Tensor> before = [&] {
          std::vector<torch::Tensor> v;
          for (const auto& p : b->parameters()) v.push_back(p.detach().clone());
          return v;
        }();
        std::optional<UpdateResult> rb = graphed.run(batches, st, u, watch);
        if (u == 3 || u == 7) {
          // Left to run_update: no parameter moved, the dropout stream is where it was.
          CHECK_FALSE(rb.has_value());
          double moved = 0;
          const auto pb = b->parameters();
          for (size_t i = 0; i < pb.size(); ++i)
            moved = std::max(moved, test::max_abs_diff(before[i], pb[i]));
          CHECK(moved == 0);
          CHECK(torch::equal(compat::cpu_rng_state(), rng_before));
          st.scheme_updated = true;
          rb = run_update(*b, ob, scaler, batches, st, u, plain);
        }
        REQUIRE(rb.has_value());
        CHECK(int(rb->kind) == int(ra.kind));
        CHECK(rb->loss == ra.loss);
        CHECK(rb->nll == ra.nll);
        CHECK(rb->gnorm == ra.gnorm);
        CHECK(rb->tokens == ra.tokens);
        CHECK(same_parameters() == 0);
        if (ra.kind == UpdateResult::Kind::Stepped)
          (ra.gnorm > st.clip_norm ? clipped : unclipped)++;
        if (u == 7) {
          CHECK(ra.kind == UpdateResult::Kind::Diverged);
          CHECK(rb->cause.find("loss blow-up") == 0);
        }
      }
      CHECK(clipped > 0);
      CHECK(unclipped > 0);
      CHECK(graphed.counts().made == 5);
      CHECK(graphed.counts().eager == 2);
      // The optimizer's step counts agree: the next update has the same bias correction.
      for (const auto& [key, state] : ob.state())
        CHECK(static_cast<const torch::optim::AdamWParamState&>(*state).step() == 6);
    }
  }

  TEST_CASE(
      "run.cuda_graph's buckets: translation batches padded to a few shapes give the batches' "
      "losses and updates (extra rows and positions carry no target)") {
    const fs::path dir = fresh_dir("graphed_buckets");
    const data::Dataset ds = copy_task(Arch::EncDec, dir / "cache");
    const int64_t max_tokens = 48;
    data::BatchPlan plan(ds.train, max_tokens, 1, /*shuffle=*/true);
    const std::vector<std::vector<int32_t>> epoch = plan.epoch(0);
    REQUIRE(epoch.size() >= 8);
    auto [a, b] = twin_models("post-ln", config_for(Arch::EncDec, ds, /*dropout=*/0.0));
    // ε well above the rounding of a ~0 gradient: Adam's first steps would turn its sign into ±lr.
    torch::optim::AdamWOptions opts(3e-3);
    opts.eps(1e-3);
    FlatAdamW oa(a->parameters(), opts), ob(b->parameters(), opts);
    DynamicLossScaler scaler;
    struct Nobody final : RunObserver {
      bool watches_update(int64_t) const override { return false; }
    } nobody;
    RunObserver plain;
    GraphedUpdate graphed(*b, ob, /*capture=*/false, max_tokens, ds.pad_id);
    StepSettings st;
    st.forward.label_smoothing = 0.1;
    st.forward.pad_id = ds.pad_id;
    st.clip_norm = 1.0;
    std::set<std::string> shapes;
    double worst_loss = 0, worst_param = 0;
    for (int64_t u = 1; u <= 8; ++u) {
      const std::vector<DeviceBatch> batches = {
          to_device(plan.make(epoch[size_t(u - 1)]), torch::kCPU, ds.pad_id)};
      shapes.insert(fmt::format("{}x{}x{}", batches[0].src.size(0), batches[0].src.size(1),
                                batches[0].tgt_in.size(1)));
      st.lr = 1e-3;
      const UpdateResult ra = run_update(*a, oa, scaler, batches, st, u, plain);
      const std::optional<UpdateResult> rb = graphed.run(batches, st, u, nobody);
      REQUIRE(rb.has_value());
      CHECK(rb->tokens == ra.tokens);
      worst_loss = std::max(worst_loss, std::abs(rb->loss - ra.loss) / ra.loss);
      CHECK(rb->gnorm == doctest::Approx(ra.gnorm).epsilon(1e-5));
      const auto pa = a->parameters(), pb = b->parameters();
      for (size_t i = 0; i < pa.size(); ++i)
        worst_param = std::max(worst_param, test::max_abs_diff(pa[i], pb[i]));
    }
    INFO("worst relative loss difference " << worst_loss << ", worst parameter difference "
                                           << worst_param);
    // Other shapes sum in another order: float rounding only. An extra row with a target, or a
    // pad position a real one attends to, changes the loss by percent.
    CHECK(worst_loss <= 1e-6);
    CHECK(worst_param <= 1e-6);
    INFO(shapes.size() << " batch shapes, " << graphed.counts().shapes << " buckets");
    CHECK(graphed.counts().shapes < int64_t(shapes.size()));
  }

  TEST_CASE("run.cuda_graph on the CPU: said to be off, and the run is the run without it") {
    const fs::path a = fresh_dir("graph_key_off"), b = fresh_dir("graph_key_on");
    std::ostringstream out_a, out_b;
    REQUIRE(train(spec_of(a, tiny_manifest(a, "", 2, 6)), test::builtin_registry(), out_a).status ==
            "completed");
    REQUIRE(train(spec_of(b, tiny_manifest(b, "cuda_graph = true", 2, 6)), test::builtin_registry(),
                  out_b)
                .status == "completed");
    CHECK(out_b.str().find("cuda graph: off (CUDA graphs are for a CUDA device (run.device))") !=
          std::string::npos);
    CHECK(out_a.str().find("cuda graph") == std::string::npos);
    const auto ra = records(a / "run", "train"), rb = records(b / "run", "train");
    REQUIRE(ra.size() == 6);
    REQUIRE(rb.size() == 6);
    for (size_t i = 0; i < ra.size(); ++i) CHECK(ra[i]["loss"] == rb[i]["loss"]);
  }

  TEST_CASE("run.cuda_graph: why a run cannot take graphs, in words") {
    ModelConfig cfg = test::small_config(Arch::LM, 0, 1);
    TransformerModel m = test::make_model("pre-ln", cfg);
    FlatAdamW o(m->parameters(), torch::optim::AdamWOptions(1e-3));
    StepSettings st;
    CHECK(GraphedUpdate::unavailable(o, st, torch::kCPU).find("CUDA device") != std::string::npos);
    const torch::Device cuda(torch::kCUDA, 0);
    const std::string why = GraphedUpdate::unavailable(o, st, cuda);
#if NORMLAB_TORCH_2
    if (why.empty()) {  // a build with the CUDA path (the wheel's)
      st.forward.dtype = "fp16";
      CHECK(GraphedUpdate::unavailable(o, st, cuda).find("fp16") == 0);
      st.forward.dtype = "bf16";
      CHECK(GraphedUpdate::unavailable(o, st, cuda, /*activation_checkpointing=*/true)
                .find("activation checkpointing") == 0);
      return;
    }
#endif
    CHECK(why.find("without LibTorch 2.x") != std::string::npos);
  }
}  // TEST_SUITE

}  // namespace normlab_test_scale

namespace normlab_test_scale {

TEST_SUITE("gpu_kernels") {
  TEST_CASE(
      "run.cuda_graph on CUDA, every scheme: replayed updates agree with run_update's (fp32 and "
      "bf16), and the graph reads each update's learning rate, tokens and scheme values") {
    if (!torch::cuda::is_available()) {
      MESSAGE("SKIP: no CUDA device");
      return;
    }
    const torch::Device cuda(torch::kCUDA, 0);
    const fs::path dir = fresh_dir("graphed_cuda");
    const data::Dataset ds = copy_task(Arch::LM, dir / "cache");
    data::BatchPlan plan(ds.train, 1 << 20, 1, /*shuffle=*/false);
    for (const PluginInfo* info : test::builtin_registry().plugins()) {
      for (const std::string dtype : {"fp32", "bf16"}) {
        CAPTURE(info->name);
        CAPTURE(dtype);
        ModelConfig cfg = config_for(Arch::LM, ds, /*dropout=*/0.1);
        cfg.family = Family::Llama;
        cfg.heads = 4;
        cfg.kv_heads = 2;
        cfg.norm = NormSpec::of(NormKind::RMSNorm);
        const std::map<std::string, ParamValue> params =
            info->name == "branchnorm"
                ? std::map<std::string, ParamValue>{{"T", ParamValue::of_int(6)}}
                : std::map<std::string, ParamValue>{};
        torch::manual_seed(11);
        TransformerModel a = test::make_model(info->name, cfg, params);
        torch::manual_seed(11);
        TransformerModel b = test::make_model(info->name, cfg, params);
        a->to(cuda);
        b->to(cuda);
        a->train();
        b->train();
        torch::optim::AdamWOptions opts(1e-3);
        opts.weight_decay(0.01);
        // ε well above the rounding of a ~0 gradient (CUDA's embedding backward adds atomically, in
        // no fixed order): Adam's first steps would turn its sign into ±lr.
        opts.eps(1e-3);
        FlatAdamW oa(a->parameters(), opts), ob(b->parameters(), opts);
        REQUIRE(GraphedUpdate::unavailable(ob, StepSettings{}, cuda) == "");
        DynamicLossScaler scaler;
        RunObserver plain;
        struct Nobody final : RunObserver {
          bool watches_update(int64_t) const override { return false; }
        } nobody;
        GraphedUpdate graphed(*b, ob, /*capture=*/true);
        StepSettings st;
        st.forward.label_smoothing = 0.1;
        st.forward.pad_id = ds.pad_id;
        st.forward.dtype = dtype;
        st.forward.cuda = true;
        st.clip_norm = 0.5;
        const int64_t updates = GraphedUpdate::kWarmups + 4;
        double worst_param = 0, worst_loss = 0;
        for (int64_t u = 1; u <= updates; ++u) {
          CAPTURE(u);
          // One shape throughout (rows of lm_block tokens), other rows and a lower token count
          // each update: the graph's inputs, not its recording, must decide.
          std::vector<int32_t> rows;
          for (int32_t i = 0; i < 8; ++i) rows.push_back(int32_t(8 * u) + i);
          const std::vector<DeviceBatch> batches = {to_device(plan.make(rows), cuda, ds.pad_id)};
          st.lr = 1e-3 * double(u);
          st.scheme_updated = false;
          torch::manual_seed(100 + u);
          const UpdateResult ra = run_update(*a, oa, scaler, batches, st, u, plain);
          torch::manual_seed(100 + u);
          const std::optional<UpdateResult> rb = graphed.run(batches, st, u, nobody);
          REQUIRE(rb.has_value());
          REQUIRE(ra.kind == UpdateResult::Kind::Stepped);
          worst_loss = std::max(worst_loss, std::abs(rb->loss - ra.loss) / std::abs(ra.loss));
          CHECK(rb->tokens == ra.tokens);
          CHECK(rb->gnorm == doctest::Approx(ra.gnorm).epsilon(dtype == "fp32" ? 1e-4 : 1e-2));
          const auto pa = a->parameters(), pb = b->parameters();
          for (size_t i = 0; i < pa.size(); ++i)
            worst_param = std::max(worst_param, test::max_abs_diff(pa[i], pb[i]));
        }
        INFO("worst relative loss difference " << worst_loss << ", worst parameter difference "
                                               << worst_param);
        // The same kernels on both sides (the graph only records them): what differs is the
        // learning rate AdamW reads (float on the device, double from the host) and the rounding
        // that follows. A value the graph kept from its recording (the learning rate grows
        // by 1e-3 each update, BranchNorm's α rises) moves a parameter by ~1e-3.
        CHECK(worst_loss <= (dtype == "fp32" ? 1e-5 : 1e-2));
        CHECK(worst_param <= (dtype == "fp32" ? 2e-5 : 2e-4));
        CHECK(graphed.counts().graphs == 1);
        CHECK(graphed.counts().made == updates);
      }
    }
    fs::remove_all(dir);
  }
}  // TEST_SUITE

}  // namespace normlab_test_scale
