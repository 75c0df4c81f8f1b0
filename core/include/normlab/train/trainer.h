// Training from a validated manifest: data, model, scheme hooks, validation, checkpoints, resume.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "normlab/manifest/experiment.h"

namespace normlab {

class PluginRegistry;

// Process exit codes of `normlab train`.
enum ExitCode : int {
  kExitCompleted = 0,
  kExitFailed = 1,
  kExitBadInput = 2,     // manifest, data or plugin error, before training starts
  kExitDiverged = 3,     // a result: non-finite loss/gradient or loss blow-up, recorded with its update
  kExitInterrupted = 130 // SIGINT/SIGTERM: checkpoint saved, the same command resumes
};

struct TrainOutcome {
  std::string status;  // completed | diverged | interrupted
  int64_t updates = 0;
  std::string note;    // diverged: "diverged at update k: <first non-finite module>"
  int exit_code = kExitCompleted;
  double last_train_loss = 0, uniform_loss = 0;
  double last_valid_nll = 0, best_valid_nll = 0, last_valid_bleu = -1;
};

TrainOutcome train(const ExperimentSpec& spec, const PluginRegistry& registry, std::ostream& out);

}  // namespace normlab
