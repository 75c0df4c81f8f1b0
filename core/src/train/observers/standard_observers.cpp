#include "standard_observers.h"

namespace normlab {

std::vector<std::unique_ptr<TrainingObserver>> standard_training_observers(bool leader) {
  std::vector<std::unique_ptr<TrainingObserver>> out;
  out.push_back(make_validation());
  if (!leader) {  // checkpoints: rank 0 writes, but a sharded optimizer's moments come from every
                  // rank
    out.push_back(make_checkpoint_policy());
    out.push_back(make_early_stopping());
    return out;
  }
  out.push_back(make_task_evaluation());  // rank 0 alone, as BLEU: the others wait at the next
                                          // update's collective
  out.push_back(make_test_decode());
  out.push_back(make_training_log());
  out.push_back(make_checkpoint_policy());
  out.push_back(make_early_stopping());
  out.push_back(make_status_file());
  out.push_back(make_console_progress());
  return out;
}

}  // namespace normlab
