// eval.patience: the run stops early after that many validations without a better valid nll.
#include <fmt/format.h>

#include "standard_observers.h"
#include "train/training_session.h"

namespace normlab {
namespace {

class EarlyStopping final : public TrainingObserver {
 public:
  void on_validation(TrainingSession& s, const Validation& v) override {
    const int64_t patience = s.spec.eval.patience;
    if (patience <= 0 || v.final || s.st.stale_validations < patience) return;
    s.request_stop(
        "stopped_early",
        fmt::format(
            "stopped early at update {}: valid nll not below its best {:.4f} for {} validations "
            "(eval.patience)",
            s.st.updates, s.st.best_valid_nll, s.st.stale_validations),
        kExitCompleted);
  }
};

}  // namespace

std::unique_ptr<TrainingObserver> make_early_stopping() {
  return std::make_unique<EarlyStopping>();
}

}  // namespace normlab
