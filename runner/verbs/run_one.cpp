// `normlab run-one MANIFEST --index I`: one run of a sweep (what sweep workers execute).
#include <iostream>

#include "commands/commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_run_one(CLI::App& app, const Globals& g) {
  auto o = state<normlab::RunOneOptions>();
  auto* run_one = app.add_subcommand("run-one", "train (or resume) run I of a sweep manifest");
  run_one->add_option("MANIFEST", o->manifest, "sweep manifest (.toml with a [sweep] section)")
      ->required();
  run_one
      ->add_option("--index", o->index, "the run's index (see `normlab sweep MANIFEST --dry-run`)")
      ->required();
  run_one->add_option("--set", o->overrides, "override a key: section.key=value (repeatable)");
  return {run_one,
          [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::run_one_command(*o, std::cout, std::cerr);
          },
          /*trains=*/true};
}

}  // namespace normlab::verbs
