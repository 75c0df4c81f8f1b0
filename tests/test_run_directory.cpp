// The run directory (issue 12 items 5, 6, 7, 10, 11, 12, 14; issue 19 items 2, 4): run.lock,
// status.json while running and after every kind of exit, a full disk, checkpoint checksums and
// --resume-from, retention, nothing created before validation, the size check, cache_dir.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "normlab/manifest/experiment.h"
#include "normlab/sweep/sweep.h"
#include "normlab/train/trainer.h"
#include "test_support.h"
#include "torch_compat.h"
#include "train/memory_estimate.h"
#include "train/run_directory.h"
#include "util/file_lock.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_run_directory {

using namespace normlab;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("normlab_rundir_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A tiny copy task; `run_dir` may live elsewhere than the manifest (the full-disk test).
std::string tiny_manifest(const fs::path& dir, const fs::path& run_dir, int64_t max_updates,
                          const std::string& scheme = "pre-ln") {
  return fmt::format(R"([model]
d_model = 32
ffn_dim = 64
heads = 2
enc_layers = 2
dec_layers = 2
dropout = 0.1

[scheme]
name = "{3}"

[data]
task = "copy"
synthetic_vocab = 12
synthetic_min_len = 3
synthetic_max_len = 8
synthetic_train = 2000
synthetic_valid = 50
cache_dir = "{0}/cache"

[optim]
lr = 2e-3
warmup_updates = 10
max_tokens = 256
max_updates = {2}

[eval]
interval = 0
bleu = false

[run]
out_dir = "{1}"
log_interval = 1
checkpoint_interval = 10
threads = 1
)",
                     dir.string(), run_dir.string(), max_updates, scheme);
}

fs::path write_manifest(const fs::path& dir, const std::string& text) {
  const fs::path p = dir / "m.toml";
  std::ofstream(p) << text;
  return p;
}

