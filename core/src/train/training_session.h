// One training run's shared state: what the update loop (trainer.cpp) and the training observers
// (observers/: validation, test decode, checkpoint policy, early stopping, console, train.jsonl,
// status.json) read and advance. The loop owns the order of events; each observer owns one concern.
#pragma once

#include <chrono>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batch_prefetch.h"
#include "checkpoint_writer.h"
#include "loss_scaler.h"
#include "normlab/data/dataset.h"
#include "normlab/manifest/experiment.h"
#include "normlab/model/transformer_model.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "run/checkpoint.h"
#include "run/optimizer.h"
#include "run/process_group.h"
#include "run_directory.h"
#include "torch_api.h"
#include "training_observer.h"
#include "update_step.h"

namespace normlab {

struct TrainingSession {
  using Clock = std::chrono::steady_clock;

  const ExperimentSpec& spec;
  std::ostream& out;
  bool tty = false;  // out is a terminal: a live progress bar between log lines

  data::Dataset ds;
  ModelConfig mcfg;
  torch::Device device{torch::kCPU};
  TransformerModel model{nullptr};
  std::unique_ptr<FlatAdamW> optimizer;
  DynamicLossScaler loss_scaler;  // fp16 only
  bool fp16 = false;
  double uniform_loss = 0, divergence_nll = 0;
  std::unique_ptr<data::BatchPlan> train_plan, valid_plan;
  std::vector<std::vector<int32_t>> valid_batches;
  std::unique_ptr<BatchPrefetcher> prefetch;  // token shards: batches made ahead on a thread

  std::string resolved_text, env_text;  // manifest.resolved.toml and env.json, written at the start
  std::string segment_id;  // this process's training segment (env.json, its checkpoints)
  std::string model_line;  // "model: encdec 6L-6L d=512 …" for the console

  std::unique_ptr<RunDirectory> run;
  std::optional<std::filesystem::path> resume_point;  // the checkpoint this process resumes from
  bool resuming = false;
  bool status_kept = false;  // a failure now leaves status.json as it was (the resume's checks)
  TrainingState st;
  RunProgress progress;
  TrainOutcome outcome;
  int64_t saved_at = -1;  // the update last.safetensors holds
  // What last.safetensors and best.safetensors hold (as submitted to the writer): a best and a
  // last of the same point are one file.
  std::optional<TrainingState> last_state, best_state;
  // Writes checkpoints beside training (rank 0); after `run`, so it finishes before `run` goes.
  std::unique_ptr<CheckpointWriter> checkpoints = std::make_unique<CheckpointWriter>();
  int64_t validated_at = -1;  // the update of the newest validation

  ProcessGroup* group = nullptr;  // a data-parallel job's (null: this process alone)
  int64_t global_batches = 1;     // batches per update over all ranks (optim.update_freq × world)
  std::string batches_per_update_changed;  // a --resume-from with another update_freq: what changed
  bool leader() const;  // rank 0, or this process alone: it writes the run directory
  int world() const;
  // False once a rank is lost mid-update: the state in memory is not one to checkpoint.
  bool checkpointable = true;

  RunObservers* events = nullptr;            // the caller's RunObservers (analysis probes …)
  std::vector<TrainingObserver*> observers;  // the run's own observers, in order

  // The stop the loop obeys after the current update: stopped_early, interrupted.
  struct Stop {
    std::string status, note;
    int exit_code = kExitCompleted;
  };
  std::optional<Stop> stop;

  Clock::time_point t_start = Clock::now();
  double setup_seconds = 0;  // from the process's start to the update loop
  std::string setup_phases;  // where the setup went: data, model built, moved, optimizer
  std::optional<Clock::time_point> loop_end;  // the last update done: the final phase begins
  int64_t first_update = 0;                   // the update this process started from

  TrainingSession(const ExperimentSpec& s, std::ostream& o) : spec(s), out(o) {}

  template <class F>
  void publish(const F& f) {
    for (TrainingObserver* o : observers) f(*o);
  }
  // `phase` is the step of the end phase that begins; `detail` says how big it is.
  void enter_phase(const std::string& phase, const std::string& detail) {
    progress.phase = phase;
    publish([&](TrainingObserver& o) {
      o.on_phase(*this, detail.empty() ? phase : phase + ": " + detail);
    });
  }
  // The 1-based epoch the run is in; once the last one is done (the next not begun), that one.
  int64_t epoch_now() const {
    return st.batch_index == 0 && st.epoch > 0 ? st.epoch : st.epoch + 1;
  }
  double elapsed() const {
    return st.elapsed_s + std::chrono::duration<double>(Clock::now() - t_start).count();
  }
  // Time left at this process's rate so far (-1: not known yet), to max_updates or, when it comes
  // first, the end of optim.max_epochs.
  double eta_seconds() const;
  // The state a checkpoint written now holds.
  TrainingState snapshot() const;
  // last.safetensors (and step_N.safetensors as the same file with `with_step`), older steps
  // pruned. Every rank of a job calls them (a sharded optimizer gathers its moments; `gather`
  // false: they are whole already, a just-loaded checkpoint's); rank 0 writes.
  void save_last(bool with_step, bool gather = true);
  void save_best();
  // Whether the checkpoint `saved` holds the point `now` on every rank (then it is linked).
  bool same_point_everywhere(const std::optional<TrainingState>& saved,
                             const TrainingState& now) const;
  // Waits for the checkpoint being written; rethrows its error. Before a run's final status.
  void finish_checkpoints();
  // The next update's global_batches batches (they may cross an epoch's end): this rank's share
  // (every world-th, from its rank on), how many were taken over all ranks (0: the end of
  // optim.max_epochs) and their target tokens. The data position moves as they are taken.
  struct UpdateBatches {
    std::vector<DeviceBatch> mine;
    int64_t taken = 0, tokens = 0;
    double data_seconds = 0;  // making them (reading shards, padding), not moving them
  };
  UpdateBatches next_batches();
  void request_stop(std::string status, std::string note, int exit_code);
};

// Everything before the run directory exists (manifest, data, model, size check: an error leaves
// nothing behind), then the run directory and its lock. Nullopt-like: `finished` set when the
// run already ended (nothing to do).
struct OpenedSession {
  std::unique_ptr<TrainingSession> session;
  std::optional<TrainOutcome> finished;
};
OpenedSession open_session(const ExperimentSpec& spec, const PluginRegistry& registry,
                           std::ostream& out, const TrainControl& control);

// A data-parallel job's rank 0 tells the other ranks, waiting for its start, that it failed.
void post_start_failure(ProcessGroup* group, const std::string& what) noexcept;

// In the run directory: manifest.resolved.toml and env.json, the resume point, the scheme's setup
// pass, run.save_initial, the observers' on_model_ready, and a resumed run's checkpoint.
void start_session(TrainingSession& s, const TrainControl& control);

}  // namespace normlab
