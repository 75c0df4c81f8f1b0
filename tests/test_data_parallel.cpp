// Data-parallel training through c10d, as users start it: `normlab train --nproc 2` (2 Gloo ranks
// on loopback) and ranks started by hand with torchrun's variables. The update of 2 ranks against
// one process with optim.update_freq = 2, one run directory, faults, resumes, world-size changes.
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "run/process_group.h"
#include "test_support.h"
#include "util/safetensors.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_data_parallel {

using namespace normlab;
using namespace normlab::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string manifest(const std::string& scheme, double dropout) {
  return fmt::format(R"([model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 2
dec_layers = 2
dropout = {}

[scheme]
name = "{}"

[data]
task = "copy"
synthetic_vocab = 12
synthetic_min_len = 3
synthetic_max_len = 6
synthetic_train = 400
synthetic_valid = 20

[optim]
lr = 2e-3
warmup_updates = 5
max_tokens = 96
max_updates = 5

[eval]
interval = 5

[run]
log_interval = 1
checkpoint_interval = 5
threads = 1
dist_timeout_s = 20
)",
                     dropout, scheme);
}

fs::path write_manifest(const fs::path& dir, const std::string& text) {
  const fs::path m = dir / "m.toml";
  std::ofstream(m) << text;
  return m;
}

// `normlab train m.toml [--set …]… [extra…]`, waited for.
int train(const fs::path& m, const fs::path& out_dir, std::vector<std::string> sets,
          const std::vector<std::string>& extra = {}, const fs::path& log = {}) {
  std::vector<std::string> args = {"train", m.string(), "--set", "run.out_dir=" + out_dir.string()};
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), extra.begin(), extra.end());
  return wait_normlab(start_normlab(args, log.empty() ? fs::path(out_dir.string() + ".log") : log));
}

std::map<std::string, torch::Tensor> tensors(const fs::path& checkpoint,
                                             const std::string& prefix = "") {
  util::SafetensorsReader r(checkpoint);
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, e] : r.entries())
    if (name.rfind(prefix, 0) == 0 && name.rfind("rng/", 0) != 0) out[name] = r.read(name);
  return out;
}

// Largest ‖a − b‖ / ‖b‖ over the tensors both files hold (model, moments, scheme state).
double worst_relative_difference(const fs::path& a, const fs::path& b) {
  const auto ta = tensors(a), tb = tensors(b);
  REQUIRE(ta.size() == tb.size());
  double worst = 0;
  for (const auto& [name, t] : tb) {
    REQUIRE(ta.count(name));
    const torch::Tensor x = ta.at(name).to(torch::kDouble), y = t.to(torch::kDouble);
    worst =
        std::max(worst, (x - y).norm().item<double>() / std::max(y.norm().item<double>(), 1e-30));
  }
  return worst;
}

bool bitwise_equal(const fs::path& a, const fs::path& b, const std::string& prefix) {
  const auto ta = tensors(a, prefix), tb = tensors(b, prefix);
  if (ta.size() != tb.size() || ta.empty()) return false;
  for (const auto& [name, t] : tb)
    if (!ta.count(name) || !torch::equal(ta.at(name), t)) return false;
  return true;
}

std::vector<json> records(const fs::path& run, const std::string& kind) {
  std::vector<json> out;
  std::ifstream f(run / "train.jsonl");
  for (std::string line; std::getline(f, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == kind) out.push_back(j);
  }
  return out;
}

json read_json(const fs::path& p) { return json::parse(slurp(p), nullptr, false); }

}  // namespace

