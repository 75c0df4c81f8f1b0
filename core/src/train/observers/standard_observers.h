// The run's own observers (training_observer.h), one concern each, in the order a run needs them:
// validation and the test decode produce scores; train.jsonl and status.json record; the
// checkpoint policy saves; early stopping may end the run; the console reports.
#pragma once

#include <memory>
#include <vector>

#include "train/training_observer.h"

namespace normlab {

std::unique_ptr<TrainingObserver> make_validation();         // eval.interval, BLEU, the final one
std::unique_ptr<TrainingObserver> make_task_evaluation();    // eval.tasks (language models)
std::unique_ptr<TrainingObserver> make_test_decode();        // eval.test_beam at the end
std::unique_ptr<TrainingObserver> make_training_log();       // train.jsonl
std::unique_ptr<TrainingObserver> make_checkpoint_policy();  // last, step_N, best
std::unique_ptr<TrainingObserver> make_early_stopping();     // eval.patience
std::unique_ptr<TrainingObserver> make_status_file();        // status.json
std::unique_ptr<TrainingObserver> make_console_progress();   // the console lines and progress bar

// All of the above, in that order (`leader`: rank 0 of a data-parallel job, or a process alone;
// the other ranks of a job validate, for early stopping, and write nothing). The order matters
// where two react to one event: the checkpoint is saved before status.json says the run ended, and
// the console speaks last: a sweep worker whose driver died gets SIGPIPE at its next line, and by
// then everything is on disk.
std::vector<std::unique_ptr<TrainingObserver>> standard_training_observers(bool leader = true);

}  // namespace normlab
