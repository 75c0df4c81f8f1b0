// What a run directory says about its run (status.json, train.jsonl, run.lock) and the --status
// table.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "normlab/sweep/sweep.h"
#include "train/spike_score.h"
#include "util/atomic_file.h"
#include "util/file_lock.h"
#include "util/record_file.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab {
namespace {

// Bytes a run directory takes on disk, each file once (step_N.safetensors is a hard link to
// last.safetensors).
uint64_t disk_use(const fs::path& dir) {
  std::set<std::pair<dev_t, ino_t>> seen;
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (seen.insert({st.st_dev, st.st_ino}).second) total += uint64_t(st.st_blocks) * 512;
  }
  return total;
}

std::string size_text(uint64_t bytes) {
  if (bytes < 1024 * 1024) return fmt::format("{:.0f}K", double(bytes) / 1024);
  if (bytes < 1024ull * 1024 * 1024) return fmt::format("{:.1f}M", double(bytes) / (1024 * 1024));
  return fmt::format("{:.2f}G", double(bytes) / (1024.0 * 1024 * 1024));
}

}  // namespace

int64_t last_logged_update(const std::string& run_dir) {
  std::ifstream f(fs::path(run_dir) / "train.jsonl", std::ios::binary);
  if (!f) return 0;
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 8192);
  f.seekg(from);
  std::string tail((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream lines(tail);
  std::string line;
  int64_t last = 0;
  while (std::getline(lines, line)) {
    const json j =
        json::parse(line, nullptr, false);  // the first line may be cut, the last half written
    if (j.is_object() && j.value("kind", "") == "train")
      last = std::max(last, j.value("update", int64_t(0)));
  }
  return last;
}

RunState read_run_state(const std::string& run_dir) {
  RunState s;
  const fs::path dir(run_dir);
  const json st = util::read_json_file(dir / "status.json");
  if (st.is_object()) {
    s.status = st.value("status", "pending");
    s.updates = st.value("updates", int64_t(0));
    s.note = st.value("note", "");
    s.max_updates = st.value("max_updates", int64_t(0));
    if (st.contains("eta_s") && st["eta_s"].is_number()) s.eta_s = st["eta_s"].get<double>();
  }
  std::ifstream f(dir / "train.jsonl");
  std::string line;
  int64_t last = 0;
  std::map<int64_t, std::map<std::string, double>> task_acc;  // update → task → acc
  std::set<std::string> tasks;
  TrainSeries series;
  while (std::getline(f, line)) {
    const json j = json::parse(line, nullptr, false);
    series.add(j);
    if (!j.is_object()) continue;
    if (j.value("kind", "") == "train") last = std::max(last, j.value("update", int64_t(0)));
    if (j.value("kind", "") == "task" && j.contains("task") && j["task"].is_string() &&
        j.contains("acc") && j["acc"].is_number() && j.contains("update") &&
        j["update"].is_number_integer()) {
      tasks.insert(j["task"].get<std::string>());
      task_acc[j["update"].get<int64_t>()][j["task"].get<std::string>()] = j["acc"].get<double>();
    }
    if (j.value("kind", "") != "valid") continue;
    const double nll = j.value("nll", -1.0);
    if (nll >= 0 && (s.best_valid_nll < 0 || nll < s.best_valid_nll)) s.best_valid_nll = nll;
    if (j.contains("bleu")) s.best_valid_bleu = std::max(s.best_valid_bleu, j.value("bleu", -1.0));
  }
  for (auto it = task_acc.rbegin(); it != task_acc.rend(); ++it) {
    if (it->second.size() != tasks.size()) continue;  // an evaluation cut short
    double sum = 0;
    for (const auto& [name, acc] : it->second) sum += acc;
    s.task_average = sum / double(tasks.size());
    s.task_update = it->first;
    break;
  }
  if (s.status == "running" || s.status == "pending") s.updates = std::max(s.updates, last);
  const RunSpikeScores spikes = series.scores();
  s.loss_spike_score = spikes.loss.percent, s.gnorm_spike_score = spikes.gnorm.percent;
  s.lock_pid = util::lock_holder(dir / "run.lock", &s.locked);
  return s;
}

void write_failed_status(const std::string& run_dir, int64_t updates, const std::string& note) {
  const json j = {{"status", "failed"}, {"updates", updates}, {"note", note}};
  util::write_file_atomically(fs::path(run_dir) / "status.json", j.dump(2) + "\n");
}

void print_sweep_status(const SweepPlan& plan, std::ostream& out, bool as_json) {
  struct Row {
    std::string id, dir;
  };
  std::vector<Row> rows;
  const json sj = util::read_json_file(fs::path(plan.dir) / "sweep.json");
  std::string source;
  if (sj.is_object() && sj.contains("runs") && sj["runs"].is_array()) {
    for (const auto& r : sj["runs"])
      rows.push_back({r.value("id", ""), r.value("dir", r.value("id", ""))});
    source = (fs::path(plan.dir) / "sweep.json").string();
  } else {
    for (const auto& r : plan.runs) rows.push_back({r.id, r.dir});
    source = plan.manifest + " (no sweep.json yet)";
  }
  size_t w = 2;
  for (const auto& r : rows) w = std::max(w, r.id.size());
  std::vector<RunState> states;
  bool any_tasks = false;  // a column for the in-loop tasks' average when a run scored them
  for (const auto& r : rows) {
    states.push_back(read_run_state((fs::path(plan.dir) / r.dir).string()));
    any_tasks = any_tasks || states.back().task_average >= 0;
  }
  const std::string tasks_head = any_tasks ? fmt::format("  {:>9}", "tasks acc") : "";
  if (!as_json) {
    fmt::print(out, "sweep {} in {}: {} runs (from {})\n", plan.name, plan.dir, rows.size(),
               source);
    fmt::print(out,
               "{:>4}  {:<{}}  {:<13}  {:>8}  {:>5}  {:>8}  {:>10}  {:>10}{}  {:>11}  {:>7}  {}\n",
               "#", "id", w, "status", "updates", "done", "ETA", "best nll", "BLEU|ppl", tasks_head,
               "spikes %", "disk", "note");
  }
  std::map<std::string, int> counts;
  json runs = json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    const fs::path dir = fs::path(plan.dir) / rows[i].dir;
    const RunState& s = states[i];
    const uint64_t disk = fs::exists(dir) ? disk_use(dir) : 0;
    std::string status = s.status, note = s.note;
    if (s.status == "running" && !s.locked)
      note =
          "no process holds run.lock: it stopped without writing its status; re-run the sweep to "
          "resume";
    if (s.locked && s.status != "running") status = "running", note = "";
    ++counts[status];
    // Progress and ETA from the status.json the trainer rewrites at every log interval.
    const bool has_eta = status == "running" && s.eta_s >= 0;
    if (as_json) {
      // Absent values are null, not the table's "-".
      runs.push_back(
          {{"index", i},
           {"id", rows[i].id},
           {"dir", dir.string()},
           {"status", status},
           {"updates", s.updates},
           {"max_updates", s.max_updates > 0 ? json(s.max_updates) : json()},
           {"eta_s", has_eta ? json(s.eta_s) : json()},
           {"best_valid_nll", s.best_valid_nll >= 0 ? json(s.best_valid_nll) : json()},
           {"best_valid_bleu", s.best_valid_bleu >= 0 ? json(s.best_valid_bleu) : json()},
           {"best_valid_ppl", s.best_valid_nll >= 0 ? json(std::exp(s.best_valid_nll)) : json()},
           {"tasks_average_acc", s.task_average >= 0 ? json(s.task_average) : json()},
           {"tasks_update", s.task_update >= 0 ? json(s.task_update) : json()},
           {"loss_spike_score", s.loss_spike_score >= 0 ? json(s.loss_spike_score) : json()},
           {"gnorm_spike_score", s.gnorm_spike_score >= 0 ? json(s.gnorm_spike_score) : json()},
           {"pid", s.locked && s.lock_pid ? json(s.lock_pid) : json()},
           {"disk_bytes", disk},
           {"note", note}});
      continue;
    }
    if (s.locked && s.lock_pid)
      note = fmt::format("pid {}{}", s.lock_pid, note.empty() ? "" : "; " + note);
    const std::string done =
        s.max_updates > 0
            ? fmt::format("{}%", 100 * std::min(s.updates, s.max_updates) / s.max_updates)
            : "-";
    const std::string eta = has_eta ? fmt::format("{}:{:02}:{:02}", int64_t(s.eta_s) / 3600,
                                                  int64_t(s.eta_s) / 60 % 60, int64_t(s.eta_s) % 60)
                                    : "-";
    const std::string tasks_cell =
        !any_tasks ? ""
                   : fmt::format("  {:>9}",
                                 s.task_average >= 0 ? fmt::format("{:.4f}", s.task_average) : "-");
    // OLMo 2's spike scores, loss/gnorm (docs/analysis.md#loss-spikes).
    auto spike = [](double p) { return p >= 0 ? fmt::format("{:.1f}", p) : std::string("-"); };
    const std::string spikes = s.loss_spike_score < 0 && s.gnorm_spike_score < 0
                                   ? "-"
                                   : spike(s.loss_spike_score) + "/" + spike(s.gnorm_spike_score);
    fmt::print(out,
               "{:>4}  {:<{}}  {:<13}  {:>8}  {:>5}  {:>8}  {:>10}  {:>10}{}  {:>11}  {:>7}  {}\n",
               i, rows[i].id, w, status, s.updates, done, eta,
               s.best_valid_nll >= 0 ? fmt::format("{:.4f}", s.best_valid_nll) : "-",
               // BLEU where the run measures it (translation), else the validation perplexity
               s.best_valid_bleu >= 0  ? fmt::format("{:.2f}", s.best_valid_bleu)
               : s.best_valid_nll >= 0 ? fmt::format("ppl {:.2f}", std::exp(s.best_valid_nll))
                                       : "-",
               tasks_cell, spikes, disk > 0 ? size_text(disk) : "-", note);
  }
  static const char* const kStatuses[] = {"completed",   "stopped_early", "diverged", "running",
                                          "interrupted", "failed",        "pending"};
  if (as_json) {
    json totals = json::object();
    for (const char* k : kStatuses) totals[k] = counts[k];
    const json j = {{"sweep", plan.name},
                    {"dir", plan.dir},
                    {"source", source},
                    {"runs", runs},
                    {"counts", totals}};
    out << j.dump(2) << "\n";
    return;
  }
  std::vector<std::string> parts;
  for (const char* k : kStatuses)
    if (counts[k] > 0 || std::string(k) != "stopped_early")
      parts.push_back(fmt::format("{} {}", counts[k], k));
  fmt::print(out, "{}\n", fmt::join(parts, " | "));
}

}  // namespace normlab
