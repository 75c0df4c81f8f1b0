// Training end to end: exact resume, SIGTERM, divergence as a result, learning on Multi30k; what a
// resume may change of the lr schedule (issue 66.2).
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "commands/commands.h"
#include "normlab/data/dataset.h"
#include "normlab/eval/bleu.h"
#include "normlab/manifest/experiment.h"
#include "normlab/sweep/sweep.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "run/checkpoint.h"
#include "test_support.h"
#include "train/lr_schedule_change.h"
#include "util/atomic_file.h"
#include "util/safetensors.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_training {

using namespace normlab;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("normlab_train_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A tiny copy-task experiment with dropout (so resuming must restore the RNG).
std::string tiny_manifest(const fs::path& out_dir, const std::string& scheme_lines, int layers = 2,
                          int64_t max_updates = 40) {
  return fmt::format(R"([model]
d_model = 32
ffn_dim = 64
heads = 2
enc_layers = {0}
dec_layers = {0}
dropout = 0.1

[scheme]
{1}

[data]
task = "copy"
synthetic_vocab = 12
synthetic_min_len = 3
synthetic_max_len = 8
synthetic_train = 2000
synthetic_valid = 50
synthetic_noise = 0.1
cache_dir = "{2}/cache"

[optim]
lr = 2e-3
warmup_updates = 10
max_tokens = 256
max_updates = {3}

[eval]
interval = 0
bleu = false

[run]
out_dir = "{2}/run"
log_interval = 1
checkpoint_interval = 1000
threads = 1
)",
                     layers, scheme_lines, out_dir.string(), max_updates);
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
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);  // a line being written
    if (j.is_object() && j["kind"] == kind) out.push_back(j);
  }
  return out;
}

json status_of(const fs::path& run_dir) {
  std::ifstream f(run_dir / "status.json");
  return json::parse(f);
}

// Fails the run in the update after `after`, before that update's checkpoint (as a kill would):
// the run's last checkpoint is of update `after`.
struct StopAfter : RunObserver {
  int64_t after;
  explicit StopAfter(int64_t n) : after(n) {}
  void after_step(int64_t u) override {
    if (u == after + 1) throw std::runtime_error("stopped by the test");
  }
};

// A warm-up then wsd schedule's lr of update u, by hand: lr·u/warmup, lr until the last `decay` of
// `max` updates, then down to floor_ratio·lr along 1 − √p (or 1 − p) of the decay's share p.
double wsd_lr(double lr, int64_t warmup, int64_t max, int64_t decay, double floor_ratio,
              bool linear, int64_t u) {
  if (u <= warmup) return lr * double(u) / double(warmup);
  if (u <= max - decay) return lr;
  const double p = double(u - (max - decay)) / double(decay);
  return floor_ratio * lr + (1 - floor_ratio) * lr * (1 - (linear ? p : std::sqrt(p)));
}

// The lr that train.jsonl logged for update u (NaN when none; run.log_interval = 1).
double logged_lr(const fs::path& run, int64_t u) {
  std::ifstream f(run / "train.jsonl");
  double lr = std::nan("");
  for (std::string line; std::getline(f, line);) {
    const json r = json::parse(line, nullptr, false);
    if (r.is_object() && r.value("kind", "") == "train" && r.value("update", int64_t(0)) == u)
      lr = r.value("lr", lr);
  }
  return lr;
}

}  // namespace

