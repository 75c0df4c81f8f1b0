// status.json: "running" with the progress (updates, epoch, losses, tokens/s, ETA) at the start and
// every log interval, then the run's final status and note. A failure's status is written by the
// trainer itself (training stops by an exception then).
#include "standard_observers.h"
#include "train/training_session.h"

namespace normlab {
namespace {

class StatusFile final : public TrainingObserver {
 public:
  void on_start(TrainingSession& s) override { s.run->write_status("running", s.progress); }
  void on_interval(TrainingSession& s, const TrainInterval& iv) override {
    s.progress.updates = s.st.updates;
    s.progress.epoch = s.epoch_now();
    s.progress.tokens_per_s = double(iv.tokens) / iv.seconds;
    s.progress.elapsed_s = s.elapsed();
    s.progress.eta_s = s.eta_seconds();
    s.run->write_status("running", s.progress);
  }
  void on_phase(TrainingSession& s, const std::string&) override {
    s.progress.eta_s = -1;  // the end phase's length is not known
    s.run->write_status("running", s.progress);
  }
  void on_end(TrainingSession& s, const TrainOutcome& o) override {
    s.progress.phase.clear();
    s.progress.updates = s.st.updates;
    s.progress.epoch = s.epoch_now();
    s.progress.elapsed_s = s.elapsed();
    s.progress.eta_s = o.status == "completed" || o.status == "stopped_early" ? 0 : -1;
    s.run->write_status(o.status, s.progress, o.note);
  }
};

}  // namespace

std::unique_ptr<TrainingObserver> make_status_file() { return std::make_unique<StatusFile>(); }

}  // namespace normlab
