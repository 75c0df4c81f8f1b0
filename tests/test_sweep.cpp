// Sweeps: expansion (products, zips, exclusions, ids, errors) and the driver end to end through the
// CLI (--jobs 2, SIGKILL of a worker and of the driver then resume, divergence as a result).
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "normlab/manifest/experiment.h"
#include "normlab/sweep/sweep.h"
#include "test_support.h"
#include "train/spike_score.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_sweep {

using namespace normlab;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("normlab_sweep_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A tiny copy-task base manifest; `sweep` is appended.
std::string tiny_base(const fs::path& out_dir, int64_t max_updates = 30) {
  return fmt::format(R"([model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 2
dec_layers = 2
dropout = 0.0

[scheme]
name = "post-ln"

[data]
task = "copy"
synthetic_vocab = 12
synthetic_min_len = 3
synthetic_max_len = 6
synthetic_train = 1000
synthetic_valid = 20

[optim]
lr = 2e-3
warmup_updates = 5
max_tokens = 128
max_updates = {1}

[eval]
interval = 0
bleu = false

[run]
out_dir = "{0}"
log_interval = 1
checkpoint_interval = 10
threads = 1
)",
                     out_dir.string(), max_updates);
}

fs::path write(const fs::path& dir, const std::string& text) {
  const fs::path p = dir / "m.toml";
  std::ofstream(p) << text;
  return p;
}

SweepPlan plan_of(const fs::path& manifest, const std::vector<std::string>& sets = {}) {
  return plan_sweep(manifest.string(), sets, &test::builtin_registry());
}

std::vector<std::string> ids_of(const SweepPlan& p) {
  std::vector<std::string> ids;
  for (const auto& r : p.runs) ids.push_back(r.id);
  return ids;
}

std::string error_of(const fs::path& manifest, const std::vector<std::string>& sets = {}) {
  try {
    plan_of(manifest, sets);
  } catch (const ManifestError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int run_cli(const std::vector<std::string>& args, const fs::path& out) {
  return test::wait_normlab(test::start_normlab(args, out));
}

std::vector<int64_t> train_updates(const fs::path& run_dir) {
  std::vector<int64_t> u;
  std::ifstream f(run_dir / "train.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j["kind"] == "train") u.push_back(j["update"].get<int64_t>());
  }
  return u;
}

json status_of(const fs::path& run_dir) {
  std::ifstream f(run_dir / "status.json");
  return json::parse(f, nullptr, false);
}

using test::wait_until;

// OLMo 2's spike score computed directly (docs/analysis.md#loss-spikes): each finite value with at
// least `min_previous` finite values before it is scored against the last `window` of them, two
// passes over the window; a spike when |x − mean| ≥ sigmas · std (population) and x ≠ mean.
std::vector<size_t> spikes_by_hand(const std::vector<double>& v, size_t window, double sigmas,
                                   size_t min_previous, int64_t* scored) {
  std::vector<size_t> finite, out;
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isfinite(v[i])) finite.push_back(i);
  *scored = 0;
  for (size_t k = min_previous; k < finite.size(); ++k) {
    const size_t n = std::min(k, window);
    if (n == 0) continue;
    double mean = 0, var = 0;
    for (size_t j = k - n; j < k; ++j) mean += v[finite[j]];
    mean /= double(n);
    for (size_t j = k - n; j < k; ++j) var += (v[finite[j]] - mean) * (v[finite[j]] - mean);
    const double d = std::abs(v[finite[k]] - mean);
    ++*scored;
    if (d > 0 && d >= sigmas * std::sqrt(var / double(n))) out.push_back(finite[k]);
  }
  return out;
}

}  // namespace

