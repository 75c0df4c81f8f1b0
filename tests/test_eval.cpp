// Evaluation of trained runs: beam search against greedy decoding, checkpoint averaging, the
// run loader's errors, LM perplexity, and run.save_initial's step_0.safetensors. Downstream tasks
// (suite "tasks"): the harness's truncation to max_length and the task files' refusals.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "eval/beam_search.h"
#include "eval/run_model.h"
#include "eval/task_eval.h"
#include "normlab/eval/eval_commands.h"
#include "normlab/interop_commands.h"
#include "normlab/manifest/experiment.h"
#include "normlab/plugins/registry.h"
#include "normlab/train/trainer.h"
#include "run/checkpoint.h"
#include "run/model_assembly.h"
#include "test_support.h"
#include "train/greedy_decoder.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_eval {

using namespace normlab;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("normlab_eval_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A small reverse-task model that learns enough in a few seconds for beam search to matter.
std::string reverse_manifest(const fs::path& dir, int64_t max_updates,
                             const std::string& extra_run = "") {
  return fmt::format(R"([model]
d_model = 32
ffn_dim = 64
heads = 2
enc_layers = 2
dec_layers = 2
dropout = 0.0

[scheme]
name = "pre-ln"

[data]
task = "reverse"
synthetic_vocab = 12
synthetic_min_len = 3
synthetic_max_len = 10
synthetic_train = 3000
synthetic_valid = 100

[optim]
lr = 3e-3
warmup_updates = 30
label_smoothing = 0.0
max_tokens = 512
max_updates = {1}
clip_norm = 1.0

[eval]
interval = 0
bleu = false

[run]
out_dir = "{0}/run"
log_interval = 1000
checkpoint_interval = 20
checkpoint_keep_last = 3
threads = 1
{2}
)",
                     dir.string(), max_updates, extra_run);
}

fs::path train_run(const fs::path& dir, const std::string& manifest,
                   const std::vector<std::string>& sets = {}) {
  const fs::path p = dir / "m.toml";
  std::ofstream(p) << manifest;
  std::ostringstream sink;
  TrainOutcome o = train(load_manifest(p.string(), sets, &test::builtin_registry()),
                         test::builtin_registry(), sink);
  REQUIRE(o.status == "completed");
  return dir / "run";
}

eval::OpenedRun open(const fs::path& run, const std::string& checkpoint = "") {
  std::ostringstream log;
  return eval::open_run({run.string(), checkpoint, "cpu", {NORMLAB_TEST_PLUGIN_DIR}}, log);
}

// The trained reverse run, shared by the cases below (trained once per process).
const fs::path& reverse_run() {
  static const fs::path run = [] {
    const fs::path dir = fresh_dir("reverse");
    return train_run(dir, reverse_manifest(dir, 200));
  }();
  return run;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

torch::Tensor logits_on(TransformerModelImpl& model, int64_t vocab) {
  torch::NoGradGuard ng;
  model.eval();
  auto src = torch::randint(4, vocab, {3, 7}, torch::kLong);
  auto tgt = torch::randint(4, vocab, {3, 5}, torch::kLong);
  return model.forward(src, tgt);
}

}  // namespace

