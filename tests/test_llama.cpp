// The Llama model family (model.family = "llama", issue 29): rotary positions, SwiGLU, grouped
// k/v heads, no biases, its init and defaults — each against a hand computation — and every
// built-in scheme training on it.
#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "eval/run_model.h"
#include "model/cuda/fused_ops.h"
#include "normlab/eval/eval_commands.h"
#include "normlab/manifest/experiment.h"
#include "normlab/model/attention.h"
#include "normlab/model/projection.h"
#include "normlab/sdk/init.h"
#include "normlab/train/trainer.h"
#include "run/fused_self_check.h"
#include "run/model_assembly.h"
#include "speed_levers.h"
#include "test_support.h"
#include "train/update_step.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_llama {

using namespace normlab;
namespace fs = std::filesystem;

namespace {

ModelConfig llama_config(int layers, int d = 16, int heads = 4, int kv_heads = 0) {
  ModelConfig cfg = test::small_config(Arch::LM, 0, layers, d, heads, 24);
  cfg.family = Family::Llama;
  cfg.kv_heads = kv_heads;
  cfg.norm = NormSpec::of(NormKind::RMSNorm);
  return cfg;
}

std::string write_manifest(const fs::path& dir, const std::string& model_keys,
                           const std::string& extra = "") {
  fs::create_directories(dir);
  std::ofstream(dir / "m.toml") << fmt::format(
      R"([model]
arch = "lm"
heads = 4
dec_layers = 2
dropout = 0.0
{}
[scheme]
name = "pre-ln"
[data]
task = "synthetic-lm"
synthetic_vocab = 16
synthetic_train = 100
synthetic_valid = 10
{}
[run]
out_dir = "{}/run"
)",
      model_keys.find("d_model") == std::string::npos ? model_keys + "\nd_model = 16" : model_keys,
      extra, dir.string());
  return (dir / "m.toml").string();
}

// A llama LM on the built-in Markov-chain task, trained in `dir` (run in dir/run).
struct LlamaRun {
  std::string scheme = "pre-ln", scheme_keys, analysis;
  int d_model = 32, kv_heads = 0, layers = 4, vocab = 32, train_blocks = 2000, updates = 120;
  double lr = 5e-3;
};

TrainOutcome train_llama_lm(const fs::path& dir, const LlamaRun& r, std::string* log = nullptr) {
  fs::create_directories(dir);
  std::ofstream(dir / "m.toml") << fmt::format(
      R"([model]
arch = "lm"
family = "llama"
d_model = {d}
heads = 4
kv_heads = {kv}
dec_layers = {layers}
ffn_multiple_of = 32
dropout = 0.0
[scheme]
name = "{scheme}"
{scheme_keys}
[data]
task = "synthetic-lm"
synthetic_vocab = {vocab}
lm_block = 32
synthetic_train = {train}
synthetic_valid = 64
cache_dir = "{dir}/cache"
[optim]
lr = {lr}
warmup_updates = 10
max_tokens = 256
max_updates = {updates}
label_smoothing = 0.0
[eval]
interval = 0
test_beam = 0
[run]
out_dir = "{dir}/run"
threads = 1
{analysis}
)",
      fmt::arg("d", r.d_model), fmt::arg("kv", r.kv_heads), fmt::arg("layers", r.layers),
      fmt::arg("scheme", r.scheme), fmt::arg("scheme_keys", r.scheme_keys),
      fmt::arg("vocab", r.vocab), fmt::arg("train", r.train_blocks), fmt::arg("dir", dir.string()),
      fmt::arg("lr", r.lr), fmt::arg("updates", r.updates), fmt::arg("analysis", r.analysis));
  const ExperimentSpec spec =
      load_manifest((dir / "m.toml").string(), {}, &test::builtin_registry());
  std::ostringstream sink;
  const TrainOutcome o = train(spec, test::builtin_registry(), sink);
  if (log) *log = sink.str();
  return o;
}

std::string manifest_error(const std::string& path,
                           const std::vector<std::string>& overrides = {}) {
  try {
    load_manifest(path, overrides, &test::builtin_registry());
  } catch (const ManifestError& e) {
    return e.what();
  }
  return "";
}

// Issue 43.5: on a GPU the llama body takes the fused operations where they apply (rotary, SwiGLU,
// RMSNorm) and ATen's composition where a scheme's norms sit in between; for every built-in
// scheme, the same states and parameter gradients as with the lever off. On the CPU through the
// operations' host twins.
void check_llama_gpu_path(const torch::Device& device) {
  const bool on_cpu = speed_levers().gpu_paths_on_cpu, was_fused = speed_levers().cuda_fused;
  speed_levers().gpu_paths_on_cpu = device.is_cpu();
  forget_gpu_fallback_notes();
  int schemes = 0;
  for (const PluginInfo* info : test::builtin_registry().plugins()) {
    CAPTURE(info->name);
    ++schemes;
    std::map<std::string, ParamValue> params;
    if (info->name == "branchnorm") params["T"] = ParamValue::of_int(50);
    torch::manual_seed(61);
    TransformerModel model = test::make_model(info->name, llama_config(2, 16, 4, 2), params);
    model->to(device);
    const torch::Tensor tokens = torch::randint(1, 50, {3, 9}, torch::kLong).to(device);
    std::vector<std::vector<torch::Tensor>> runs;
    for (const bool fused : {true, false}) {
      speed_levers().cuda_fused = fused;
      model->zero_grad();
      const torch::Tensor h = model->final_hidden(torch::Tensor(), tokens, /*unpadded=*/true);
      (h * torch::linspace(-1, 1, h.numel()).to(device).view(h.sizes())).sum().backward();
      std::vector<torch::Tensor> r{h.detach().cpu()};
      for (const auto& p : model->parameters())
        if (p.grad().defined()) r.push_back(p.grad().cpu());
      runs.push_back(r);
    }
    speed_levers().cuda_fused = was_fused;
    REQUIRE(runs[0].size() == runs[1].size());
    CHECK(runs[0].size() > 10);
    for (size_t i = 0; i < runs[0].size(); ++i) {
      CAPTURE(i);  // 0: the states, then each parameter's gradient
      CHECK(test::max_abs_diff(runs[0][i], runs[1][i]) <=
            2e-5 * std::max(1.0, runs[1][i].abs().max().item<double>()));
    }
  }
  CHECK(schemes >= 20);
  // nGPT's norms at ffn.up and ffn.gate keep SwiGLU's composition: said once, for all its layers.
  const std::vector<std::string> notes = take_gpu_fallback_notes();
  CHECK(std::count_if(notes.begin(), notes.end(), [](const std::string& n) {
          return n.find("SwiGLU: the scheme's norm at ffn.up/ffn.gate") != std::string::npos;
        }) == 1);
  speed_levers().gpu_paths_on_cpu = on_cpu;
}

// Both families' models for every built-in scheme, as (scheme, config, parameters).
std::vector<std::tuple<std::string, ModelConfig, std::map<std::string, ParamValue>>>
every_scheme_model() {
  std::vector<std::tuple<std::string, ModelConfig, std::map<std::string, ParamValue>>> out;
  for (const PluginInfo* info : test::builtin_registry().plugins()) {
    std::map<std::string, ParamValue> params;
    if (info->name == "branchnorm") params["T"] = ParamValue::of_int(50);
    out.emplace_back(info->name, llama_config(2, 64, 4, 2), params);
    out.emplace_back(info->name, test::small_config(Arch::EncDec, 2, 2, 64, 4, 96), params);
  }
  return out;
}

