// A user's Ctrl-C at a chosen update, for the tests of interrupted runs.
#pragma once

#include <signal.h>

#include <cstdint>

#include "normlab/train/run_events.h"

namespace normlab::test {

// Raises SIGINT after update `at`: the trainer saves and says interrupted; the same call again
// resumes.
struct InterruptAt : RunObserver {
  int64_t at;
  explicit InterruptAt(int64_t u) : at(u) {}
  void after_step(int64_t u) override {
    if (u == at) ::raise(SIGINT);
  }
};

}  // namespace normlab::test