TEST_SUITE("eval") {
  TEST_CASE("beam search with beam 1 is greedy decoding") {
    torch::manual_seed(3);
    for (const char* scheme : {"post-ln", "pre-ln"}) {
      CAPTURE(scheme);
      auto cfg = test::small_config(Arch::EncDec, 2, 2);
      TransformerModel model = test::make_model(scheme, cfg);
      std::mt19937 rng(5);
      std::vector<std::vector<int32_t>> sources;
      for (int i = 0; i < 40; ++i) {
        std::vector<int32_t> s(size_t(3 + rng() % 9));
        for (auto& t : s) t = int32_t(4 + rng() % 46);
        s.push_back(data::kEos);
        sources.push_back(s);
      }
      const auto greedy = greedy_decode(*model, sources, torch::kCPU, 1.2, 10, 4096);
      eval::BeamOptions opt;
      opt.beam = 1;
      opt.max_len_a = 1.2;
      opt.max_len_b = 10;
      opt.min_len = 0;         // greedy decoding may end at once
      opt.batch_tokens = 300;  // other batches than greedy's
      const auto beam = eval::beam_search(*model, sources, torch::kCPU, opt);
      int64_t tokens = 0;
      for (size_t i = 0; i < sources.size(); ++i) {
        CAPTURE(i);
        CHECK(beam[i].tokens == greedy[i]);
        tokens += int64_t(greedy[i].size());
      }
      CHECK(tokens > 40);  // not all empty: the comparison says something
    }
  }

  TEST_CASE(
      "beam search scores at least greedy's hypotheses under the model (trained reverse run)") {
    eval::OpenedRun r = open(reverse_run(), "last");
    std::vector<std::vector<int32_t>> sources;
    for (const auto& ex : r.ds.test.examples) sources.push_back(ex.src);
    const auto greedy = greedy_decode(*r.model, sources, r.device, 0, 200, 8000);
    eval::BeamOptions opt;
    opt.beam = 5;
    const auto beam = eval::beam_search(*r.model, sources, r.device, opt);
    std::vector<std::vector<int32_t>> beam_tokens;
    for (const auto& h : beam) beam_tokens.push_back(h.tokens);
    const auto lp_greedy = eval::sequence_log_probs(*r.model, sources, greedy, r.device);
    const auto lp_beam = eval::sequence_log_probs(*r.model, sources, beam_tokens, r.device);
    double total_greedy = 0, total_beam = 0;
    int better = 0, worse = 0;
    for (size_t i = 0; i < sources.size(); ++i) {
      CAPTURE(i);
      // The score beam search reports is the model's, length-normalized (lenpen 1).
      CHECK(beam[i].log_prob == doctest::Approx(lp_beam[i]).epsilon(1e-4));
      CHECK(beam[i].score ==
            doctest::Approx(lp_beam[i] / double(beam[i].tokens.size() + 1)).epsilon(1e-4));
      // Both scored the same way (float noise of the decoders' own sums is ~1e-6).
      const double g = lp_greedy[i] / double(greedy[i].size() + 1),
                   b = lp_beam[i] / double(beam[i].tokens.size() + 1);
      total_greedy += g;
      total_beam += b;
      better += b > g + 1e-4;
      worse += b < g - 1e-4;
    }
    MESSAGE(
        fmt::format("{} sentences: beam better on {}, worse on {}; mean normalized score beam "
                    "{:.4f} greedy {:.4f}",
                    sources.size(), better, worse, total_beam / double(sources.size()),
                    total_greedy / double(sources.size())));
    CHECK(total_beam > total_greedy);
    CHECK(better > 5);  // measured: better on 18 of 100, worse on none
    CHECK(better > 3 * worse);
  }

  TEST_CASE("averaging K identical checkpoints gives the checkpoint; two give their mean") {
    const fs::path ck = reverse_run() / "checkpoints";
    const fs::path copies = fresh_dir("avg");
    for (int i = 0; i < 3; ++i)
      fs::copy_file(ck / "last.safetensors", copies / fmt::format("c{}.safetensors", i));
    eval::OpenedRun a = open(reverse_run(), "last");
    eval::OpenedRun b = open(reverse_run(), "last");
    eval::load_average(
        {copies / "c0.safetensors", copies / "c1.safetensors", copies / "c2.safetensors"},
        *b.model);
    auto pa = a.model->named_parameters(), pb = b.model->named_parameters();
    for (const auto& item : pa) {
      CAPTURE(item.key());
      CHECK(test::max_abs_diff(item.value(), pb[item.key()]) < 1e-7);
    }
    // avg:2 through the loader: the mean of the two newest step_N.safetensors.
    eval::OpenedRun avg = open(reverse_run(), "avg:2");
    eval::OpenedRun s180 = open(reverse_run(), "step_180"), s200 = open(reverse_run(), "step_200");
    CHECK(avg.tag == "avg2");
    auto p180 = s180.model->named_parameters(), p200 = s200.model->named_parameters();
    double moved = 0;
    for (const auto& item : avg.model->named_parameters()) {
      CAPTURE(item.key());
      CHECK(test::max_abs_diff(item.value(), (p180[item.key()] + p200[item.key()]) / 2) < 1e-6);
      moved = std::max(moved, test::max_abs_diff(p180[item.key()], p200[item.key()]));
    }
    CHECK(moved > 1e-4);  // the two differ: the mean is not one of them
  }

  TEST_CASE("a missing run, checkpoint or split is one error naming it") {
    const fs::path nowhere = fresh_dir("missing") / "no_such_run";
    CHECK(error_of([&] { open(nowhere); }) ==
          fmt::format("run directory {} not found", nowhere.string()));
    const fs::path empty = fresh_dir("not_a_run");
    CHECK(error_of([&] {
            open(empty);
          }).find((empty / "manifest.resolved.toml").string() + " not found") != std::string::npos);
    const std::string step = error_of([&] { open(reverse_run(), "step_999"); });
    CHECK(step.find((reverse_run() / "checkpoints" / "step_999.safetensors").string() +
                    " not found") != std::string::npos);
    CHECK(step.find("last.safetensors") != std::string::npos);  // says what there is
    CHECK(error_of([&] { open(reverse_run(), "avg:9"); }).find("needs 9 step_N.safetensors") !=
          std::string::npos);
    CHECK(error_of([&] { open(reverse_run(), "newest"); }).find("got 'newest'") !=
          std::string::npos);

    // Through the command: exit code 2 and one line on stderr.
    EvalOptions opt;
    opt.model = {nowhere.string(), "", "cpu", {NORMLAB_TEST_PLUGIN_DIR}};
    std::ostringstream out, err;
    CHECK(eval_command(opt, out, err) == 2);
    CHECK(err.str() ==
          fmt::format("normlab: error: run directory {} not found\n", nowhere.string()));
  }

  TEST_CASE("LM runs: test perplexity, and a split the data lacks is named") {
    const fs::path dir = fresh_dir("lm");
    {
      std::ofstream text(dir / "text.txt");
      std::mt19937 rng(7);
      const char* words[] = {"the", "a",     "dog", "cat",   "sees", "runs",
                             "big", "small", "red", "house", "."};
      for (int i = 0; i < 300; ++i) {
        for (int w = 0; w < 6 + int(rng() % 5); ++w) text << (w ? " " : "") << words[rng() % 11];
        text << "\n";
      }
    }
    const std::string manifest = fmt::format(R"([model]
arch = "lm"
d_model = 32
ffn_dim = 64
heads = 2
dec_layers = 2
dropout = 0.0
[data]
task = "lm"
train = "{0}/text.txt"
lm_block = 16
cache_dir = "{0}/cache"
[data.tokenizer]
vocab_size = 30
[optim]
max_tokens = 256
max_updates = 30
warmup_updates = 5
lr = 2e-3
[eval]
interval = 0
[run]
out_dir = "{0}/run"
threads = 1
)",
                                             dir.string());
    const fs::path run = train_run(dir, manifest);
    EvalOptions opt;
    opt.model = {run.string(), "last", "cpu", {NORMLAB_TEST_PLUGIN_DIR}};
    opt.split = "valid";
    opt.json = true;
    std::ostringstream out, err;
    REQUIRE(eval_command(opt, out, err) == 0);
    const json j = json::parse(out.str());
    // The trainer's final validation (same weights, other batches) gives the same NLL.
    json last_valid;
    std::ifstream log(run / "train.jsonl");
    for (std::string line; std::getline(log, line);)
      if (auto r = json::parse(line); r["kind"] == "valid") last_valid = r;
    REQUIRE(last_valid.is_object());
    CHECK(j["nll"].get<double>() == doctest::Approx(last_valid["nll"].get<double>()).epsilon(1e-5));
    CHECK(j["ppl"].get<double>() == doctest::Approx(std::exp(j["nll"].get<double>())));
    CHECK_FALSE(j.contains("bleu"));

    opt.split = "test";
    std::ostringstream out2, err2;
    CHECK(eval_command(opt, out2, err2) == 2);
    CHECK(err2.str().find("no test set") != std::string::npos);
    CHECK(err2.str().find((run / "manifest.resolved.toml").string()) != std::string::npos);
    CHECK(err2.str().find("data.test") != std::string::npos);
  }

  TEST_CASE(
      "run.save_initial: step_0.safetensors is the seeded initialization and outlives pruning") {
    for (const std::string scheme : {"deepnorm", "admin"}) {
      CAPTURE(scheme);
      const fs::path dir = fresh_dir(std::string("init_") + scheme);
      std::string m = reverse_manifest(dir, 60, "save_initial = true");
      m.replace(m.find("name = \"pre-ln\""), 15, fmt::format("name = \"{}\"", scheme));
      const fs::path run = train_run(dir, m, {"run.checkpoint_keep_last=1", "run.seed=11"});
      const fs::path ck = run / "checkpoints";
      CHECK(fs::exists(ck / "step_0.safetensors"));
      CHECK(fs::exists(ck / "step_60.safetensors"));
      CHECK_FALSE(fs::exists(ck / "step_40.safetensors"));  // pruned: keep_last = 1 …
      // … and the initialization is not what training left.
      eval::OpenedRun init = open(run, "step_0"), last = open(run, "last");
      // A fresh model from the same seed has the same weights; Admin's ω (set by its profiling
      // pass on the first batch) are the profile in scheme_setup.safetensors instead of their
      // initial 1.
      torch::manual_seed(11);
      const ModelConfig cfg = init.model->config();
      TransformerModel fresh(cfg, test::builtin_registry().create(scheme, {}, cfg.geometry()));
      auto fresh_params = fresh->named_parameters();
      std::map<std::string, torch::Tensor> profile;
      if (scheme == "admin")
        for (const auto& [k, t] : load_scheme_state(run / "scheme_setup.safetensors"))
          profile[k] = t;
      int omegas = 0, moved = 0;
      for (const auto& item : init.model->named_parameters()) {
        const std::string& key = item.key();
        CAPTURE(key);
        const auto omega_at = key.rfind("_omega");
        if (scheme == "admin" && omega_at != std::string::npos) {
          // "encoder.layers.1.ffn_omega" → encoder.omega_init[1 · sublayers + index of ffn]
          const std::string stack = key.substr(0, key.find('.'));
          const int layer = std::stoi(key.substr(key.find("layers.") + 7));
          const std::string sub = key.substr(key.rfind('.') + 1, omega_at - key.rfind('.') - 1);
          const std::vector<std::string> subs =
              stack == "encoder" ? std::vector<std::string>{"self_attn", "ffn"}
                                 : std::vector<std::string>{"self_attn", "cross_attn", "ffn"};
          const size_t i = size_t(std::find(subs.begin(), subs.end(), sub) - subs.begin());
          REQUIRE(i < subs.size());
          const double r = profile.at(stack + ".omega_init")
                               .flatten()[int64_t(size_t(layer) * subs.size() + i)]
                               .item<double>();
          CHECK(item.value().min().item<double>() == doctest::Approx(r));
          CHECK(item.value().max().item<double>() == doctest::Approx(r));
          moved +=
              std::abs(r - 1.0) > 1e-3;  // every ω but each stack's first (ω_1² = 1 + an empty sum)
          ++omegas;
        } else {
          CHECK(test::max_abs_diff(item.value(), fresh_params[key]) == 0);
        }
      }
      CHECK(omegas == (scheme == "admin" ? 2 * 2 + 2 * 3 : 0));
      CHECK(moved == (scheme == "admin" ? omegas - 2 : 0));
      torch::manual_seed(1);
      const auto a = logits_on(*init.model, cfg.tgt_vocab);
      torch::manual_seed(1);
      CHECK(test::max_abs_diff(logits_on(*last.model, cfg.tgt_vocab), a) >
            1e-3);  // training moved it
    }
  }

  TEST_CASE("export honours the run's own run.plugin_path; a plugin_path that is gone is named") {
    // Issue 46.6: a run of an out-of-tree scheme exports without --plugin-path.
    const fs::path d = fresh_dir("export_plugin_path");
    const std::string plugin_dir =
        (fs::path(NORMLAB_TEST_SDK_PLUGIN_DIR) / "decay_choice").string();
    const fs::path manifest = test::tiny_llama_manifest(d, "decay-choice", 1, 2, 0.0);
    PluginRegistry registry({plugin_dir});
    const ExperimentSpec spec =
        load_manifest(manifest.string(), {"run.plugin_path=[\"" + plugin_dir + "\"]"}, &registry);
    std::ostringstream log;
    REQUIRE(train(spec, registry, log).status == "completed");
    ExportOptions opt;
    opt.run_dir = (d / "run").string();
    opt.to = (d / "export").string();
    std::ostringstream out, err;
    CHECK(export_command(opt, out, err) == 0);
    INFO(err.str());
    CHECK(fs::exists(d / "export" / "config.json"));
    // The same run once its plugin folder is gone: the error names the missing folder.
    const fs::path moved = d / "run_moved_plugin";
    fs::copy(d / "run", moved, fs::copy_options::recursive);
    std::string resolved = test::slurp(moved / "manifest.resolved.toml");
    const size_t at = resolved.find(plugin_dir);
    REQUIRE(at != std::string::npos);
    resolved.replace(at, plugin_dir.size(), (d / "gone").string());
    std::ofstream(moved / "manifest.resolved.toml") << resolved;
    opt.run_dir = moved.string();
    opt.to = (d / "export2").string();
    std::ostringstream out2, err2;
    CHECK(export_command(opt, out2, err2) != 0);
    CHECK(err2.str().find("not found: " + (d / "gone").string()) != std::string::npos);
  }

}  // TEST_SUITE

