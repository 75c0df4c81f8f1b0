#include <fmt/format.h>
#include <fmt/ostream.h>

#include <ostream>
#include <sstream>

#include "commands/commands.h"
#include "input_errors.h"
#include "local_launcher.h"
#include "normlab/analysis/run_probes.h"
#include "normlab/data/dataset.h"
#include "normlab/manifest/experiment.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "run/process_group.h"
#include "train/observers/standard_observers.h"
#include "train/run_directory.h"
#include "train/run_recipe.h"
#include "train/update_profiler.h"
#include "util/atomic_file.h"

namespace normlab {
namespace {

// This rank joins its data-parallel job: the backend the manifest asks for (auto: nccl on CUDA,
// gloo on CPU), this rank's device, and the resolved manifest's hash, which every rank must share.
std::unique_ptr<ProcessGroup> join_job(const ExperimentSpec& spec, const DistEnv& env) {
  const bool cuda = spec.run.device.rfind("cuda", 0) == 0;
  const std::string backend =
      spec.run.dist_backend == "auto" ? (cuda ? "nccl" : "gloo") : spec.run.dist_backend;
  const std::string device =
      spec.run.device == "cuda" ? fmt::format("cuda:{}", env.local_rank) : spec.run.device;
  const std::string resolved = resolved_manifest_text(spec);
  util::Sha256 hash;
  hash.update(resolved.data(), resolved.size());
  const std::string fingerprint = hash.hex();
  return ProcessGroup::join(env, backend, device, fingerprint,
                            std::chrono::milliseconds(int64_t(spec.run.dist_timeout_s * 1000)));
}

}  // namespace

// The command layer composes a run: the standard training observers (validation, test decode,
// train.jsonl, console, checkpoints, early stopping, status.json) and the analysis probes as one
// more run observer.
TrainOutcome train(const ExperimentSpec& spec, const PluginRegistry& registry, std::ostream& out,
                   const TrainControl& control) {
  // The other ranks of a data-parallel job record nothing: rank 0 writes the run directory.
  const bool leader = !control.group || control.group->leader();
  const std::unique_ptr<RunObserver> probes = leader ? analysis::make_probe_observer() : nullptr;
  const auto standard = standard_training_observers(leader);
  TrainControl composed = control;
  if (probes) composed.observers.insert(composed.observers.begin(), probes.get());
  std::vector<TrainingObserver*> own;
  for (const auto& o : standard) own.push_back(o.get());
  own.insert(own.end(), control.training_observers.begin(), control.training_observers.end());
  composed.training_observers = own;
  return run_training(spec, registry, out, composed);
}

int train_job(const ExperimentSpec& spec, const PluginRegistry& registry, TrainControl control,
              int nproc, std::ostream& out, std::ostream& err) {
  DistEnv env;
  try {
    env = dist_env_from_environment();
  } catch (const std::invalid_argument& e) {
    throw ManifestError(fmt::format("data-parallel job: {}", e.what()));
  }
  if (nproc > 1 && env.distributed() && !started_by_local_launcher())
    throw ManifestError(fmt::format(
        "--nproc {}: this process is already rank {} of a job of {} (RANK/WORLD_SIZE or SLURM_* "
        "set by a launcher); drop --nproc under torchrun/srun, or unset those variables to launch "
        "{} ranks here",
        nproc, env.rank, env.world, nproc));
  if (nproc > 1 && !env.distributed())
    return launch_local_ranks(nproc, spec.run.dist_timeout_s + 5, spec.run.out_dir, err);
  std::unique_ptr<ProcessGroup> group;
  if (env.distributed()) {
    try {
      group = join_job(spec, env);
    } catch (const JoinError& e) {
      fmt::print(err, "normlab: error: rank {}: {}\n", env.rank, e.what());
      return kExitBadInput;
    }
  }
  control.group = group.get();
  const std::string who = group ? fmt::format("rank {}: ", group->rank()) : "";
  try {
    std::ostream silent(nullptr);  // the other ranks' console: rank 0 speaks for the job
    const TrainOutcome o = train(spec, registry, group && !group->leader() ? silent : out, control);
    if (group && !group->leader() && o.exit_code != kExitCompleted && !o.note.empty())
      fmt::print(err, "normlab: {}{}\n", who, o.note);
    return o.exit_code;
  } catch (const RunBusyError& e) {
    fmt::print(err, "normlab: error: {}\n", e.what());
    return kExitBusy;
  } catch (const PeerLostError& e) {  // before the updates began (or after they ended)
    fmt::print(err, "normlab: error: {}{}\n", who, e.what());
    return kExitInterrupted;
  } catch (const std::exception& e) {
    if (!group || group->leader()) throw;  // rank 0's errors are reported as a single process's
    fmt::print(err, "normlab: error: {}{}\n", who, e.what());
    return kExitFailed;
  }
}

int train_command(const TrainOptions& opt, std::ostream& out, std::ostream& err) {
  return reporting_input_errors(err, [&]() -> int {
    try {  // before the setup, not after it
      UpdateProfiler::requested_update();
    } catch (const std::invalid_argument& e) {
      throw ManifestError(e.what());
    }
    // The manifest names extra plugin paths, so read it once for them, then validate fully.
    ExperimentSpec pre = load_manifest(opt.manifest, opt.overrides, nullptr);
    std::vector<std::filesystem::path> paths(opt.plugin_paths.begin(), opt.plugin_paths.end());
    for (const auto& p : pre.run.plugin_path) {
      std::filesystem::path pp(p);
      paths.push_back(pp.is_relative() ? std::filesystem::path(opt.manifest).parent_path() / pp
                                       : pp);
    }
    PluginRegistry registry(paths);
    ExperimentSpec spec = load_manifest(opt.manifest, opt.overrides, &registry);
    record_plugin_origin(spec, registry, opt.plugin_paths);
    if (opt.dump_config) {
      out << dump_manifest(spec);
      return kExitCompleted;
    }
    TrainControl control;
    control.allow_world_size_change = opt.allow_world_size_change;
    control.resume_from = opt.resume_from;
    control.allow_unverified = opt.allow_unverified;
    control.allow_data_change = opt.allow_data_change;
    return train_job(spec, registry, control, opt.nproc, out, err);
  });
}

int manifest_reference_command(std::ostream& out) {
  out << manifest_reference_markdown();
  return 0;
}

}  // namespace normlab
