// The probe registry (a probe of this test binary, registered by one line, shows up in a run's
// records), typed scheme values, and the trainer's run events to any number of observers.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "normlab/analysis/probe.h"
#include "normlab/analysis/probes.h"
#include "normlab/manifest/experiment.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_probes {

using namespace normlab;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Only the test below wants its records; every other "all" run of this binary gets none.
std::atomic<bool> g_count_parameters{false};

// A probe of this test binary: the number of trained parameters, at update 0 and every due update.
class ParameterCount final : public analysis::Probe {
 public:
  void on_start(analysis::ProbeContext& ctx) override { record(ctx); }
  void after_step(analysis::ProbeContext& ctx) override { record(ctx); }

 private:
  static void record(analysis::ProbeContext& ctx) {
    if (!g_count_parameters) return;
    int64_t n = 0;
    for (const analysis::ProbedParam& p : ctx.params) n += p.value.numel();
    ctx.emit("parameter_count", "model", -1, "total", double(n));
  }
};

}  // namespace

NORMLAB_PROBE("parameter_count", ParameterCount);

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("normlab_probes_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

ExperimentSpec tiny_run(const fs::path& dir, const std::string& analysis) {
  std::ofstream(dir / "m.toml") << fmt::format(R"([model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 1
dec_layers = 1
dropout = 0.1
[scheme]
name = "pre-ln"
[data]
task = "copy"
synthetic_vocab = 10
synthetic_train = 300
synthetic_valid = 12
cache_dir = "{0}/cache"
[optim]
max_tokens = 128
max_updates = 7
[eval]
interval = 4
bleu = false
[run]
out_dir = "{0}/run"
log_interval = 2
threads = 1
{1}
)",
                                               dir.string(), analysis);
  return load_manifest((dir / "m.toml").string(), {}, &test::builtin_registry());
}

std::vector<json> jsonl(const fs::path& file) {
  std::vector<json> rows;
  std::ifstream f(file);
  for (std::string line; std::getline(f, line);) rows.push_back(json::parse(line));
  return rows;
}

// Every event as one line of text, in order.
struct EventLog final : RunObserver {
  std::vector<std::string> events;
  int64_t probe_rows = -1;
  void on_model_ready(const RunStart& run) override {
    probe_rows = run.first_valid_examples(3).tgt_in.size(0);
    events.push_back("model_ready");
  }
  void on_run_start(int64_t done) override { events.push_back(fmt::format("run_start {}", done)); }
  void before_forward(int64_t u) override { events.push_back(fmt::format("before_forward {}", u)); }
  void after_backward(int64_t u) override { events.push_back(fmt::format("after_backward {}", u)); }
  void before_step(int64_t u, double g) override {
    events.push_back(
        fmt::format("before_step {} {}", u, std::isfinite(g) && g > 0 ? "norm" : "bad norm"));
  }
  void after_step(int64_t u) override { events.push_back(fmt::format("after_step {}", u)); }
  void on_scalar(const std::string& tag, int64_t u, double) override {
    events.push_back(fmt::format("{} {}", tag, u));
  }
  void on_run_end(const TrainOutcome& o) override {
    events.push_back(fmt::format("run_end {} {}", o.status, o.updates));
  }
};

}  // namespace