namespace {

// A small text language model shared by the task cases below (trained once per process): its own
// SentencePiece tokenizer, lm_block 16 (max_length max(16, 2048) = 2048, as export writes it).
std::string task_lm_manifest(const fs::path& dir) {
  return fmt::format(R"([model]
arch = "lm"
d_model = 32
ffn_dim = 64
heads = 2
dec_layers = 2
dropout = 0.0
[data]
task = "lm"
train = "{0}/text.txt"
lm_block = 16
cache_dir = "{0}/cache"
[data.tokenizer]
vocab_size = 30
[optim]
max_tokens = 256
max_updates = 20
warmup_updates = 5
lr = 2e-3
[eval]
interval = 10
[run]
out_dir = "{0}/run"
log_interval = 1
threads = 1
)",
                     dir.string());
}

const fs::path& task_lm_dir() {
  static const fs::path dir = [] {
    const fs::path d = fresh_dir("task_lm");
    std::ofstream text(d / "text.txt");
    std::mt19937 rng(66);
    const char* words[] = {"the", "a", "dog", "cat", "sees", "runs", "big", "small", "red", "."};
    for (int i = 0; i < 300; ++i) {
      for (int w = 0; w < 6 + int(rng() % 5); ++w) text << (w ? " " : "") << words[rng() % 10];
      text << "\n";
    }
    return d;
  }();
  return dir;
}

const fs::path& task_lm_run() {
  static const fs::path run = train_run(task_lm_dir(), task_lm_manifest(task_lm_dir()));
  return run;
}

fs::path write_lines(const fs::path& path, const std::vector<std::string>& lines) {
  fs::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary);
  for (const std::string& l : lines) f << l << "\n";
  return path;
}

std::vector<int32_t> random_ids(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (int32_t& id : v) id = int32_t(4 + rng() % uint32_t(vocab - 4));
  return v;
}

