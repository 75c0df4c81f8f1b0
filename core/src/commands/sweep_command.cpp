// `normlab sweep` (expand, --dry-run, --status, run the workers) and `normlab run-one` (train run I
// of a sweep: what a worker process and a Slurm array task run).
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <thread>

#include "commands/commands.h"
#include "input_errors.h"
#include "normlab/data/dataset.h"
#include "normlab/sweep/sweep.h"
#include "normlab/train/trainer.h"
#include "train/run_directory.h"
#include "train/run_recipe.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab {
namespace {

std::vector<fs::path> plugin_search_paths(const std::vector<std::string>& cli,
                                          const SweepPlan& plan) {
  std::vector<fs::path> paths(cli.begin(), cli.end());
  paths.insert(paths.end(), plan.plugin_paths.begin(), plan.plugin_paths.end());
  return paths;
}

void print_dry_run(const SweepPlan& plan, std::ostream& out) {
  size_t w = 2;
  for (const auto& r : plan.runs) w = std::max(w, r.id.size());
  fmt::print(out, "sweep {}: {} runs in {} (every run's manifest validated)\n", plan.name,
             plan.runs.size(), plan.dir);
  fmt::print(out, "{:>4}  {:<{}}  {:<11}  {}\n", "#", "id", w, "now", "overrides");
  for (const auto& r : plan.runs) {
    const RunState s = read_run_state(run_directory(plan, r));
    std::string now = s.status == "pending" ? "new" : s.status;
    fmt::print(out, "{:>4}  {:<{}}  {:<11}  {}\n", r.index, r.id, w, now,
               fmt::join(r.overrides, " "));
  }
}

// sweep.json for a sweep started run by run (a Slurm array): written when absent; when present,
// run I must still be the run it lists.
void check_sweep_json(const SweepPlan& plan, const SweepRun& run) {
  const fs::path path = fs::path(plan.dir) / "sweep.json";
  if (!fs::exists(path)) {
    SweepPlan listed = plan;
    listed.sets.clear();
    for (const auto& s : plan.sets)
      if (s.rfind("run.threads=", 0) != 0) listed.sets.push_back(s);
    claim_sweep_directory(plan);
    util::write_file_atomically(path, sweep_json_text(listed, ""));
    return;
  }
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f, nullptr, false);
  if (!j.is_object() || !j.contains("runs") || !j["runs"].is_array()) return;
  for (const auto& r : j["runs"]) {
    if (r.value("index", -1) != run.index) continue;
    if (r.value("id", "") != run.id)
      throw ManifestError(
          fmt::format("{}: run {} is '{}' in {} but '{}' in the expansion of the manifest now; the "
                      "manifest changed under a running sweep",
                      plan.manifest, run.index, r.value("id", ""), path.string(), run.id));
    return;
  }
}

}  // namespace

int sweep_command(const SweepOptions& opt, std::ostream& out, std::ostream& err) {
  return reporting_input_errors(err, [&] {
    if (opt.jobs < 1) throw ManifestError(fmt::format("--jobs {}: expected at least 1", opt.jobs));
    SweepPlan plan = plan_sweep(opt.manifest, opt.overrides, nullptr);
    if (opt.status) {
      // --watch S: the table again every S seconds until no run is pending or running.
      const bool clear =
          opt.watch_s > 0 && !opt.json && &out == &std::cout && isatty(STDOUT_FILENO);
      for (bool first = true;; first = false) {
        if (clear)
          out << "\033[H\033[2J";
        else if (!first)
          out << "\n";
        print_sweep_status(plan, out, opt.json);
        out.flush();
        if (opt.watch_s <= 0) return 0;
        bool open_runs = false;
        for (const auto& r : plan.runs) {
          const std::string st = read_run_state(run_directory(plan, r)).status;
          open_runs = open_runs || !(st == "completed" || st == "diverged" ||
                                     st == "stopped_early" || st == "failed");
        }
        if (!open_runs) return 0;
        std::this_thread::sleep_for(std::chrono::duration<double>(opt.watch_s));
      }
    }
    {
      // Every run validated before any worker starts (then the plugins are unloaded again).
      PluginRegistry registry(plugin_search_paths(opt.plugin_paths, plan));
      plan = plan_sweep(opt.manifest, opt.overrides, &registry);
    }
    if (opt.slurm) {
      // One array task per run not yet completed or diverged; `run-one` applies the --sets itself.
      sync_sweep_json(plan);
      std::vector<int> todo;
      for (const auto& r : plan.runs) {
        const std::string st = read_run_state(run_directory(plan, r)).status;
        if (st != "completed" && st != "diverged" && st != "stopped_early") todo.push_back(r.index);
      }
      if (todo.empty()) {
        fmt::print(out, "sweep {}: every run is completed or diverged; nothing to submit\n",
                   plan.name);
        return 0;
      }
      SlurmOptions so = opt.slurm_opt;
      so.submit = !opt.dry_run;
      std::string script;
      std::string job;
      try {
        job = submit_slurm(so, current_executable(), fs::absolute(plan.manifest).string(),
                           opt.overrides, todo, fs::absolute(plan.dir).string(), &script);
      } catch (const std::runtime_error& e) {
        fmt::print(err, "normlab: error: {}\n", e.what());
        return int(kExitFailed);
      }
      if (opt.dry_run) {
        fmt::print(out, "wrote {} ({} array tasks); submit it with: sbatch {}\n", script,
                   todo.size(), script);
        return 0;
      }
      fmt::print(out, "{}",
                 slurm_watch_hint(job, opt.manifest, fs::absolute(plan.dir).string(), script,
                                  opt.overrides));
      return 0;
    }
    if (opt.dry_run) {
      print_dry_run(plan, out);
      return 0;
    }
    SweepDriverOptions d;
    d.jobs = opt.jobs;
    d.threads_per_run = opt.threads_per_run;
    d.retry_failed = opt.retry_failed;
    d.plugin_paths = opt.plugin_paths;
    return run_sweep(plan, d, out);
  });
}

int run_one_command(const RunOneOptions& opt, std::ostream& out, std::ostream& err) {
  return reporting_input_errors(err, [&] {
    const SweepPlan plan = plan_sweep(opt.manifest, opt.overrides, nullptr);
    if (opt.index < 0 || opt.index >= int(plan.runs.size()))
      throw ManifestError(fmt::format("--index {}: expected 0 to {} ({} has {} runs)", opt.index,
                                      int(plan.runs.size()) - 1, opt.manifest, plan.runs.size()));
    const SweepRun& run = plan.runs[size_t(opt.index)];
    PluginRegistry registry(plugin_search_paths(opt.plugin_paths, plan));
    ExperimentSpec spec;
    try {
      spec = load_sweep_run(plan, run, {}, &registry);
    } catch (const ManifestError& e) {
      throw ManifestError(fmt::format("{} (sweep run {} '{}')", e.what(), run.index, run.id));
    }
    record_plugin_origin(spec, registry, opt.plugin_paths);
    check_sweep_json(plan, run);
    const std::string dir = run_directory(plan, run);
    fmt::print(out, "run-one: run {} of {} ('{}') of sweep {} in {}\n", run.index, plan.runs.size(),
               run.id, plan.name, dir);
    // One process per run directory (train() holds its run.lock); a previous worker may still be
    // saving its checkpoint, so wait a little before giving the run back to the driver.
    TrainControl control;
    control.lock_wait = std::chrono::seconds(10);
    // Under `srun --ntasks K` (sweep --slurm --ntasks-per-run K) each task is one rank of the run.
    return train_job(spec, registry, control, /*nproc=*/0, out, err);
  });
}

}  // namespace normlab