TEST_SUITE("analysis") {
  TEST_CASE("a probe registered by one line in the test binary shows up in a run's records") {
    const auto names = analysis::probe_names();
    for (const char* built_in :
         {"act_grad_norm", "grad_norm", "hidden_state_norm", "layer_angular_distance",
          "layer_cosine", "ln_input_norm", "param_update", "scheme_state", "sparsity",
          "update_norm", "parameter_count", "activation_kurtosis", "attn_entropy", "attn_logit_max",
          "massive_activations", "output_logits"})
      CHECK(std::count(names.begin(), names.end(), built_in) == 1);
    AnalysisSection a;
    a.probes = {"grad_norm"};
    CHECK(analysis::make_probe_plan(a, 10).probes == std::vector<std::string>{"grad_norm"});
    a.probes = {"all"};
    CHECK(analysis::make_probe_plan(a, 10).probes == names);
    a.probes = {"no_such_probe"};
    CHECK_THROWS_WITH_AS(analysis::make_probe_plan(a, 10),
                         doctest::Contains("unknown probe 'no_such_probe'"), std::invalid_argument);

    const fs::path dir = fresh_dir("registered");
    std::ostringstream sink;
    g_count_parameters = true;
    // Selected by its name: the manifest takes its choices from the probe registry (issue 15: a new
    // probe was selectable only through "all", the manifest's list being fixed).
    const TrainOutcome o =
        train(tiny_run(dir,
                       "[analysis]\nprobes = [\"parameter_count\"]\ninterval = 3\ndense_until = 1\n"
                       "formats = [\"jsonl\"]"),
              test::builtin_registry(), sink);
    g_count_parameters = false;
    REQUIRE(o.status == "completed");
    std::ifstream env_file(dir / "run" / "env.json");
    const int64_t parameters = json::parse(env_file)["parameters"].get<int64_t>();
    std::set<int64_t> updates;
    for (const json& r : jsonl(dir / "run" / "analysis.jsonl"))
      if (r["metric"] == "parameter_count") {
        CHECK(r["value"].get<double>() == double(parameters));
        updates.insert(r["update"].get<int64_t>());
      }
    // Update 0, the dense window, every 3rd update and the last: the session's schedule.
    CHECK(updates == std::set<int64_t>{0, 1, 3, 6, 7});
    // A misspelt name names the file, line and key, and lists the registered probes.
    const fs::path bad = fresh_dir("registered_bad");
    const std::string expected =
        (bad / "m.toml").string() +
        ":27:10: [analysis] probes: expected a list of all | act_grad_norm | "
        "activation_kurtosis | attn_entropy | attn_logit_max | grad_norm | hidden_state_norm | "
        "layer_angular_distance | layer_cosine | ln_input_norm | massive_activations | "
        "output_logits | param_update | parameter_count | scheme_state | sparsity | update_norm, "
        "got \"parameter_counts\"";
    CHECK_THROWS_WITH_AS(tiny_run(bad, "[analysis]\nprobes = [\"parameter_counts\"]"),
                         doctest::Contains(expected.c_str()), ManifestError);
  }

  // Issue 15.5: scheme_state parsed status() ("alpha_t=0.1429", 4 digits); it reads values() now.
  TEST_CASE("scheme_state records the scheme's typed values, not the digits of its status line") {
    torch::manual_seed(8);
    auto model = test::make_model("branchnorm", test::small_config(Arch::LM, 0, 2),
                                  {{"T", ParamValue::of_int(7)}});
    double alpha = -1;
    for (const SchemeValue& v : model->scheme().values())
      if (v.name == "alpha_t") alpha = v.value;
    REQUIRE(alpha == doctest::Approx(1.0 / 7));
    REQUIRE(model->scheme().status().find("alpha_t=0.1429") !=
            std::string::npos);  // what was parsed before
    const fs::path dir = fresh_dir("typed");
    AnalysisSection a;
    a.probes = {"scheme_state"};
    a.formats = {"jsonl"};
    analysis::ProbeSession probes(
        a, 10, *model, {torch::Tensor(), torch::tensor({{2, 5, 6, 7}}, torch::kLong), 0}, dir, 0);
    bool found = false;
    for (const json& r : jsonl(dir / "analysis.jsonl"))
      if (r["metric"] == "scheme_state" && r["sublayer"] == "alpha_t") {
        CHECK(r["update"] == 0);
        CHECK(r["value"].get<double>() == alpha);  // bitwise: JSON keeps every digit
        found = true;
      }
    CHECK(found);
  }

}  // TEST_SUITE

TEST_SUITE("training") {
  TEST_CASE(
      "the trainer publishes every run event to each registered observer, and knows no probe") {
    const fs::path dir = fresh_dir("events");
    EventLog first, second;
    TrainControl control;
    control.observers = {&first, &second};
    std::ostringstream sink;
    // run_training registers nothing itself: [analysis] asks for every probe, yet none records.
    const TrainOutcome o = run_training(tiny_run(dir, "[analysis]\nprobes = [\"all\"]"),
                                        test::builtin_registry(), sink, control);
    REQUIRE(o.status == "completed");
    CHECK(!fs::exists(dir / "run" / "analysis.csv"));
    CHECK(first.events == second.events);
    CHECK(first.probe_rows == 3);
    std::vector<std::string> expected = {"model_ready", "run_start 0"};
    for (int u = 1; u <= 7; ++u) {
      for (const char* e : {"before_forward", "after_backward"})
        expected.push_back(fmt::format("{} {}", e, u));
      expected.push_back(fmt::format("before_step {} norm", u));
      expected.push_back(fmt::format("after_step {}", u));
      if (u % 2 == 0 || u == 7)
        for (const char* tag : {"train/loss", "train/nll", "train/gnorm", "train/lr"})
          expected.push_back(fmt::format("{} {}", tag, u));
      if (u % 4 == 0 || u == 7) expected.push_back(fmt::format("valid/nll {}", u));
    }
    // The synthetic task's test set, decoded at the end.
    for (const std::string& e : first.events)
      if (e.rfind("test/", 0) == 0) expected.push_back(e);
    expected.push_back("run_end completed 7");
    CHECK(first.events == expected);

    // The command layer's train() adds the probes as one more observer.
    const fs::path with = fresh_dir("events_probes");
    EventLog third;
    control.observers = {&third};
    REQUIRE(train(tiny_run(with, "[analysis]\nprobes = [\"all\"]"), test::builtin_registry(), sink,
                  control)
                .status == "completed");
    CHECK(fs::exists(with / "run" / "analysis.csv"));
    CHECK(third.events == first.events);
  }

  TEST_CASE(
      "trainer sources include no analysis header; commands.h is not in the public include tree") {
    const fs::path root = NORMLAB_TEST_SOURCE_DIR;
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(root / "core" / "src" / "train")) {
      std::ifstream f(e.path());
      std::stringstream text;
      text << f.rdbuf();
      CAPTURE(e.path().string());
      CHECK(text.str().find("normlab/analysis/") == std::string::npos);
      ++files;
    }
    CHECK(files >= 10);
    CHECK(!fs::exists(root / "core" / "include" / "normlab" / "commands.h"));
    CHECK(fs::exists(root / "core" / "src" / "commands" / "commands.h"));
  }

}  // TEST_SUITE

}  // namespace normlab_test_probes
