// Training from a validated manifest: data, model, scheme hooks, validation, checkpoints, resume.
// The trainer publishes run events (run_events.h) to the observers a caller registers.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <limits>
#include <string>
#include <vector>

#include "normlab/manifest/experiment.h"

namespace normlab {

class PluginRegistry;
class RunObserver;
class TrainingObserver;

// Process exit codes of `normlab train`.
enum ExitCode : int {
  kExitCompleted = 0,
  kExitFailed = 1,
  kExitBadInput = 2,  // manifest, data or plugin error, before training starts
  kExitDiverged =
      3,           // a result: non-finite loss/gradient or loss blow-up, recorded with its update
  kExitBusy = 75,  // another process holds the run directory's run.lock (EX_TEMPFAIL)
  kExitInterrupted = 130  // SIGINT/SIGTERM: checkpoint saved, the same command resumes
};

struct TrainOutcome {
  std::string status;  // completed | diverged | interrupted
  int64_t updates = 0;
  std::string note;  // diverged: "diverged at update k: <first non-finite module>"
  int exit_code = kExitCompleted;
  // The mean nll of the last log interval (status.json train_nll); NaN: no interval logged in this
  // process (a resume with no update left).
  double last_train_nll = std::numeric_limits<double>::quiet_NaN();
  double uniform_loss = 0;
  double last_valid_nll = 0, best_valid_nll = 0, last_valid_bleu = -1;
};

// How to start or resume, beyond the manifest.
class ProcessGroup;

struct TrainControl {
  // A data-parallel job's group (run/process_group.h), not owned; null: this process alone. Rank 0
  // writes the run directory; every rank trains on its share of each update's batches.
  ProcessGroup* group = nullptr;
  // Resume a checkpoint written by another number of ranks, with optim.update_freq rescaled so the
  // batches per update (over all ranks) stay those of the checkpoint.
  bool allow_world_size_change = false;
  std::string
      resume_from;  // a checkpoint to resume from instead of <run>/checkpoints/last.safetensors
  bool allow_unverified = false;  // resume even when SHA256SUMS does not vouch for the checkpoint
  // Resume although the data differ from the data the checkpoint's run trained on (issue 56.4).
  bool allow_data_change = false;
  std::chrono::milliseconds lock_wait{1000};  // how long to wait for another holder of run.lock
  std::vector<RunObserver*> observers;        // get every run event, in this order (not owned)
  // The run's own observers (validation, checkpoints, logs, …: core/src/train/observers/); empty:
  // the standard set. Not owned.
  std::vector<TrainingObserver*> training_observers;
};

// Trains (or resumes) into spec.run.out_dir, holding its run.lock, publishing the run's events to
// control.observers. Every run that started ends with a final status.json (completed, diverged,
// interrupted, or failed with the cause); errors are thrown after it is written (RunBusyError,
// CheckpointError, ManifestError, util::FileError, …).
TrainOutcome run_training(const ExperimentSpec& spec, const PluginRegistry& registry,
                          std::ostream& out, const TrainControl& control = {});

// run_training with the manifest's [analysis] probes registered as an observer (before
// control.observers): what `normlab train` and the sweep workers run. Defined by the command layer.
TrainOutcome train(const ExperimentSpec& spec, const PluginRegistry& registry, std::ostream& out,
                   const TrainControl& control = {});

}  // namespace normlab
