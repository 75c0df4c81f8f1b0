#include "run_directory.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <regex>
#include <sstream>
#include <thread>

#include "normlab/manifest/experiment.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab {

namespace {

// NaN → null: JSON has no NaN.
json number_or_null(double x) { return std::isfinite(x) ? json(x) : json(); }

}  // namespace

std::string iso8601_utc(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

RunDirectory::RunDirectory(fs::path dir, std::chrono::milliseconds wait) : dir_(std::move(dir)) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  int holder = 0;
  while (!(lock_ = util::FileLock::try_acquire(dir_ / "run.lock", &holder))) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw RunBusyError(
          fmt::format("{}: another process (pid {}) is training in this run directory (it holds "
                      "run.lock); wait for it or choose another [run] out_dir",
                      dir_.string(), holder));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  fs::create_directories(dir_ / "checkpoints");
  // What a killed writer left (a checkpoint-sized last.safetensors.tmp.PID.N): the lock is ours, so
  // only readers (eval writes eval/) may be at work here, and a live process's files stay.
  util::remove_stale_temporaries(dir_);
  util::remove_stale_temporaries(dir_ / "checkpoints");
  // A resumed run keeps the time it was first started.
  const json old = util::read_json_file(dir_ / "status.json");
  started_ = old.is_object() && old.contains("started") && old["started"].is_string()
                 ? old["started"].get<std::string>()
                 : iso8601_utc(std::chrono::system_clock::now());
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  host_ = host;
}

void claim_run_directory(const fs::path& dir, const std::string& what) {
  util::claim_directory(dir, "run", what, [](const fs::path& d) {
    return fs::exists(d / "run.lock");  // only normlab makes it
  });
}

bool mark_interrupted_if_running(const fs::path& dir, int pid, const std::string& note) noexcept {
  try {
    int holder = 0;
    const auto lock = util::FileLock::try_acquire(dir / "run.lock", &holder);
    if (!lock) return false;  // a rerun already took the run over
    json st = util::read_json_file(dir / "status.json");
    if (!st.is_object() || st.value("status", "") != "running" || st.value("pid", 0) != pid)
      return false;
    st["status"] = "interrupted";
    st["phase"] = nullptr;
    st["note"] = note;
    st["updated"] = iso8601_utc(std::chrono::system_clock::now());
    util::write_file_atomically(dir / "status.json", st.dump(2) + "\n");
    return true;
  } catch (...) {
    return false;
  }
}

RunDirectory RunDirectory::reader(fs::path dir) {
  RunDirectory r;
  r.dir_ = std::move(dir);
  return r;
}

void RunDirectory::require_writer() const {
  if (!writer())
    throw std::logic_error(fmt::format(
        "{}: written by another rank (rank 0 of the job holds run.lock)", dir_.string()));
}

void RunDirectory::write_file(const std::string& name, const std::string& text) const {
  require_writer();
  util::write_file_atomically(dir_ / name, text);
}