// lm-evaluation-harness's score of one request, written out from huggingface.py
// _loglikelihood_tokens: the window (context + continuation)[-(max_length + 1):][:-1] run as a
// sequence of its own, the continuation's log-probs (its last tokens' predictions) summed.
double harness_loglikelihood(TransformerModelImpl& model, const std::vector<int32_t>& context,
                             const std::vector<int32_t>& continuation, int64_t max_length) {
  std::vector<int64_t> window(context.begin(), context.end());
  window.insert(window.end(), continuation.begin(), continuation.end());
  if (int64_t(window.size()) > max_length + 1)
    window.erase(window.begin(), window.end() - (max_length + 1));
  window.pop_back();
  REQUIRE(int64_t(window.size()) <= max_length);
  torch::NoGradGuard no_grad;
  model.eval();
  const torch::Tensor lp = torch::log_softmax(
      model.forward_lm(torch::tensor(window).unsqueeze(0)).to(torch::kFloat)[0], -1);
  const int64_t T = int64_t(window.size()), n = int64_t(continuation.size());
  double ll = 0;
  for (int64_t j = 0; j < n; ++j) ll += lp[T - n + j][continuation[size_t(j)]].item<double>();
  return ll;
}

struct Ran {
  int code;
  std::string out, err;
};

Ran eval_tasks(const std::vector<fs::path>& files, int shots = 0) {
  EvalOptions opt;
  opt.model = {task_lm_run().string(), "last", "cpu", {NORMLAB_TEST_PLUGIN_DIR}};
  for (const fs::path& f : files) opt.tasks.push_back(f.string());
  opt.shots = shots;
  opt.json = true;
  std::ostringstream out, err;
  const int code = eval_command(opt, out, err);
  return {code, out.str(), err.str()};
}

}  // namespace

