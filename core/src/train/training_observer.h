// What the update loop publishes to a run's own observers (observers/): the events after which
// validation, the test decode, checkpoints, early stopping, the console, train.jsonl and
// status.json do their part. Internal: the public, read-only events for analysis are
// normlab/train/run_events.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace normlab {

struct TrainingSession;
struct TrainOutcome;
struct UpdateResult;

// The averages of one log interval (run.log_interval updates).
struct TrainInterval {
  int64_t updates = 0, tokens = 0, clipped = 0, overflows = 0;
  double loss = 0, nll = 0, gnorm = 0;  // means over the interval's updates
  double lr = 0;                        // the last update's
  double seconds = 0;                   // wall time of the interval
  double allreduce_seconds = 0;         // of it, the gradient all-reduce's (a data-parallel job)
  double data_seconds = 0;              // of it, making the batches (reading shards, padding)
  std::string scheme_status;  // the scheme's live values at its end ("alpha_t=0.42"), or ""
  // optim.z_loss: the mean of its term c·log²Z per token (a part of loss).
  double z_loss = 0;
};

// One validation's scores (BLEU -1: not decoded).
struct Validation {
  // bleu: on the eval.bleu_max_sentences subset (comparable across validations, best by BLEU);
  // bleu_full: the final validation's BLEU on every sentence when the subset is smaller.
  double nll = 0, loss = 0, bleu = -1, bleu_full = -1;
  int64_t bleu_sentences = 0, tokens = 0;
  bool best = false, best_bleu = false, final = false;
  double seconds = 0;  // its wall time (the tasks' is apart: TaskScores)
};

// One in-loop evaluation of eval.tasks: a train.jsonl record per task (kind "task").
struct TaskScores {
  std::vector<nlohmann::json> records;
  double average_acc = 0;  // the mean of the tasks' acc
  double seconds = 0;
};

// The end-of-training test decode: its train.jsonl record and its console line.
struct TestScore {
  nlohmann::json record;
  std::string line;
};

class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // The run starts or resumes (its checkpoint loaded).
  virtual void on_start(TrainingSession&) {}
  // An fp16 overflow: update u was skipped.
  virtual void on_overflow(TrainingSession&, int64_t /*u*/) {}
  // Update u diverged (nothing stepped); the run ends with on_end(diverged).
  virtual void on_diverged(TrainingSession&, const UpdateResult&, int64_t /*u*/) {}
  // Every run.log_interval updates (and at max_updates).
  virtual void on_interval(TrainingSession&, const TrainInterval&) {}
  // An update without a log interval (the live progress bar).
  virtual void on_tick(TrainingSession&, double /*loss*/) {}
  // An update is done: validation and checkpoint intervals.
  virtual void after_update(TrainingSession&) {}
  virtual void on_validation(TrainingSession&, const Validation&) {}
  virtual void on_tasks(TrainingSession&, const TaskScores&) {}
  virtual void on_test(TrainingSession&, const TestScore&) {}
  // max_updates or max_epochs reached: the end phase (final validation, test decode, last save).
  virtual void on_training_done(TrainingSession&) {}
  // A step of the end phase begins (TrainingSession::enter_phase): "final validation", "test
  // decode"; what the console and status.json show instead of a stalled "ETA 00:00".
  virtual void on_phase(TrainingSession&, const std::string& /*what*/) {}
  // The run's last word: completed, stopped_early, diverged or interrupted (not after a failure).
  virtual void on_end(TrainingSession&, const TrainOutcome&) {}
};

}  // namespace normlab