// Issue 43.2: a model built on a device draws its weights from that device's generator, with the
// init's distribution: per parameter, the same mean and spread as the CPU's draw (constants equal).
void check_init_on_device(const torch::Device& device) {
  int compared = 0;
  for (auto& [scheme, cfg, params] : every_scheme_model()) {
    CAPTURE(scheme);
    CAPTURE(cfg.family == Family::Llama);
    const ModelSpec spec{cfg, scheme, params};
    torch::manual_seed(7);
    const TransformerModel on_cpu = assemble_model(spec, test::builtin_registry()).model;
    const AssembledModel built = assemble_model(spec, test::builtin_registry(), device);
    CHECK(built.built_on == device);
    const auto cpu_params = on_cpu->named_parameters();
    for (const auto& item : built.model->named_parameters()) {
      CAPTURE(item.key());
      REQUIRE(item.value().device() == device);
      const torch::Tensor got = item.value().detach().cpu().to(torch::kDouble),
                          want = cpu_params[item.key()].detach().to(torch::kDouble);
      if (want.numel() == 1 || want.std().item<double>() == 0) {
        CHECK(torch::equal(got, want));  // a constant: a gain, a bias, a scale
        continue;
      }
      // Two independent draws of n ≥ 4000: their spreads differ by σ ≈ 1/√n (relative), their means
      // by σ ≈ sd·√(2/n); the bounds are 5σ and more.
      if (want.numel() < 4000) continue;
      ++compared;
      const double sd = want.std().item<double>();
      CHECK(std::abs(got.std().item<double>() / sd - 1) < 0.08);
      CHECK(std::abs(got.mean().item<double>() - want.mean().item<double>()) < 0.12 * sd);
    }
    // run.init_on_cpu: the CPU's draw, moved.
    ModelSpec cpu_drawn = spec;
    cpu_drawn.init_on_cpu = true;
    torch::manual_seed(7);
    const AssembledModel moved = assemble_model(cpu_drawn, test::builtin_registry(), device);
    CHECK(moved.built_on == torch::Device(torch::kCPU));
    for (const auto& item : moved.model->named_parameters()) {
      CAPTURE(item.key());
      CHECK(torch::equal(item.value().detach().cpu(), cpu_params[item.key()].detach()));
    }
  }
  CHECK(compared > 100);
}
}  // namespace