TEST_SUITE("training") {
  TEST_CASE("exact resume: 2k updates straight equal k + resume + k, bitwise on CPU") {
    for (const std::string scheme : {"name = \"branchnorm\"\nT = 30", "name = \"admin\""}) {
      CAPTURE(scheme);
      fs::path a = fresh_dir("straight"), b = fresh_dir("resumed");
      std::ostringstream sink;
      TrainOutcome straight =
          train(spec_of(a, tiny_manifest(a, scheme)), test::builtin_registry(), sink);
      REQUIRE(straight.status == "completed");
      TrainOutcome first = train(spec_of(b, tiny_manifest(b, scheme), {"optim.max_updates=20"}),
                                 test::builtin_registry(), sink);
      REQUIRE(first.updates == 20);
      TrainOutcome second =
          train(spec_of(b, tiny_manifest(b, scheme)), test::builtin_registry(), sink);
      CHECK(second.updates == 40);
      CHECK(sink.str().find("resuming") != std::string::npos);
      auto ra = records(a / "run", "train"), rb = records(b / "run", "train");
      REQUIRE(ra.size() == 40);
      REQUIRE(rb.size() == 40);
      for (size_t i = 0; i < 40; ++i) {
        CAPTURE(i);
        CHECK(ra[i]["update"] == rb[i]["update"]);
        CHECK(ra[i]["loss"].get<double>() == rb[i]["loss"].get<double>());  // bitwise
        CHECK(ra[i]["gnorm"].get<double>() == rb[i]["gnorm"].get<double>());
      }
      CHECK(status_of(b / "run")["status"] == "completed");
      // Running a completed experiment again does nothing.
      TrainOutcome again =
          train(spec_of(b, tiny_manifest(b, scheme)), test::builtin_registry(), sink);
      CHECK(again.updates == 40);
      CHECK(records(b / "run", "train").size() == 40);
    }
  }

  TEST_CASE("SIGTERM mid-run leaves a resumable checkpoint") {
    fs::path d = fresh_dir("sigterm");
    const fs::path manifest = d / "m.toml";
    std::ofstream(manifest) << tiny_manifest(d, "name = \"post-ln\"", 2, 100000);
    const pid_t pid = fork();
    if (pid == 0) {
      ::freopen("/dev/null", "w", stdout);
      execl(NORMLAB_TEST_CLI, NORMLAB_TEST_CLI, "train", manifest.c_str(), "--plugin-path",
            NORMLAB_TEST_PLUGIN_DIR, static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait for some updates, then stop it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline &&
           (!fs::exists(d / "run" / "train.jsonl") || records(d / "run", "train").size() < 15))
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kill(pid, SIGTERM);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    REQUIRE(WIFEXITED(wstatus));
    CHECK(WEXITSTATUS(wstatus) == kExitInterrupted);
    json st = status_of(d / "run");
    CHECK(st["status"] == "interrupted");
    const int64_t stopped_at = st["updates"].get<int64_t>();
    CHECK(stopped_at >= 15);
    CHECK(fs::exists(d / "run" / "checkpoints" / "last.safetensors"));
    // The same experiment resumes from there (with a reachable end).
    std::ostringstream sink;
    TrainOutcome o = train(spec_of(d, tiny_manifest(d, "name = \"post-ln\""),
                                   {"optim.max_updates=" + std::to_string(stopped_at + 5)}),
                           test::builtin_registry(), sink);
    CHECK(o.status == "completed");
    CHECK(o.updates == stopped_at + 5);
    CHECK(sink.str().find("resuming") != std::string::npos);
  }

  TEST_CASE("forced divergence is recorded as a result, with the update and the module") {
    fs::path d = fresh_dir("diverge");
    std::ostringstream sink;
    // Post-LN 18L-18L without warm-up. At lr 0.1 (inverse-sqrt decay) it only stalls near the
    // unigram loss; at a constant lr 1.0 the loss blows up within two updates.
    ExperimentSpec spec =
        spec_of(d, tiny_manifest(d, "name = \"post-ln\"", 18),
                {"optim.lr=1.0", "optim.warmup_updates=0", "optim.lr_schedule=\"constant\""});
    TrainOutcome o = train(spec, test::builtin_registry(), sink);
    INFO(sink.str());
    CHECK(o.status == "diverged");
    CHECK(o.exit_code == kExitDiverged);
    CHECK(o.note.find("diverged at update ") == 0);
    json st = status_of(d / "run");
    CHECK(st["status"] == "diverged");
    CHECK(st["note"].get<std::string>().find("loss blow-up") != std::string::npos);
    auto div = records(d / "run", "diverged");
    REQUIRE(div.size() == 1);
    CHECK(div[0]["update"].get<int64_t>() == st["updates"].get<int64_t>());
  }

  TEST_CASE("non-finite values are traced to the first module that produced them") {
    fs::path d = fresh_dir("nan");
    std::ostringstream sink;
    ExperimentSpec spec = spec_of(d, tiny_manifest(d, "name = \"post-ln\"", 2));
    spec.optim.lr = 1e30;  // the first update makes weights infinite → the next loss is not finite
    spec.optim.warmup_updates = 0;
    spec.run.divergence_loss = 1e30;
    TrainOutcome o = train(spec, test::builtin_registry(), sink);
    INFO(sink.str());
    CHECK(o.status == "diverged");
    CHECK(o.note.find("non-finite") != std::string::npos);
    CHECK(o.note.find("first non-finite: output of encoder.layers.0.") != std::string::npos);
  }

  // Issue 19.5: the loss is validated every time, BLEU (greedy decoding) only from
  // eval.bleu_after_updates on and at every eval.bleu_every-th validation (and the final one).
  TEST_CASE(
      "validation schedule: BLEU after bleu_after_updates on every k-th validation, loss on all") {
    fs::path d = fresh_dir("bleu_schedule");
    std::ostringstream sink;
    const std::vector<std::string> schedule = {"eval.bleu=true", "eval.interval=4",
                                               "eval.bleu_after_updates=8", "eval.bleu_every=2",
                                               "optim.max_updates=20"};
    TrainOutcome o = train(spec_of(d, tiny_manifest(d, "name = \"pre-ln\"", 1), schedule),
                           test::builtin_registry(), sink);
    INFO(sink.str());
    REQUIRE(o.status == "completed");
    std::vector<int64_t> validated, with_bleu;
    for (const auto& v : records(d / "run", "valid")) {
      validated.push_back(v["update"].get<int64_t>());
      if (v.contains("bleu")) with_bleu.push_back(v["update"].get<int64_t>());
    }
    CHECK(validated == std::vector<int64_t>{4, 8, 12, 16, 20});
    CHECK(with_bleu == std::vector<int64_t>{8, 16, 20});

    // Validation by loss only decodes nothing: no BLEU, no hypotheses written.
    fs::path q = fresh_dir("loss_only");
    std::vector<std::string> loss_only = schedule;
    loss_only.push_back("eval.bleu_after_updates=1000");
    REQUIRE(train(spec_of(q, tiny_manifest(q, "name = \"pre-ln\"", 1), loss_only),
                  test::builtin_registry(), sink)
                .status == "completed");
    CHECK(records(q / "run", "valid").size() == 5);
    for (const auto& v : records(q / "run", "valid")) CHECK(!v.contains("bleu"));
    CHECK(!fs::exists(q / "run" / "valid_hypotheses.txt"));
  }

  // Issue 19.5: eval.bleu_max_sentences is a fixed subset during training and the full set at the
  // end: the final record keeps the subset's BLEU (comparable with the earlier ones, what
  // best.safetensors by BLEU compares) and adds bleu_full over every validation sentence.
  TEST_CASE(
      "validation schedule: BLEU on the bleu_max_sentences subset during training, every sentence "
      "at the end") {
    fs::path d = fresh_dir("bleu_subset");
    std::ostringstream sink;
    ExperimentSpec spec =
        spec_of(d, tiny_manifest(d, "name = \"pre-ln\"", 1),
                {"eval.bleu=true", "eval.interval=10", "eval.bleu_max_sentences=7",
                 "optim.max_updates=20", "run.checkpoint_save_best=\"bleu\""});
    TrainOutcome o = train(spec, test::builtin_registry(), sink);
    INFO(sink.str());
    REQUIRE(o.status == "completed");
    std::vector<json> valid = records(d / "run", "valid");
    REQUIRE(valid.size() == 2);
    CHECK(valid[0]["bleu_sentences"] == 7);
    CHECK(!valid[0].contains("bleu_full"));
    CHECK(valid[1]["bleu_sentences"] == 7);
    REQUIRE(valid[1].contains("bleu_full"));

    // The final hypotheses cover all 50 validation sentences; both scores are recomputed from them.
    std::ostringstream quiet;
    data::Dataset ds = data::load_dataset(spec.data, quiet);
    std::ifstream in(d / "run" / "valid_hypotheses.txt");
    std::vector<std::string> hyps;
    for (std::string line; std::getline(in, line);) hyps.push_back(line);
    REQUIRE(hyps.size() == 50);
    REQUIRE(ds.valid.references.size() == 50);
    CHECK(valid[1]["bleu_full"].get<double>() ==
          doctest::Approx(eval::corpus_bleu(hyps, ds.valid.references).score));
    const std::vector<std::string> first7(hyps.begin(), hyps.begin() + 7),
        refs7(ds.valid.references.begin(), ds.valid.references.begin() + 7);
    CHECK(valid[1]["bleu"].get<double>() ==
          doctest::Approx(eval::corpus_bleu(first7, refs7).score));
    CHECK(o.last_valid_bleu == doctest::Approx(valid[1]["bleu_full"].get<double>()));
    CHECK(sink.str().find("(7 sentences; all 50: ") != std::string::npos);
  }

  // Issue 19.5: eval.patience validations without a lower valid nll end the run as stopped_early,
  // a finished run that is not trained again.
  TEST_CASE(
      "results say what happened: the end phase is shown, one train nll, tokens/s without "
      "validation (issue 27.15)") {
    fs::path d = fresh_dir("phase");
    std::ostringstream sink;
    TrainOutcome o = train(spec_of(d, tiny_manifest(d, "name = \"pre-ln\"", 1),
                                   {"optim.max_updates=4", "eval.test_beam=2"}),
                           test::builtin_registry(), sink);
    INFO(sink.str());
    REQUIRE(o.status == "completed");
    // Each step of the end phase has its line, before its result.
    const std::string text = sink.str();
    const size_t valid = text.find("valid   | final validation: 50 sentences");
    const size_t test_line = text.find("test    | test decode: 50 sentences, beam 2");
    CHECK(valid != std::string::npos);
    CHECK(test_line != std::string::npos);
    CHECK(valid < test_line);
    CHECK(text.find("uniform-prediction loss", valid) < test_line);  // the validation's result
    // The final train figure is one quantity: the last log interval's mean nll, everywhere.
    const json st = status_of(d / "run");
    const auto logged = records(d / "run", "train");
    REQUIRE(!logged.empty());
    CHECK(st["phase"].is_null());
    CHECK(st["train_nll"].get<double>() == logged.back()["nll"].get<double>());
    CHECK(o.last_train_nll == logged.back()["nll"].get<double>());
    CHECK(text.find(fmt::format("train nll {:.4f} (the last log interval's)", o.last_train_nll)) !=
          std::string::npos);
    // Validation after every update on a validation set 60x the batch: its time is not the
    // updates'. Before, each interval's ms/update included it (about 20x an update here).
    fs::path v = fresh_dir("phase_valid");
    train(spec_of(v, tiny_manifest(v, "name = \"pre-ln\"", 1),
                  {"optim.max_updates=6", "data.synthetic_valid=3000"}),
          test::builtin_registry(), sink);
    fs::path w = fresh_dir("phase_valid_each");
    train(spec_of(w, tiny_manifest(w, "name = \"pre-ln\"", 1),
                  {"optim.max_updates=6", "data.synthetic_valid=3000", "eval.interval=1"}),
          test::builtin_registry(), sink);
    auto median_ms = [](const std::vector<json>& r) {
      std::vector<double> ms;
      for (const auto& j : r) ms.push_back(j["ms_per_update"].get<double>());
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    const double plain = median_ms(records(v / "run", "train")),
                 validated = median_ms(records(w / "run", "train"));
    INFO("ms/update without validation " << plain << ", validating after every update "
                                         << validated);
    REQUIRE(records(w / "run", "valid").size() >= 5);
    CHECK(validated < 4 * plain);
  }

  TEST_CASE("early stopping: eval.patience ends the run with status stopped_early") {
    fs::path d = fresh_dir("patience");
    std::ostringstream sink;
    // Steps far below float resolution (tiny clipped gradients, Adam eps 1): the validation loss
    // stays exactly the same after the first validation, so it never improves again.
    const std::vector<std::string> frozen = {
        "eval.interval=2", "eval.patience=2",       "optim.max_updates=40",     "optim.lr=1e-9",
        "optim.eps=1",     "optim.clip_norm=1e-12", "run.checkpoint_interval=2"};
    TrainOutcome o = train(spec_of(d, tiny_manifest(d, "name = \"pre-ln\"", 1), frozen),
                           test::builtin_registry(), sink);
    INFO(sink.str());
    CHECK(o.status == "stopped_early");
    CHECK(o.exit_code == kExitCompleted);
    CHECK(o.updates == 6);
    json st = status_of(d / "run");
    CHECK(st["status"] == "stopped_early");
    CHECK(st["updates"] == 6);
    CHECK(st["note"].get<std::string>().find("eval.patience") != std::string::npos);
    CHECK(records(d / "run", "valid").size() == 3);
    CHECK(fs::exists(d / "run" / "checkpoints" / "last.safetensors"));
    // Finished: the same command does nothing.
    TrainOutcome again = train(spec_of(d, tiny_manifest(d, "name = \"pre-ln\"", 1), frozen),
                               test::builtin_registry(), sink);
    CHECK(again.status == "stopped_early");
    CHECK(again.exit_code == kExitCompleted);
    CHECK(records(d / "run", "train").size() == 6);
    // A bad value is one error naming the key and what was expected.
    CHECK_THROWS_WITH_AS(
        spec_of(d, tiny_manifest(d, "name = \"pre-ln\"", 1), {"eval.bleu_every=0"}),
        doctest::Contains("[eval] bleu_every: expected integer in [1, inf], got integer 0"),
        ManifestError);
  }

  TEST_CASE("Multi30k: a 6L-6L Post-LN model lowers validation loss below the threshold" *
            doctest::test_suite("shared_data")) {
    const fs::path shared = NORMLAB_TEST_SHARED_DATA;
    if (!fs::exists(shared / "multi30k" / "train.en")) {
      MESSAGE("SKIP: " << shared.string() << " is absent");
      return;
    }
    fs::path d = fresh_dir("multi30k");
    std::ostringstream sink;
    std::vector<std::string> sets = test::shared_multi30k_overrides();
    sets.insert(sets.end(), {"optim.max_updates=300", "optim.warmup_updates=100", "optim.lr=2e-3",
                             "eval.interval=0", "eval.bleu_max_sentences=100", "eval.test_beam=0",
                             "run.out_dir=\"" + (d / "run").string() + "\"", "run.log_interval=100",
                             "data.cache_dir=\"" + (d / "cache").string() + "\"",
                             "data.tokenizer.vocab_size=2000"});
    ExperimentSpec spec = load_manifest(NORMLAB_TEST_SOURCE_DIR "/experiments/multi30k.toml", sets,
                                        &test::builtin_registry());
    TrainOutcome o = train(spec, test::builtin_registry(), sink);
    MESSAGE(sink.str());
    REQUIRE(o.status == "completed");
    // The threshold: the best a model can do without looking at the source or the target prefix
    // is the validation cross-entropy under the training unigram distribution (computed here from
    // the same tokenized data, a cache hit). Learning must beat it clearly. Measured: valid nll
    // 4.71 after 300 updates (uniform ln 2000 = 7.60).
    std::ostringstream quiet;
    data::Dataset ds = data::load_dataset(spec.data, quiet);
    std::vector<double> freq(size_t(ds.tgt_vocab), 1.0);  // add-one smoothing
    double total = double(freq.size());
    for (const auto& ex : ds.train.examples)
      for (int32_t t : ex.tgt) freq[size_t(t)] += 1, total += 1;
    double unigram = 0, n = 0;
    for (const auto& ex : ds.valid.examples)
      for (int32_t t : ex.tgt) unigram -= std::log(freq[size_t(t)] / total), n += 1;
    unigram /= n;
    MESSAGE("valid nll " << o.last_valid_nll << " vs unigram cross-entropy " << unigram
                         << " vs uniform " << o.uniform_loss);
    CHECK(o.last_valid_nll < unigram - 0.5);
    CHECK(o.last_valid_bleu >= 0);
  }

  // Issue 66.2: every resume path checks every lr-schedule key against the lr of the updates the
  // run has done. The schedule: lr 0.01 after a 2-update warm-up, wsd with its 1-sqrt decay over
  // the last 4 of 10 updates (lr until update 6, 0.001 at update 10).
  TEST_CASE(
      "issue 66.2: a resume changes the lr schedule only where the updates done keep theirs") {
    const fs::path d = fresh_dir("schedule_resume");
    const fs::path m = test::tiny_llama_manifest(d, "pre-ln", 1, 10, 0.0);
    PluginRegistry& reg = test::builtin_registry();
    const std::vector<std::string> base = {
        "optim.lr_schedule=\"wsd\"",   "optim.warmup_updates=2", "optim.decay_updates=4",
        "optim.min_lr_ratio=0.1",      "run.log_interval=1",     "run.checkpoint_interval=1",
        "run.checkpoint_keep_last=100"};
    auto spec = [&](const fs::path& out, const std::vector<std::string>& sets) {
      std::vector<std::string> all = base;
      all.push_back(fmt::format("run.out_dir=\"{}\"", out.string()));
      all.insert(all.end(), sets.begin(), sets.end());
      return load_manifest(m.string(), all, &reg);
    };
    std::ostringstream sink;
    // A run of the schedule stopped after update `after` (as a kill would stop it).
    auto stopped = [&](const fs::path& out, int64_t after) {
      StopAfter stop(after);
      TrainControl c;
      c.observers = {&stop};
      CHECK_THROWS(train(spec(out, {}), reg, sink, c));
      REQUIRE(checkpoint_updates(out / "checkpoints" / "last.safetensors") == after);
    };
    // The ManifestError of a resume of `out` with `sets` (from `from` when given); "" when none.
    auto refusal = [&](const fs::path& out, const std::vector<std::string>& sets,
                       const fs::path& from = {}) {
      TrainControl c;
      c.resume_from = from.string();
      try {
        train(spec(out, sets), reg, sink, c);
      } catch (const ManifestError& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    auto resumed = [&](const fs::path& out, const std::vector<std::string>& sets,
                       const fs::path& from = {}) {
      TrainControl c;
      c.resume_from = from.string();
      std::ostringstream log;
      const TrainOutcome o = train(spec(out, sets), reg, log, c);
      INFO(log.str());
      CHECK(o.status == "completed");
      CHECK(log.str().find("resuming") != std::string::npos);
    };
    auto has = [](const std::string& text, const std::string& part) {
      INFO(text);
      CHECK(text.find(part) != std::string::npos);
    };
    // The base schedule by hand.
    auto base_lr = [](int64_t u) { return wsd_lr(0.01, 2, 10, 4, 0.1, false, u); };

    const fs::path mid = d / "mid";  // stopped after update 8: in its decay
    stopped(mid, 8);
    const fs::path mid8 = mid / "checkpoints" / "step_8.safetensors";
    const fs::path old8 = d / "old_mid" / "step_8.safetensors";  // kept through a branch below
    fs::create_directories(old8.parent_path());
    fs::copy_file(mid8, old8);
    fs::copy_file(mid / "checkpoints" / "SHA256SUMS", old8.parent_path() / "SHA256SUMS");
    {  // The checkpoint records the schedule it trained with.
      const json record = json::parse(checkpoint_state(mid8).lr_schedule);
      CHECK(record["lr_schedule"] == "wsd");
      CHECK(record["decay_updates"] == 4);
      CHECK(record["max_updates"] == 10);
      // A checkpoint older than the record is compared with manifest.resolved.toml: read back.
      const std::optional<OptimSection> was =
          schedule_from_resolved_manifest(test::slurp(mid / "manifest.resolved.toml"), {});
      REQUIRE(was.has_value());
      CHECK(was->lr_schedule == "wsd");
      CHECK(was->warmup_updates == 2);
      CHECK(was->decay_updates == 4);
      CHECK(was->min_lr_ratio == doctest::Approx(0.1));
      CHECK(was->max_updates == 10);
    }
    {  // A malformed record is refused, naming the file and the key.
      util::SafetensorsReader r(mid8);
      util::TensorList tensors;
      for (const auto& [name, e] : r.entries()) tensors.emplace_back(name, r.read(name));
      json step = json::parse(r.meta("lr_schedule"));
      step["lr_schedule"] = "step";
      for (const auto& [record, expect] : std::vector<std::pair<std::string, std::string>>{
               {"[1]", "not a JSON object"},
               {R"({"lr": 0.01})", "no 'warmup_updates'"},
               {step.dump(), "'lr_schedule' is \"step\", expected one of"}}) {
        auto meta = r.metadata();
        meta["lr_schedule"] = record;
        const fs::path f = d / "forged.safetensors";
        util::AtomicFile out(f);
        util::write_safetensors(out, tensors, meta);
        out.commit();
        std::string why;
        try {
          checkpoint_state(f);
        } catch (const CheckpointError& e) {
          why = e.what();
        }
        has(why, "checkpoint " + f.string() + ": __metadata__.lr_schedule: " + expect);
      }
    }
    const std::string manifest_before = test::slurp(mid / "manifest.resolved.toml");
    // The resume from the run directory, and --resume-from its own checkpoint: a wsd decay changed
    // midway is refused with the key, both values and both lrs (0.0055 at update 7 under the run's
    // schedule; 0.01 where the decay would begin at update 8).
    for (const fs::path& from : {fs::path(), mid8}) {
      CAPTURE(from);
      const std::string run =
          from.empty() ? "the run it resumes at update 8"
                       : "the checkpoint it resumes from (" + from.string() + ", update 8)";
      std::string r = refusal(mid, {"optim.decay_updates=2"}, from);
      has(r, "optim.decay_updates 4 → 2 changes the wsd schedule of " + run);
      has(r, "the lr of update 7 was 0.0055, it would be 0.01; keep decay_updates = 4");
      r = refusal(mid, {"optim.decay_updates=6"}, from);  // decay from update 5
      has(r, "optim.decay_updates 4 → 6");
      has(r, "the lr of update 5 was 0.01");
      r = refusal(mid, {"optim.decay_shape=\"linear\""}, from);
      has(r, "optim.decay_shape \"1-sqrt\" → \"linear\" changes the wsd schedule");
      has(r, "the lr of update 7 was 0.0055, it would be 0.00775");
      r = refusal(mid, {"optim.max_updates=20"}, from);
      has(r, "optim.max_updates 10 → 20 changes the wsd schedule");
      // The decay still begins after update 6, but is stretched over 6 updates.
      r = refusal(mid, {"optim.max_updates=12", "optim.decay_updates=6"}, from);
      has(r, "optim.max_updates 10 → 12, optim.decay_updates 4 → 6 changes");
      has(r, "keep max_updates = 10, decay_updates = 4");
      // The keys that make another experiment of it in its own directory.
      for (const auto& [set, line] : std::vector<std::pair<std::string, std::string>>{
               {"optim.lr=0.02", "lr = 0.02"},
               {"optim.warmup_updates=3", "warmup_updates = 3"},
               {"optim.lr_schedule=\"cosine\"", "lr_schedule = 'cosine'"},
               {"optim.min_lr_ratio=0.2", "min_lr_ratio = 0.2"}}) {
        r = refusal(mid, {set}, from);
        has(r, "belongs to another experiment");
        has(r, line);
      }
    }
    // Each refusal left the run as it was.
    CHECK(test::slurp(mid / "manifest.resolved.toml") == manifest_before);
    CHECK(checkpoint_updates(mid / "checkpoints" / "last.safetensors") == 8);

    // A branch into another directory: the checkpoint's record is what the run did, whatever
    // the key.
    const fs::path stable = d / "stable";  // stopped after update 5: lr 0.01 until 6
    stopped(stable, 5);
    const fs::path stable5 = stable / "checkpoints" / "step_5.safetensors";
    {
      std::string r = refusal(d / "b_lr", {"optim.lr=0.02"}, stable5);
      has(r, "optim.lr 0.01 → 0.02 changes the wsd schedule of the checkpoint it resumes from");
      has(r, "the lr of update 1 was 0.005, it would be 0.01");
      r = refusal(d / "b_warmup", {"optim.warmup_updates=4"}, stable5);
      has(r, "optim.warmup_updates 2 → 4");
      has(r, "the lr of update 1 was 0.005, it would be 0.0025");
      r = refusal(d / "b_cosine", {"optim.lr_schedule=\"cosine\""}, stable5);
      has(r, "optim.lr_schedule \"wsd\" → \"cosine\"");
      has(r, "the lr of update 3 was 0.01");
      r = refusal(d / "b_decay", {"optim.decay_updates=6"}, stable5);  // decay from update 5
      has(r, "the lr of update 5 was 0.01");
      r = refusal(d / "b_floor", {"optim.min_lr_ratio=0.5"}, mid8);  // in the decay: refused
      has(r, "optim.min_lr_ratio 0.1 → 0.5");
      has(r, "the lr of update 7 was 0.0055, it would be 0.0075");
      for (const char* b : {"b_lr", "b_warmup", "b_cosine", "b_decay", "b_floor"}) {
        CHECK_FALSE(fs::exists(d / b / "manifest.resolved.toml"));
        CHECK_FALSE(fs::exists(d / b / "checkpoints" / "last.safetensors"));
      }
    }
    // Allowed: the lr of updates 1-5 stays, so the decay may be another (and the first resumed
    // update takes the new schedule's lr), or the schedule constant from there.
    resumed(d / "b_floor_shape", {"optim.min_lr_ratio=0.5", "optim.decay_shape=\"linear\""},
            stable5);
    for (int64_t u = 6; u <= 10; ++u) {
      CAPTURE(u);
      CHECK(logged_lr(d / "b_floor_shape", u) ==
            doctest::Approx(wsd_lr(0.01, 2, 10, 4, 0.5, true, u)).epsilon(1e-6));
    }
    CHECK(logged_lr(d / "b_floor_shape", 10) == doctest::Approx(0.005).epsilon(1e-6));
    resumed(d / "b_constant", {"optim.lr_schedule=\"constant\""}, stable5);
    for (int64_t u = 6; u <= 10; ++u)
      CHECK(logged_lr(d / "b_constant", u) == doctest::Approx(0.01).epsilon(1e-6));

    // The resume with the run's own schedule continues it: lr of update 9 as the schedule says.
    resumed(mid, {});
    CHECK(logged_lr(mid, 9) == doctest::Approx(base_lr(9)).epsilon(1e-6));
    CHECK(logged_lr(mid, 8) == doctest::Approx(base_lr(8)).epsilon(1e-6));
    // A decay may begin from any update of the stable phase, extending the run (issue 59.4's
    // design): --resume-from update 5 of the finished run, decay over updates 6-14.
    resumed(mid, {"optim.max_updates=14", "optim.decay_updates=9"},
            mid / "checkpoints" / "step_5.safetensors");
    for (int64_t u : {6, 10, 14}) {
      CAPTURE(u);
      CHECK(logged_lr(mid, u) ==
            doctest::Approx(wsd_lr(0.01, 2, 14, 9, 0.1, false, u)).epsilon(1e-6));
    }
    // A run's manifest says what it trains with now; a checkpoint's record what it trained with.
    // `stable` branches at update 5 to decay over updates 6-14 (its manifest says so), stopped
    // after update 7; the copy of update 8 of the first schedule resumes there with that
    // schedule, and is refused the new one, which its own manifest would let through.
    {
      StopAfter stop(7);
      TrainControl c;
      c.resume_from = stable5.string();
      c.observers = {&stop};
      CHECK_THROWS(
          train(spec(stable, {"optim.max_updates=14", "optim.decay_updates=9"}), reg, sink, c));
    }
    std::string r = refusal(stable, {"optim.max_updates=14", "optim.decay_updates=9"}, old8);
    has(r, "optim.max_updates 10 → 14, optim.decay_updates 4 → 9 changes the wsd schedule");
    has(r, "the lr of update 6 was 0.01");
    resumed(stable, {}, old8);
    CHECK(logged_lr(stable, 9) == doctest::Approx(base_lr(9)).epsilon(1e-6));
  }

  // Issue 66.2: a sweep's worker (`normlab run-one`, what `normlab sweep` runs) resumes its run
  // through the same check.
  TEST_CASE("issue 66.2: a sweep run resumed with its wsd decay changed midway is refused") {
    const fs::path d = fresh_dir("schedule_sweep");
    const fs::path m = test::tiny_llama_manifest(d, "pre-ln", 1, 10, 0.0);
    std::ofstream(m, std::ios::app)
        << "[sweep]\n[[sweep.axis]]\nkey = \"run.seed\"\nvalues = [1]\n";
    PluginRegistry& reg = test::builtin_registry();
    const std::vector<std::string> sets = {"optim.lr_schedule=\"wsd\"", "run.log_interval=1",
                                           "run.checkpoint_interval=1"};
    auto with_decay = [&](int decay) {
      std::vector<std::string> all = sets;
      all.push_back(fmt::format("optim.decay_updates={}", decay));
      return all;
    };
    const SweepPlan plan = plan_sweep(m.string(), with_decay(4), &reg);
    REQUIRE(plan.runs.size() == 1);
    const fs::path run = run_directory(plan, plan.runs[0]);
    sync_sweep_json(plan);  // as `normlab sweep` does before its workers start
    {                       // the run stopped after update 8, in its decay (updates 7-10)
      StopAfter stop(8);
      TrainControl c;
      c.observers = {&stop};
      std::ostringstream sink;
      CHECK_THROWS(train(load_sweep_run(plan, plan.runs[0], {}, &reg), reg, sink, c));
      REQUIRE(checkpoint_updates(run / "checkpoints" / "last.safetensors") == 8);
    }
    RunOneOptions worker;
    worker.manifest = m.string();
    worker.index = 0;
    worker.plugin_paths = {NORMLAB_TEST_PLUGIN_DIR};
    worker.overrides = with_decay(2);
    std::ostringstream out, err;
    CHECK(run_one_command(worker, out, err) == kExitBadInput);
    CHECK(err.str().find("optim.decay_updates 4 → 2 changes the wsd schedule of the run it resumes "
                         "at update 8") != std::string::npos);
    worker.overrides = with_decay(4);
    CHECK(run_one_command(worker, out, err) == kExitCompleted);
    INFO(out.str(), err.str());
    CHECK(logged_lr(run, 9) ==
          doctest::Approx(wsd_lr(0.01, 0, 10, 4, 0.1, false, 9)).epsilon(1e-6));
  }

  // Issue 66.2: a checkpoint saved before checkpoints recorded their schedule is compared with the
  // manifest.resolved.toml of its own run directory, never with the one it is resumed into; with
  // neither, the resume is refused unless --allow-unverified. A refused resume leaves status.json
  // as it was. The schedule: cosine over 10 updates after a 2-update warm-up.
  TEST_CASE("issue 66.2: a checkpoint without a schedule record is checked against its own run") {
    const fs::path d = fresh_dir("schedule_no_record");
    const fs::path m = test::tiny_llama_manifest(d, "pre-ln", 1, 10, 0.0);
    PluginRegistry& reg = test::builtin_registry();
    auto spec = [&](const fs::path& out, const std::vector<std::string>& sets) {
      std::vector<std::string> all = {"optim.lr_schedule=\"cosine\"", "optim.warmup_updates=2",
                                      "run.log_interval=1", "run.checkpoint_interval=1",
                                      "run.checkpoint_keep_last=100"};
      all.push_back(fmt::format("run.out_dir=\"{}\"", out.string()));
      all.insert(all.end(), sets.begin(), sets.end());
      return load_manifest(m.string(), all, &reg);
    };
    std::ostringstream sink;
    auto refusal = [&](const fs::path& out, const std::vector<std::string>& sets,
                       const fs::path& from = {}) {
      TrainControl c;
      c.resume_from = from.string();
      try {
        train(spec(out, sets), reg, sink, c);
      } catch (const ManifestError& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    auto has = [](const std::string& text, const std::string& part) {
      INFO(text);
      CHECK(text.find(part) != std::string::npos);
    };
    const fs::path src = d / "src";
    REQUIRE(train(spec(src, {}), reg, sink, TrainControl{}).status == "completed");
    // step_10 as normlab wrote it before the record: no __metadata__.lr_schedule (and its checksum
    // in SHA256SUMS, so that only the schedule is in question).
    const fs::path step10 = src / "checkpoints" / "step_10.safetensors";
    {
      util::SafetensorsReader r(step10);
      util::TensorList tensors;
      for (const auto& [name, e] : r.entries()) tensors.emplace_back(name, r.read(name));
      auto meta = r.metadata();
      REQUIRE(meta.erase("lr_schedule") == 1);
      util::AtomicFile out(d / "old.safetensors");
      util::write_safetensors(out, tensors, meta);
      out.commit();
    }
    fs::rename(d / "old.safetensors", step10);
    const std::string hash = util::sha256_file(step10);
    {
      std::istringstream sums(test::slurp(src / "checkpoints" / "SHA256SUMS"));
      std::string kept, line;
      while (std::getline(sums, line))
        if (line.find("step_10.safetensors") == std::string::npos) kept += line + "\n";
      std::ofstream(src / "checkpoints" / "SHA256SUMS")
          << kept << hash << "  step_10.safetensors\n";
    }
    REQUIRE(checkpoint_state(step10).lr_schedule.empty());

    // --resume-from into another directory, cosine re-stretched 10 → 13: refused from the source
    // run's manifest, into a new directory and into one whose manifest already says 13.
    const std::string change =
        "optim.max_updates 10 → 13 changes the cosine schedule of the "
        "checkpoint it resumes from (" +
        step10.string() + ", update 10)";
    has(refusal(d / "branch", {"optim.max_updates=13"}, step10), change);
    CHECK_FALSE(fs::exists(d / "branch" / "manifest.resolved.toml"));
    {
      StopAfter stop(1);
      TrainControl c;
      c.observers = {&stop};
      CHECK_THROWS(train(spec(d / "other", {"optim.max_updates=13"}), reg, sink, c));
    }
    has(refusal(d / "other", {"optim.max_updates=13"}, step10), change);

    // The same checkpoint outside any run directory: nothing says what it trained with.
    const fs::path loose = d / "loose" / "step_10.safetensors";
    fs::create_directories(loose.parent_path());
    fs::copy_file(step10, loose);
    std::ofstream(loose.parent_path() / "SHA256SUMS") << hash << "  step_10.safetensors\n";
    const std::string r = refusal(d / "from_loose", {}, loose);
    has(r, "checkpoint " + loose.string() + " (update 10) records no lr schedule");
    has(r, "pass --allow-unverified");
    CHECK_FALSE(fs::exists(d / "from_loose" / "manifest.resolved.toml"));
    {
      TrainControl c;
      c.resume_from = loose.string();
      c.allow_unverified = true;
      std::ostringstream log;
      CHECK(train(spec(d / "from_loose", {"optim.max_updates=11"}), reg, log, c).status ==
            "completed");
      has(log.str(), "records no lr schedule");
      has(log.str(), "resuming anyway (--allow-unverified)");
    }

    // A refused resume of the completed run leaves its status.json as it was.
    const std::string status = test::slurp(src / "status.json");
    REQUIRE(json::parse(status)["status"] == "completed");
    has(refusal(src, {"optim.max_updates=13"}),
        "optim.max_updates 10 → 13 changes the cosine schedule of the run it resumes at update 10");
    CHECK(test::slurp(src / "status.json") == status);
  }

}  // TEST_SUITE

}  // namespace normlab_test_training
