#include <fmt/format.h>
#include <fmt/ostream.h>

#include <ostream>

#include "input_errors.h"
#include "commands/commands.h"
#include "normlab/analysis/run_probes.h"
#include "normlab/data/dataset.h"
#include "normlab/manifest/experiment.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "train/observers/standard_observers.h"
#include "train/run_directory.h"

namespace normlab {

// The command layer composes a run: the standard training observers (validation, test decode,
// train.jsonl, console, checkpoints, early stopping, status.json) and the analysis probes as one
// more run observer.
TrainOutcome train(const ExperimentSpec& spec, const PluginRegistry& registry, std::ostream& out,
                   const TrainControl& control) {
  const std::unique_ptr<RunObserver> probes = analysis::make_probe_observer();
  const auto standard = standard_training_observers();
  TrainControl composed = control;
  composed.observers.insert(composed.observers.begin(), probes.get());
  std::vector<TrainingObserver*> own;
  for (const auto& o : standard) own.push_back(o.get());
  own.insert(own.end(), control.training_observers.begin(), control.training_observers.end());
  composed.training_observers = own;
  return run_training(spec, registry, out, composed);
}

int train_command(const TrainOptions& opt, std::ostream& out, std::ostream& err) {
  return reporting_input_errors(err, [&]() -> int {
    // The manifest names extra plugin paths, so read it once for them, then validate fully.
    ExperimentSpec pre = load_manifest(opt.manifest, opt.overrides, nullptr);
    std::vector<std::filesystem::path> paths(opt.plugin_paths.begin(), opt.plugin_paths.end());
    for (const auto& p : pre.run.plugin_path) {
      std::filesystem::path pp(p);
      paths.push_back(pp.is_relative() ? std::filesystem::path(opt.manifest).parent_path() / pp : pp);
    }
    PluginRegistry registry(paths);
    ExperimentSpec spec = load_manifest(opt.manifest, opt.overrides, &registry);
    if (opt.dump_config) {
      out << dump_manifest(spec);
      return kExitCompleted;
    }
    TrainControl control;
    control.resume_from = opt.resume_from;
    control.allow_unverified = opt.allow_unverified;
    try {
      return train(spec, registry, out, control).exit_code;
    } catch (const RunBusyError& e) {
      fmt::print(err, "normlab: error: {}\n", e.what());
      return kExitBusy;
    }
  });
}

int manifest_reference_command(std::ostream& out) {
  out << manifest_reference_markdown();
  return 0;
}

}  // namespace normlab