TEST_SUITE("sweep") {
  TEST_CASE(
      "expansion: a product in axis order; scheme tables with labels; ids from the values that "
      "vary") {
    const fs::path d = fresh_dir("product");
    const fs::path m = write(d, tiny_base(d / "sw") + R"(
[sweep]
name = "lr-study"
[[sweep.axis]]
key = "scheme"
values = [{name = "post-ln"}, {name = "branchnorm", schedule = "exp", label = "branchnorm-exp"},
          {name = "branchnorm", schedule = "sigmoid", T = 50}]
[[sweep.axis]]
key = "optim.lr"
values = [1e-3, 5e-4]
[[sweep.axis]]
key = "run.seed"
values = [7]
)");
    const SweepPlan p = plan_of(m);
    CHECK(p.name == "lr-study");
    CHECK(p.dir == (d / "sw").string());
    CHECK(ids_of(p) == std::vector<std::string>{
                           "post-ln_lr=0.001", "post-ln_lr=0.0005", "branchnorm-exp_lr=0.001",
                           "branchnorm-exp_lr=0.0005", "branchnorm-50-sigmoid_lr=0.001",
                           "branchnorm-50-sigmoid_lr=0.0005"});
    const SweepRun& r = p.runs[2];
    CHECK(r.index == 2);
    CHECK(r.dir == "branchnorm-exp_lr=0.001");
    CHECK(r.overrides ==
          std::vector<std::string>{"scheme={name = \"branchnorm\", schedule = \"exp\"}",
                                   "optim.lr=0.001", "run.seed=7"});
    CHECK(r.values == std::map<std::string, std::string>{{"optim.lr", "0.001"},
                                                         {"run.seed", "7"},
                                                         {"scheme", "branchnorm-exp"},
                                                         {"scheme.name", "branchnorm"},
                                                         {"scheme.schedule", "exp"}});
    CHECK(p.runs[4].overrides[0] ==
          "scheme={T = 50, name = \"branchnorm\", schedule = \"sigmoid\"}");
    CHECK(p.max_updates == std::vector<int64_t>(6, 30));
    // The run's manifest: the scheme table replaced [scheme], the rest from the base, its own dir.
    const ExperimentSpec spec = load_sweep_run(p, r, {}, &test::builtin_registry());
    CHECK(spec.scheme.name == "branchnorm");
    CHECK(spec.scheme.params.at("schedule").s == "exp");
    CHECK(spec.optim.lr == 0.001);
    CHECK(spec.run.seed == 7);
    CHECK(spec.model.d_model == 16);
    CHECK(spec.run.out_dir == (d / "sw" / "branchnorm-exp_lr=0.001").string());
    // Stable: the same manifest expands to the same runs.
    const SweepPlan again = plan_of(m);
    CHECK(ids_of(again) == ids_of(p));
    CHECK(again.runs[5].overrides == p.runs[5].overrides);
    // sweep.json lists the runs with typed values.
    const json j = json::parse(sweep_json_text(p, "now"));
    CHECK(j["name"] == "lr-study");
    CHECK(j["runs"].size() == 6);
    CHECK(j["runs"][2]["id"] == "branchnorm-exp_lr=0.001");
    CHECK(j["runs"][2]["values"]["optim.lr"] == 0.001);
    CHECK(j["runs"][2]["values"]["run.seed"] == 7);
    CHECK(j["runs"][2]["values"]["scheme"] == "branchnorm-exp");
  }

  TEST_CASE("expansion: zipped axes, ids, exclusions (quoted and dotted keys, lists of values)") {
    const fs::path d = fresh_dir("zip");
    const std::string sweep = R"(
[sweep]
[[sweep.axis]]
key = "scheme.name"
values = ["post-ln", "deepnorm", "pre-ln"]
[[sweep.axis]]
zip = ["model.enc_layers", "model.dec_layers"]
values = [[2, 2], [4, 2], [6, 2]]
[[sweep.exclude]]
"scheme.name" = "post-ln"
"model.enc_layers" = [4, 6]
[[sweep.exclude]]
scheme.name = "pre-ln"
model.enc_layers = 2
)";
    const SweepPlan p = plan_of(write(d, tiny_base(d / "sw") + sweep));
    CHECK(ids_of(p) == std::vector<std::string>{"post-ln_enc_layers=2", "deepnorm_enc_layers=2",
                                                "deepnorm_enc_layers=4", "deepnorm_enc_layers=6",
                                                "pre-ln_enc_layers=4", "pre-ln_enc_layers=6"});
    CHECK(p.runs[2].overrides == std::vector<std::string>{"scheme.name=\"deepnorm\"",
                                                          "model.enc_layers=4",
                                                          "model.dec_layers=2"});
    CHECK(p.runs[5].index == 5);

    // A zip axis with an id: the prefix glued to the varying values; a seed axis with id "seed".
    const std::string sweep2 = R"(
[sweep]
[[sweep.axis]]
zip = ["model.enc_layers", "model.dec_layers"]
id = "L"
values = [[2, 2], [3, 1]]
[[sweep.axis]]
key = "run.seed"
id = "seed"
values = [1, 2]
)";
    const SweepPlan p2 = plan_of(write(d, tiny_base(d / "sw2") + sweep2));
    CHECK(ids_of(p2) ==
          std::vector<std::string>{"L2-2_seed1", "L2-2_seed2", "L3-1_seed1", "L3-1_seed2"});

    // A table of [model] keys as the values of one axis, with labels.
    const std::string sweep3 = R"(
[sweep]
[[sweep.axis]]
key = "model"
values = [{d_model = 16, heads = 2, label = "small"}, {d_model = 32, heads = 4}]
)";
    const SweepPlan p3 = plan_of(write(d, tiny_base(d / "sw3") + sweep3));
    CHECK(ids_of(p3) == std::vector<std::string>{"small", "d_model=32_heads=4"});
    CHECK(p3.runs[1].overrides == std::vector<std::string>{"model.d_model=32", "model.heads=4"});

    // A recipe per scheme (issue 45): [optim] tables zipped with scheme tables; the scheme names
    // the run, the recipe rides along as overrides.
    const std::string sweep4 = R"(