TEST_SUITE("data_parallel") {
  TEST_CASE(
      "2 ranks make the update of one process with optim.update_freq = 2: weights, moments, scheme "
      "state, norms") {
    const fs::path d = fresh_dir("normlab_dp", "parity");
    const fs::path m = write_manifest(d, manifest("post-ln", 0.0));
    // Admin's profiling pass, BranchNorm's α clock, DeepNorm's constants, mHC's streams.
    for (const std::string scheme : {"post-ln", "deepnorm", "branchnorm", "admin", "mhc"}) {
      CAPTURE(scheme);
      const std::vector<std::string> sets = {
          "scheme.name=" + scheme, "analysis.probes=[\"grad_norm\"]", "analysis.dense_until=5"};
      const fs::path two = d / (scheme + "_2ranks"), one = d / (scheme + "_1process");
      REQUIRE(train(m, two, sets, {"--nproc", "2"}) == 0);
      auto one_sets = sets;
      one_sets.push_back("optim.update_freq=2");
      REQUIRE(train(m, one, one_sets) == 0);
      INFO(slurp(two.string() + ".log"));
      CHECK(worst_relative_difference(two / "checkpoints/last.safetensors",
                                      one / "checkpoints/last.safetensors") <= 1e-6);
      // The logged losses and gradient norms are the job's, not rank 0's share.
      const auto t2 = records(two, "train"), t1 = records(one, "train");
      REQUIRE(t2.size() == 5);
      REQUIRE(t1.size() == 5);
      for (size_t i = 0; i < t2.size(); ++i) {
        CHECK(t2[i]["loss"].get<double>() ==
              doctest::Approx(t1[i]["loss"].get<double>()).epsilon(1e-6));
        CHECK(t2[i]["gnorm"].get<double>() ==
              doctest::Approx(t1[i]["gnorm"].get<double>()).epsilon(1e-6));
        // The gradient all-reduce's share of an update, logged for jobs (not for one process).
        CHECK(t2[i]["allreduce_ms_per_update"].get<double>() > 0);
        CHECK(t2[i]["allreduce_ms_per_update"].get<double>() <
              t2[i]["ms_per_update"].get<double>());
        CHECK(!t1[i].contains("allreduce_ms_per_update"));
      }
      const auto v2 = records(two, "valid"), v1 = records(one, "valid");
      REQUIRE(v2.size() == 1);
      CHECK(v2[0]["nll"].get<double>() ==
            doctest::Approx(v1[0]["nll"].get<double>()).epsilon(1e-6));
      CHECK(v2[0]["tokens"] == v1[0]["tokens"]);
      // The probes' per-layer gradient norms too (analysis.csv, rank 0's alone).
      CHECK(slurp(two / "analysis.csv").size() > 100);
      CHECK(slurp(two / "analysis.csv") == slurp(one / "analysis.csv"));
      // One run directory: rank 0's records, the job in env.json.
      const json env = read_json(two / "env.json");
      CHECK(env["distributed"]["world_size"] == 2);
      CHECK(env["distributed"]["backend"] == "gloo");
      CHECK(env["distributed"]["ranks"].size() == 2);
      CHECK(read_json(two / "status.json")["status"] == "completed");
      CHECK(slurp(two.string() + ".log").find("tok/s (2 ranks)") != std::string::npos);
    }
    // The comparison can fail: one process without accumulation makes other updates.
    const fs::path alone = d / "alone";
    REQUIRE(train(m, alone, {}) == 0);
    CHECK(worst_relative_difference(d / "post-ln_2ranks/checkpoints/last.safetensors",
                                    alone / "checkpoints/last.safetensors") > 1e-3);
    fs::remove_all(d);
  }

  TEST_CASE("dropout: each rank its own stream, two identical jobs bitwise equal") {
    std::set<uint64_t> seeds;
    for (int rank = 0; rank < 4; ++rank)
      for (int64_t u = 1; u <= 100; ++u) seeds.insert(rank_stream_seed(1, rank, u));
    CHECK(seeds.size() == 400);
    const fs::path d = fresh_dir("normlab_dp", "dropout");
    const fs::path m = write_manifest(d, manifest("pre-ln", 0.2));
    REQUIRE(train(m, d / "a", {"optim.max_updates=8"}, {"--nproc", "2"}) == 0);
    REQUIRE(train(m, d / "b", {"optim.max_updates=8"}, {"--nproc", "2"}) == 0);
    CHECK(bitwise_equal(d / "a/checkpoints/last.safetensors", d / "b/checkpoints/last.safetensors",
                        "model/"));
    // With the same batches but one stream, the masks (and so the weights) differ.
    REQUIRE(train(m, d / "c", {"optim.max_updates=8", "optim.update_freq=2"}) == 0);
    CHECK(!bitwise_equal(d / "a/checkpoints/last.safetensors", d / "c/checkpoints/last.safetensors",
                         "model/"));
    CHECK(read_json(d / "a/env.json")["distributed"]["dropout_streams"].get<std::string>().find(
              "rank_stream_seed") != std::string::npos);
    fs::remove_all(d);
  }

  TEST_CASE(
      "kill -9 of a rank: the job stops as interrupted naming it, nothing half-written; a rerun "
      "resumes bitwise") {
    const fs::path d = fresh_dir("normlab_dp", "kill");
    const fs::path m = write_manifest(d, manifest("pre-ln", 0.1));
    const std::vector<std::string> sets = {"optim.max_updates=200", "run.checkpoint_interval=25",
                                           "eval.interval=50", "run.log_interval=5"};
    REQUIRE(train(m, d / "whole", sets, {"--nproc", "2"}) == 0);
    for (const int victim : {1, 0}) {
      CAPTURE(victim);
      const fs::path run = d / fmt::format("killed{}", victim),
                     log = d / fmt::format("killed{}.log", victim);
      std::vector<std::string> args = {"train", m.string(), "--nproc",
                                       "2",     "--set",    "run.out_dir=" + run.string()};
      for (const auto& s : sets) args.insert(args.end(), {"--set", s});
      const pid_t launcher = start_normlab(args, log);
      // Between two checkpoints, so updates are lost and must be made again.
      REQUIRE(wait_until([&] {
        const auto t = records(run, "train");
        return !t.empty() && t.back()["update"].get<int>() >= 85 &&
               t.back()["update"].get<int>() % 25 >= 10;
      }));
      const json ranks = read_json(run / "env.json")["distributed"]["ranks"];
      const int pid = ranks[victim]["pid"].get<int>();
      ::kill(pid, SIGKILL);
      const auto killed_at = std::chrono::steady_clock::now();
      const int code = wait_normlab(launcher);
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
      INFO(slurp(log));
      CHECK(took < 20);  // within run.dist_timeout_s (the connection closes at once)
      CHECK(slurp(log).find(fmt::format("rank {} (pid {})", victim, pid)) != std::string::npos);
      if (victim == 1) {  // rank 0 writes the status: interrupted, naming the rank
        CHECK(code == 130);
        const json st = read_json(run / "status.json");
        CHECK(st["status"] == "interrupted");
        CHECK(st["note"].get<std::string>().find(fmt::format("rank 1 (pid {}", pid)) !=
              std::string::npos);
      } else {  // rank 0 cannot write its status: the launcher does (issue 42.18)
        CHECK(code == 130);
        const json st = read_json(run / "status.json");
        CHECK(st["status"] == "interrupted");
        CHECK(st["note"].get<std::string>().find(fmt::format("rank 0 (pid {}) was killed", pid)) !=
              std::string::npos);
      }
      // Nothing half-written: every checkpoint listed in SHA256SUMS, no temporaries left.
      for (const auto& e : fs::directory_iterator(run / "checkpoints"))
        CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
      // The same command again: it resumes from the last checkpoint and ends where the whole run
      // did.
      REQUIRE(train(m, run, sets, {"--nproc", "2"}, log) == 0);
      CHECK(bitwise_equal(run / "checkpoints/last.safetensors",
                          d / "whole/checkpoints/last.safetensors", "model/"));
      CHECK(bitwise_equal(run / "checkpoints/last.safetensors",
                          d / "whole/checkpoints/last.safetensors", "optimizer/"));
      // Each update logged once.
      std::vector<int> updates;
      for (const auto& r : records(run, "train")) updates.push_back(r["update"].get<int>());
      std::vector<int> want;
      for (int u = 5; u <= 200; u += 5) want.push_back(u);
      CHECK(updates == want);
    }
    fs::remove_all(d);
  }

  TEST_CASE(
      "another number of ranks on resume: refused naming --allow-world-size-change, which keeps "
      "the global batch") {
    const fs::path d = fresh_dir("normlab_dp", "world");
    const fs::path m = write_manifest(d, manifest("post-ln", 0.0));
    REQUIRE(train(m, d / "two", {"optim.max_updates=5"}, {"--nproc", "2"}) == 0);
    fs::copy(d / "two", d / "changed", fs::copy_options::recursive);
    fs::remove(d / "changed/run.lock");
    const std::string status_before = slurp(d / "changed/status.json");
    const fs::path log = d / "changed.log";
    CHECK(train(m, d / "changed", {"optim.max_updates=10"}, {}, log) == 2);
    CHECK(slurp(log).find("written by a job of 2 rank(s) (2 batches per update); this job has 1") !=
          std::string::npos);
    CHECK(slurp(log).find("--allow-world-size-change") != std::string::npos);
    CHECK(slurp(d / "changed/status.json") == status_before);
    // Allowed: one process makes the 2-batch updates the 2 ranks made.
    REQUIRE(train(m, d / "changed", {"optim.max_updates=10"}, {"--allow-world-size-change"}, log) ==
            0);
    REQUIRE(train(m, d / "two", {"optim.max_updates=10"}, {"--nproc", "2"}) == 0);
    CHECK(worst_relative_difference(d / "changed/checkpoints/last.safetensors",
                                    d / "two/checkpoints/last.safetensors") <= 1e-6);
    // 3 ranks cannot share 2 batches per update.
    fs::remove_all(d / "changed");
    fs::copy(d / "two", d / "changed", fs::copy_options::recursive);
    fs::remove(d / "changed/run.lock");
    CHECK(train(m, d / "changed", {"optim.max_updates=12"},
                {"--nproc", "3", "--allow-world-size-change"}, log) == 2);
    CHECK(slurp(log).find("cannot be shared equally by 3 ranks") != std::string::npos);
    fs::remove_all(d);
  }

  TEST_CASE(
      "joining: different manifests or a missing rank are one clear error on every rank, never a "
      "hang") {
    const fs::path d = fresh_dir("normlab_dp", "join");
    const fs::path m = write_manifest(d, manifest("post-ln", 0.0));
    const std::string port = std::to_string(20000 + ::getpid() % 20000);
    auto rank_env = [&](int rank) {
      return std::vector<std::string>{"RANK=" + std::to_string(rank), "WORLD_SIZE=2",
                                      "LOCAL_RANK=" + std::to_string(rank), "MASTER_ADDR=127.0.0.1",
                                      "MASTER_PORT=" + port};
    };
    // torchrun's variables, one rank with another learning rate.
    const fs::path l0 = d / "r0.log", l1 = d / "r1.log";
    const pid_t r0 = start_normlab(
        {"train", m.string(), "--set", "run.out_dir=" + (d / "x").string()}, l0, rank_env(0));
    const pid_t r1 = start_normlab({"train", m.string(), "--set",
                                    "run.out_dir=" + (d / "x").string(), "--set", "optim.lr=1e-3"},
                                   l1, rank_env(1));
    CHECK(wait_normlab(r0) == 2);
    CHECK(wait_normlab(r1) == 2);
    for (const fs::path& l : {l0, l1}) {
      INFO(slurp(l));
      CHECK(slurp(l).find("runs another experiment") != std::string::npos);
    }
    CHECK(!fs::exists(d / "x/status.json"));
    // Rank 1 never comes: rank 0 gives up after run.dist_timeout_s.
    const auto start = std::chrono::steady_clock::now();
    const pid_t alone =
        start_normlab({"train", m.string(), "--set", "run.out_dir=" + (d / "y").string(), "--set",
                       "run.dist_timeout_s=3"},
                      l0, rank_env(0));
    CHECK(wait_normlab(alone) == 2);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 30);
    CHECK(slurp(l0).find("within 3 s (run.dist_timeout_s)") != std::string::npos);
    fs::remove_all(d);
  }

  TEST_CASE(
      "a job holds its run directory: a second job is refused; SIGTERM stops every rank after the "
      "same update") {
    const fs::path d = fresh_dir("normlab_dp", "lock");
    const fs::path m = write_manifest(d, manifest("post-ln", 0.0));
    const fs::path run = d / "run", log = d / "job.log";
    const pid_t job =
        start_normlab({"train", m.string(), "--nproc", "2", "--set", "run.out_dir=" + run.string(),
                       "--set", "optim.max_updates=100000", "--set", "run.log_interval=10"},
                      log);
    REQUIRE(wait_until([&] { return records(run, "train").size() >= 3; }));
    CHECK(train(m, run, {"optim.max_updates=100000"}, {}, d / "second.log") == 75);
    ::kill(job, SIGTERM);
    INFO(slurp(log));
    CHECK(wait_normlab(job) == 130);
    const json st = read_json(run / "status.json");
    CHECK(st["status"] == "interrupted");
    // The checkpoint holds the update the status names: the ranks agreed on where to stop.
    CHECK(util::SafetensorsReader(run / "checkpoints/last.safetensors")
              .meta("training_state")
              .find(fmt::format("\"updates\":{}", st["updates"].get<int64_t>())) !=
          std::string::npos);
    fs::remove_all(d);
  }

  TEST_CASE(
      "run.shard_optimizer (ZeRO stage 1): bitwise the unsharded job; one checkpoint file, resumed "
      "by 1 process") {
    const fs::path d = fresh_dir("normlab_dp", "shard");
    const fs::path m = write_manifest(d, manifest("mhc", 0.1));
    const std::vector<std::string> plain = {"optim.max_updates=20", "eval.interval=10"};
    std::vector<std::string> sharded = plain;
    sharded.push_back("run.shard_optimizer=true");
    REQUIRE(train(m, d / "plain", plain, {"--nproc", "2"}) == 0);
    REQUIRE(train(m, d / "sharded", sharded, {"--nproc", "2"}) == 0);
    const fs::path a = d / "plain/checkpoints/last.safetensors",
                   b = d / "sharded/checkpoints/last.safetensors";
    CHECK(bitwise_equal(a, b, "model/"));
    CHECK(bitwise_equal(a, b, "optimizer/"));  // every rank's shard of the moments, gathered
    // Stopped at update 10 and resumed: the shards are cut from the checkpoint again.
    auto half = sharded;
    half[0] = "optim.max_updates=10";
    REQUIRE(train(m, d / "resumed", half, {"--nproc", "2"}) == 0);
    REQUIRE(train(m, d / "resumed", sharded, {"--nproc", "2"}) == 0);
    CHECK(bitwise_equal(d / "resumed/checkpoints/last.safetensors", b, "model/"));
    CHECK(bitwise_equal(d / "resumed/checkpoints/last.safetensors", b, "optimizer/"));
    // One file a single process resumes, as the unsharded job's.
    for (const std::string run : {"plain", "sharded"})
      REQUIRE(train(m, d / run, {"optim.max_updates=24", "eval.interval=10"},
                    {"--allow-world-size-change"}) == 0);
    CHECK(bitwise_equal(a, b, "model/"));
    fs::remove_all(d);
  }
}

}  // namespace normlab_test_data_parallel
