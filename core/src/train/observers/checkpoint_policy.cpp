// Checkpoints: last.safetensors and step_N.safetensors every run.checkpoint_interval updates (older
// steps pruned to run.checkpoint_keep_last), best.safetensors on a better validation
// (run.checkpoint_save_best), and last once more when the run ends, unless it already holds that
// very state. Written beside training (CheckpointWriter); the run's end waits for the last write.
#include "standard_observers.h"
#include "train/training_session.h"

namespace normlab {
namespace {

class CheckpointPolicy final : public TrainingObserver {
 public:
  void after_update(TrainingSession& s) override {
    if (s.stop) return;  // an early stop saves once, at its end
    if (s.st.updates % s.spec.run.checkpoint_interval == 0) save(s, /*with_step=*/true);
  }
  void on_validation(TrainingSession& s, const Validation& v) override {
    const std::string& by = s.spec.run.checkpoint_save_best;
    bool best = (by == "valid_nll" && v.best) || (by == "bleu" && v.best_bleu);
    // Saving is a collective for a sharded optimizer: BLEU is rank 0's alone, so it decides for
    // all.
    if (s.group && s.optimizer->sharded()) best = s.group->max(best) > 0;
    if (best) s.save_best();
    changed_since_save_ = true;  // the best scores and patience count moved
  }
  void on_training_done(TrainingSession& s) override { save_unless_current(s); }
  void on_end(TrainingSession& s, const TrainOutcome& o) override {
    if (s.checkpointable && (o.status == "interrupted" || o.status == "stopped_early"))
      save_unless_current(s);
    // The final status (the next observer) comes once the last checkpoint is on disk.
    s.finish_checkpoints();
  }

 private:
  void save(TrainingSession& s, bool with_step) {
    s.save_last(with_step);
    changed_since_save_ = false;
  }
  void save_unless_current(TrainingSession& s) {
    if (s.saved_at != s.st.updates || changed_since_save_) save(s, /*with_step=*/false);
  }
  bool changed_since_save_ = false;
};

}  // namespace

std::unique_ptr<TrainingObserver> make_checkpoint_policy() {
  return std::make_unique<CheckpointPolicy>();
}

}  // namespace normlab
