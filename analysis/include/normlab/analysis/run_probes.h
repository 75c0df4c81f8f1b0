// The [analysis] probes of a run as a run observer (normlab/train/run_events.h): the train and
// sweep commands register one with every run; it records nothing when [analysis] selects no probe.
#pragma once

#include <memory>

namespace normlab {
class RunObserver;
}  // namespace normlab

namespace normlab::analysis {

std::unique_ptr<RunObserver> make_probe_observer();

}  // namespace normlab::analysis