[sweep]
[[sweep.axis]]
zip = ["scheme", "optim"]
values = [[{name = "pre-ln"}, {weight_decay = 0.1, warmup_updates = 30}],
          [{name = "deepnorm"}, {weight_decay = 0.0, warmup_updates = 0, beta2 = 0.95}]]
)";
    const SweepPlan p4 = plan_of(write(d, tiny_base(d / "sw4") + sweep4));
    CHECK(ids_of(p4) == std::vector<std::string>{"pre-ln", "deepnorm"});
    CHECK(p4.runs[1].overrides ==
          std::vector<std::string>{"scheme={name = \"deepnorm\"}", "optim.beta2=0.95",
                                   "optim.warmup_updates=0", "optim.weight_decay=0.0"});
  }

  TEST_CASE("bad [sweep] input: one error naming file:line:column, the key and what was expected") {
    const fs::path d = fresh_dir("errors");
    const std::string f = (d / "m.toml").string();
    const std::string base = tiny_base(d / "sw");
    struct Case {
      std::string name, sweep, at, message;
      std::vector<std::string> sets;
    };
    const std::vector<Case> cases = {
        {"key not in the schema", "[[sweep.axis]]\nkey = \"model.depth\"\nvalues = [1, 2]\n",
         "\"model.depth\"",
         "[sweep] axis 1: 'model.depth' is not a manifest key: [model] has no key 'depth' (known: "
         "arch, d_model, ffn_dim"},
        {"unknown section", "[[sweep.axis]]\nkey = \"optimizer.lr\"\nvalues = [1]\n",
         "\"optimizer.lr\"",
         "[sweep] axis 1: 'optimizer.lr' is not a manifest key: unknown section [optimizer] "
         "(known: model, scheme"},
        {"zip of unequal length",
         "[[sweep.axis]]\nzip = [\"model.enc_layers\", \"model.dec_layers\"]\nvalues = [[2, 2], "
         "[4]]\n",
         "[4]",
         "[sweep] axis 1 (model.enc_layers, model.dec_layers): values[1]: expected an array of 2 "
         "values, one per zip key "
         "(model.enc_layers, model.dec_layers), got an array of 1"},
        {"empty axis", "[[sweep.axis]]\nkey = \"optim.lr\"\nvalues = []\n", "[]",
         "[sweep] axis 1 (optim.lr): values: expected a non-empty array, got an array of 0"},
        {"no values", "[[sweep.axis]]\nkey = \"optim.lr\"\n", "[[sweep.axis]]",
         "[sweep] axis 1: values: expected a non-empty array, got none"},
        {"key and zip",
         "[[sweep.axis]]\nkey = \"optim.lr\"\nzip = [\"a.b\", \"c.d\"]\nvalues = [1]\n",
         "[[sweep.axis]]",
         "[sweep] axis 1: expected either key = \"section.key\" or zip = [\"section.key\", ...]"},
        {"unknown axis key", "[[sweep.axis]]\nkeys = \"optim.lr\"\nvalues = [1]\n", "\"optim.lr\"",
         "[sweep] axis 1: unknown key 'keys' (known: key, zip, values, id)"},
        {"no axis", "name = \"x\"\n", "[sweep]",
         "[sweep] axis: expected at least one [[sweep.axis]] table"},
        {"out_dir", "[[sweep.axis]]\nkey = \"run.out_dir\"\nvalues = [\"a\", \"b\"]\n",
         "\"run.out_dir\"", "[sweep] axis 1: run.out_dir cannot vary"},
        {"overlapping axes",
         "[[sweep.axis]]\nkey = \"scheme\"\nvalues = [{name = \"post-ln\"}]\n[[sweep.axis]]\nkey = "
         "\"scheme.name\"\nvalues = [\"x\"]\n",
         "\"scheme.name\"", "[sweep] axis 2: 'scheme.name' overlaps 'scheme' of the axis at"},
        {"scheme value not a table", "[[sweep.axis]]\nkey = \"scheme\"\nvalues = [\"post-ln\"]\n",
         "\"post-ln\"]",
         "[sweep] axis 1 (scheme): values[0]: expected a table of [scheme] keys such as {name = "
         "\"deepnorm\"}, got string \"post-ln\""},
        {"scheme table without name",
         "[[sweep.axis]]\nkey = \"scheme\"\nvalues = [{schedule = \"exp\"}]\n", "{schedule",
         "[sweep] axis 1 (scheme): values[0]: expected a string `name` (the scheme) in each scheme "
         "table, got none"},
        {"bad label",
         "[[sweep.axis]]\nkey = \"scheme\"\nvalues = [{name = \"post-ln\", label = \"a/b\"}]\n",
         "\"a/b\"",
         "label: expected a non-empty string of letters, digits, '.', '_', '-', got string "
         "\"a/b\""},
        {"exclude key not swept",
         "[[sweep.axis]]\nkey = \"optim.lr\"\nvalues = [1e-3, "
         "2e-3]\n[[sweep.exclude]]\n\"optim.warmup_updates\" = 5\n",
         "5\n",
         "[sweep] exclude 1: 'optim.warmup_updates' is not varied by any axis (axis keys: "
         "optim.lr)"},
        {"exclude matching nothing",
         "[[sweep.axis]]\nkey = \"optim.lr\"\nvalues = [1e-3, "
         "2e-3]\n[[sweep.exclude]]\n\"optim.lr\" = 3e-3\n",
         "[[sweep.exclude]]", "[sweep] exclude 1: matches no run of the expansion"},
        {"duplicate ids",
         "[[sweep.axis]]\nkey = \"scheme\"\nvalues = [{name = \"post-ln\", label = \"a\"}, {name = "
         "\"deepnorm\", label = \"a\"}]\n",
         "{name = \"deepnorm\"",
         "[sweep] axis 1 (scheme): values[1]: gives the same id text as values[0] ('a'); give them "
         "distinct labels"},
        {"bad value of a run", "[[sweep.axis]]\nkey = \"model.enc_layers\"\nvalues = [2, 0]\n",
         "0]",
         "[model] enc_layers: expected integer in [1, 100000], got integer 0 (sweep run 1 "
         "'enc_layers=0')"},
        {"unknown scheme of a run",
         "[[sweep.axis]]\nkey = \"scheme\"\nvalues = [{name = \"postln\"}]\n", "{name",
         "[scheme] name: unknown scheme 'postln' (known: admin"},
        {"bad scheme parameter of a run",
         "[[sweep.axis]]\nkey = \"scheme\"\nvalues = [{name = \"branchnorm\", schedule = "
         "\"cosine\"}]\n",
         "{name",
         "[scheme] scheme 'branchnorm' parameter 'schedule': expected one of linear | exp | "
         "sigmoid, got \"cosine\" (sweep run 0 'run')"},
        {"--set against an axis",
         "[[sweep.axis]]\nkey = \"optim.lr\"\nvalues = [1e-3, 2e-3]\n",
         "",
         "--set optim.lr=0.1: optim.lr is varied by [[sweep.axis]] 'optim.lr' in " + f,
         {"optim.lr=0.1"}},
    };
    for (const auto& c : cases) {
      CAPTURE(c.name);
      const std::string text = base + "\n[sweep]\n" + c.sweep;
      const fs::path m = write(d, text);
      const std::string e = error_of(m, c.sets);
      CHECK_MESSAGE(e.find(c.message) != std::string::npos, e);
      if (!c.at.empty()) {
        // The position is in the [sweep] part of the file.
        const auto at = text.find(c.at, base.size());
        const size_t line = size_t(std::count(text.begin(), text.begin() + long(at), '\n')) + 1;
        const size_t col = at - text.rfind('\n', at);
        CHECK_MESSAGE(e.rfind(fmt::format("{}:{}:{}: ", f, line, col), 0) == 0, e);
      }
    }
    // No [sweep] at all, and `normlab train` of a sweep manifest.
    CHECK(error_of(write(d, base))
              .find(f + ": [sweep]: expected a [sweep] table with [[sweep.axis]] tables") == 0);
    const fs::path sweep_manifest =
        write(d, base + "\n[sweep]\n[[sweep.axis]]\nkey = \"optim.lr\"\nvalues = [1e-3]\n");
    try {
      load_manifest(sweep_manifest.string(), {}, &test::builtin_registry());
      FAIL("a [sweep] manifest loaded as a plain one");
    } catch (const ManifestError& e) {
      CHECK(std::string(e.what()).find(
                "[sweep] makes this a sweep manifest: run it with `normlab sweep") !=
            std::string::npos);
    }
  }

  TEST_CASE(
      "quickstart-sweep: 2 schemes x 2 depths with --jobs 2 complete; --status; a re-run does "
      "nothing") {
    const fs::path d = fresh_dir("quickstart");
    const fs::path out = d / "out.txt";
    const std::string manifest = NORMLAB_TEST_SOURCE_DIR "/experiments/quickstart-sweep.toml";
    const std::vector<std::string> sets = {"--set", "run.out_dir=\"" + (d / "sw").string() + "\"",
                                           "--set", "optim.max_updates=20",
                                           "--set", "eval.interval=10",
                                           "--set", "data.synthetic_train=300",
                                           "--set", "data.synthetic_valid=20"};
    auto args = [&](std::vector<std::string> a) {
      a.insert(a.begin(), {"sweep", manifest});
      a.insert(a.end(), sets.begin(), sets.end());
      return a;
    };
    REQUIRE(run_cli(args({"--dry-run"}), out) == 0);
    const std::vector<std::string> ids = {"post-ln_L2-2", "post-ln_L6-6", "deepnorm_L2-2",
                                          "deepnorm_L6-6"};
    for (const auto& id : ids) CHECK(slurp(out).find(id) != std::string::npos);
    CHECK(!fs::exists(d / "sw" / "sweep.json"));  // --dry-run starts nothing

    const auto t0 = std::chrono::steady_clock::now();
    const int code = run_cli(args({"--jobs", "2"}), out);
    MESSAGE("sweep of 4 runs: "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
            << " s");
    INFO(slurp(out));
    REQUIRE(code == 0);
    CHECK(slurp(out).find("[sweep] 4/4 done | 0 running | 0 diverged | 0 failed") !=
          std::string::npos);
    const json sj = json::parse(slurp(d / "sw" / "sweep.json"));
    REQUIRE(sj["runs"].size() == 4);
    for (size_t i = 0; i < 4; ++i) {
      CAPTURE(i);
      CHECK(sj["runs"][i]["id"] == ids[i]);
      const fs::path run = d / "sw" / ids[i];
      CHECK(status_of(run)["status"] == "completed");
      CHECK(status_of(run)["updates"] == 20);
      CHECK(fs::exists(run / "manifest.resolved.toml"));
      CHECK(fs::exists(run / "worker.log"));
      CHECK(train_updates(run) ==
            std::vector<int64_t>{20});  // quickstart logs every 25 updates: once at the end
    }
    CHECK(slurp(d / "sw" / "post-ln_L6-6" / "manifest.resolved.toml").find("enc_layers = 6") !=
          std::string::npos);
    CHECK(slurp(d / "sw" / "deepnorm_L2-2" / "manifest.resolved.toml").find("deepnorm") !=
          std::string::npos);
    // Threads per worker: the manifest's run.threads (1), whatever --jobs is.
    const json env = json::parse(slurp(d / "sw" / "deepnorm_L2-2" / "env.json"));
    CHECK(env["threads"] == 1);
    CHECK(env["threads_set_by"] == "manifest");

    const fs::path status_out = d / "status.txt";
    REQUIRE(run_cli(args({"--status"}), status_out) == 0);
    const std::string table = slurp(status_out);
    INFO(table);
    for (const auto& id : ids) CHECK(table.find(id) != std::string::npos);
    CHECK(
        table.find("4 completed | 0 diverged | 0 running | 0 interrupted | 0 failed | 0 pending") !=
        std::string::npos);

    // Again: everything is finished, nothing is trained or written again.
    const auto log_before = slurp(d / "sw" / ids[0] / "train.jsonl");
    const fs::path again = d / "again.txt";
    REQUIRE(run_cli(args({"--jobs", "2"}), again) == 0);
    CHECK(slurp(again).find("4 finished before") != std::string::npos);
    CHECK(slurp(again).find("0 to run") != std::string::npos);
    CHECK(slurp(d / "sw" / ids[0] / "train.jsonl") == log_before);
  }

  TEST_CASE(
      "SIGKILL of a worker and of the driver, then re-runs: every run completes, no update lost or "
      "duplicated") {
    const fs::path d = fresh_dir("kill");
    const int64_t max_updates = 400;
    const fs::path m = write(d, tiny_base(d / "sw", max_updates) + R"(
[sweep]
[[sweep.axis]]
key = "scheme.name"
values = ["post-ln", "deepnorm"]
)");
    const fs::path a = d / "sw" / "post-ln", b = d / "sw" / "deepnorm";
    const fs::path out = d / "out.txt";
    const pid_t driver = test::start_normlab({"sweep", m.string(), "--jobs", "2"}, out);
    auto updates_past = [&](const fs::path& run, size_t n) {
      return [=] { return train_updates(run).size() >= n; };
    };
    // Between two checkpoints (every 10 updates), so the kill loses logged updates.
    REQUIRE(wait_until([&] {
      const size_t n = train_updates(a).size();
      return n >= 25 && n % 10 >= 3 && n % 10 <= 7;
    }));
    // A worker dies without saving: its run fails, the other goes on.
    const int worker = std::stoi(slurp(a / "run.lock"));
    REQUIRE(worker > 0);
    ::kill(worker, SIGKILL);
    REQUIRE(
        wait_until([&] { return status_of(a).is_object() && status_of(a)["status"] == "failed"; }));
    CHECK(status_of(a)["note"].get<std::string>().find("worker killed by signal 9") == 0);
    // Then the driver dies outright: its workers stop with a checkpoint (SIGTERM from the kernel).
    const size_t b_now = train_updates(b).size();
    REQUIRE(wait_until(updates_past(b, b_now + 10)));
    ::kill(driver, SIGKILL);
    test::wait_normlab(driver);
    REQUIRE(wait_until([&] { return !read_run_state(b.string()).locked; }));
    INFO(slurp(out));
    CHECK(status_of(b)["status"] == "interrupted");
    CHECK(train_updates(b).size() < size_t(max_updates));

    // Re-run: the interrupted run resumes; the failed one waits for --retry-failed.
    const fs::path out2 = d / "out2.txt";
    CHECK(run_cli({"sweep", m.string(), "--jobs", "2"}, out2) == 1);
    INFO(slurp(out2));
    CHECK(slurp(out2).find("1 failed before (--retry-failed retries them)") != std::string::npos);
    CHECK(status_of(b)["status"] == "completed");
    CHECK(status_of(a)["status"] == "failed");
    const fs::path out3 = d / "out3.txt";
    CHECK(run_cli({"sweep", m.string(), "--jobs", "2", "--retry-failed"}, out3) == 0);
    INFO(slurp(out3));
    for (const fs::path& run : {a, b}) {
      CAPTURE(run);
      CHECK(status_of(run)["status"] == "completed");
      CHECK(status_of(run)["updates"] == max_updates);
      std::vector<int64_t> expected(static_cast<size_t>(max_updates));
      std::iota(expected.begin(), expected.end(), 1);
      CHECK(train_updates(run) == expected);  // each update once, none missing
      const std::string log = slurp(run / "worker.log");
      size_t starts = 0;
      for (size_t at = log.find("==== "); at != std::string::npos; at = log.find("==== ", at + 1))
        ++starts;
      CHECK(starts == 2);  // appended, never truncated
      CHECK(log.find("resuming") != std::string::npos);
    }
    // The killed worker logged past its checkpoint; those records were recomputed and kept aside.
    CHECK(fs::exists(a / "train.discarded.jsonl"));
  }

  TEST_CASE(
      "a diverging run is a result: the others complete, the sweep succeeds, --status shows the "
      "update") {
    const fs::path d = fresh_dir("diverge");
    const fs::path m = write(d, tiny_base(d / "sw", 20) + R"(
[sweep]
[[sweep.axis]]
key = "run.divergence_loss"
id = "div"
values = [0.0, 0.01, 0.0]
[[sweep.axis]]
key = "run.seed"
id = "seed"
values = [1]
)");
    // Two runs with the same value would get one id: a third value equal to the first is refused.
    CHECK(error_of(m).find("values[2]: gives the same id text as values[0] ('0.0')") !=
          std::string::npos);
    std::string text = slurp(m);
    text.replace(text.find("0.01, 0.0]"), 10, "0.01]");
    std::ofstream(m) << text;
    const fs::path out = d / "out.txt";
    const int code = run_cli({"sweep", m.string(), "--jobs", "2"}, out);
    INFO(slurp(out));
    CHECK(code == 0);
    CHECK(slurp(out).find("2/2 done | 0 running | 1 diverged | 0 failed") != std::string::npos);
    CHECK(status_of(d / "sw" / "div0.0")["status"] == "completed");
    const json st = status_of(d / "sw" / "div0.01");
    CHECK(st["status"] == "diverged");
    CHECK(st["updates"] == 1);
    const fs::path status_out = d / "status.txt";
    REQUIRE(run_cli({"sweep", m.string(), "--status"}, status_out) == 0);
    const std::string table = slurp(status_out);
    INFO(table);
    CHECK(table.find("div0.01") != std::string::npos);
    CHECK(table.find("diverged at update 1") != std::string::npos);
    CHECK(table.find("1 completed | 1 diverged") != std::string::npos);
    // A run without BLEU (eval.bleu = false, or a language model) shows its validation
    // perplexity in that column (issue 46.9).
    CHECK(table.find("BLEU|ppl") != std::string::npos);
    CHECK(table.find(" ppl ") != std::string::npos);

    // The base manifest changed under the sweep's folder (hostile review, session 18: "all runs
    // finished", exit 0, two experiments in one report): refused before any worker, naming the
    // run's folder and the key. A longer optim.max_updates extends the same experiment.
    std::string changed = slurp(m);
    changed.replace(changed.find("warmup_updates = 5"), 18, "warmup_updates = 7");
    std::ofstream(m) << changed;
    const fs::path out2 = d / "out2.txt";
    CHECK(run_cli({"sweep", m.string(), "--jobs", "2"}, out2) == 2);
    const std::string refused = slurp(out2);
    INFO(refused);
    CHECK(refused.find((d / "sw" / "div0.0").string() +
                       " holds this run trained under another "
                       "manifest ([optim] 'warmup_updates = 5' became 'warmup_updates = 7')") !=
          std::string::npos);
    CHECK(run_cli({"sweep", m.string(), "--dry-run"}, out2) == 2);
    changed.replace(changed.find("warmup_updates = 7"), 18, "warmup_updates = 5");
    std::ofstream(m) << changed;
    const fs::path out3 = d / "out3.txt";
    CHECK(run_cli({"sweep", m.string(), "--jobs", "2", "--set", "optim.max_updates=22"}, out3) ==
          0);
    INFO(slurp(out3));
    CHECK(status_of(d / "sw" / "div0.0")["updates"] == 22);
  }

  // Issue 19.5: a run that eval.patience stopped is finished for the driver (no worker again),
  // --status (its own count) and the exit code.
  TEST_CASE(
      "a run stopped early (eval.patience) is finished: the sweep succeeds, a re-run starts "
      "nothing") {
    const fs::path d = fresh_dir("patience");
    const fs::path m = write(d, tiny_base(d / "sw", 20) + R"(
[sweep]
[[sweep.axis]]
key = "eval.patience"
id = "patience"
values = [0, 2]
)");
    // Steps far below float resolution: the validation loss never improves after the first one.
    const std::vector<std::string> frozen = {
        "--set", "eval.interval=2", "--set", "optim.lr=1e-9",
        "--set", "optim.eps=1",     "--set", "optim.clip_norm=1e-12"};
    auto args = [&](std::vector<std::string> a) {
      a.insert(a.end(), frozen.begin(), frozen.end());
      return a;
    };
    const fs::path out = d / "out.txt";
    const int code = run_cli(args({"sweep", m.string(), "--jobs", "2"}), out);
    INFO(slurp(out));
    CHECK(code == 0);
    CHECK(slurp(out).find("2/2 done | 0 running | 0 diverged | 0 failed") != std::string::npos);
    CHECK(status_of(d / "sw" / "patience0")["status"] == "completed");
    const json st = status_of(d / "sw" / "patience2");
    CHECK(st["status"] == "stopped_early");
    CHECK(st["updates"] == 6);
    const fs::path status_out = d / "status.txt";
    REQUIRE(run_cli(args({"sweep", m.string(), "--status"}), status_out) == 0);
    INFO(slurp(status_out));
    CHECK(slurp(status_out).find("1 completed | 1 stopped_early | 0 diverged") !=
          std::string::npos);
    // Each run's disk use (issue 19.4), hard-linked checkpoints counted once.
    const fs::path json_out = d / "status.json";
    REQUIRE(run_cli(args({"sweep", m.string(), "--status", "--json"}), json_out) == 0);
    const json table = json::parse(slurp(json_out));
    for (const auto& r : table["runs"]) {
      uint64_t files = 0;
      for (const auto& e : fs::recursive_directory_iterator(r["dir"].get<std::string>()))
        if (e.is_regular_file()) files += e.file_size();
      CHECK(r["disk_bytes"].get<uint64_t>() > 0);
      CHECK(r["disk_bytes"].get<uint64_t>() < files + 64 * 4096);  // blocks, each link once
    }
    CHECK(table["counts"]["stopped_early"] == 1);
    const fs::path again = d / "again.txt";
    REQUIRE(run_cli(args({"sweep", m.string()}), again) == 0);
    CHECK(slurp(again).find("2 finished before") != std::string::npos);
    CHECK(slurp(again).find("0 to run") != std::string::npos);
  }

  // Issue 12.8: workers used cores / jobs threads, so --jobs changed the numbers of a sweep.
  TEST_CASE("a sweep's results are the same for any --jobs; --threads-per-run is recorded") {
    const fs::path d = fresh_dir("jobs");
    auto sweep_manifest = [&](const std::string& name) {
      fs::create_directories(d / name);
      std::string text = tiny_base(d / name / "sw", 8);
      text.replace(text.find("threads = 1"), 11, "threads = 2");
      return write(d / name, text + R"([sweep]
[[sweep.axis]]
key = "optim.lr"
values = [1e-3, 3e-3]
)");
    };
    auto losses = [](const fs::path& run) {
      std::vector<double> out;
      std::ifstream f(run / "train.jsonl");
      for (std::string line; std::getline(f, line);)
        if (const json j = json::parse(line); j["kind"] == "train")
          out.push_back(j["loss"].get<double>());
      return out;
    };
    const fs::path out = d / "out.txt";
    for (const char* jobs : {"1", "2"}) {
      REQUIRE(
          run_cli({"sweep", sweep_manifest(std::string("jobs") + jobs).string(), "--jobs", jobs},
                  out) == 0);
      // The header names the runs' threads (issue 27.15: it printed the literal "run.threads").
      if (std::string(jobs) == "2")
        CHECK(slurp(out).find("2 job(s) x 2 thread(s) on") != std::string::npos);
      // The last line names the report command for this sweep (issue 46.12).
      std::string text = slurp(out);
      while (!text.empty() && text.back() == '\n') text.pop_back();
      const std::string last = text.substr(text.rfind('\n') + 1);
      CHECK(last.find("normlab report " + (d / (std::string("jobs") + jobs) / "sw").string()) !=
            std::string::npos);
    }
    // `normlab ablate SWEEP --jobs 2` (issue 46.10): every run ablated, the sweep's figure drawn.
    const fs::path sw = d / "jobs2" / "sw";
    REQUIRE(run_cli({"ablate", sw.string(), "--jobs", "2"}, out) == 0);
    {
      const std::string text = slurp(out);
      INFO(text);
      CHECK(text.find("layers numbered from 0") != std::string::npos);
      CHECK(text.find("2 of 2 runs ablated") != std::string::npos);
      for (const char* id : {"lr=0.001", "lr=0.003"}) {
        bool csv = false;
        for (const auto& e : fs::directory_iterator(sw / id / "eval"))
          csv = csv || e.path().filename().string().rfind("ablate.valid.", 0) == 0;
        CHECK(csv);
      }
      CHECK(fs::exists(sw / "ablation" / "layer_ablation.png"));
      // A sweep.json whose run folder lies outside the sweep: refused, nothing written there.
      const fs::path crafted = d / "crafted";
      fs::create_directories(crafted);
      std::ofstream(crafted / "sweep.json")
          << R"({"runs": [{"index": 0, "dir": "../jobs2/sw/lr=0.001"}]})";
      CHECK(run_cli({"ablate", crafted.string()}, out) == 2);
      CHECK(slurp(out).find("is outside the sweep") != std::string::npos);
    }
    REQUIRE(run_cli({"sweep", sweep_manifest("override").string(), "--jobs", "2",
                     "--threads-per-run", "1"},
                    out) == 0);
    for (const char* id : {"lr=0.001", "lr=0.003"}) {
      CAPTURE(id);
      const fs::path one = d / "jobs1" / "sw" / id, two = d / "jobs2" / "sw" / id,
                     over = d / "override" / "sw" / id;
      for (const fs::path& run : {one, two}) {
        const json env = json::parse(slurp(run / "env.json"));
        CHECK(env["threads"] == 2);  // the manifest's, not cores / jobs
        CHECK(env["threads_set_by"] == "manifest");
      }
      const auto a = losses(one), b = losses(two);
      REQUIRE(a.size() == 8);
      CHECK(a == b);  // bitwise
      const json env = json::parse(slurp(over / "env.json"));
      CHECK(env["threads"] == 1);
      CHECK(env["threads_set_by"] == "normlab sweep --threads-per-run 1");
    }
  }

  // Found in CI: runs sharing cores with spinning OpenMP threads trained 7x and decoded 10x slower.
  TEST_CASE("an oversubscribed sweep's workers wait passively, unless OMP_WAIT_POLICY is set") {
    const fs::path d = fresh_dir("wait_policy");
    // The test's own environment (ctest sets PASSIVE) is put back afterwards.
    const char* was = std::getenv("OMP_WAIT_POLICY");
    const std::optional<std::string> saved = was ? std::optional<std::string>(was) : std::nullopt;
    auto sweep = [&](const std::string& name, int cores, const char* policy) {
      policy ? ::setenv("OMP_WAIT_POLICY", policy, 1) : ::unsetenv("OMP_WAIT_POLICY");
      fs::create_directories(d / name);
      const SweepPlan plan = plan_of(write(d / name, tiny_base(d / name / "sw", 3) + R"([sweep]
[[sweep.axis]]
key = "optim.lr"
values = [1e-3, 3e-3]
)"));
      SweepDriverOptions o;
      o.jobs = 2;
      o.cores = cores;
      o.executable = NORMLAB_TEST_CLI;
      o.plugin_paths = {NORMLAB_TEST_PLUGIN_DIR};
      std::ostringstream out;
      const int code = run_sweep(plan, o, out);
      std::vector<std::string> policies;
      for (const char* id : {"lr=0.001", "lr=0.003"})
        policies.push_back(
            json::parse(slurp(d / name / "sw" / id / "env.json"))["omp_wait_policy"]);
      return std::make_tuple(code, out.str(), policies);
    };
    const auto [code1, out1, shared] = sweep("shared", 1, nullptr);  // 2 jobs x 1 thread, 1 core
    CHECK(code1 == 0);
    CHECK(out1.find("oversubscribes the CPU") != std::string::npos);
    CHECK(out1.find("OMP_WAIT_POLICY=PASSIVE") != std::string::npos);
    CHECK(shared == std::vector<std::string>{"PASSIVE", "PASSIVE"});
    const auto [code2, out2, enough] = sweep("enough", 2, nullptr);  // 2 jobs x 1 thread, 2 cores
    CHECK(code2 == 0);
    CHECK(out2.find("oversubscribes") == std::string::npos);
    CHECK(enough == std::vector<std::string>{"", ""});
    const auto [code3, out3, users] = sweep("users", 1, "ACTIVE");  // the user's choice stays
    CHECK(code3 == 0);
    CHECK(out3.find("OMP_WAIT_POLICY=ACTIVE is yours") != std::string::npos);
    CHECK(users == std::vector<std::string>{"ACTIVE", "ACTIVE"});
    saved ? ::setenv("OMP_WAIT_POLICY", saved->c_str(), 1) : ::unsetenv("OMP_WAIT_POLICY");
  }

  TEST_CASE("spike score (OLMo 2): planted spikes found, as computed by hand") {
    // A noisy level around 2 (a fixed pseudo-random sequence), a huge value early (a first
    // gradient norm), spikes planted up and down, a NaN (skipped) and a long series (the window
    // slides past the huge value).
    std::vector<double> v;
    uint32_t lcg = 12345;
    for (int i = 0; i < 3000; ++i) {
      lcg = lcg * 1664525u + 1013904223u;
      v.push_back(2.0 + 0.01 * (double(lcg >> 8) / double(1u << 24) - 0.5));
    }
    v[5] = 1e6;
    v[1500] += 1.0;
    v[2600] -= 1.0;
    v[1700] = std::nan("");
    int64_t scored = 0;
    const std::vector<size_t> want = spikes_by_hand(v, 1000, 7, 20, &scored);
    CHECK(want == std::vector<size_t>{1500, 2600});  // what was planted (index 5: 5 values before)
    CHECK(scored == 3000 - 1 - 20);
    const SpikeScore got = spike_score(v);
    CHECK(got.at == want);
    CHECK(got.scored == scored);
    CHECK(got.spikes == 2);
    CHECK(got.percent == doctest::Approx(100.0 * 2 / double(scored)));
    // Until index 1005 the huge value is in the window: nothing near 2 is a spike then; a value
    // planted after it left is one.
    v[1003] += 1.0, v[1010] += 1.0;
    CHECK(spike_score(v).at == spikes_by_hand(v, 1000, 7, 20, &scored));
    CHECK(spike_score(v).at == std::vector<size_t>{1010, 1500, 2600});
    // The window's edges by hand: window 5 drops the 10 (σ = 0 then, any other value is a spike);
    // window 6 keeps it (mean 5/3, σ = 3.73: 1 is 0.18σ away). Fewer than min_previous values
    // before: not scored; nothing scored: percent -1.
    const std::vector<double> edge = {10, 0, 0, 0, 0, 0, 1, 1};
    CHECK(spike_score(edge, {5, 7, 3}).at == std::vector<size_t>{6});
    CHECK(spike_score(edge, {6, 7, 3}).at.empty());
    CHECK(spike_score(edge, {5, 7, 3}).scored == 5);
    CHECK(spike_score({1, 1, 1, 1}).percent == -1);
    CHECK(spike_score({}).scored == 0);
  }

  TEST_CASE("run-one trains run I; a bad index is bad input") {
    const fs::path d = fresh_dir("run_one");
    const fs::path m = write(d, tiny_base(d / "sw", 30) + R"(
[sweep]
[[sweep.axis]]
key = "optim.lr"
values = [1e-3, 2e-3]
)");
    const fs::path out = d / "out.txt";
    CHECK(run_cli({"run-one", m.string(), "--index", "2"}, out) == 2);
    CHECK(slurp(out).find("--index 2: expected 0 to 1") != std::string::npos);
    CHECK(run_cli({"run-one", m.string(), "--index", "1", "--set", "run.threads=1"}, out) == 0);
    CHECK(status_of(d / "sw" / "lr=0.002")["status"] == "completed");
    CHECK(!fs::exists(d / "sw" / "lr=0.001"));
    const json sj = json::parse(slurp(d / "sw" / "sweep.json"));  // written for --status
    CHECK(sj["runs"][1]["id"] == "lr=0.002");
    CHECK(sj["sets"].empty());
    // Issue 67.5: the run's summary record and --status carry OLMo 2's spike scores, those of the
    // train records' nll and gnorm (log_interval 1: 30 values, 10 scored).
    std::vector<double> nll, gnorm;
    json summary;
    std::ifstream f(d / "sw" / "lr=0.002" / "train.jsonl");
    for (std::string line; std::getline(f, line);) {
      const json j = json::parse(line);
      if (j["kind"] == "train")
        nll.push_back(j["nll"].get<double>()), gnorm.push_back(j["gnorm"].get<double>());
      if (j["kind"] == "summary") summary = j;
    }
    REQUIRE(nll.size() == 30);
    REQUIRE(summary.is_object());
    CHECK(summary["update"] == 30);
    const SpikeScore loss = spike_score(nll), grad = spike_score(gnorm);
    CHECK(loss.scored == 10);
    CHECK(summary["loss_spike_scored"] == 10);
    CHECK(summary["loss_spikes"] == loss.spikes);
    CHECK(summary["loss_spike_score"].get<double>() == loss.percent);
    CHECK(summary["gnorm_spikes"] == grad.spikes);
    CHECK(summary["gnorm_spike_score"].get<double>() == grad.percent);
    const fs::path status_out = d / "status.json";
    REQUIRE(run_cli({"sweep", m.string(), "--status", "--json"}, status_out) == 0);
    const json st = json::parse(slurp(status_out));
    CHECK(st["runs"][1]["loss_spike_score"].get<double>() == loss.percent);
    CHECK(st["runs"][1]["gnorm_spike_score"].get<double>() == grad.percent);
    CHECK(st["runs"][0]["loss_spike_score"].is_null());  // not run
    const fs::path table_out = d / "status.txt";
    REQUIRE(run_cli({"sweep", m.string(), "--status"}, table_out) == 0);
    const std::string table = slurp(table_out);
    INFO(table);
    CHECK(table.find("spikes %") != std::string::npos);
    CHECK(table.find(fmt::format("{:.1f}/{:.1f}", loss.percent, grad.percent)) !=
          std::string::npos);
  }

  TEST_CASE(
      "depth_sweep.toml expands (dry run): six schemes, BranchNorm's three schedules, depths and "
      "seeds" *
      doctest::test_suite("shared_data")) {
    if (!fs::exists(fs::path(NORMLAB_TEST_SHARED_DATA) / "multi30k" / "train.en")) {
      MESSAGE("SKIP: " NORMLAB_TEST_SHARED_DATA " is absent");
      return;
    }
    const fs::path d = fresh_dir("depth");
    const fs::path out = d / "out.txt";
    // The manifest reads data/multi30k/ of the checkout; the test points it at the shared corpus.
    std::vector<std::string> args = {
        "sweep", NORMLAB_TEST_SOURCE_DIR "/experiments/depth_sweep.toml", "--dry-run", "--set",
        "run.out_dir=\"" + (d / "sw").string() + "\""};
    for (const std::string& set : test::shared_multi30k_overrides())
      args.insert(args.end(), {"--set", set});
    CHECK(run_cli(args, out) == 0);
    const std::string text = slurp(out);
    INFO(text);
    CHECK(text.find("sweep depth-sweep: 72 runs") != std::string::npos);
    for (const char* id :
         {"post-ln_L6-6_seed1", "branchnorm-exp_L18-18_seed2", "branchnorm-sigmoid_L50-50_seed3",
          "admin_L50-50_seed1", "b2t_L6-6_seed3", "pre-ln_L18-18_seed1", "deepnorm_L50-50_seed2",
          "branchnorm-linear_L6-6_seed1"})
      CHECK(text.find(id) != std::string::npos);
    CHECK(!fs::exists(d / "sw"));
  }

}  // TEST_SUITE

}  // namespace normlab_test_sweep