ExperimentSpec spec_of(const fs::path& manifest, const std::vector<std::string>& sets = {},
                       const PluginRegistry& reg = test::builtin_registry()) {
  return load_manifest(manifest.string(), sets, &reg);
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

json status_of(const fs::path& run_dir) {
  return json::parse(slurp(run_dir / "status.json"), nullptr, /*allow_exceptions=*/false);
}

std::vector<int64_t> train_updates(const fs::path& run_dir) {
  std::vector<int64_t> out;
  std::ifstream f(run_dir / "train.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j["kind"] == "train") out.push_back(j["update"].get<int64_t>());
  }
  return out;
}

// `normlab train` in a child, stdout+stderr into separate files; `setup` runs in the child first.
pid_t start_train(const std::vector<std::string>& args, const fs::path& out, const fs::path& err,
                  const std::function<void()>& setup = {}) {
  std::vector<std::string> all = {NORMLAB_TEST_CLI, "train"};
  all.insert(all.end(), args.begin(), args.end());
  all.insert(all.end(), {"--plugin-path", NORMLAB_TEST_PLUGIN_DIR});
  const pid_t pid = fork();
  if (pid == 0) {
    if (setup) setup();
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int finish(pid_t pid) { return test::wait_normlab(pid); }
using test::wait_until;

size_t line_count(const std::string& text) {
  return size_t(std::count(text.begin(), text.end(), '\n'));
}

std::vector<fs::path> temporaries(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) out.push_back(e.path());
  return out;
}

}  // namespace

TEST_SUITE("rundir") {
  TEST_CASE(
      "status.json shows progress while running; a second train on the run directory is refused "
      "with the pid") {
    const fs::path d = fresh_dir("lock");
    const fs::path m = write_manifest(d, tiny_manifest(d, d / "run", 1000000));
    const std::vector<std::string> args = {m.string(), "--set", "run.log_interval=5"};
    const pid_t first = start_train(args, d / "first.out", d / "first.err");
    json st;
    REQUIRE(wait_until([&] {
      st = status_of(d / "run");
      return st.is_object() && st.value("status", "") == "running" && st.value("updates", 0) >= 10;
    }));
    // Issue 19.2: progress anyone can read.
    CHECK(st["max_updates"] == 1000000);
    CHECK(st["epoch"].get<int64_t>() >= 1);
    CHECK(st["train_loss"].is_number());
    CHECK(st["tokens_per_s"].get<double>() > 0);
    CHECK(st["eta_s"].get<double>() > 0);
    CHECK(st["pid"] == first);
    CHECK(st["host"].is_string());
    const std::regex iso(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)");
    CHECK(std::regex_match(st["started"].get<std::string>(), iso));
    CHECK(std::regex_match(st["updated"].get<std::string>(), iso));
    const int64_t seen = st["updates"].get<int64_t>();
    REQUIRE(wait_until([&] {
      const json later = status_of(d / "run");
      return later.is_object() && later.value("updates", 0) > seen;
    }));

    // Issue 12.5: the second process is refused with one line naming the holder, and writes
    // nothing.
    const size_t lines_before = train_updates(d / "run").size();
    const pid_t second = start_train(args, d / "second.out", d / "second.err");
    const int code = finish(second);
    const std::string err = slurp(d / "second.err");
    CHECK(code == kExitBusy);
    CHECK(line_count(err) == 1);
    CHECK(err.find(fmt::format("pid {}", first)) != std::string::npos);
    CHECK(err.find("run.lock") != std::string::npos);
    CHECK(train_updates(d / "run").size() >=
          lines_before);  // the first one is still the only writer

    // The sweep's --status table shows the run's progress and ETA from status.json.
    SweepPlan plan;
    plan.name = "one";
    plan.dir = d.string();
    plan.manifest = m.string();
    SweepRun r;
    r.id = "run";
    r.dir = "run";
    plan.runs.push_back(r);
    std::ostringstream table;
    print_sweep_status(plan, table);
    CHECK(table.str().find(" 0%") != std::string::npos);  // of a million updates
    CHECK(std::regex_search(table.str(), std::regex(R"(\d+:\d\d:\d\d)")));

    ::kill(first, SIGTERM);
    CHECK(finish(first) == kExitInterrupted);
    CHECK(status_of(d / "run")["status"] == "interrupted");
  }

  TEST_CASE(
      "a sweep directory is locked the same way: a second driver is refused with the holder's "
      "pid") {
    const fs::path d = fresh_dir("sweeplock");
    const fs::path m = write_manifest(d, tiny_manifest(d, d / "sw", 5) + R"(
[sweep]
[[sweep.axis]]
key = "optim.lr"
values = [1e-3, 2e-3]
)");
    int holder = 0;
    auto lock =
        util::FileLock::try_acquire(d / "sw" / "sweep.lock", &holder);  // as a running driver would
    REQUIRE(lock.has_value());
    std::vector<std::string> all = {NORMLAB_TEST_CLI, "sweep", m.string(), "--plugin-path",
                                    NORMLAB_TEST_PLUGIN_DIR};
    const fs::path err = d / "err";
    const pid_t pid = fork();
    if (pid == 0) {
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(e, 2);
      ::dup2(e, 1);
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    CHECK(finish(pid) == kExitBadInput);
    CHECK(slurp(err).find(fmt::format("(pid {})", ::getpid())) != std::string::npos);
    CHECK_FALSE(fs::exists(d / "sw" / "lr=0.001" / "train.jsonl"));
  }

  TEST_CASE("run.lock is released when its holder is killed with SIGKILL") {
    const fs::path d = fresh_dir("kill9");
    int pipe_fd[2];
    REQUIRE(::pipe(pipe_fd) == 0);
    const pid_t child = fork();
    if (child == 0) {
      int holder = 0;
      auto lock = util::FileLock::try_acquire(d / "run.lock", &holder);
      (void)!::write(pipe_fd[1], lock ? "y" : "n", 1);
      ::pause();
      ::_exit(0);
    }
    char c = 0;
    REQUIRE(::read(pipe_fd[0], &c, 1) == 1);
    REQUIRE(c == 'y');
    bool held = false;
    CHECK(util::lock_holder(d / "run.lock", &held) == child);
    CHECK(held);
    int holder = 0;
    CHECK_FALSE(util::FileLock::try_acquire(d / "run.lock", &holder).has_value());
    CHECK(holder == child);
    ::kill(child, SIGKILL);
    finish(child);
    util::lock_holder(d / "run.lock", &held);
    CHECK_FALSE(held);
    CHECK(util::FileLock::try_acquire(d / "run.lock", &holder).has_value());
  }

  TEST_CASE(
      "a full disk during a checkpoint: one line naming the file, status failed, no temporary, old "
      "checkpoint intact" *
      doctest::test_suite("needs_root")) {
    const fs::path d = fresh_dir("fulldisk");
    const fs::path mnt = d / "small_disk";
    fs::create_directories(mnt);
    if (::mount("normlab-test", mnt.c_str(), "tmpfs", 0, "size=4m") != 0) {
      MESSAGE("SKIP: cannot mount a tmpfs here (", std::strerror(errno),
              "); the full-disk test needs root");
      return;
    }
    struct Unmount {
      fs::path p;
      ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
    } unmount{mnt};
    const fs::path run = mnt / "run";
    const fs::path m = write_manifest(d, tiny_manifest(d, run, 40));
    std::ostringstream sink;
    TrainOutcome first =
        train(spec_of(m, {"optim.max_updates=10"}), test::builtin_registry(), sink);
    REQUIRE(first.status == "completed");
    const std::string sums_before = slurp(run / "checkpoints" / "SHA256SUMS");
    const auto last_size = fs::file_size(run / "checkpoints" / "last.safetensors");
    // Fill the disk up to 64 KiB: enough for logs and status.json, not for a checkpoint.
    {
      std::ofstream filler(mnt / "filler", std::ios::binary);
      const std::string block(4096, 'x');
      while (filler.write(block.data(), block.size())) {
        filler.flush();
        if (!filler) break;
      }
    }
    fs::resize_file(mnt / "filler", fs::file_size(mnt / "filler") - 64 * 1024);

    const pid_t pid = start_train({m.string()}, d / "out", d / "err");
    const int code = finish(pid);
    const std::string err = slurp(d / "err");
    INFO(err);
    CHECK(code == 1);  // an error, not an abort (134)
    CHECK(line_count(err) == 1);
    CHECK(err.find("No space left on device") != std::string::npos);
    CHECK(err.find((run / "checkpoints" / "last.safetensors").string()) != std::string::npos);
    const json st = status_of(run);
    CHECK(st["status"] == "failed");
    CHECK(st["note"].get<std::string>().find("No space left on device") != std::string::npos);
    CHECK(temporaries(run).empty());
    CHECK(fs::file_size(run / "checkpoints" / "last.safetensors") == last_size);
    CHECK(slurp(run / "checkpoints" / "SHA256SUMS") == sums_before);
  }

  TEST_CASE("every error exit writes a final status: failed with the cause") {
    PluginRegistry reg(
        {fs::path(NORMLAB_TEST_BAD_PLUGIN_DIR) / "throwing_update", NORMLAB_TEST_PLUGIN_DIR},
        /*use_default_paths=*/false);
    for (const std::string kind : {"runtime", "bad_alloc", "int", "torch_oom"}) {
      CAPTURE(kind);
      const fs::path d = fresh_dir("fail_" + kind);
      const fs::path m = write_manifest(d, tiny_manifest(d, d / "run", 20, "throwing-update"));
      ::setenv("NORMLAB_TEST_THROW", kind.c_str(), 1);
      std::ostringstream sink;
      std::string what;
      try {
        train(spec_of(m, {}, reg), reg, sink);
      } catch (const std::exception& e) {
        what = e.what();
      }
      ::unsetenv("NORMLAB_TEST_THROW");
      CHECK(!what.empty());
      const json st = status_of(d / "run");
      REQUIRE(st.is_object());
      CHECK(st["status"] == "failed");
      const std::string note = st.value("note", "");
      if (kind == "runtime") CHECK(note.find("injected failure at update 3") != std::string::npos);
      if (kind == "bad_alloc") CHECK(note.find("out of memory") != std::string::npos);
      if (kind == "int") CHECK(note.find("non-standard exception") != std::string::npos);
      // LibTorch's allocator error: one line in status.json and in the exception (issue 27.6), not
      // its trace.
      if (kind == "torch_oom") {
        CHECK(note.find("out of memory at update 3") != std::string::npos);
        CHECK(note.find('\n') == std::string::npos);
        CHECK(note.size() < 400);
        CHECK(what.find('\n') == std::string::npos);
      }
    }
  }

  TEST_CASE(
      "a damaged last.safetensors is refused, naming the newest good step_N.safetensors; "
      "--resume-from resumes from it") {
    const fs::path d = fresh_dir("checksum");
    const fs::path m = write_manifest(d, tiny_manifest(d, d / "run", 40));
    std::ostringstream sink;
    REQUIRE(train(spec_of(m, {"optim.max_updates=25"}), test::builtin_registry(), sink).updates ==
            25);
    const fs::path ckpt = d / "run" / "checkpoints";
    REQUIRE(fs::exists(ckpt / "step_10.safetensors"));
    REQUIRE(fs::exists(ckpt / "step_20.safetensors"));
    // Flip bytes in the middle of last.safetensors (tensor data: LibTorch itself would not notice).
    {
      std::fstream f(ckpt / "last.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(fs::file_size(ckpt / "last.safetensors") / 2));
      f.write("\x13\x37\x13\x37", 4);
    }
    std::string what;
    try {
      train(spec_of(m), test::builtin_registry(), sink);
    } catch (const CheckpointError& e) {
      what = e.what();
    }
    INFO(what);
    CHECK(what.find((ckpt / "last.safetensors").string()) != std::string::npos);
    CHECK(what.find("--resume-from " + (ckpt / "step_20.safetensors").string()) !=
          std::string::npos);
    CHECK(status_of(d / "run")["status"] == "failed");

    TrainControl control;
    control.resume_from = (ckpt / "step_20.safetensors").string();
    const TrainOutcome o = train(spec_of(m), test::builtin_registry(), sink, control);
    CHECK(o.status == "completed");
    CHECK(o.updates == 40);
    std::vector<int64_t> expected;
    for (int64_t u = 1; u <= 40; ++u) expected.push_back(u);
    CHECK(train_updates(d / "run") ==
          expected);  // 21..25 of the first run moved aside, each update once
    CHECK(sink.str().find("from " + (ckpt / "step_20.safetensors").string()) != std::string::npos);
  }

  TEST_CASE(
      "retention: a 100-update run with checkpoints every 10 keeps at most 3 checkpoint files' "
      "worth of disk") {
    // Validating every 10 updates, and (issue 19: the final last.safetensors used to be a fourth
    // file) only at the end.
    for (const std::string interval : {"10", "0"}) {
      CAPTURE(interval);
      const fs::path d = fresh_dir("retention" + interval);
      const fs::path m = write_manifest(d, tiny_manifest(d, d / "run", 100));
      std::ostringstream sink;
      REQUIRE(train(spec_of(m, {"eval.interval=" + interval, "run.log_interval=50"}),
                    test::builtin_registry(), sink)
                  .status == "completed");
      std::set<std::pair<uint64_t, uint64_t>> inodes;  // hard links share one: no extra disk
      std::set<std::string> names;
      for (const auto& e : fs::directory_iterator(d / "run" / "checkpoints")) {
        if (e.path().extension() != ".safetensors") continue;
        struct stat s {};
        REQUIRE(::stat(e.path().c_str(), &s) == 0);
        inodes.insert({uint64_t(s.st_dev), uint64_t(s.st_ino)});
        names.insert(e.path().filename().string());
      }
      CHECK(inodes.size() <= 3);
      CHECK(names == std::set<std::string>{"best.safetensors", "last.safetensors",
                                           "step_100.safetensors", "step_90.safetensors"});
      // Every kept checkpoint matches its recorded SHA-256.
      RunDirectory run(d / "run", std::chrono::milliseconds(0));
      for (const auto& n : names)
        CHECK(run.checkpoint_problem(d / "run" / "checkpoints" / n) == "");
    }
  }

  TEST_CASE(
      "a run that fails validation at start creates no run directory; the corrected manifest then "
      "trains") {
    const fs::path d = fresh_dir("novalidation");
    const fs::path m = write_manifest(d, tiny_manifest(d, d / "run", 5));
    std::ostringstream sink;
    CHECK_THROWS_AS(train(spec_of(m, {"run.device=\"cuda:99\""}), test::builtin_registry(), sink),
                    ManifestError);
    CHECK_FALSE(fs::exists(d / "run"));
    CHECK(train(spec_of(m), test::builtin_registry(), sink).status == "completed");
  }

  TEST_CASE(
      "size check: a model far above the available memory is refused before allocating, naming the "
      "keys") {
    ModelConfig cfg = test::small_config(Arch::EncDec, 6, 6, 65536, 8, 4 * 65536);
    cfg.src_vocab = cfg.tgt_vocab = 10000;
    const std::string problem = oversize_problem("m.toml", cfg, 4096, 16.0 * (1 << 30), "cpu");
    CHECK(problem.find("m.toml: [model] d_model = 65536") == 0);
    CHECK(problem.find("run.allow_oversize = true") != std::string::npos);
    CHECK(problem.find("lower model.d_model") != std::string::npos);
    CHECK(oversize_problem("m.toml", test::small_config(Arch::EncDec, 2, 2), 4096, 16.0 * (1 << 30),
                           "cpu") == "");

    // Attention counts (issue 27.6): d 64, 64 heads, 1+1 layers, 4,000-token sentences passed the
    // check on a 22 GB machine, then asked for 8.2 GB per attention tensor. Per attention: 3
    // tensors of heads x len fp32 per query token; the two attentions of a decoder layer (self and
    // cross) at once, none kept from layer to layer.
    ModelConfig wide = test::small_config(Arch::EncDec, 1, 1, 64, 64, 256);
    wide.src_vocab = wide.tgt_vocab = 8000;
    TrainingMemoryOptions long_sentences;
    long_sentences.max_len = 4000;
    CHECK(attention_activation_bytes(wide, 4000, long_sentences) ==
          doctest::Approx(4000.0 * 3 * 4 * 64 * 4000 * 2));
    CHECK(estimate_training_memory(wide, 4000, long_sentences).activation_bytes -
              estimate_training_memory(wide, 4000).activation_bytes ==
          doctest::Approx(attention_activation_bytes(wide, 4000, long_sentences)));
    CHECK(oversize_problem("m.toml", wide, 4000, 22.0 * (1 << 30), "cpu") ==
          "");  // what passed before
    const std::string attn =
        oversize_problem("m.toml", wide, 4000, 22.0 * (1 << 30), "cpu", long_sentences);
    CHECK(attn.find("data.max_len (sentences up to 4000 tokens") != std::string::npos);
    // A sentence longer than max_tokens is a batch of its own (BatchPlan), so it counts whole
    // (issue 42.7: the estimate capped it at max_tokens and passed a run that then asked for 40
    // GB).
    CHECK(attention_activation_bytes(wide, 1000, long_sentences) ==
          doctest::Approx(4000.0 * 3 * 4 * 64 * 4000 * 2));

    // The estimate counts the parameters the model really has (within a few percent).
    for (auto [arch, family] :
         {std::pair{Arch::EncDec, Family::Transformer}, std::pair{Arch::LM, Family::Transformer},
          std::pair{Arch::LM, Family::Llama}}) {
      ModelConfig small = test::small_config(arch, 3, 2, 64, 4, 128);
      small.family = family;
      small.kv_heads = family == Family::Llama ? 2 : 0;
      TransformerModel model = test::make_model("pre-ln", small);
      int64_t n = 0;
      for (const auto& p : model->parameters()) n += p.numel();
      const double estimate = double(estimate_training_memory(small, 1024).parameters);
      CHECK(std::abs(estimate - double(n)) / double(n) < 0.05);
    }

    // Through the CLI, in a child whose address space is capped so that the old behaviour
    // (allocate, then die) cannot take the machine's memory: exit 2 with one line, no run
    // directory.
    const fs::path d = fresh_dir("oversize");
    const fs::path m = write_manifest(d, tiny_manifest(d, d / "run", 5));
    const pid_t pid =
        start_train({m.string(), "--set", "model.d_model=65536", "--set", "model.ffn_dim=262144"},
                    d / "out", d / "err", [] {
                      const rlimit lim{rlim_t(12) << 30, rlim_t(12) << 30};
                      ::setrlimit(RLIMIT_AS, &lim);
                    });
    const int code = finish(pid);
    const std::string err = slurp(d / "err");
    INFO(err);
    CHECK(code == kExitBadInput);
    CHECK(line_count(err) == 1);
    CHECK(err.find("run.allow_oversize") != std::string::npos);
    CHECK_FALSE(fs::exists(d / "run"));
  }

  TEST_CASE(
      "the memory estimate printed at startup is within 30 % of the run's peak RSS at 2,000 layers "
      "with activation checkpointing") {
    // Issue 27.6: deep and narrow, the estimate counted only tensors (d 16: 166 MiB against a
    // 490-614 MiB peak); LibTorch's runtime and each layer's bookkeeping were missing.
    const fs::path d = fresh_dir("estimate_rss");
    const fs::path m = d / "m.toml";
    std::ofstream(m) << fmt::format(R"([model]
arch = "lm"
d_model = 16
ffn_dim = 64
heads = 2
dec_layers = 2000
[scheme]
name = "pre-ln"
[data]
task = "synthetic-lm"
synthetic_vocab = 64
synthetic_train = 200
synthetic_valid = 16
lm_block = 64
cache_dir = "{0}/cache"
[optim]
max_tokens = 512
max_updates = 2
warmup_updates = 1
[eval]
interval = 0
bleu = false
[run]
threads = 1
activation_checkpointing = true
checkpoint_keep_last = 0
out_dir = "{0}/run"
)",
                                    d.string());
    const pid_t pid = start_train({m.string()}, d / "out", d / "err");
    int status = 0;
    rusage usage{};
    ::wait4(pid, &status, 0, &usage);
    const std::string out = slurp(d / "out");
    INFO(out << slurp(d / "err"));
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    std::smatch mib;
    REQUIRE(std::regex_search(out, mib, std::regex(R"(memory: estimated (\d+) MiB)")));
    const double estimate = std::stod(mib[1]), peak = double(usage.ru_maxrss) / 1024;
    INFO("estimate " << estimate << " MiB, peak RSS " << peak << " MiB");
    CHECK(estimate > 0.7 * peak);
    CHECK(estimate < 1.3 * peak);
  }

  TEST_CASE(
      "data.cache_dir is relative to the manifest, like every other path; --set values to the "
      "working directory") {
    const fs::path d = fresh_dir("cachedir");
    fs::create_directories(d / "sub");
    const fs::path m = d / "sub" / "m.toml";
    std::ofstream(m) << "[data]\ntask = \"copy\"\ncache_dir = \"my_cache\"\n";
    CHECK(fs::path(load_manifest(m.string(), {}, nullptr).data.cache_dir) ==
          d / "sub" / "my_cache");
    CHECK(fs::path(load_manifest(m.string(), {"data.cache_dir=\"rel\""}, nullptr).data.cache_dir) ==
          fs::path("rel"));
  }

  TEST_CASE(
      "generator states are restored from CPU byte tensors whatever form they were read back in") {
    const at::Tensor state = compat::cpu_rng_state();
    const double first = torch::rand({1}).item<double>();
    // As an archive mapped onto another device or dtype hands it back: a long tensor, a strided
    // view.
    compat::set_cpu_rng_state(state.to(torch::kLong));
    CHECK(torch::rand({1}).item<double>() == first);
    compat::set_cpu_rng_state(torch::stack({state, state}, 1).select(1, 0));
    CHECK(torch::rand({1}).item<double>() == first);
    const at::Tensor s = compat::as_rng_state(state.to(torch::kLong));
    CHECK(s.device().is_cpu());
    CHECK(bool(s.scalar_type() == torch::kByte));
  }

}  // TEST_SUITE

}  // namespace normlab_test_run_directory
