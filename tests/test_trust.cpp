// Issue 42 (trust 3), as a hostile user found it: what a run may write, which checkpoint fields
// are believed, how ranks wait. Each case names the item it pins; each failed before the fix.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "interrupt_at.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "run/checkpoint.h"
#include "run/checksums.h"
#include "test_support.h"
#include "train/memory_estimate.h"
#include "util/atomic_file.h"
#include "util/owned_dir.h"
#include "util/safetensors.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_trust {

using namespace normlab;
using namespace normlab::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path fresh(const std::string& name) { return fresh_dir("normlab_trust", name); }

// A copy-task run of a few updates in `out_dir`.
fs::path write_manifest(const fs::path& d, int64_t max_updates, const std::string& extra = "") {
  const fs::path m = d / "m.toml";
  std::ofstream(m) << fmt::format(R"([model]
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
synthetic_min_len = 3
synthetic_max_len = 6
synthetic_train = 200
synthetic_valid = 20
[optim]
max_tokens = 64
max_updates = {}
[eval]
interval = 0
bleu = false
[run]
out_dir = "{}"
log_interval = 4
checkpoint_interval = 2
threads = 1
dist_timeout_s = 3
{}
)",
                                  max_updates, (d / "run").string(), extra);
  return m;
}

// `normlab ARGS…` with its output in `log`: the exit code.
int normlab_cli(const std::vector<std::string>& args, const fs::path& log,
                const std::vector<std::string>& env = {}) {
  return wait_normlab(start_normlab(args, log, env));
}

// Every entry of a folder with its bytes (files) or "<dir>".
std::map<std::string, std::string> contents(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[fs::relative(e.path(), dir).string()] = e.is_directory() ? "<dir>" : slurp(e.path());
  return out;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

std::vector<json> records(const fs::path& run, const std::string& kind) {
  std::vector<json> out;
  for (const auto& l : lines(slurp(run / "train.jsonl"))) {
    json j = json::parse(l);
    if (j.value("kind", "") == kind) out.push_back(j);
  }
  return out;
}

// Rewrites SHA256SUMS of `dir` for its files, as `sha256sum *.safetensors > SHA256SUMS` would.
void regenerate_sums(const fs::path& dir) {
  std::string text;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors")
      text += util::sha256_file(e.path()) + "  " + e.path().filename().string() + "\n";
  std::ofstream(dir / "SHA256SUMS") << text;
}

// Edits one key of a checkpoint's training_state in place.
void forge_state(const fs::path& file, const std::string& key, const json& value) {
  util::TensorList tensors;
  std::map<std::string, std::string> meta;
  {
    util::SafetensorsReader r(file);
    for (const auto& [name, e] : r.entries()) tensors.emplace_back(name, r.read(name));
    meta = r.metadata();
  }
  json ts = json::parse(meta["training_state"]);
  ts[key] = value;
  meta["training_state"] = ts.dump();
  util::AtomicFile out(file);
  util::write_safetensors(out, tensors, meta);
  out.commit();
}

// A TCP port on loopback that accepts connections (the kernel completes them into the backlog)
// and never answers: a stand-in for `python3 -m http.server` holding MASTER_PORT.
struct SilentServer {
  int fd = -1, port = 0;
  SilentServer() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~SilentServer() { ::close(fd); }
};

// The child's exit code, or kKilledAtDeadline when it had to be killed after `seconds` (a hang).
constexpr int kKilledAtDeadline = -1;
int finish_within(pid_t pid, double seconds) {
  int code = kKilledAtDeadline;
  const bool ended = wait_until(
      [&] {
        int st = 0;
        if (::waitpid(pid, &st, WNOHANG) != pid) return false;
        code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return true;
      },
      seconds);
  if (!ended) {
    ::kill(pid, SIGKILL);
    wait_normlab(pid);
  }
  return code;
}

}  // namespace