std::string RunDirectory::read_file_or_empty(const std::string& name) const {
  std::ifstream f(dir_ / name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void RunDirectory::write_status(const std::string& status, const RunProgress& p,
                                const std::string& note) {
  require_writer();
  json j = {{"status", status},
            {"updates", p.updates},
            {"max_updates", p.max_updates},
            {"epoch", p.epoch},
            {"phase", p.phase.empty() ? json() : json(p.phase)},
            {"train_loss", number_or_null(p.train_loss)},
            {"train_nll", number_or_null(p.train_nll)},
            {"valid_loss", number_or_null(p.valid_loss)},
            {"valid_nll", number_or_null(p.valid_nll)},
            {"valid_bleu", p.valid_bleu >= 0 ? json(p.valid_bleu) : json()},
            {"tokens_per_s", p.tokens_per_s},
            {"eta_s", p.eta_s >= 0 ? json(std::round(p.eta_s)) : json()},
            {"elapsed_s", p.elapsed_s},
            {"started", started_},
            {"updated", iso8601_utc(std::chrono::system_clock::now())},
            {"pid", int64_t(::getpid())},
            {"host", host_}};
  if (!note.empty()) j["note"] = note;
  write_file("status.json", j.dump(2) + "\n");
}

void RunDirectory::write_final_status_noexcept(const std::string& status, const RunProgress& p,
                                               const std::string& note) noexcept {
  if (!writer()) return;  // another rank's: the status is rank 0's
  try {
    write_status(status, p, note);
  } catch (...) {
    // The disk may be what failed; the error that ended the run is reported by the caller.
  }
}

RunDirectory::Sums RunDirectory::read_sums() const {
  return read_sums_file(dir_ / "checkpoints" / "SHA256SUMS");
}

void RunDirectory::write_sums(const Sums& sums) {
  require_writer();
  std::string text;
  for (const auto& [name, hash] : sums) text += fmt::format("{}  {}\n", hash, name);
  util::write_file_atomically(dir_ / "checkpoints" / "SHA256SUMS", text);
}

void RunDirectory::save_checkpoint(const std::string& name,
                                   const std::function<void(util::AtomicFile&)>& fill) {
  require_writer();
  util::AtomicFile file(checkpoint(name));
  fill(file);
  const std::string hash = file.finish();
  Sums sums = read_sums();
  sums.emplace(name, hash);  // the old file's hash stays listed until the rename is done
  write_sums(sums);
  file.publish();
  sums.erase(name);
  sums.emplace(name, hash);
  write_sums(sums);
}

void RunDirectory::link_checkpoint(const std::string& from, const std::string& to) {
  require_writer();
  const fs::path src = checkpoint(from), dst = checkpoint(to);
  const fs::path tmp = dst.string() + fmt::format(".tmp.{}", ::getpid());
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_hard_link(src, tmp, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(src, tmp, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      fs::remove(tmp, ec);
      throw util::FileError(fmt::format("cannot write {}: {}", dst.string(), ec.message()));
    }
  }
  Sums sums = read_sums();
  auto range = sums.equal_range(from);
  std::vector<std::string> hashes;
  for (auto it = range.first; it != range.second; ++it) hashes.push_back(it->second);
  sums.erase(to);
  // The newest hash of `from` is the one just published (listed last by save_checkpoint).
  if (!hashes.empty()) sums.emplace(to, hashes.back());
  write_sums(sums);
  fs::rename(tmp, dst, ec);
  const std::error_code rename_error = ec;
  // rename() of two links to one file does nothing and leaves tmp: remove it either way.
  fs::remove(tmp, ec);
  if (rename_error)
    throw util::FileError(fmt::format("cannot write {}: {}", dst.string(), rename_error.message()));
  util::sync_directory(dst.parent_path());
}

namespace {
// The step_N.safetensors files of a checkpoints folder, ascending.
std::vector<std::pair<int64_t, fs::path>> step_files(const fs::path& folder) {
  static const std::regex step_name(R"(step_(\d+)\.safetensors)");
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, step_name)) out.emplace_back(std::stoll(m[1]), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<fs::path> newest_good_step_in(const fs::path& folder) {
  auto all = step_files(folder);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (checksum_problem(it->second).empty()) return it->second;
  return std::nullopt;
}
}  // namespace

std::vector<std::pair<int64_t, fs::path>> RunDirectory::steps() const {
  return step_files(dir_ / "checkpoints");
}

void RunDirectory::prune_steps(int64_t keep) {
  require_writer();
  auto all = steps();
  // step_0.safetensors is the initialization (run.save_initial), kept for init studies: never
  // pruned.
  all.erase(std::remove_if(all.begin(), all.end(), [](const auto& s) { return s.first == 0; }),
            all.end());
  if (int64_t(all.size()) <= keep) return;
  Sums sums = read_sums();
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i].second, ec);
    sums.erase(all[i].second.filename().string());
  }
  write_sums(sums);
}