TEST_SUITE("llama") {
  // Issue 57.3: the fused self-check, through the kernels' host twins (gpu_paths_on_cpu). A twin
  // made wrong (the tests' fault lever) is caught, turned off and reported; the run then trains
  // with ATen's composition and gives its losses bitwise.
  TEST_CASE("fused self-check: a wrong kernel is caught, turned off for the run, and said") {
    const bool on_cpu = speed_levers().gpu_paths_on_cpu;
    speed_levers().gpu_paths_on_cpu = true;
    auto restore = [&] {
      speed_levers() = SpeedLevers{};
      speed_levers().gpu_paths_on_cpu = on_cpu;
    };
    FusedOpsUsed all;
    all.rope = all.swiglu = all.rms_norm = all.grouped_heads = all.adamw = true;
    // Right kernels: every operation this LibTorch has passes, in each dtype.
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const std::string dtype_name = c10::toString(dtype);
      CAPTURE(dtype_name);
      const FusedSelfCheck ok = self_check_fused_ops(at::Device(at::kCPU), dtype, all);
      CHECK(ok.ran);
      CHECK(ok.ops.size() >= 2);
      for (const FusedOpCheck& c : ok.ops) {
        CAPTURE(c.op);
        CAPTURE(c.error);
        CHECK(c.ok);
      }
      MESSAGE("self-check in " << dtype_name << ": " << ok.ops.size() << " operations, "
                               << ok.seconds * 1e3 << " ms");
      CHECK(ok.seconds < 1.0);
    }
    CHECK(speed_levers().cuda_rope);
    // Not on the GPU path: nothing runs.
    speed_levers().gpu_paths_on_cpu = false;
    CHECK_FALSE(self_check_fused_ops(at::Device(at::kCPU), at::kFloat, all).ran);
    speed_levers().gpu_paths_on_cpu = true;
    for (const std::string fault : {"rope", "swiglu"}) {
      CAPTURE(fault);
      speed_levers().test_fault = fault;
      const FusedSelfCheck bad = self_check_fused_ops(at::Device(at::kCPU), at::kFloat, all);
      for (const FusedOpCheck& c : bad.ops) CHECK(c.ok == (c.op != fault));
      CHECK((fault == "rope" ? !speed_levers().cuda_rope : !speed_levers().cuda_swiglu));
      restore();
      speed_levers().gpu_paths_on_cpu = true;
    }
    // A run: the faulty rope is turned off before training, said once, recorded in env.json, and
    // the losses are those of the run with rope's lever off by hand.
    auto run = [&](const std::string& name, const std::string& fault, bool rope_lever) {
      speed_levers().gpu_paths_on_cpu = true;
      speed_levers().test_fault = fault;
      speed_levers().cuda_rope = rope_lever;
      LlamaRun r;
      r.updates = 4;
      r.train_blocks = 60;
      std::string log;
      const fs::path dir = test::fresh_dir("normlab_llama_self_check", name);
      const TrainOutcome o = train_llama_lm(dir, r, &log);
      restore();
      INFO(log);
      CHECK(o.status == "completed");
      std::vector<double> losses;
      std::ifstream in(dir / "run" / "train.jsonl");
      for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j.value("kind", "") == "train") losses.push_back(j["loss"].get<double>());
        if (j.value("kind", "") == "valid") losses.push_back(j["nll"].get<double>());
      }
      const auto env = nlohmann::json::parse(test::slurp(dir / "run" / "env.json"));
      return std::make_tuple(losses, log, env);
    };
    const auto [faulty, faulty_log, faulty_env] = run("faulty", "rope", true);
    const auto [reference, reference_log, reference_env] = run("reference", "", false);
    const auto [fused, fused_log, fused_env] = run("fused", "", true);
    CHECK(faulty.size() >= 2);
    CHECK(faulty == reference);
    const std::string said = "fused self-check: rope is off for this run on cpu: rope forward";
    CHECK(faulty_log.find(said) != std::string::npos);
    CHECK(fused_log.find("fused self-check:") == std::string::npos);
    CHECK(faulty_env["fused_self_check"]["ops"]["rope"].get<std::string>().rfind("off: ", 0) == 0);
    CHECK(fused_env["fused_self_check"]["ops"]["rope"] == "ok");
    CHECK(fused_env["fused_self_check"]["seconds"].get<double>() < 1.0);
    // The fused twins round otherwise than the composition: the faulty run is not the fused one.
    CHECK(fused.size() == faulty.size());
  }

  // Issue 66 (noted): eval, ablate, forward and translate open a run through eval::open_run and run
  // the fused kernels on a GPU too; the same self-check runs there, and says what it turned off.
  TEST_CASE("fused self-check: a command that opens a run checks the kernels too") {
    const fs::path dir = test::fresh_dir("normlab_llama_open_run_check", "run");
    LlamaRun small;
    small.layers = 2;
    small.train_blocks = 60;
    small.updates = 2;
    REQUIRE(train_llama_lm(dir, small).status == "completed");
    const bool on_cpu = speed_levers().gpu_paths_on_cpu;
    auto open = [&](const std::string& fault) {
      speed_levers().gpu_paths_on_cpu = true;
      speed_levers().test_fault = fault;
      std::ostringstream log;
      eval::OpenedRun r =
          eval::open_run({(dir / "run").string(), "", "cpu", {NORMLAB_TEST_PLUGIN_DIR}}, log);
      const bool rope_on = speed_levers().cuda_rope;
      speed_levers() = SpeedLevers{};
      speed_levers().gpu_paths_on_cpu = on_cpu;
      return std::make_pair(log.str(), rope_on);
    };
    const std::pair<std::string, bool> faulty = open("rope");
    INFO(faulty.first);
    CHECK(faulty.first.find("fused self-check: rope is off for this run on cpu: rope forward") !=
          std::string::npos);
    CHECK_FALSE(faulty.second);  // turned off for the process, as train turns it off for the run
    const std::pair<std::string, bool> right = open("");
    CHECK(right.first.find("fused self-check:") == std::string::npos);
    CHECK(right.second);
    fs::remove_all(dir);
  }

  TEST_CASE(
      "a projection drawn on the CPU is torch::nn::Linear's for the same seed (a seed's weights "
      "are those it gave before issue 43.2)") {
    for (const bool bias : {true, false}) {
      CAPTURE(bias);
      torch::manual_seed(5);
      torch::nn::Linear linear(torch::nn::LinearOptions(7, 5).bias(bias));
      const torch::Tensor after_linear = torch::rand({3});
      torch::manual_seed(5);
      Projection projection(7, 5, bias);
      CHECK(torch::equal(projection->weight, linear->weight));
      CHECK(projection->bias.defined() == bias);
      if (bias) CHECK(torch::equal(projection->bias, linear->bias));
      CHECK(torch::equal(torch::rand({3}), after_linear));  // the generator moved on as far
      const torch::Tensor x = torch::randn({2, 7});
      CHECK(torch::allclose(projection(x), linear->forward(x), 0, 1e-6));
      CHECK(projection->named_parameters().size() == linear->named_parameters().size());
    }
  }

  TEST_CASE(
      "a model built for a device creates every parameter there, for every scheme and both "
      "families (issue 43.2: no CPU-side copy)") {
    // The meta device stands for a GPU: tensors with shapes and no storage.
    for (auto& [scheme, cfg, params] : every_scheme_model()) {
      CAPTURE(scheme);
      CAPTURE(cfg.family == Family::Llama);
      TransformerModel model{nullptr};
      {
        const ScopedParameterDevice building_on(torch::kMeta);
        CHECK(parameter_device() == torch::Device(torch::kMeta));
        model = test::make_model(scheme, cfg, params);
      }
      CHECK(parameter_device() == torch::Device(torch::kCPU));
      int64_t count = 0;
      for (const auto& item : model->named_parameters()) {
        CAPTURE(item.key());
        CHECK(item.value().is_meta());
        ++count;
      }
      CHECK(count > 10);
    }
  }

  TEST_CASE("init on CPU and on a device: assemble_model says where the weights were drawn") {
    const ModelSpec spec{llama_config(2, 16, 4), "pre-ln", {}};
    CHECK(assemble_model(spec, test::builtin_registry()).built_on == torch::Device(torch::kCPU));
    const AssembledModel meta = assemble_model(spec, test::builtin_registry(), torch::kMeta);
    CHECK(meta.built_on == torch::Device(torch::kMeta));
    for (const auto& p : meta.model->parameters()) CHECK(p.is_meta());
    CHECK(meta.move_seconds < 0.5);  // nothing left to move
    // run.init_on_cpu (drawn on the CPU, then moved) is checked on CUDA, in suite gpu_kernels.
  }

  TEST_CASE(
      "normlab train says once which operation of the GPU path falls back (nGPT's SwiGLU), and "
      "where its setup went") {
    const bool on_cpu = speed_levers().gpu_paths_on_cpu;
    speed_levers().gpu_paths_on_cpu = true;
    forget_gpu_fallback_notes();
    LlamaRun r;
    r.scheme = "ngpt";
    r.lr = 2e-2;
    r.updates = 3;
    r.train_blocks = 60;
    std::string log;
    const fs::path dir = test::fresh_dir("normlab_llama_gpu_notes", "run");
    const TrainOutcome o = train_llama_lm(dir, r, &log);
    speed_levers().gpu_paths_on_cpu = on_cpu;
    INFO(log);
    CHECK(o.status == "completed");
    const nlohmann::json env = nlohmann::json::parse(test::slurp(dir / "run" / "env.json"));
    CHECK(env["cuda_fused"] == true);
    CHECK(env["init_device"] == "cpu");
    const std::string note =
        "gpu path: SwiGLU: the scheme's norm at ffn.up/ffn.gate sits between the projection and "
        "the activation: ATen's composition\n";
    const size_t at = log.find(note);
    CHECK(at != std::string::npos);
    CHECK(log.find(note, at + 1) == std::string::npos);
    // Issue 43.2: the setup's parts, which add up to at most the time to the first update.
    std::smatch total, parts;
    REQUIRE(std::regex_search(log, total, std::regex(R"(first update done ([0-9.]+) s after)")));
    REQUIRE(std::regex_search(
        log, parts,
        std::regex(
            R"(setup: data ([0-9.]+) s, model built on cpu ([0-9.]+) s, moved to cpu ([0-9.]+) )"
            R"(s, optimizer ([0-9.]+) s, first update ([0-9.]+) s)")));
    double sum = 0;
    for (size_t i = 1; i < parts.size(); ++i) sum += std::stod(parts[i].str());
    CHECK(sum <= std::stod(total[1].str()) + 0.05);  // each part is rounded to 0.01 s
  }

  TEST_CASE(
      "every scheme's llama body: the GPU path's fused operations (host twins) change rounding "
      "only") {
    check_llama_gpu_path(torch::kCPU);
  }

  TEST_CASE(
      "packed sequences (downstream tasks read a context once, its choices after it): each "
      "choice's states are those of its own sequence, for every scheme and both families") {
    const std::vector<int64_t> context = {5, 9, 2, 17, 33, 8, 11};
    const std::vector<std::vector<int64_t>> choices = {{4}, {21, 7, 30}, {12, 6, 19, 40}};
    // Packed: the context at positions 0…6, then each choice at 7… seeing the context and itself.
    std::vector<int64_t> tokens = context, positions;
    for (int64_t t = 0; t < int64_t(context.size()); ++t) positions.push_back(t);
    std::vector<int64_t> starts;
    for (const auto& c : choices) {
      starts.push_back(int64_t(tokens.size()));
      for (size_t j = 0; j < c.size(); ++j) {
        tokens.push_back(c[j]);
        positions.push_back(int64_t(context.size() + j));
      }
    }
    const int64_t T = int64_t(tokens.size()), L = int64_t(context.size());
    torch::Tensor mask = torch::full({1, 1, T, T}, -std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t u = 0; u <= t; ++u) {
        const bool same_choice = std::upper_bound(starts.begin(), starts.end(), t) ==
                                 std::upper_bound(starts.begin(), starts.end(), u);
        if (u < L || same_choice) mask[0][0][t][u] = 0;
      }
    int compared = 0;
    for (auto& [scheme, cfg, params] : every_scheme_model()) {
      ModelConfig lm = cfg;
      lm.arch = Arch::LM;  // the transformer family's with sinusoidal positions, llama's rotary
      lm.enc_layers = 0;
      CAPTURE(scheme);
      CAPTURE(lm.family == Family::Llama);
      torch::manual_seed(58);
      TransformerModel model = test::make_model(scheme, lm, params);
      model->eval();
      torch::NoGradGuard no_grad;
      const torch::Tensor packed = model->packed_hidden(
          torch::tensor(tokens).unsqueeze(0), torch::tensor(positions).unsqueeze(0), mask)[0];
      for (size_t c = 0; c < choices.size(); ++c) {
        std::vector<int64_t> alone = context;
        alone.insert(alone.end(), choices[c].begin(), choices[c].end());
        const torch::Tensor h = model->final_hidden(
            torch::Tensor(), torch::tensor(alone).unsqueeze(0), /*unpadded=*/true)[0];
        const double scale = std::max(1.0, h.abs().max().item<double>());
        CHECK(test::max_abs_diff(packed.narrow(0, 0, L), h.narrow(0, 0, L)) <= 1e-5 * scale);
        CHECK(test::max_abs_diff(packed.narrow(0, starts[c], int64_t(choices[c].size())),
                                 h.narrow(0, L, int64_t(choices[c].size()))) <= 1e-5 * scale);
        ++compared;
      }
    }
    CHECK(compared >= 30);
  }

  TEST_CASE("rotary positions: the rotation of RoFormer eq. 34 in the half-split layout, by hand") {
    // dh = 4, θ = 100: frequencies θ^0 = 1 and θ^(-2/4) = 0.1; position t rotates the pairs
    // (x0, x2) by t·1 and (x1, x3) by t·0.1.
    torch::Tensor cos, sin;
    rope_tables(3, 4, 100.0, torch::TensorOptions().dtype(torch::kFloat), &cos, &sin);
    const torch::Tensor x =
        torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 1, 4}).expand({1, 1, 3, 4});
    const torch::Tensor y = apply_rope(x, cos, sin);
    for (int t = 0; t < 3; ++t) {
      const double a = t * 1.0, b = t * 0.1;
      const double expect[4] = {
          1 * std::cos(a) - 3 * std::sin(a), 2 * std::cos(b) - 4 * std::sin(b),
          3 * std::cos(a) + 1 * std::sin(a), 4 * std::cos(b) + 2 * std::sin(b)};
      for (int i = 0; i < 4; ++i)
        CHECK(y[0][0][t][i].item<double>() == doctest::Approx(expect[i]).epsilon(1e-6));
    }
    // What rotary positions are for: q_m·k_n depends on m − n only.
    torch::manual_seed(3);
    rope_tables(12, 8, 10000.0, torch::TensorOptions().dtype(torch::kDouble), &cos, &sin);
    const torch::Tensor q = torch::randn({8}, torch::kDouble),
                        k = torch::randn({8}, torch::kDouble);
    const torch::Tensor rq = apply_rope(q.expand({12, 8}), cos, sin),
                        rk = apply_rope(k.expand({12, 8}), cos, sin);
    CHECK(rq[7].dot(rk[4]).item<double>() ==
          doctest::Approx(rq[3].dot(rk[0]).item<double>()).epsilon(1e-12));
    CHECK(rq[7].dot(rk[4]).item<double>() !=
          doctest::Approx(rq[7].dot(rk[3]).item<double>()).epsilon(1e-3));
  }

  // Issue 43: a batch without pads takes the causal kernel (SDPA is_causal on LibTorch 2.x, flash
  // attention on a GPU) instead of the mask tensor; the same states and gradients as with the
  // causal + padding mask. The fused CPU attention is switched off so that ATen's attention runs.
  TEST_CASE(
      "unpadded batches: the causal kernel gives the masked attention's states and gradients") {
    const bool fused = speed_levers().fused_attention;
    speed_levers().fused_attention = false;
    for (const int kv_heads : {0, 2}) {
      CAPTURE(kv_heads);
      torch::manual_seed(5);
      TransformerModel model = test::make_model("pre-ln", llama_config(2, 16, 4, kv_heads));
      const torch::Tensor tokens = torch::randint(1, 50, {3, 9}, torch::kLong);  // no pad (0)
      std::vector<std::vector<torch::Tensor>> runs;
      for (const bool unpadded : {true, false}) {
        model->zero_grad();
        const torch::Tensor h = model->final_hidden(torch::Tensor(), tokens, unpadded);
        (h * torch::linspace(-1, 1, h.numel()).view(h.sizes())).sum().backward();
        std::vector<torch::Tensor> r{h.detach()};
        for (const auto& p : model->parameters())
          if (p.grad().defined()) r.push_back(p.grad().clone());
        runs.push_back(r);
      }
      REQUIRE(runs[0].size() == runs[1].size());
      CHECK(runs[0].size() > 10);
      for (size_t i = 0; i < runs[0].size(); ++i) {
        CAPTURE(i);  // 0: the states, then each parameter's gradient
        CHECK(test::max_abs_diff(runs[0][i], runs[1][i]) <=
              1e-5 * std::max(1.0, runs[1][i].abs().max().item<double>()));
      }
    }
    // An encoder-decoder's decoder too (its own masks: causal, and the source's padding).
    torch::manual_seed(6);
    TransformerModel encdec = test::make_model("pre-ln", test::small_config(Arch::EncDec, 2, 2));
    torch::Tensor src = torch::randint(3, 50, {2, 7}, torch::kLong);
    src[1][6] = 0;  // a padded source
    const torch::Tensor tgt = torch::randint(3, 50, {2, 5}, torch::kLong);
    const torch::Tensor a = encdec->forward(src, tgt, /*unpadded=*/true),
                        b = encdec->forward(src, tgt, /*unpadded=*/false);
    CHECK(test::max_abs_diff(a, b) <= 1e-5 * std::max(1.0, b.abs().max().item<double>()));
    speed_levers().fused_attention = fused;
  }

  TEST_CASE("SwiGLU feed-forward: fc2(SiLU(gate·h) ⊙ fc1·h), no biases") {
    torch::manual_seed(1);
    FeedForward ffn(4, 6, 0.0, /*gated=*/true, /*bias=*/false);
    CHECK_FALSE(ffn->fc1->bias.defined());
    CHECK_FALSE(ffn->fc2->bias.defined());
    const torch::Tensor h = torch::randn({2, 3, 4});
    const torch::Tensor g = torch::matmul(h, ffn->gate->weight.t()),
                        u = torch::matmul(h, ffn->fc1->weight.t());
    const torch::Tensor silu = g / (1 + torch::exp(-g));
    const torch::Tensor expect = torch::matmul(silu * u, ffn->fc2->weight.t());
    CHECK(test::max_abs_diff(ffn->forward(h), expect) < 1e-6);
  }

  TEST_CASE(
      "grouped k/v heads equal full attention with each k/v head repeated for its query heads") {
    torch::manual_seed(2);
    AttentionOptions o;
    o.d_model = 16;
    o.heads = 4;
    o.kv_heads = 2;
    o.bias = false;
    o.rope_theta = 10000;
    MultiheadAttention grouped(o);
    o.kv_heads = 4;
    MultiheadAttention full(o);
    CHECK(grouped->k_proj->weight.size(0) == 8);  // 2 heads of 4
    {
      torch::NoGradGuard no_grad;
      full->q_proj->weight.copy_(grouped->q_proj->weight);
      full->out_proj->weight.copy_(grouped->out_proj->weight);
      // kv head j serves query heads 2j and 2j+1: its 4 rows, twice.
      for (auto [f, g] :
           {std::pair{full->k_proj, grouped->k_proj}, std::pair{full->v_proj, grouped->v_proj}})
        f->weight.copy_(g->weight.view({2, 1, 4, 16}).expand({2, 2, 4, 16}).reshape({16, 16}));
    }
    grouped->eval();
    full->eval();
    const torch::Tensor x = torch::randn({2, 5, 16});
    const torch::Tensor mask = causal_mask(5, x.options());
    CHECK(test::max_abs_diff(grouped->forward(x, x, mask, true), full->forward(x, x, mask, true)) <
          1e-6);
  }

  TEST_CASE(
      "a llama model: no biases, no absolute positions, unscaled embeddings, N(0, 0.02) init") {
    torch::manual_seed(4);
    ModelConfig cfg = llama_config(/*layers=*/8, /*d=*/64, /*heads=*/4, /*kv_heads=*/2);
    cfg.ffn_dim = 128;
    cfg.tgt_vocab = 400;
    for (bool scaled : {false, true}) {
      cfg.scaled_init = scaled;
      TransformerModel m = test::make_model("pre-ln", cfg);
      double out_sq = 0, in_sq = 0;
      int64_t out_n = 0, in_n = 0;
      for (const auto& p : m->named_parameters()) {
        CHECK_MESSAGE(p.key().find(".bias") == std::string::npos, p.key());
        const bool into_residual = p.key().find("out_proj") != std::string::npos ||
                                   p.key().find("fc2") != std::string::npos;
        if (p.key().find("norm") != std::string::npos) continue;
        (into_residual ? out_sq : in_sq) += p.value().pow(2).sum().item<double>();
        (into_residual ? out_n : in_n) += p.value().numel();
      }
      CHECK(m->named_parameters().find("decoder.layers.0.ffn.gate.weight") != nullptr);
      CHECK(m->named_parameters()["decoder.layers.0.self_attn.k_proj.weight"].size(0) == 32);
      CHECK(std::sqrt(in_sq / double(in_n)) == doctest::Approx(0.02).epsilon(0.03));
      CHECK(std::sqrt(out_sq / double(out_n)) ==
            doctest::Approx(scaled ? 0.02 / std::sqrt(16.0) : 0.02).epsilon(0.03));
    }
    // Without absolute positions a token's first-position hidden state is its embedding's image
    // alone: the same token at position 0 of two different sequences gives the same logits.
    TransformerModel m = test::make_model("pre-ln", cfg);
    m->eval();
    torch::NoGradGuard no_grad;
    const torch::Tensor a = torch::tensor({{7, 8, 9}}), b = torch::tensor({{7, 30, 31}});
    CHECK(test::max_abs_diff(m->forward_lm(a).select(1, 0), m->forward_lm(b).select(1, 0)) < 1e-6);
    // The Transformer family of the same size has biases and still scales its embeddings by √d.
    ModelConfig t = cfg;
    t.family = Family::Transformer;
    t.kv_heads = 0;
    TransformerModel fairseq = test::make_model("pre-ln", t);
    CHECK(fairseq->named_parameters().find("decoder.layers.0.ffn.fc1.bias") != nullptr);
    CHECK(fairseq->named_parameters().find("decoder.layers.0.ffn.gate.weight") == nullptr);
  }

  TEST_CASE(
      "nGPT on llama: SwiGLU with s_u and s_ν·√d, logits s_z ⊙ (E_out h) and no final norm, by "
      "hand") {
    torch::manual_seed(9);
    ModelConfig cfg = llama_config(/*layers=*/2, /*d=*/16, /*heads=*/2);
    TransformerModel m = test::make_model("ngpt", cfg);
    auto params = m->named_parameters();
    REQUIRE(params.find("decoder.logit_scale.weight") != nullptr);
    CHECK(params.find("decoder.layer_norm.weight") == nullptr);
    // Stored "scaled": s_z starts at 1/√d and acts as stored·√d = 1.
    CHECK(params["decoder.logit_scale.weight"].size(0) == 50);
    CHECK(params["decoder.logit_scale.weight"][0].item<double>() == doctest::Approx(0.25));
    auto& ffn = *m->decoder->layer(0).ffn;
    REQUIRE(ffn.up_norm);
    REQUIRE(ffn.gate_norm);
    torch::NoGradGuard no_grad;
    ffn.up_norm->weight.uniform_(0.5, 1.5);
    ffn.gate_norm->weight.uniform_(0.5, 1.5);
    params["decoder.logit_scale.weight"].uniform_(0.1, 0.4);
    const torch::Tensor h = torch::randn({2, 3, 16});
    const torch::Tensor u = torch::matmul(h, ffn.fc1->weight.t()) * ffn.up_norm->weight;
    const torch::Tensor v =
        torch::matmul(h, ffn.gate->weight.t()) * ffn.gate_norm->weight * 4.0;  // √d = 4
    CHECK(test::max_abs_diff(ffn.activation(h), u * (v / (1 + torch::exp(-v)))) < 1e-5);
    m->eval();
    const torch::Tensor tokens = torch::tensor({{5, 6, 7}});
    const torch::Tensor hidden = m->final_hidden(torch::Tensor(), tokens);
    const torch::Tensor s_z = params["decoder.logit_scale.weight"] * 4.0;
    CHECK(test::max_abs_diff(m->forward_lm(tokens),
                             torch::matmul(hidden, m->output_weight().t()) * s_z) < 1e-5);
    // The transformer family keeps its adaptation: a final L2 norm with a gain, no logit scale.
    ModelConfig t = cfg;
    t.family = Family::Transformer;
    t.norm = NormSpec();
    TransformerModel fairseq = test::make_model("ngpt", t);
    CHECK(fairseq->named_parameters().find("decoder.logit_scale.weight") == nullptr);
    CHECK(fairseq->named_parameters().find("decoder.layer_norm.weight") != nullptr);
  }

  TEST_CASE("nGPT on llama: one s_qk ∈ ℝ^d (heads × d_k) scales both q and k, by hand") {
    torch::manual_seed(10);
    ModelConfig cfg = llama_config(/*layers=*/1, /*d=*/16, /*heads=*/2);
    TransformerModel m = test::make_model("ngpt", cfg);
    auto params = m->named_parameters();
    REQUIRE(params.find("decoder.layers.0.self_attn.q_norm.weight") != nullptr);
    CHECK(params["decoder.layers.0.self_attn.q_norm.weight"].sizes() ==
          torch::IntArrayRef{2, 1, 8});
    CHECK(params.find("decoder.layers.0.self_attn.k_norm.weight") == nullptr);
    // One attention with nGPT's q/k norms: s_qk stored scaled (starts at 1/√d = 0.25, acts ×√d).
    AttentionOptions o;
    o.d_model = 16;
    o.heads = 2;
    o.bias = false;
    o.rope_theta = 10000;
    MultiheadAttention attn(o);
    NormSpec q = NormSpec::of(NormKind::L2), k = NormSpec::of(NormKind::L2);
    q.eps = k.eps = 1e-12;
    q.affine = k.affine = true;
    q.gain_scale = k.gain_scale = 0.25;
    q.out_scale = 8;  // d_k: the core's 1/√d_k becomes nGPT's √d_k
    q.gain_per_head = k.gain_per_head = k.gain_from_query = true;
    attn->add_norm(BranchPoint::Query, q);
    attn->add_norm(BranchPoint::Key, k);
    CHECK(attn->named_parameters().find("k_norm.weight") == nullptr);
    torch::NoGradGuard no_grad;
    attn->q_norm->weight.uniform_(0.1, 0.4);
    attn->eval();
    const torch::Tensor x = torch::randn({1, 4, 16});
    torch::Tensor cos, sin;
    rope_tables(4, 8, 10000, x.options(), &cos, &sin);
    auto heads = [](const torch::Tensor& y) { return y.view({1, 4, 2, 8}).transpose(1, 2); };
    const torch::Tensor s_qk = attn->q_norm->weight * 4.0;  // [2, 1, 8], ×√d
    auto unit = [](const torch::Tensor& y) { return y / y.norm(2, {-1}, true); };
    const torch::Tensor qh =
        s_qk * unit(apply_rope(heads(torch::matmul(x, attn->q_proj->weight.t())), cos, sin));
    const torch::Tensor kh =
        s_qk * unit(apply_rope(heads(torch::matmul(x, attn->k_proj->weight.t())), cos, sin));
    const torch::Tensor vh = heads(torch::matmul(x, attn->v_proj->weight.t()));
    const torch::Tensor mask = causal_mask(4, x.options());
    const torch::Tensor p =
        torch::softmax(torch::matmul(qh, kh.transpose(-1, -2)) * std::sqrt(8.0) + mask, -1);
    const torch::Tensor ctx = torch::matmul(p, vh).transpose(1, 2).reshape({1, 4, 16});
    CHECK(test::max_abs_diff(attn->forward(x, x, mask, true),
                             torch::matmul(ctx, attn->out_proj->weight.t())) < 1e-5);
    // Grouped k/v heads: k is repeated per query head before its norm, so each query head's
    // s_qk scales the k it attends with — as full attention with the k/v rows repeated.
    o.kv_heads = 1;
    MultiheadAttention grouped(o);
    grouped->add_norm(BranchPoint::Query, q);
    grouped->add_norm(BranchPoint::Key, k);
    grouped->q_norm->weight.copy_(attn->q_norm->weight);
    grouped->q_proj->weight.copy_(attn->q_proj->weight);
    grouped->out_proj->weight.copy_(attn->out_proj->weight);
    for (auto [f, g] :
         {std::pair{attn->k_proj, grouped->k_proj}, std::pair{attn->v_proj, grouped->v_proj}})
      f->weight.copy_(g->weight.view({1, 8, 16}).expand({2, 8, 16}).reshape({16, 16}));
    grouped->eval();
    CHECK(test::max_abs_diff(grouped->forward(x, x, mask, true), attn->forward(x, x, mask, true)) <
          1e-5);
  }

  TEST_CASE(
      "DyT on llama: no β, a learned embedding scale from √d, α₀ from the authors' LLaMA table") {
    torch::manual_seed(11);
    ModelConfig cfg = llama_config(/*layers=*/2, /*d=*/64, /*heads=*/4);
    TransformerModel m = test::make_model("dyt", cfg);
    auto params = m->named_parameters();
    for (const auto& p : params) CHECK_MESSAGE(p.key().find(".bias") == std::string::npos, p.key());
    REQUIRE(params.find("decoder.embed_scale") != nullptr);
    CHECK(params["decoder.embed_scale"].item<double>() == doctest::Approx(8.0));  // √64
    // Widths under 4096 take the 4096 row (attention 0.8, FFN 0.2, final 0.2).
    auto alpha = [&](const std::string& suffix) {
      for (const auto& p : params)
        if (p.key().size() >= suffix.size() &&
            p.key().compare(p.key().size() - suffix.size(), suffix.size(), suffix) == 0)
          return p.value().item<double>();
      FAIL("no parameter ending in " << suffix);
      return 0.0;
    };
    CHECK(alpha("layers.0.self_attn_norm.alpha") == doctest::Approx(0.8));
    CHECK(alpha("layers.1.ffn_norm.alpha") == doctest::Approx(0.2));
    CHECK(alpha("decoder.layer_norm.alpha") == doctest::Approx(0.2));
    // The rows by width, and the switches that override them.
    auto derived = [](int64_t width, const std::string& where,
                      const std::map<std::string, ParamValue>& p = {}) {
      ModelGeometry g = llama_config(2, 16, 4).geometry();
      g.d_model = width;
      for (const auto& d : test::builtin_registry().create("dyt", p, g).scheme->derive())
        if (d.where == where) return d.value;
      return -1.0;
    };
    CHECK(derived(5120, "attention inputs") == 0.6);
    CHECK(derived(6000, "ffn inputs") == 0.15);
    CHECK(derived(8192, "final norm") == 0.05);
    CHECK(derived(8192, "attention inputs", {{"alpha0_attn", ParamValue::of_float(0.3)}}) == 0.3);
    CHECK(derived(4096, "ffn inputs", {{"llama_alpha_table", ParamValue::of_bool(false)}}) == 0.5);
    // The scale multiplies the embedded input: at 0 every token looks the same at position 0.
    {
      torch::NoGradGuard no_grad;
      params["decoder.embed_scale"].zero_();
    }
    m->eval();
    CHECK(test::max_abs_diff(m->forward_lm(torch::tensor({{3}})),
                             m->forward_lm(torch::tensor({{9}}))) < 1e-7);
    // The transformer family keeps DyT as the paper's (β, α₀ = 0.5, no learned embedding scale).
    ModelConfig t = cfg;
    t.family = Family::Transformer;
    t.norm = NormSpec();
    TransformerModel fairseq = test::make_model("dyt", t);
    CHECK(fairseq->named_parameters().find("decoder.embed_scale") == nullptr);
    CHECK(fairseq->named_parameters().find("decoder.layer_norm.bias") != nullptr);
    CHECK(fairseq->named_parameters()["decoder.layer_norm.alpha"].item<double>() == 0.5);
  }

  TEST_CASE(
      "the layer parameter names sdk/init.h promises are the core's parameters of every layer, "
      "both families") {
    ModelConfig t = test::small_config(Arch::EncDec, 2, 2);
    for (const ModelConfig& cfg : {t, llama_config(/*layers=*/2)}) {
      TransformerModel m = test::make_model("pre-ln", cfg);
      std::vector<TransformerStackImpl*> stacks = {m->decoder.get()};
      if (cfg.arch == Arch::EncDec) stacks.push_back(m->encoder.get());
      for (TransformerStackImpl* stack : stacks) {
        for (size_t i = 0; i < stack->num_layers(); ++i) {
          auto& layer = stack->layer(i);
          std::set<std::string> built, promised;
          for (const auto& p : layer.named_parameters())
            if (p.key().find("_norm") == std::string::npos) built.insert(p.key());  // the scheme's
          for (const std::string& n : layer_parameter_names(layer.geometry())) promised.insert(n);
          CHECK(built == promised);
          CHECK(promised.count("ffn.fc1.weight") == 1);
          CHECK(promised.count("self_attn.q_proj.bias") == (cfg.family == Family::Transformer));
          CHECK(promised.count("cross_attn.v_proj.weight") == layer.geometry().has_cross_attn());
        }
      }
    }
  }

  TEST_CASE("manifest: family llama's defaults and its errors name the key") {
    const fs::path root = test::fresh_dir("normlab_llama_manifest", "m");
    {
      // d = 96: int(8·96/3) = 256, a multiple of 256; d = 64: 170 → 256; ffn_multiple_of 32: 170 →
      // 192.
      const ExperimentSpec s =
          load_manifest(write_manifest(root / "a", "family = \"llama\"\nd_model = 64"), {},
                        &test::builtin_registry());
      CHECK(s.model.ffn_dim == 256);
      CHECK(s.scheme.norm == "rmsnorm");
      CHECK(s.scheme.norm_eps == 1e-6);
      CHECK(s.optim.lr_schedule == "cosine");
      const ExperimentSpec t = load_manifest(
          write_manifest(root / "b", "family = \"llama\"\nd_model = 64\nffn_multiple_of = 32"), {},
          &test::builtin_registry());
      CHECK(t.model.ffn_dim == 192);
      const ExperimentSpec u =
          load_manifest(write_manifest(root / "c", "family = \"llama\"\nffn_dim = 40"), {},
                        &test::builtin_registry());
      CHECK(u.model.ffn_dim == 40);
      const ExperimentSpec fairseq =
          load_manifest(write_manifest(root / "d", ""), {}, &test::builtin_registry());
      CHECK(fairseq.scheme.norm == "layernorm");
      CHECK(fairseq.optim.lr_schedule == "inverse_sqrt");
    }
    CHECK(manifest_error(write_manifest(root / "e", "family = \"llama\"\nkv_heads = 3"))
              .find("[model] kv_heads: expected a divisor of heads = 4, got 3") !=
          std::string::npos);
    CHECK(manifest_error(write_manifest(root / "f", "rope_theta = 500.0"))
              .find("[model] rope_theta: a key of family = \"llama\"") != std::string::npos);
    CHECK(manifest_error(write_manifest(root / "g", "family = \"llama\"\nd_model = 12"))
              .find("[model] heads: rotary positions need an even head width") !=
          std::string::npos);
    CHECK(manifest_error(write_manifest(root / "h", "family = \"gpt\"")).find("[model] family") !=
          std::string::npos);
    const std::string encdec =
        manifest_error(write_manifest(root / "i", "family = \"llama\""), {"model.arch=\"encdec\""});
    CHECK(encdec.find("m.toml:") != std::string::npos);
    CHECK(encdec.find("decoder-only") != std::string::npos);
    fs::remove_all(root);
  }

  TEST_CASE("cosine schedule: warm-up to lr, then lr_min + (lr − lr_min)(1 + cos πp)/2") {
    OptimSection o;
    o.lr = 1e-3;
    o.warmup_updates = 10;
    o.max_updates = 110;
    o.min_lr_ratio = 0.1;
    o.lr_schedule = "cosine";
    CHECK(learning_rate(o, 5) == doctest::Approx(5e-4));
    CHECK(learning_rate(o, 10) == doctest::Approx(1e-3));
    CHECK(learning_rate(o, 60) == doctest::Approx(0.55e-3));  // p = 1/2
    CHECK(learning_rate(o, 35) == doctest::Approx(1e-4 + 0.9e-3 * (1 + std::cos(M_PI / 4)) / 2));
    CHECK(learning_rate(o, 110) == doctest::Approx(1e-4));
  }

  TEST_CASE("every built-in scheme trains a llama-family language model") {
    const fs::path root =
        fs::temp_directory_path() / ("normlab_llama_training_" + std::to_string(::getpid()));
    fs::remove_all(root);
    int schemes = 0;
    for (const PluginInfo* info : test::builtin_registry().plugins()) {
      ++schemes;
      LlamaRun r;
      r.scheme = info->name;
      r.scheme_keys = info->name == "branchnorm" ? "T = 50" : "";
      r.kv_heads = 2;
      r.lr = info->name == "ngpt" ? 2e-2 : 5e-3;
      const TrainOutcome o = train_llama_lm(root / info->name, r);
      INFO(info->name << ": " << o.status << " " << o.note << ", valid nll " << o.last_valid_nll
                      << " vs uniform " << o.uniform_loss);
      CHECK(o.status == "completed");
      CHECK(std::isfinite(o.last_valid_nll));
      // A Markov chain with 4 successors per symbol: entropy rate ~1 nat against log 36 = 3.58 for
      // the uniform guess.
      CHECK(o.last_valid_nll < 0.8 * o.uniform_loss);
    }
    CHECK(schemes >= 20);
    fs::remove_all(root);
  }

  TEST_CASE(
      "normlab ablate: one row per layer; dropping a Pre-LN layer equals zeroing its branches' "
      "output projections") {
    const fs::path dir = test::fresh_dir("normlab_llama_ablate", "run");
    LlamaRun small;
    small.layers = 3;
    small.train_blocks = 500;
    small.updates = 30;
    REQUIRE(train_llama_lm(dir, small).status == "completed");
    AblateOptions opt;
    opt.model.run = (dir / "run").string();
    opt.model.plugin_paths = {NORMLAB_TEST_PLUGIN_DIR};
    opt.json = true;
    std::ostringstream out, err;
    REQUIRE_MESSAGE(ablate_command(opt, out, err) == 0, err.str());
    const auto j = nlohmann::json::parse(out.str());
    REQUIRE(j["layers"].size() == 3);
    // Progress on stderr (issue 59.9): the first pass's time, then each layer with what is left.
    CHECK(err.str().find("ablate: all layers scored in") != std::string::npos);
    CHECK(err.str().find("3 layers to drop") != std::string::npos);
    CHECK(err.str().find("ablate: 3/3 layers dropped") != std::string::npos);
    // The rows: every layer matters at least a little in a trained model.
    for (const auto& row : j["layers"]) CHECK(row["delta_nll"].get<double>() > 0);
    const std::string csv = test::slurp(j["csv"].get<std::string>());
    CHECK(csv.rfind("stack,layer,nll,delta_nll,ppl\nnone,-1,", 0) == 0);
    CHECK(std::count(csv.begin(), csv.end(), '\n') == 5);
    // Independently: a Pre-LN layer whose out_proj and fc2 are zero adds nothing to the stream.
    std::ostringstream log;
    eval::OpenedRun r = eval::open_run({opt.model.run, "", "", opt.model.plugin_paths, false}, log);
    CHECK(eval::split_nll(*r.model, r.ds.valid, r.device, 4096) ==
          doctest::Approx(j["nll"].get<double>()).epsilon(1e-12));
    {
      torch::NoGradGuard no_grad;
      for (const auto& p : r.model->decoder->layer(1).named_parameters())
        if (p.key().find("out_proj") != std::string::npos ||
            p.key().find("fc2") != std::string::npos)
          p.value().zero_();
    }
    CHECK(eval::split_nll(*r.model, r.ds.valid, r.device, 4096) ==
          doctest::Approx(j["layers"][1]["nll"].get<double>()).epsilon(1e-6));
    // A layer that does not exist is one error line, exit 2.
    opt.drop_layer = "0,3";
    std::ostringstream out2, err2;
    CHECK(ablate_command(opt, out2, err2) == 2);
    CHECK(err2.str().find("--drop-layer: expected each or layer indices in [-3, 2], got '3'") !=
          std::string::npos);
    opt.drop_layer = "-1";
    std::ostringstream out3, err3;
    REQUIRE(ablate_command(opt, out3, err3) == 0);
    CHECK(nlohmann::json::parse(out3.str())["layers"][0]["layer"] == 2);
    fs::remove_all(dir);
  }

  // The reduced reproduction (docs/reproducing.md, "LLaMA family"): what held at 12 layers on
  // tinyshakespeare holds on a 6-layer model of the built-in Markov-chain LM in seconds.
  TEST_CASE(
      "reduced reproduction: LNS damps Pre-LN's hidden-state growth; Mix-LN lifts the deep layers' "
      "gradient norms") {
    const fs::path root = test::fresh_dir("normlab_llama_repro", "runs");
    struct Depth {
      double rms_growth, grad_ratio;
    };
    auto run = [&](const std::string& scheme) {
      const fs::path dir = root / scheme;
      LlamaRun r;
      r.scheme = scheme;
      r.d_model = 64;
      r.layers = 6;
      r.vocab = 64;
      r.lr = 3e-3;
      r.updates = 60;
      r.analysis =
          "[analysis]\nprobes = [\"hidden_state_norm\", \"grad_norm\"]\ninterval = 60\ndense_until "
          "= 0\nformats = [\"csv\"]";
      REQUIRE(train_llama_lm(dir, r).status == "completed");
      std::map<std::pair<std::string, int>, double> last;
      std::ifstream f(dir / "run" / "analysis.csv");
      std::string line;
      std::getline(f, line);
      while (std::getline(f, line)) {
        std::vector<std::string> c;
        std::stringstream ss(line);
        for (std::string x; std::getline(ss, x, ',');) c.push_back(x);
        if (c[0] != "60") continue;
        if (c[1] == "hidden_rms" || (c[1] == "grad_norm" && c[4] == "all" && c[2] == "decoder"))
          last[{c[1], std::stoi(c[3])}] = std::stod(c[5]);
      }
      return Depth{last.at({"hidden_rms", 5}) / last.at({"hidden_rms", 0}),
                   last.at({"grad_norm", 5}) / last.at({"grad_norm", 0})};
    };
    const Depth pre = run("pre-ln"), lns = run("ln-scaling"), mix = run("mix-ln");
    INFO("rms growth L6/L1: pre-ln " << pre.rms_growth << ", ln-scaling " << lns.rms_growth);
    INFO("grad norm L6/L1: pre-ln " << pre.grad_ratio << ", mix-ln " << mix.grad_ratio);
    // Measured here: rms growth 2.25 (Pre-LN) vs 1.57 (LNS); last/first layer gradient norm 0.27
    // (Pre-LN) vs 0.94 (Mix-LN). At 12 layers on tinyshakespeare: 1.30 vs 1.02; 0.39 vs 3.52
    // (Mix-LN overshoots: its Post-LN layers get the small gradients there, so "more uniform" did
    // not hold).
    CHECK(pre.rms_growth > 1.5);
    CHECK(lns.rms_growth < 0.85 * pre.rms_growth);
    CHECK(pre.grad_ratio < 0.5);
    CHECK(mix.grad_ratio > 2 * pre.grad_ratio);
    fs::remove_all(root);
  }

}  // TEST_SUITE