TEST_SUITE("trust") {
  TEST_CASE("42.1: run.out_dir on a folder that is not a run is refused before a byte is written") {
    const fs::path d = fresh("outdir");
    const fs::path user = d / "mine";
    fs::create_directories(user);
    for (const char* f : {"status.json", "env.json", "valid_hypotheses.txt", "train.jsonl"})
      std::ofstream(user / f) << "the user's own " << f << "\n";
    const auto before = contents(user);
    const fs::path m = write_manifest(d, 2);
    const fs::path log = d / "user.log";
    CHECK(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + user.string() + "\""},
                      log) == 2);
    const auto out = lines(slurp(log));
    REQUIRE(out.size() >= 1);
    CHECK(out.back().find("is neither empty nor a folder normlab made") != std::string::npos);
    CHECK(out.back().find(user.string()) != std::string::npos);
    CHECK(contents(user) == before);  // nothing overwritten, renamed or added

    // The root folder: refused, nothing added to it.
    std::set<std::string> root_before;
    for (const auto& e : fs::directory_iterator("/")) root_before.insert(e.path().string());
    CHECK(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"/\""}, d / "root.log") == 2);
    std::set<std::string> root_after;
    for (const auto& e : fs::directory_iterator("/")) root_after.insert(e.path().string());
    CHECK(root_before == root_after);

    // A sweep into the user's folder: refused the same way.
    const fs::path sweep = d / "sweep.toml";
    std::ofstream(sweep) << slurp(m)
                         << "[sweep]\nname = \"s\"\n[[sweep.axis]]\nkey = \"scheme\"\n"
                            "values = [{name = \"pre-ln\"}, {name = \"post-ln\"}]\n";
    CHECK(normlab_cli({"sweep", sweep.string(), "--set", "run.out_dir=\"" + user.string() + "\""},
                      d / "sweep.log") == 2);
    CHECK(slurp(d / "sweep.log").find("is neither empty nor a folder normlab made") !=
          std::string::npos);
    CHECK(contents(user) == before);

    // New and empty folders are taken and marked; the run's own folder is taken again.
    const fs::path empty = d / "empty";
    fs::create_directories(empty);
    CHECK(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + empty.string() + "\""},
                      d / "empty.log") == 0);
    CHECK(util::owner_kind(empty) == "run");
    CHECK(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + empty.string() + "\"",
                       "--set", "optim.max_updates=4"},
                      d / "again.log") == 0);
    // A run of a normlab before the marker (run.lock and manifest.resolved.toml) is recognised.
    fs::remove(empty / util::kOwnerMarker);
    CHECK(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + empty.string() + "\"",
                       "--set", "optim.max_updates=6"},
                      d / "legacy.log") == 0);
    CHECK(util::owner_kind(empty) == "run");
    // A run folder is not a sweep folder.
    CHECK(normlab_cli({"sweep", sweep.string(), "--set", "run.out_dir=\"" + empty.string() + "\""},
                      d / "sweep2.log") == 2);
    CHECK(slurp(d / "sweep2.log").find("is a normlab run folder, not a sweep folder") !=
          std::string::npos);
  }

  TEST_CASE("42.20: a run folder that cannot be created is reported with its real cause") {
    const fs::path d = fresh("cannot_create");
    std::ofstream(d / "file") << "x";
    const fs::path m = write_manifest(d, 2);
    const fs::path log = d / "log";
    CHECK(normlab_cli({"train", m.string(), "--set",
                       "run.out_dir=\"" + (d / "file" / "run").string() + "\""},
                      log) == 2);
    const std::string text = slurp(log);
    CHECK(text.find("cannot create it: Not a directory") != std::string::npos);
    CHECK(text.find("run.lock") == std::string::npos);
  }

  TEST_CASE("42.2: --resume-from a run with another update_freq trains with this manifest's") {
    const fs::path d = fresh("update_freq");
    const fs::path m = write_manifest(d, 4);
    const fs::path a = d / "a", b = d / "b";
    REQUIRE(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + a.string() + "\"",
                         "--set", "optim.update_freq=4"},
                        d / "a.log") == 0);
    const TrainingState at4 = checkpoint_state(a / "checkpoints" / "last.safetensors");
    REQUIRE(at4.global_batches == 4);
    // The branch: update_freq 1, two more updates.
    const fs::path log = d / "b.log";
    REQUIRE(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + b.string() + "\"",
                         "--set", "optim.max_updates=6", "--resume-from",
                         (a / "checkpoints" / "last.safetensors").string()},
                        log) == 0);
    const TrainingState at6 = checkpoint_state(b / "checkpoints" / "last.safetensors");
    CHECK(at6.global_batches == 1);
    // 2 updates of 1 batch each (the epoch of 200 sentences in 64-token batches is longer).
    CHECK(at6.epoch * 1000 + at6.batch_index == at4.epoch * 1000 + at4.batch_index + 2);
    CHECK(slurp(log).find("this run takes 1 batches per update") != std::string::npos);
    const json env = json::parse(slurp(b / "env.json"));
    CHECK(env.value("resume_batches_per_update", "").find("the checkpoint's run took 4") !=
          std::string::npos);
  }

  TEST_CASE("a resumed run keeps each earlier segment's env.json, oldest first") {
    // Each segment may run on another machine; NORMLAB_THREADS_SET_BY marks which one wrote what.
    const fs::path d = fresh("env_segments");
    const fs::path m = write_manifest(d, 2), run = d / "run";
    REQUIRE(normlab_cli({"train", m.string()}, d / "one.log",
                        {"NORMLAB_THREADS_SET_BY=segment one"}) == 0);
    const json first = json::parse(slurp(run / "env.json"));
    CHECK_FALSE(first.contains("earlier_segments"));
    CHECK_FALSE(first.contains("resumed_at_update"));
    REQUIRE(normlab_cli({"train", m.string(), "--set", "optim.max_updates=4"}, d / "two.log") == 0);
    REQUIRE(normlab_cli({"train", m.string(), "--set", "optim.max_updates=6"}, d / "three.log",
                        {"NORMLAB_THREADS_SET_BY=segment three"}) == 0);
    const json env = json::parse(slurp(run / "env.json"));
    CHECK(env["threads_set_by"] == "segment three");
    CHECK(env["resumed_at_update"] == 4);
    CHECK(env["resumed_from"].get<std::string>().find("last.safetensors") != std::string::npos);
    REQUIRE(env["earlier_segments"].is_array());
    REQUIRE(env["earlier_segments"].size() == 2);
    const json& one = env["earlier_segments"][0];
    const json& two = env["earlier_segments"][1];
    CHECK(one == first);  // kept whole, as it was written
    CHECK(two["threads_set_by"] == "manifest");
    CHECK(two["resumed_at_update"] == 2);
    CHECK_FALSE(two.contains("earlier_segments"));  // one flat list, not nested
    // A finished run is not trained again, and an explicit --resume-from is not dropped unsaid.
    CHECK(normlab_cli({"train", m.string(), "--set", "optim.max_updates=6", "--resume-from",
                       (run / "checkpoints" / "step_4.safetensors").string()},
                      d / "finished.log") == 0);
    CHECK(slurp(d / "finished.log")
              .find("step_4.safetensors not used: to train from it, raise "
                    "optim.max_updates past 6") != std::string::npos);
    CHECK(json::parse(slurp(run / "env.json")) == env);

    // A refused resume (a killed run's checkpoint past max_updates) writes nothing: no segment that
    // never ran, status.json and manifest.resolved.toml as they were.
    const fs::path killed = d / "killed";
    const pid_t pid =
        start_normlab({"train", m.string(), "--set", "run.out_dir=\"" + killed.string() + "\"",
                       "--set", "optim.max_updates=100000"},
                      d / "killed.log");
    const bool saved =
        wait_until([&] { return fs::exists(killed / "checkpoints" / "last.safetensors"); });
    ::kill(pid, SIGKILL);
    wait_normlab(pid);
    REQUIRE(saved);
    // Not compared: the lock (the pid of whoever holds the run, now the refused one) and the
    // temporary files of a write the kill cut short (removed by the next process that takes the
    // run).
    const auto kept = [](std::map<std::string, std::string> files) {
      files.erase("run.lock");
      for (auto it = files.begin(); it != files.end();)
        it = it->first.find(".tmp.") != std::string::npos ? files.erase(it) : std::next(it);
      return files;
    };
    const auto before = kept(contents(killed));
    CHECK(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + killed.string() + "\"",
                       "--set", "optim.max_updates=1"},
                      d / "refused.log") != 0);
    CHECK(slurp(d / "refused.log").find("is past this run's optim.max_updates 1") !=
          std::string::npos);
    CHECK(kept(contents(killed)) == before);

    // A branch from update 4 into a new folder carries the segments that made updates 1-4, not
    // the one after them.
    const fs::path branch = d / "branch";
    REQUIRE(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + branch.string() + "\"",
                         "--set", "optim.max_updates=8", "--resume-from",
                         fs::relative(run / "checkpoints" / "step_4.safetensors").string()},
                        d / "branch.log") == 0);
    const json b = json::parse(slurp(branch / "env.json"));
    CHECK(b["resumed_at_update"] == 4);
    CHECK(fs::path(b["resumed_from"].get<std::string>()).is_absolute());
    REQUIRE(b["earlier_segments"].size() == 2);
    CHECK(b["earlier_segments"][0] == first);
    CHECK(b["earlier_segments"][1]["resumed_at_update"] == 2);
    CHECK_FALSE(b.contains("discarded_segments"));

    // A checkpoint of the line about to be discarded, kept under another name (the rewind below
    // overwrites step_6): segment three wrote it, so its history is segments one, two, three.
    fs::copy_file(run / "checkpoints" / "step_6.safetensors",
                  run / "checkpoints" / "old_6.safetensors");

    // Back to update 4 in the run's own folder: the segment after it is discarded, with its
    // records (train.discarded.jsonl).
    REQUIRE(normlab_cli({"train", m.string(), "--set", "optim.max_updates=8", "--resume-from",
                         (run / "checkpoints" / "step_4.safetensors").string()},
                        d / "back.log") == 0);
    const json back = json::parse(slurp(run / "env.json"));
    REQUIRE(back["earlier_segments"].size() == 2);
    REQUIRE(back["discarded_segments"].size() == 1);
    CHECK(back["discarded_segments"][0]["threads_set_by"] == "segment three");
    CHECK(back["resumed_from_segment"] == back["earlier_segments"][1]["segment"]);
    // A branch from the discarded line follows the segment that wrote its checkpoint, not the
    // updates: one, two, three — not one, two and the segment now running from update 4.
    const fs::path old_line = d / "old_line";
    REQUIRE(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + old_line.string() + "\"",
                         "--set", "optim.max_updates=8", "--allow-unverified", "--resume-from",
                         (run / "checkpoints" / "old_6.safetensors").string()},
                        d / "old_line.log") == 0);
    const json o = json::parse(slurp(old_line / "env.json"));
    REQUIRE(o["earlier_segments"].size() == 3);
    CHECK(o["earlier_segments"][0] == first);
    CHECK(o["earlier_segments"][2]["threads_set_by"] == "segment three");
    CHECK_FALSE(o.contains("earlier_segments_lost"));

    // An env.json that is gone: said, and recorded, not silently replaced.
    fs::remove(run / "env.json");
    REQUIRE(normlab_cli({"train", m.string(), "--set", "optim.max_updates=10"}, d / "gone.log") ==
            0);
    CHECK(slurp(d / "gone.log").find("env.json is missing; the records of the segments before") !=
          std::string::npos);
    CHECK(json::parse(slurp(run / "env.json")).contains("earlier_segments_lost"));

    // Records that contradict each other (a loop, an id twice) are said, and taken by update.
    const auto edit_env = [&](const std::function<void(json&)>& change) {
      json e = json::parse(slurp(branch / "env.json"));
      change(e);
      std::ofstream(branch / "env.json") << e.dump(2);
    };
    edit_env([](json& e) { e["earlier_segments"][0]["resumed_from_segment"] = e["segment"]; });
    REQUIRE(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + branch.string() + "\"",
                         "--set", "optim.max_updates=10"},
                        d / "loop.log") == 0);
    CHECK(slurp(d / "loop.log").find("resume from each other in a loop") != std::string::npos);
    const json looped = json::parse(slurp(branch / "env.json"));
    CHECK(looped.contains("earlier_segments_lost"));
    CHECK(looped["earlier_segments"].size() == 3);  // the three that started before update 8
    edit_env(
        [](json& e) { e["earlier_segments"][1]["segment"] = e["earlier_segments"][0]["segment"]; });
    REQUIRE(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + branch.string() + "\"",
                         "--set", "optim.max_updates=12"},
                        d / "twice.log") == 0);
    CHECK(slurp(d / "twice.log").find("is recorded twice") != std::string::npos);
    CHECK(json::parse(slurp(branch / "env.json"))["earlier_segments"].size() == 4);
  }

  TEST_CASE("42.4: a forged counter in a resumed checkpoint is refused at once, never a hang") {
    const fs::path d = fresh("forged");
    const fs::path m = write_manifest(d, 2);
    REQUIRE(normlab_cli({"train", m.string()}, d / "first.log") == 0);
    const fs::path ckpts = d / "run" / "checkpoints";
    for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
             {"global_batches", int64_t(1) << 62}, {"updates", int64_t(1000000000000000000)}}) {
      CAPTURE(key);
      const std::string saved = slurp(ckpts / "last.safetensors");
      forge_state(ckpts / "last.safetensors", key, value);
      regenerate_sums(ckpts);  // the checksum vouches for it: only the bounds can refuse it
      const fs::path log = d / (key + ".log");
      const auto t0 = std::chrono::steady_clock::now();
      const int code = finish_within(
          start_normlab({"train", m.string(), "--set", "optim.max_updates=4"}, log), 60);
      REQUIRE(code != kKilledAtDeadline);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
      CHECK(code == 2);
      CHECK(slurp(log).find("training_state." + key) != std::string::npos);
      CHECK(slurp(log).find("completed 1000000000000000000") == std::string::npos);
      std::ofstream(ckpts / "last.safetensors", std::ios::binary) << saved;
      regenerate_sums(ckpts);
    }
  }

  TEST_CASE("42.6: eval of another run's checkpoint never overwrites this run's results") {
    const fs::path d = fresh("eval_other");
    const fs::path m = write_manifest(d, 2);
    const fs::path run = d / "run", other = d / "other";
    REQUIRE(normlab_cli({"train", m.string()}, d / "run.log") == 0);
    REQUIRE(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + other.string() + "\"",
                         "--set", "run.seed=7"},
                        d / "other.log") == 0);
    REQUIRE(normlab_cli(
                {"eval", run.string(), "--split", "valid", "--checkpoint", "last", "--beam", "1"},
                d / "own.log") == 0);
    const fs::path own = run / "eval" / "valid.last.beam1.json";
    REQUIRE(fs::exists(own));
    const std::string own_before = slurp(own);
    REQUIRE(normlab_cli({"eval", run.string(), "--split", "valid", "--checkpoint",
                         (other / "checkpoints" / "last.safetensors").string(), "--beam", "1"},
                        d / "foreign.log") == 0);
    CHECK(slurp(own) == own_before);
    const fs::path foreign = run / "eval" / "valid.other.last.u2.beam1.json";
    REQUIRE(fs::exists(foreign));
    CHECK(json::parse(slurp(foreign))["checkpoint"].get<std::string>().find("other") !=
          std::string::npos);
  }

  TEST_CASE("42.7: the size check counts an LM block longer than optim.max_tokens") {
    ModelConfig c = small_config(Arch::LM, 0, 2, 64, 4, 256);
    c.tgt_vocab = 1000;
    TrainingMemoryOptions o;
    o.max_len = 100001;  // lm_block = 100000: one block is one batch of 100,001 tokens
    const MemoryEstimate e = estimate_training_memory(c, 512, o);
    // At least attention's 3 × heads × len² fp32 values of that one block.
    CHECK(e.activation_bytes >= 3.0 * 4 * 4 * 100001.0 * 100001.0);
    const std::string why = oversize_problem("m.toml", c, 512, 8.0 * (1 << 30), "cpu", o);
    CHECK(why.find("data.lm_block") != std::string::npos);
  }

  TEST_CASE("42.8: a run stopped in the middle of a log interval logs that interval whole") {
    const fs::path d = fresh("interval");
    const fs::path m = write_manifest(d, 8);
    std::ostringstream sink;
    const ExperimentSpec whole = load_manifest(
        m.string(), {"run.out_dir=\"" + (d / "whole").string() + "\""}, &builtin_registry());
    REQUIRE(train(whole, builtin_registry(), sink).status == "completed");
    const ExperimentSpec split = load_manifest(
        m.string(), {"run.out_dir=\"" + (d / "split").string() + "\""}, &builtin_registry());
    InterruptAt stop(6);  // updates 5 and 6 of the interval 5-8 done
    TrainControl control;
    control.observers = {&stop};
    REQUIRE(train(split, builtin_registry(), sink, control).status == "interrupted");
    REQUIRE(train(split, builtin_registry(), sink).status == "completed");
    const auto a = records(d / "whole", "train"), b = records(d / "split", "train");
    REQUIRE(a.size() == 2);
    REQUIRE(b.size() == 2);
    CHECK(b[1]["update"] == 8);
    for (const char* key : {"loss", "nll", "ppl", "gnorm", "clipped", "lr"}) {
      CAPTURE(key);
      CHECK(a[1].value(key, json()) == b[1].value(key, json()));  // bitwise: the same doubles
    }
  }

  TEST_CASE("42.11, 42.14, 42.15: --checkpoint values and files that are not checkpoints") {
    const fs::path d = fresh("ckpt_args");
    const fs::path m = write_manifest(d, 2);
    const fs::path run = d / "run";
    REQUIRE(normlab_cli({"train", m.string()}, d / "train.log") == 0);
    auto refused = [&](const std::vector<std::string>& extra, const std::string& needle) {
      CAPTURE(needle);
      const fs::path log = d / "case.log";
      fs::remove(log);
      std::vector<std::string> args = {"eval", run.string(), "--split", "valid"};
      args.insert(args.end(), extra.begin(), extra.end());
      const int code = finish_within(start_normlab(args, log), 30);
      CHECK(code != kKilledAtDeadline);  // a FIFO once blocked eval forever
      CHECK(code == 2);
      const auto out = lines(slurp(log));
      REQUIRE_FALSE(out.empty());
      CHECK(out.back().find(needle) != std::string::npos);
      CHECK(out.back().find("stoll") == std::string::npos);
    };
    refused({"--checkpoint", "avg:99999999999999999999"}, "expected avg:K with K from 1 to");
    refused({"--checkpoint", "avg:0"}, "expected avg:K with K from 1 to");
    fs::create_directories(d / "dir.safetensors");
    refused({"--checkpoint", (d / "dir.safetensors").string()}, "a folder, not a checkpoint file");
    REQUIRE(::mkfifo((d / "fifo.safetensors").c_str(), 0600) == 0);
    refused({"--checkpoint", (d / "fifo.safetensors").string(), "--allow-unverified"}, "a FIFO");
    fs::create_symlink("/dev/zero", d / "zero.safetensors");
    refused({"--checkpoint", (d / "zero.safetensors").string(), "--allow-unverified"},
            "a character device");
    CHECK(file_kind_problem(d / "missing.safetensors") == "no such file");
  }

  TEST_CASE("42.13: a SHA256SUMS written by sha256sum -b or with upper-case hex is read") {
    const fs::path d = fresh("sums");
    std::ofstream(d / "a.safetensors") << "bytes";
    const std::string hash = util::sha256_file(d / "a.safetensors");
    std::string upper = hash;
    for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
    for (const std::string& line :
         {hash + " *a.safetensors\n", upper + "  a.safetensors\n", upper + " *a.safetensors\r\n"}) {
      CAPTURE(line);
      std::ofstream(d / "SHA256SUMS") << line;
      CHECK(checksum_problem(d / "a.safetensors") == "");
    }
    std::ofstream(d / "SHA256SUMS") << hash + " ?a.safetensors\n";  // not sha256sum's format
    CHECK(checksum_problem(d / "a.safetensors").find("does not list it") != std::string::npos);
  }

  TEST_CASE("42.16: selections that match nothing are refused") {
    const fs::path d = fresh("selections");
    const fs::path m = write_manifest(d, 2);
    REQUIRE(normlab_cli({"train", m.string()}, d / "train.log") == 0);
    const fs::path log = d / "ablate.log";
    CHECK(normlab_cli({"ablate", (d / "run").string(), "--split", "valid", "--drop-layer", ""},
                      log) == 2);
    CHECK(slurp(log).find("--drop-layer: expected each or layer indices") != std::string::npos);
    CHECK_FALSE(fs::exists(d / "run" / "eval" / "ablate.valid.last.csv"));
    // A 3-1 model (hostile review): an encoder index past the decoder is the encoder's layer, not
    // refused by the decoder's range; a layer named twice (0,0 or 2,-1) is dropped once.
    const fs::path deep = d / "deep";
    REQUIRE(normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + deep.string() + "\"",
                         "--set", "model.enc_layers=3"},
                        d / "deep.log") == 0);
    const auto rows = [&](const std::string& drop) {
      const fs::path out = d / "ablate_rows.log";
      const int code =
          normlab_cli({"ablate", deep.string(), "--split", "valid", "--drop-layer", drop}, out);
      std::string csv = code == 0 ? slurp(deep / "eval" / "ablate.valid.best.csv") : slurp(out);
      return std::to_string(code) + ":" + csv;
    };
    const std::string two = rows("2,-1");
    CHECK(two.find("encoder,2,") != std::string::npos);
    CHECK(two.find("decoder,0,") != std::string::npos);    // -1: each stack's last layer
    CHECK(std::count(two.begin(), two.end(), '\n') == 4);  // header, none, encoder 2, decoder 0
    const std::string twice = rows("0,0");
    CHECK(std::count(twice.begin(), twice.end(), '\n') == 4);  // header, none, encoder 0, decoder 0
    CHECK(rows("3").find("expected each or layer indices in [-3, 2], got '3'") !=
          std::string::npos);
    CHECK(
        normlab_cli({"train", m.string(), "--set", "run.out_dir=\"" + (d / "r2").string() + "\"",
                     "--set", "analysis.layers=\"99\"", "--set", "analysis.probes=[\"grad_norm\"]"},
                    d / "layers.log") == 2);
    CHECK(slurp(d / "layers.log").find("layer 99 is in no stack of this model") !=
          std::string::npos);
    CHECK_FALSE(fs::exists(d / "r2"));
  }

  TEST_CASE("42.17: eval whose eval/ cannot be written prints the scores, then the error") {
    const fs::path d = fresh("eval_unwritable");
    const fs::path m = write_manifest(d, 2);
    REQUIRE(normlab_cli({"train", m.string()}, d / "train.log") == 0);
    fs::remove_all(d / "run" / "eval");
    std::ofstream(d / "run" / "eval") << "a file where eval/ belongs";
    const fs::path log = d / "eval.log";
    CHECK(normlab_cli({"eval", (d / "run").string(), "--split", "valid", "--beam", "1"}, log) == 1);
    const std::string text = slurp(log);
    const size_t scores = text.find("BLEU|"), error = text.find("normlab: error: cannot write");
    CHECK(scores != std::string::npos);
    CHECK(error != std::string::npos);
    CHECK(scores < error);
  }

  TEST_CASE("42.3, 42.12: a rank never hangs on a port held by something that does not answer") {
    const fs::path d = fresh("dist_hang");
    const fs::path m = write_manifest(d, 2);
    SilentServer server;
    const std::vector<std::string> env = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                          fmt::format("MASTER_PORT={}", server.port)};
    const fs::path log = d / "rank1.log";
    const auto t0 = std::chrono::steady_clock::now();
    const int code = finish_within(start_normlab({"train", m.string()}, log, env), 40);
    REQUIRE(code != kKilledAtDeadline);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(took < 15);  // dist_timeout_s = 3, plus the process's start
    CHECK(code == 2);
    const auto out = lines(slurp(log));
    REQUIRE(out.size() == 1);  // one line, no c10d retry log
    CHECK(out[0].find(fmt::format("127.0.0.1:{}", server.port)) != std::string::npos);
    // An address that does not resolve: one line after the timeout, not c10d's once a second.
    const fs::path log2 = d / "noaddr.log";
    CHECK(normlab_cli({"train", m.string()}, log2,
                      {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=no-such-host.invalid",
                       "MASTER_PORT=29999"}) == 2);
    CHECK(lines(slurp(log2)).size() == 1);
  }

  TEST_CASE("42.21: --nproc where RANK/WORLD_SIZE are already set is refused with one line") {
    const fs::path d = fresh("nproc_mix");
    const fs::path m = write_manifest(d, 2);
    const fs::path log = d / "log";
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(normlab_cli({"train", m.string(), "--nproc", "2"}, log,
                      {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29998"}) ==
          2);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15));
    const auto out = lines(slurp(log));
    REQUIRE(out.size() == 1);
    CHECK(out[0].find("--nproc 2: this process is already rank 0 of a job of 2") !=
          std::string::npos);
    CHECK_FALSE(fs::exists(d / "run"));
  }

  TEST_CASE("42.18: --nproc 2 with rank 0 SIGKILLed ends interrupted, exit 130") {
    const fs::path d = fresh("rank0_kill");
    const fs::path m = write_manifest(d, 100000, "");
    const fs::path run = d / "run";
    const fs::path log = d / "launcher.log";
    const pid_t launcher =
        start_normlab({"train", m.string(), "--nproc", "2", "--set", "run.dist_timeout_s=5"}, log);
    // Rank 0 writes status.json with its pid once it trains.
    int rank0 = 0;
    REQUIRE(wait_until([&] {
      if (!fs::exists(run / "status.json")) return false;
      const json st = json::parse(slurp(run / "status.json"), nullptr, false);
      if (!st.is_object() || st.value("status", "") != "running" || st.value("updates", 0) < 1)
        return false;
      rank0 = st.value("pid", 0);
      return rank0 > 0;
    }));
    ::kill(rank0, SIGKILL);
    CHECK(wait_normlab(launcher) == 130);
    const json st = json::parse(slurp(run / "status.json"));
    CHECK(st["status"] == "interrupted");
    CHECK(st.value("note", "").find("killed by signal 9") != std::string::npos);
  }
}

}  // namespace normlab_test_trust