std::optional<fs::path> RunDirectory::resume_point(const std::string& resume_from,
                                                   bool allow_unverified) const {
  const fs::path file =
      resume_from.empty() ? checkpoint("last.safetensors") : fs::path(resume_from);
  if (resume_from.empty() && !fs::exists(file)) {
    if (const std::string hint = legacy_checkpoint_hint(dir_); !hint.empty())
      throw CheckpointError(
          fmt::format("run directory {} cannot be resumed{}", dir_.string(), hint));
    return std::nullopt;
  }
  const std::string problem = checkpoint_problem(file);
  if (problem.empty() || allow_unverified) return file;
  // Beside the checkpoint: a branch's --resume-from names another run's folder.
  const auto good = newest_good_step_in(fs::absolute(file).parent_path());
  throw CheckpointError(fmt::format(
      "checkpoint {}: {}; {} {}", file.string(), problem,
      good ? fmt::format("resume from the newest good one beside it with --resume-from {}",
                         good->string())
           : std::string("no step_N.safetensors beside it has a matching checksum to resume from"),
      "or, to use it anyway, pass --allow-unverified"));
}

void RunDirectory::save_last(int64_t updates, bool with_step, int64_t keep_last,
                             const std::function<void(util::AtomicFile&)>& fill) {
  require_writer();
  save_checkpoint("last.safetensors", fill);
  finish_last(updates, with_step, keep_last);
}

void RunDirectory::finish_last(int64_t updates, bool with_step, int64_t keep_last) {
  require_writer();
  const std::string step = fmt::format("step_{}.safetensors", updates);
  if ((with_step || fs::exists(checkpoint(step))) && keep_last > 0)
    link_checkpoint("last.safetensors", step);
  prune_steps(keep_last);
}

util::JsonlLog RunDirectory::training_log(int64_t updates_done) const {
  require_writer();
  util::drop_records_after(dir_ / "train.jsonl", updates_done);
  return util::JsonlLog(dir_ / "train.jsonl");
}