TEST_SUITE("tasks") {
  TEST_CASE(
      "a context longer than max_length is cut from the left as lm-evaluation-harness cuts it") {
    eval::OpenedRun r = open(task_lm_run(), "last");
    const int64_t vocab = r.model->config().tgt_vocab;
    const fs::path dir = fresh_dir("tasks_truncate");
    const std::vector<int32_t> long_ctx = random_ids(40, vocab, 1),
                               short_ctx = random_ids(5, vocab, 2);
    const std::vector<std::vector<int32_t>> long_choices = {
        random_ids(3, vocab, 3), random_ids(5, vocab, 4), random_ids(16, vocab, 5)};
    const std::vector<int32_t> short_cont = random_ids(2, vocab, 6);
    const json long_item = {{"context_ids", long_ctx},
                            {"choice_ids", long_choices},
                            {"choices", {"a", "b", "c"}},
                            {"gold", 0}};
    const json short_item = {
        {"context_ids", short_ctx}, {"continuation_ids", short_cont}, {"continuation", " x"}};
    // Not cut (14 + 2 ≤ 17), but its three choices packed after the context would make a row of
    // 14 + 3 · 1 = 17 tokens: the third starts a row of its own.
    const std::vector<int32_t> packed_ctx = random_ids(14, vocab, 10);
    const std::vector<std::vector<int32_t>> packed_choices = {
        random_ids(2, vocab, 11), random_ids(2, vocab, 12), random_ids(2, vocab, 13)};
    const json packed_item = {{"context_ids", packed_ctx},
                              {"choice_ids", packed_choices},
                              {"choices", {"a", "b", "c"}},
                              {"gold", 1}};
    const eval::TaskFile task = eval::read_task_file(
        write_lines(dir / "long.jsonl", {long_item.dump(), short_item.dump(), packed_item.dump()}),
        vocab);
    for (const bool share : {true, false}) {
      CAPTURE(share);
      eval::TaskOptions opt;
      opt.max_length = 16;
      opt.share_contexts = share;
      const eval::TaskResult res = eval::evaluate_task(*r.model, nullptr, 0, task, opt, r.device);
      REQUIRE(res.scores.size() == 3);
      double moved = 0;  // how far the harness's window moves the scores from the whole context's
      for (size_t c = 0; c < long_choices.size(); ++c) {
        const double want = harness_loglikelihood(*r.model, long_ctx, long_choices[c], 16);
        CHECK(res.scores[0].loglikelihood[c] == doctest::Approx(want).epsilon(1e-5));
        moved = std::max(moved, std::abs(want - harness_loglikelihood(*r.model, long_ctx,
                                                                      long_choices[c], 1 << 20)));
      }
      CHECK(moved > 1e-3);  // the check above can tell a cut context from a whole one
      CHECK(res.scores[1].loglikelihood[0] ==
            doctest::Approx(harness_loglikelihood(*r.model, short_ctx, short_cont, 16))
                .epsilon(1e-5));
      for (size_t c = 0; c < packed_choices.size(); ++c)
        CHECK(res.scores[2].loglikelihood[c] ==
              doctest::Approx(harness_loglikelihood(*r.model, packed_ctx, packed_choices[c], 16))
                  .epsilon(1e-5));
      // Said per item: the context tokens cut (the most of any choice: 40 + 16 − 17).
      CHECK(res.scores[0].truncated == 40 + 16 - 17);
      CHECK(res.scores[1].truncated == 0);
      CHECK(res.scores[2].truncated == 0);
      CHECK(res.truncated_items == 1);
      CHECK(res.max_length == 16);
      // Memory: no row of a forward pass is longer than max_length (the choices packed after one
      // context start a new row rather than grow it).
      CHECK(res.longest_row <= 16);
    }
    // A continuation longer than max_length: refused, as the harness asserts.
    const json too_long = {{"context_ids", short_ctx},
                           {"continuation_ids", random_ids(17, vocab, 7)},
                           {"continuation", " x"}};
    eval::TaskOptions opt;
    opt.max_length = 16;
    const eval::TaskFile bad =
        eval::read_task_file(write_lines(dir / "bad.jsonl", {too_long.dump()}), vocab);
    CHECK_THROWS_WITH(eval::check_task(nullptr, 0, bad, opt),
                      doctest::Contains("bad.jsonl:1: choice 0 is 17 tokens, more than the "
                                        "model's max_length 16"));
  }

  TEST_CASE("identical choices tie as lm-evaluation-harness ties them: the first of equal maxima") {
    // Issue 68.1: two identical choices scored at two places of a packed row or a padded batch
    // differed by ~1e-6, so acc never took the first of equal maxima as the harness's np.argmax.
    eval::OpenedRun r = open(task_lm_run(), "last");
    const eval::TaskTokens tt = eval::task_tokens(r.ds);
    REQUIRE(tt.tok != nullptr);
    const int64_t vocab = r.model->config().tgt_vocab;
    const fs::path dir = fresh_dir("tasks_ties");
    std::vector<json> items;
    // Every choice the same: the harness picks choice 0 whatever the model, so an item is right
    // exactly when its gold is 0 (acc and acc_norm).
    for (int i = 0; i < 6; ++i) {
      const std::vector<int32_t> cont = random_ids(1 + size_t(i % 3), vocab, uint32_t(40 + i));
      items.push_back({{"context_ids", random_ids(3 + size_t(i), vocab, uint32_t(30 + i))},
                       {"choice_ids", {cont, cont, cont}},
                       {"choices", {"a", "a", "a"}},
                       {"gold", i % 3}});
    }
    items.push_back({{"context", "the dog"}, {"choices", {"sees", "sees"}}, {"gold", 1}});
    items.push_back({{"context", "a big cat"}, {"choices", {"runs", "runs", "runs"}}, {"gold", 0}});
    items.push_back(
        {{"contexts", {"the cat sees", "the cat sees"}}, {"continuation", "the dog"}, {"gold", 1}});
    const size_t all_same = items.size();
    // A duplicated gold (its second copy) and a duplicated wrong choice: the model decides.
    items.push_back({{"context", "the dog"}, {"choices", {"sees", "runs", "sees"}}, {"gold", 2}});
    items.push_back(
        {{"context", "the red cat"}, {"choices", {"runs", "sees", "runs", "big"}}, {"gold", 1}});
    const std::vector<int32_t> x = random_ids(1, vocab, 50), yz = random_ids(2, vocab, 51);
    items.push_back({{"context_ids", random_ids(4, vocab, 52)},
                     {"choice_ids", {x, yz, yz}},
                     {"choices", {"b", "cd", "cd"}},
                     {"gold", 2}});
    items.push_back({{"context_ids", random_ids(5, vocab, 53)},
                     {"choice_ids", {yz, x, yz}},
                     {"choices", {"cd", "b", "cd"}},
                     {"gold", 1}});
    std::vector<std::string> lines;
    for (const json& it : items) lines.push_back(it.dump());
    const eval::TaskFile task = eval::read_task_file(write_lines(dir / "ties.jsonl", lines), vocab);
    // The harness's rule written out: pred = np.argmax(scores), the first index of the maximum.
    const auto first_max = [](const std::vector<double>& v) {
      size_t best = 0;
      for (size_t c = 1; c < v.size(); ++c)
        if (v[c] > v[best]) best = c;
      return best;
    };
    for (const bool share : {true, false}) {
      CAPTURE(share);
      eval::TaskOptions opt;
      opt.share_contexts = share;
      const eval::TaskResult res =
          eval::evaluate_task(*r.model, tt.tok, tt.eot, task, opt, r.device);
      REQUIRE(res.scores.size() == items.size());
      double right = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        CAPTURE(i);
        const json& it = items[i];
        const eval::ItemScore& sc = res.scores[i];
        const json texts = it.contains("contexts") ? it["contexts"] : it["choices"];
        REQUIRE(sc.loglikelihood.size() == texts.size());
        // Identical choices: bitwise equal log-likelihoods.
        for (size_t c = 0; c < texts.size(); ++c)
          for (size_t k = 0; k < c; ++k)
            if (texts[c] == texts[k]) CHECK(sc.loglikelihood[c] == sc.loglikelihood[k]);
        std::vector<double> norm;  // acc_norm: ll / len(choice text), as the harness's
        for (size_t c = 0; c < texts.size(); ++c)
          norm.push_back(sc.loglikelihood[c] /
                         double(texts[c].get<std::string>().size()));  // ASCII here
        const size_t gold = it["gold"].get<size_t>();
        CHECK(sc.correct == (first_max(sc.loglikelihood) == gold));
        CHECK(sc.correct_norm == (first_max(norm) == gold));
        if (i < all_same) {
          CHECK(sc.correct == (gold == 0));
          CHECK(sc.correct_norm == (gold == 0));
        }
        right += sc.correct;
      }
      CHECK(res.acc == doctest::Approx(right / double(items.size())).epsilon(1e-12));
    }
  }

  TEST_CASE(
      "in the loop as offline: the cut to max_length, the long-item warning, task records "
      "after the validation's") {
    // Issues 68.4 and 68.7: the in-loop scores cut a long context as `eval --tasks` does (the same
    // code), both warn once about items far longer than the training block, and a task record
    // follows the validation record of its update whatever eval.tasks_interval.
    const int64_t vocab = open(task_lm_run(), "last").model->config().tgt_vocab;
    const fs::path dir = fresh_dir("tasks_loop");
    fs::copy_file(task_lm_dir() / "text.txt", dir / "text.txt");
    const auto item = [&](size_t context, uint32_t seed) {
      return json{{"context_ids", random_ids(context, vocab, seed)},
                  {"continuation_ids", random_ids(3, vocab, seed + 1)},
                  {"continuation", " x"}}
          .dump();
    };
    // 2100 + 3 tokens: cut to max(lm_block 16, 2048); 40 + 3 > 2 × 16; 5 + 3 short.
    const fs::path file =
        write_lines(dir / "loop.jsonl", {item(2100, 60), item(40, 62), item(5, 64)});
    const std::string warning = fmt::format(
        "warning: {}: 2 of its 3 items are longer than 2 × the model's training block "
        "(data.lm_block = 16: 32 tokens; the longest 2049 tokens)",
        file.string());
    for (const int every : {0, 2}) {
      CAPTURE(every);
      const fs::path out = dir / fmt::format("run{}", every);
      std::ofstream(dir / "m.toml") << task_lm_manifest(dir);
      std::ostringstream console;
      const TrainOutcome o =
          train(load_manifest((dir / "m.toml").string(),
                              {fmt::format("run.out_dir=\"{}\"", out.string()),
                               "optim.max_updates=4", "optim.warmup_updates=1", "eval.interval=2",
                               fmt::format("eval.tasks=[\"{}\"]", file.string()),
                               fmt::format("eval.tasks_interval={}", every)},
                              &test::builtin_registry()),
                test::builtin_registry(), console);
      REQUIRE(o.status == "completed");
      const std::string text = console.str();
      CHECK(text.find("[eval] tasks: " + warning) != std::string::npos);
      CHECK(text.find(warning) == text.rfind(warning));  // once
      std::ifstream log(out / "train.jsonl");
      std::vector<std::pair<std::string, int64_t>> order;
      json last_task;
      for (std::string line; std::getline(log, line);) {
        const json r = json::parse(line);
        if (r["kind"] == "valid" || r["kind"] == "task")
          order.emplace_back(r["kind"].get<std::string>(), r["update"].get<int64_t>());
        if (r["kind"] == "task") last_task = r;
      }
      CHECK(order == std::vector<std::pair<std::string, int64_t>>{
                         {"valid", 2}, {"task", 2}, {"valid", 4}, {"task", 4}});
      REQUIRE(last_task.is_object());
      CHECK(last_task["max_length"] == 2048);
      CHECK(last_task["truncated_items"] == 1);
      // The same cut offline: equal scores (on the loop's 1 thread: sums are ordered by threads).
      EvalOptions opt;
      opt.model = {out.string(), "last", "cpu", {NORMLAB_TEST_PLUGIN_DIR}};
      opt.model.threads = 1;
      opt.tasks = {file.string()};
      opt.json = true;
      const int threads = at::get_num_threads();
      std::ostringstream eval_out, eval_err;
      REQUIRE_MESSAGE(eval_command(opt, eval_out, eval_err) == 0, eval_err.str());
      CHECK(eval_err.str().find(warning) != std::string::npos);
      const json offline = json::parse(eval_out.str())["tasks"]["loop"];
      CHECK(offline["item_scores"][0]["truncated"] == 2100 + 3 - 2049);
      for (const char* key : {"acc", "ppl", "bits_per_byte", "truncated_items", "max_length"})
        CHECK_MESSAGE(offline[key] == last_task[key], key);
      // A language model's split is counted in blocks, not sentences; --threads N sets LibTorch's
      // threads.
      EvalOptions split;
      split.model = opt.model;
      split.model.threads = 2;
      split.split = "valid";
      std::ostringstream split_out, split_err;
      REQUIRE_MESSAGE(eval_command(split, split_out, split_err) == 0, split_err.str());
      CHECK(at::get_num_threads() == 2);
      at::set_num_threads(threads);
      CHECK(split_out.str().find(" blocks | nll ") != std::string::npos);
      CHECK(split_out.str().find("sentences") == std::string::npos);
    }
  }

  TEST_CASE("eval --tasks cuts a context to max(lm_block, 2048) tokens and says so per item") {
    eval::OpenedRun r = open(task_lm_run(), "last");
    const int64_t vocab = r.model->config().tgt_vocab;
    const std::vector<int32_t> ctx = random_ids(2100, vocab, 8), cont = random_ids(3, vocab, 9);
    const json item = {{"context_ids", ctx}, {"continuation_ids", cont}, {"continuation", " x"}};
    const Ran ran =
        eval_tasks({write_lines(fresh_dir("tasks_long") / "long.jsonl", {item.dump()})});
    REQUIRE_MESSAGE(ran.code == 0, ran.err);
    const json t = json::parse(ran.out)["tasks"]["long"];
    CHECK(t["max_length"] == 2048);
    CHECK(t["truncated_items"] == 1);
    CHECK(t["item_scores"][0]["truncated"] == 2100 + 3 - 2049);
    const double want = harness_loglikelihood(*r.model, ctx, cont, 2048);
    CHECK(t["item_scores"][0]["loglikelihood"][0].get<double>() ==
          doctest::Approx(want).epsilon(1e-5));
    CHECK(std::abs(want - harness_loglikelihood(*r.model, ctx, cont, 1 << 20)) > 1e-3);
  }

  TEST_CASE("--shots with pre-tokenized items or examples is refused, not scored zero-shot") {
    const fs::path dir = fresh_dir("tasks_shots_ids");
    const std::string pool =
        R"({"context": "the dog", "choices": ["sees", "runs"], "gold": 0, "fewshot": true})";
    const fs::path scored_ids = write_lines(
        dir / "ids.jsonl",
        {pool, R"({"context_ids": [5, 6, 7], "continuation_ids": [8], "continuation": " x"})"});
    Ran ran = eval_tasks({scored_ids}, 1);
    CHECK(ran.code == 2);
    CHECK(ran.err.find("--shots 1: " + scored_ids.string() +
                       ":2 is pre-tokenized (context_ids): such items are scored zero-shot only") !=
          std::string::npos);
    CHECK(ran.out.empty());
    CHECK_FALSE(fs::exists(task_lm_run() / "eval" / "tasks.last.ids.1shot.json"));
    const fs::path pool_ids = write_lines(
        dir / "pool_ids.jsonl",
        {R"({"context_ids": [5], "choice_ids": [[6], [7]], "choices": ["a", "b"], "gold": 0, "fewshot": true})",
         R"({"context": "the cat", "choices": ["sees", "runs"], "gold": 1})"});
    ran = eval_tasks({pool_ids}, 1);
    CHECK(ran.code == 2);
    CHECK(ran.err.find(pool_ids.string() + ":1 is pre-tokenized (context_ids): few-shot examples "
                                           "are joined as text") != std::string::npos);
    // Zero-shot, the same items score.
    CHECK(eval_tasks({scored_ids}).code == 0);
  }

  TEST_CASE("two task files of one name are refused before any is scored") {
    const fs::path dir = fresh_dir("tasks_names");
    const std::string line = R"({"context": "the dog", "choices": ["sees", "runs"], "gold": 0})";
    const fs::path a = write_lines(dir / "a" / "test.jsonl", {line});
    const fs::path b = write_lines(dir / "b" / "test.jsonl", {line, line});
    Ran ran = eval_tasks({a, b});
    CHECK(ran.code == 2);
    CHECK(ran.err.find("--tasks: " + a.string() + " and " + b.string() + " are both task 'test'") !=
          std::string::npos);
    CHECK(ran.out.empty());
    ran = eval_tasks({a, dir / "a" / ".." / "a" / "test.jsonl"});
    CHECK(ran.code == 2);
    CHECK(ran.err.find("is given twice") != std::string::npos);
    // A bad later file fails the command before the first is scored.
    const fs::path few = write_lines(dir / "few.jsonl", {line});
    ran = eval_tasks({a, few}, 2);
    CHECK(ran.code == 2);
    CHECK(ran.out.empty());
  }

  TEST_CASE("a task line nested 200,000 deep is one error naming it; long values are cut") {
    const fs::path dir = fresh_dir("tasks_deep");
    const std::string deep = std::string(200000, '[') + std::string(200000, ']');
    const std::string ok = R"({"context": "x", "choices": ["a", "b"], "gold": 0})";
    for (const std::string& bad :
         {R"({"context": "x", "choices": ["a", "b"], "gold": )" + deep + "}",
          R"({"context": "x", "choices": ["a", "b"], "gold": 0, "note": )" + deep + "}",
          R"({"context_ids": )" + deep + R"(, "continuation_ids": [5], "continuation": " a"})"}) {
      const fs::path f = write_lines(dir / "deep.jsonl", {ok, bad});
      CHECK_THROWS_WITH(eval::read_task_file(f, 30),
                        (f.string() + ":2: (line): JSON nested deeper than 64 levels").c_str());
    }
    // Within the limit: read (a field nobody reads may nest).
    const std::string nested = std::string(60, '[') + std::string(60, ']');
    CHECK(eval::read_task_file(
              write_lines(
                  dir / "nested.jsonl",
                  {R"({"context": "x", "choices": ["a"], "gold": 0, "note": )" + nested + "}"}),
              30)
              .items.size() == 1);
    // A value quoted in a message is cut: a line may hold megabytes.
    const std::string big(100000, 'z');
    for (const std::string& bad :
         {R"({"context": "x", "choices": ["a", "b"], "gold": ")" + big + "\"}",
          R"({"context": "x", "choices": ["a", "b"], "gold": )" + nested + "}",
          R"({"context_ids": [[")" + big +
              R"("]], "continuation_ids": [5], "continuation": " a"})"}) {
      const fs::path f = write_lines(dir / "big.jsonl", {bad});
      const std::string what = error_of([&] { eval::read_task_file(f, 30); });
      CHECK(what.find(f.string() + ":1: ") == 0);
      CHECK(what.size() < f.string().size() + 200);
    }
  }

  TEST_CASE("each eval --tasks call keeps its results: named by tasks, shots and limit") {
    // Issue 68.6: every call wrote tasks.<checkpoint>.json, so a one-task check replaced the
    // results of every task.
    const fs::path dir = fresh_dir("tasks_keep");
    std::vector<std::string> items;
    for (int i = 0; i < 6; ++i)
      items.push_back(json({{"context_ids", {5 + i, 6, 7}},
                            {"choice_ids", json::array({json::array({8}), json::array({9 + i}),
                                                        json::array({10})})},
                            {"choices", {"a", "b", "c"}},
                            {"gold", i % 3}})
                          .dump());
    const fs::path a = write_lines(dir / "alpha.jsonl", items),
                   b = write_lines(dir / "beta.jsonl", items);
    const fs::path eval_dir = task_lm_run() / "eval";
    for (const char* f : {"tasks.last.alpha+beta.json", "tasks.last.alpha.limit2.json"})
      fs::remove(eval_dir / f);
    REQUIRE(eval_tasks({b, a}).code == 0);
    EvalOptions opt;
    opt.model = {task_lm_run().string(), "last", "cpu", {NORMLAB_TEST_PLUGIN_DIR}};
    opt.tasks = {a.string()};
    opt.limit = 2;
    opt.json = true;
    std::ostringstream out, err;
    REQUIRE_MESSAGE(eval_command(opt, out, err) == 0, err.str());
    std::ifstream all_file(eval_dir / "tasks.last.alpha+beta.json"),
        check_file(eval_dir / "tasks.last.alpha.limit2.json");
    REQUIRE(all_file);
    REQUIRE(check_file);
    const json all = json::parse(all_file), check = json::parse(check_file);
    CHECK(all["tasks"]["alpha"]["items"] == 6);
    CHECK(all["tasks"]["beta"]["items"] == 6);
    CHECK(all["limit"] == 0);
    CHECK(check["tasks"].size() == 1);
    CHECK(check["tasks"]["alpha"]["items"] == 2);
    CHECK(check["limit"] == 2);
    // The same call with --separate-choices keeps the packed call's file (hostile review: it
    // replaced it).
    fs::remove(eval_dir / "tasks.last.alpha.limit2.separate.json");
    opt.separate_choices = true;
    REQUIRE_MESSAGE(eval_command(opt, out, err) == 0, err.str());
    std::ifstream separate_file(eval_dir / "tasks.last.alpha.limit2.separate.json"),
        packed_again(eval_dir / "tasks.last.alpha.limit2.json");
    REQUIRE(separate_file);
    REQUIRE(packed_again);
    CHECK(json::parse(separate_file)["separate_choices"] == true);
    CHECK(json::parse(packed_again)["separate_choices"] == false);
    // A three-choice task: chance 1/3; no source record beside it: the harness's defaults for
    // a multiple_choice task (acc, acc_norm), bits per byte normlab's own.
    const json& t = all["tasks"]["alpha"];
    CHECK(t["chance"].get<double>() == doctest::Approx(1.0 / 3.0));
    CHECK(t["harness_metrics"] == json({"acc", "acc_norm"}));
    CHECK(t["normlab_metrics"] == json({"bits_per_byte", "bits_per_byte_item_mean"}));

    // Names that collided (hostile review of 68.6): a task named like a suffix ("alpha.limit2",
    // zero-shot, whole) beside alpha --limit 2; "a+b" beside a and b; another folder's alpha.jsonl
    // in a call of its own. Each call's results stay in a file of their own.
    const fs::path other = dir / "other";
    fs::create_directories(other);
    const fs::path suffix_like = write_lines(dir / "alpha.limit2.jsonl", items),
                   plus = write_lines(dir / "alpha+beta.jsonl", items),
                   a2 = write_lines(other / "alpha.jsonl", items);
    for (const char* f : {"tasks.last.alpha%2Elimit2.json", "tasks.last.alpha%2Bbeta.json",
                          "tasks.last.alpha.json"})
      fs::remove(eval_dir / f);
    for (const auto& e : fs::directory_iterator(eval_dir))
      if (e.path().filename().string().find(".files-") != std::string::npos) fs::remove(e.path());
    REQUIRE(eval_tasks({suffix_like}).code == 0);
    REQUIRE(eval_tasks({plus}).code == 0);
    REQUIRE(eval_tasks({a}).code == 0);   // the same call again: its own file, replaced
    REQUIRE(eval_tasks({a2}).code == 0);  // another alpha.jsonl: a file of its own
    const auto items_of = [&](const std::string& f, const std::string& task) {
      std::ifstream in(eval_dir / f);
      REQUIRE_MESSAGE(in, f);
      return json::parse(in)["tasks"][task]["items"].get<int>();
    };
    CHECK(items_of("tasks.last.alpha.limit2.json", "alpha") == 2);
    CHECK(items_of("tasks.last.alpha%2Elimit2.json", "alpha.limit2") == 6);
    CHECK(items_of("tasks.last.alpha+beta.json", "beta") == 6);
    CHECK(items_of("tasks.last.alpha%2Bbeta.json", "alpha+beta") == 6);
    std::ifstream first(eval_dir / "tasks.last.alpha.json");
    REQUIRE(first);
    CHECK(json::parse(first)["tasks"]["alpha"]["file"] == a.string());
    int hashed = 0;
    for (const auto& e : fs::directory_iterator(eval_dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("tasks.last.alpha.files-", 0) != 0) continue;
      ++hashed;
      std::ifstream in(e.path());
      CHECK(json::parse(in)["tasks"]["alpha"]["file"] == a2.string());
    }
    CHECK(hashed == 1);
  }

  TEST_CASE("the harness's metrics of a task: its source record, its YAML, else the defaults") {
    const fs::path dir = fresh_dir("tasks_metrics");
    const std::string mc = R"({"context": "x", "choices": ["a", "b"], "gold": 0})";
    const std::string lw = R"({"context": "x", "continuation": " y"})";
    eval::TaskFile f = eval::read_task_file(write_lines(dir / "lambada.jsonl", {lw}), 30);
    CHECK(f.harness_metrics == std::vector<std::string>{"perplexity", "acc"});
    CHECK(f.metrics_from == "the harness's defaults for a loglikelihood task");
    // Winogrande's and BoolQ's YAMLs list acc alone (a source record written before "metrics").
    write_lines(dir / "winogrande.source.json",
                {R"({"format": {"task_yaml": "lm_eval/tasks/winogrande/default.yaml"}})"});
    f = eval::read_task_file(write_lines(dir / "winogrande.jsonl", {mc}), 30);
    CHECK(f.harness_metrics == std::vector<std::string>{"acc"});
    write_lines(dir / "boolq.source.json", {R"({"format": {"metrics": ["acc"]}})"});
    f = eval::read_task_file(write_lines(dir / "boolq.jsonl", {mc}), 30);
    CHECK(f.harness_metrics == std::vector<std::string>{"acc"});
    CHECK(f.metrics_from == "boolq.source.json format.metrics");
    write_lines(dir / "bad.source.json", {R"({"format": {"metrics": ["f1"]}})"});
    CHECK_THROWS_WITH(eval::read_task_file(write_lines(dir / "bad.jsonl", {mc}), 30),
                      doctest::Contains("bad.source.json: format.metrics: expected a non-empty "
                                        "list of metrics among acc, acc_norm"));
  }

  TEST_CASE("a last-word task's perplexity stderr is lm-evaluation-harness's bootstrap") {
    // lm_eval 0.4.13, DISABLE_MULTIPROC=1 (the pool draws the same chunks):
    // bootstrap_stderr(perplexity, xs, iters=100000) and iters=2000.
    const std::vector<double> xs = {-1.5, -0.25, -3.0, -2.125, -0.75, -4.5, -1.0};
    CHECK(eval::harness_perplexity_stderr(xs, 100000) ==
          doctest::Approx(4.406954483545879).epsilon(1e-12));
    CHECK(eval::harness_perplexity_stderr(xs, 2000) ==
          doctest::Approx(4.369159880347281).epsilon(1e-12));
    // What it estimates: the standard error of exp(−mean ll); on many items the delta method's
    // ppl · sd(ll) / √n.
    std::mt19937 rng(7);
    std::normal_distribution<double> normal(-3.0, 0.8);
    std::vector<double> lls(400);
    double mean = 0, ss = 0;
    for (double& x : lls) mean += (x = normal(rng)) / double(lls.size());
    for (double x : lls) ss += (x - mean) * (x - mean);
    const double delta =
        std::exp(-mean) * std::sqrt(ss / double(lls.size() - 1) / double(lls.size()));
    CHECK(eval::harness_perplexity_stderr(lls, 20000) == doctest::Approx(delta).epsilon(0.05));
    CHECK(eval::harness_perplexity_stderr({-2.0}, 1000) < 1e-12);  // one item: no spread
  }

  TEST_CASE("eval.tasks that scoring would refuse stop the run before its first update") {
    const fs::path dir = task_lm_dir();
    const fs::path tasks = dir / "bad_tasks";
    const std::string line = R"({"context": "the dog", "choices": ["sees", "runs"], "gold": 0})";
    const std::string pool =
        R"({"context": "the cat", "choices": ["sees", "runs"], "gold": 1, "fewshot": true})";
    write_lines(tasks / "one_pool.jsonl", {pool, line});
    write_lines(tasks / "blank.jsonl",
                {line, R"({"context": "   ", "choices": ["a", "b"], "gold": 0})"});
    write_lines(
        tasks / "ids.jsonl",
        {pool, R"({"context_ids": [5, 6], "continuation_ids": [7], "continuation": " x"})"});
    write_lines(tasks / "x" / "one_pool.jsonl", {line});
    // [eval] keys (paths relative to the manifest's folder) and what the error says.
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"tasks = [\"bad_tasks/one_pool.jsonl\"]\ntasks_shots = 2",
         "eval.tasks_shots = 2: " + (tasks / "one_pool.jsonl").string() + " has 1 few-shot items"},
        {"tasks = [\"bad_tasks/blank.jsonl\"]",
         (tasks / "blank.jsonl").string() + ":2: the context of choice 0 encodes to no token"},
        {"tasks = [\"bad_tasks/ids.jsonl\"]\ntasks_shots = 1",
         (tasks / "ids.jsonl").string() + ":2 is pre-tokenized"},
        {"tasks = [\"bad_tasks/one_pool.jsonl\", \"bad_tasks/x/one_pool.jsonl\"]",
         "are both task 'one_pool'"}};
    for (const auto& [keys, want] : cases) {
      CAPTURE(want);
      fs::remove_all(dir / "bad_run");
      const fs::path m = dir / "m_bad.toml";
      std::string text = task_lm_manifest(dir);
      text.replace(text.find("interval = 10\n"), 14, "interval = 10\n" + keys + "\n");
      std::ofstream(m) << text;
      std::ostringstream sink;
      const std::string what = error_of([&] {
        train(load_manifest(m.string(), {"run.out_dir=\"" + (dir / "bad_run").string() + "\""},
                            &test::builtin_registry()),
              test::builtin_registry(), sink);
      });
      INFO(what);
      CHECK(what.find("[eval] tasks: ") != std::string::npos);
      CHECK(what.find(want) != std::string::npos);
      // Nothing trained: no update logged, no checkpoint.
      std::ifstream log(dir / "bad_run" / "train.jsonl");
      int updates = 0;
      for (std::string l; std::getline(log, l);) updates += json::parse(l)["kind"] == "train";
      CHECK(updates == 0);
    }
  }
}  // TEST_SUITE

}  // namespace normlab_test_eval