TEST_SUITE("gpu_kernels") {
  TEST_CASE("every scheme's llama body on CUDA: the fused operations change rounding only") {
    if (!torch::cuda::is_available()) {
      MESSAGE("SKIP: no CUDA device");
      return;
    }
    check_llama_gpu_path(torch::Device(torch::kCUDA, 0));
  }

  TEST_CASE(
      "grouped k/v heads on CUDA in bf16: SDPA's grouped heads (flash) against the repeated "
      "heads") {
    if (!torch::cuda::is_available()) {
      MESSAGE("SKIP: no CUDA device");
      return;
    }
    const torch::Device cuda(torch::kCUDA, 0);
    AttentionOptions o;
    o.d_model = 64;
    o.heads = 4;
    o.kv_heads = 2;  // dh 16: what SDPA's flash kernel takes
    o.bias = false;
    o.rope_theta = 10000;
    torch::manual_seed(3);
    MultiheadAttention attn(o);
    attn->to(cuda, torch::kBFloat16);
    const torch::Tensor x0 = torch::randn({2, 24, 64}, torch::device(cuda).dtype(torch::kBFloat16));
    const torch::Tensor probe = torch::randn({2, 24, 64}, x0.options());
    if (!sdpa_grouped_heads_apply(x0.view({2, 24, 4, 16}).transpose(1, 2))) {
      MESSAGE("SKIP: this GPU's SDPA has no flash kernel (compute capability below 8.0)");
      return;
    }
    const bool was_fused = speed_levers().cuda_fused;
    std::vector<std::vector<torch::Tensor>> runs;
    forget_gpu_fallback_notes();
    for (const bool fused : {true, false}) {
      speed_levers().cuda_fused = fused;
      attn->zero_grad();
      const torch::Tensor x = x0.clone().requires_grad_(true);
      const torch::Tensor y = attn->forward(x, x, torch::Tensor(), /*self_attention=*/true,
                                            /*causal=*/true);
      (y.to(torch::kFloat) * probe.to(torch::kFloat)).sum().backward();
      std::vector<torch::Tensor> r{y.detach().to(torch::kFloat).cpu(),
                                   x.grad().to(torch::kFloat).cpu()};
      for (const auto& p : attn->parameters()) r.push_back(p.grad().to(torch::kFloat).cpu());
      runs.push_back(r);
      if (fused)  // the grouped heads went to SDPA as they are: no "repeated" fallback said
        for (const std::string& note : take_gpu_fallback_notes())
          CHECK(note.find("grouped k/v heads repeated") == std::string::npos);
    }
    speed_levers().cuda_fused = was_fused;
    for (size_t i = 0; i < runs[0].size(); ++i) {
      CAPTURE(i);  // 0: the output, 1: ∂x, then q, k, v, out_proj's weight gradients
      const double scale = std::max(1.0, runs[1][i].abs().max().item<double>());
      CHECK(test::max_abs_diff(runs[0][i], runs[1][i]) <= 3e-2 * scale);  // bf16 roundings
    }
  }

  TEST_CASE(
      "every scheme's model drawn on CUDA: the init's distribution per parameter, and the CPU's "
      "weights with init_on_cpu") {
    if (!torch::cuda::is_available()) {
      MESSAGE("SKIP: no CUDA device");
      return;
    }
    check_init_on_device(torch::Device(torch::kCUDA, 0));
  }
}

}  // namespace normlab_test_llama