namespace {

// Lines of a resolved manifest that may change between the start and a resume of one run.
bool may_change_on_resume(const std::string& line) {
  for (const char* k : {"max_updates",
                        "max_epochs",
                        "log_interval",
                        "checkpoint_interval",
                        "interval",
                        "threads",
                        "device",
                        "bleu",
                        "bleu_max_sentences",
                        "out_dir",
                        "bleu_after_updates",
                        "bleu_every",
                        "patience",
                        "formats",
                        "checkpoint_keep_last",
                        "checkpoint_save_best",
                        "allow_oversize",
                        "init_on_cpu",
                        "activation_checkpointing",
                        "test_beam",
                        "save_initial",
                        "plugin_path",
                        "tasks",
                        "tasks_interval",
                        "tasks_limit",
                        "tasks_shots"})
    if (line.rfind(std::string(k) + " = ", 0) == 0) return true;
  return line.rfind("# source:", 0) == 0;
}

// Keys added since a run may have started (absent from its manifest.resolved.toml), whose values
// may change on a resume: the data-parallel settings; and optim.no_decay at the value that is what
// such a run did (every parameter decayed).
bool newer_key(const std::string& line) {
  return line.rfind("dist_backend = ", 0) == 0 || line.rfind("dist_timeout_s = ", 0) == 0 ||
         line.rfind("shard_optimizer = ", 0) == 0 || line.rfind("init_on_cpu = ", 0) == 0 ||
         line == "tf32 = false" || line.rfind("cuda_graph = ", 0) == 0 ||
         line == "no_decay = 'nothing'" || line == "no_decay = \"nothing\"" ||
         line.rfind("tasks = ", 0) == 0 || line.rfind("tasks_interval = ", 0) == 0 ||
         line.rfind("tasks_limit = ", 0) == 0 || line.rfind("tasks_shots = ", 0) == 0 ||
         line.rfind("decay_updates = ", 0) == 0 || line.rfind("decay_shape = ", 0) == 0;
}

// A resolved manifest's lines by key ("section.key" → its lines), in order. Compared key by key,
// not line by line: a newer key present on one side only shifted the lines, and a resume with
// run.tf32 changed was refused naming two unrelated lines (issue 56.19).
std::vector<std::pair<std::string, std::string>> manifest_entries(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string section, line;
  while (std::getline(in, line)) {
    if (line.empty() || line.rfind("#", 0) == 0) continue;
    if (line.front() == '[') {
      section = line;
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos && !out.empty()) {
      out.back().second += "\n" + line;  // a value continued on this line
      continue;
    }
    out.emplace_back(section + " " + line.substr(0, eq), line);
  }
  return out;
}

std::string manifest_difference(const std::string& before, const std::string& now) {
  const auto a = manifest_entries(before), b = manifest_entries(now);
  auto find = [](const auto& entries, const std::string& key) -> const std::string* {
    for (const auto& [k, line] : entries)
      if (k == key) return &line;
    return nullptr;
  };
  auto where = [](const std::string& key) {  // "[optim] lr" → "[optim] "
    return key.substr(0, key.find(' ') + 1);
  };
  for (const auto& [key, now_line] : b) {
    const std::string* was = find(a, key);
    if (!was) {
      if (!newer_key(now_line)) return fmt::format("{}'{}' is new", where(key), now_line);
      continue;
    }
    if (*was != now_line && !(may_change_on_resume(*was) && may_change_on_resume(now_line)) &&
        !(newer_key(*was) && newer_key(now_line)))
      return fmt::format("{}'{}' became '{}'", where(key), *was, now_line);
  }
  for (const auto& [key, was_line] : a)
    if (!find(b, key) && !newer_key(was_line))
      return fmt::format("{}'{}' is no longer there", where(key), was_line);
  return "";
}

// `dir`'s manifest.resolved.toml, or nothing where it has none.
std::optional<std::string> resolved_manifest_of(const fs::path& dir) {
  std::ifstream f(dir / "manifest.resolved.toml");
  if (!f) return std::nullopt;
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

}  // namespace

std::string manifest_section_change(const fs::path& dir, const std::string& resolved,
                                    const std::string& section) {
  const std::optional<std::string> before = resolved_manifest_of(dir);
  if (!before) return "";
  const std::string head = "[" + section + "] ";
  const auto was = manifest_entries(*before), now = manifest_entries(resolved);
  const auto find = [&](const auto& entries, const std::string& key) -> std::string {
    for (const auto& [k, line] : entries)
      if (k == key) return line;
    return "(absent)";
  };
  for (const auto* side : {&now, &was})
    for (const auto& [key, line] : *side)
      if (key.rfind(head, 0) == 0 && find(was, key) != find(now, key))
        return fmt::format("[{}] '{}' in the checkpoint's run, '{}' in this one", section,
                           find(was, key), find(now, key));
  return "";
}

std::string run_manifest_change(const fs::path& dir, const std::string& resolved) {
  const std::optional<std::string> before = resolved_manifest_of(dir);
  return before ? manifest_difference(*before, resolved) : "";
}

std::optional<TrainOutcome> finished_run(const ExperimentSpec& spec, const fs::path& dir,
                                         const std::string& resolved, std::ostream& out) {
  if (!fs::exists(dir / "manifest.resolved.toml")) return std::nullopt;
  const std::string diff = run_manifest_change(dir, resolved);
  if (!diff.empty())
    throw ManifestError(
        fmt::format("{}: run directory {} belongs to another experiment ({}); "
                    "choose another [run] out_dir",
                    spec.source, dir.string(), diff));
  if (!fs::exists(dir / "status.json")) return std::nullopt;
  const json st = util::read_json_file(dir / "status.json");
  const std::string status = st.is_object() ? st.value("status", "") : "";
  const bool finished =
      status == "diverged" || status == "stopped_early" ||
      (status == "completed" && st.value("updates", int64_t(0)) >= spec.optim.max_updates);
  if (!finished) return std::nullopt;
  TrainOutcome o;
  o.status = status;
  o.updates = st.value("updates", int64_t(0));
  o.note = st.value("note", "");
  o.exit_code = o.status == "diverged" ? kExitDiverged : kExitCompleted;
  fmt::print(out, "{}: already {} at update {} — nothing to do (status.json)\n", dir.string(),
             o.status, o.updates);
  return o;
}

}  // namespace normlab
