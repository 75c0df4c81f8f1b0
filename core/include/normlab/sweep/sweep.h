// Sweeps: a manifest with a [sweep] section expands into runs (a product of axes, zipped axes,
// exclusions); `normlab sweep` runs them as worker processes, `normlab run-one` trains one of them
// (what a Slurm array task runs). No LibTorch here: the driver only starts `normlab` processes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "normlab/manifest/experiment.h"

namespace normlab {

class PluginRegistry;

// One run of a sweep. Bad [sweep] input throws ManifestError ("file:line:column: [sweep] …").
struct SweepRun {
  int index = 0;   // position in the expansion (first axis varies slowest)
  std::string id;  // stable, readable, filesystem-safe; from the values that vary
  std::vector<std::string> overrides;         // the run's axis values as "section.key=value" (TOML)
  std::map<std::string, std::string> values;  // axis key → value text (strings without quotes)
  std::string dir;                            // the run directory, relative to the sweep directory
  std::map<std::string, std::string> literals;  // axis key → value as a TOML literal (typed)
  std::vector<std::string> origins;             // per override: "file:line:column" of its value
};

struct SweepPlan {
  std::string manifest;  // the sweep manifest as given (sweep.json and workers get it absolute)
  std::string name;      // [sweep] name, default the manifest's stem
  std::string dir;       // the sweep directory: [run] out_dir, default runs/<manifest stem>
  std::vector<std::string> sets;          // the command line's --set overrides
  std::vector<std::string> plugin_paths;  // --plugin-path, then [run] plugin_path (for validation)
  std::vector<SweepRun> runs;
  std::vector<int64_t> max_updates;  // per run, from its validated manifest (0 when not validated)
  std::vector<int64_t>
      threads;  // per run, its manifest's run.threads (0: all cores; when validated)
};

// The runs of `manifest` with the command line's `overrides`, each validated as a full manifest
// (scheme names and parameters through the plugins: built-in, NORMLAB_PLUGIN_PATH, [run]
// plugin_path).
std::vector<SweepRun> expand_sweep(const std::string& manifest,
                                   const std::vector<std::string>& overrides);

// The sweep directory of `manifest` with `overrides` (no validation of the runs).
std::string sweep_dir(const std::string& manifest, const std::vector<std::string>& overrides);

// Expands and, with a registry, validates every run up front (the first bad run throws
// ManifestError naming the file, the key and what was expected, and the run).
SweepPlan plan_sweep(const std::string& manifest, const std::vector<std::string>& overrides,
                     const PluginRegistry* registry);

// What run-one applies to the base manifest: the run's axis values, the plan's --set overrides,
// `extra` (e.g. run.threads from the driver), then run.out_dir = <sweep dir>/<run dir>.
std::vector<std::string> run_overrides(const SweepPlan& plan, const SweepRun& run,
                                       const std::vector<std::string>& extra = {});
// The run's validated manifest (throws ManifestError).
ExperimentSpec load_sweep_run(const SweepPlan& plan, const SweepRun& run,
                              const std::vector<std::string>& extra,
                              const PluginRegistry* registry);
std::string run_directory(const SweepPlan& plan, const SweepRun& run);  // <sweep dir>/<run dir>

// <sweep dir>/sweep.json: {"manifest", "name", "created", "sets", "runs": [{"index", "id", "dir",
// "overrides", "values"}]}. Writes it atomically when absent; accepts an existing one whose runs
// are all still in the plan unchanged (rewritten when the plan adds runs); otherwise throws
// ManifestError saying which run changed. Returns a line describing what it did ("" when nothing).
std::string sync_sweep_json(const SweepPlan& plan);
// Takes plan.dir for the sweep: new, empty, marked by normlab (.normlab-dir), or a sweep of a
// normlab from before the marker (sweep.json or sweep.lock). Throws util::DirectoryClaimError
// before writing anything into any other folder (one line naming it and what it holds).
void claim_sweep_directory(const SweepPlan& plan);
std::string sweep_json_text(const SweepPlan& plan, const std::string& created);

// What a run directory says about its run (status.json, train.jsonl, run.lock).
struct RunState {
  std::string status =
      "pending";  // pending | running | completed | stopped_early | diverged | interrupted | failed
  int64_t updates = 0;  // status.json's, or the last logged update when further
  std::string note;
  double best_valid_nll = -1;  // -1: no validation yet
  double best_valid_bleu = -1;
  // The mean acc of the in-loop downstream tasks (eval.tasks) at the newest update that scored
  // them all (-1: none).
  double task_average = -1;
  int64_t task_update = -1;
  int64_t max_updates = 0;  // status.json's (0: not known)
  double eta_s = -1;        // status.json's estimate of the time left (-1: not known)
  // OLMo 2's spike scores (%) of train.jsonl's training nll and gradient norm (-1: none scored).
  double loss_spike_score = -1, gnorm_spike_score = -1;
  bool locked = false;  // a live process holds run.lock
  int lock_pid = 0;
};
RunState read_run_state(const std::string& run_dir);
// The last "update" logged in train.jsonl (0 when none).
int64_t last_logged_update(const std::string& run_dir);

// Writes status.json {"status": "failed", "updates", "note"} for a worker that died (atomically).
void write_failed_status(const std::string& run_dir, int64_t updates, const std::string& note);

// Exit code run-one uses when another process already trains the run (the driver retries later).
constexpr int kExitRunBusy = 75;

struct SweepDriverOptions {
  int jobs = 1;
  bool retry_failed = false;
  std::vector<std::string> plugin_paths;  // passed on to the workers
  std::string executable;                 // the normlab executable (default: self_command_prefix)
  int cores = 0;                          // 0: the CPUs this process may use
  // > 0: every worker gets run.threads = this, recorded in its env.json; 0: each run's manifest
  // decides, so results never depend on `jobs` (thread counts change float reduction order).
  int threads_per_run = 0;
  // Empty: run I's worker is `normlab run-one MANIFEST --index I` and sweep.json is kept in sync.
  // Set (by `normlab frontier`, whose runs no [sweep] section lists): the worker's arguments after
  // the executable (the plugin paths are added), and no sweep.json.
  std::function<std::vector<std::string>(const SweepRun&)> worker_args;
};
// Runs every unfinished run of the plan, `jobs` worker processes at a time; returns the exit code
// (0 all completed or diverged, 1 any failed, 130 interrupted by SIGINT/SIGTERM).
int run_sweep(const SweepPlan& plan, const SweepDriverOptions& opt, std::ostream& out);

// The --status table of a sweep directory (from sweep.json, else from `plan`); with `json`, one
// JSON object {sweep, dir, source, runs: [{index, id, dir, status, updates, best_valid_nll,
// best_valid_bleu, pid, note}], counts: {status: n}} (absent values null).
void print_sweep_status(const SweepPlan& plan, std::ostream& out, bool json = false);

}  // namespace normlab
