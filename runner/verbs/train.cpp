// `normlab train MANIFEST`: train or resume the experiment of a manifest.
#include <iostream>

#include "commands/commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_train(CLI::App& app, const Globals& g) {
  auto o = state<normlab::TrainOptions>();
  auto* train = app.add_subcommand("train", "train (or resume) the experiment of a TOML manifest");
  train->add_option("MANIFEST", o->manifest, "experiment manifest (.toml)")->required();
  train->add_option("--set", o->overrides, "override a key: section.key=value (repeatable)");
  train->add_flag("--dump-config", o->dump_config, "print the fully resolved manifest and exit");
  train
      ->add_option(
          "--resume-from", o->resume_from,
          "resume from this checkpoint (e.g. RUN/checkpoints/step_N.safetensors) instead of "
          "RUN/checkpoints/last.safetensors")
      ->check(CLI::ExistingFile);
  train->add_flag("--allow-unverified", o->allow_unverified,
                  "resume even when checkpoints/SHA256SUMS does not list the checkpoint's SHA-256");
  train
      ->add_option("--nproc", o->nproc,
                   "data-parallel: start N ranks on this machine (c10d; as torchrun "
                   "--nproc-per-node N --no-python)")
      ->check(CLI::Range(1, 1024));
  train->add_flag(
      "--allow-world-size-change", o->allow_world_size_change,
      "resume a checkpoint written by another number of ranks, keeping its batches per update");
  train->add_flag("--allow-data-change", o->allow_data_change,
                  "resume at the checkpoint's data position although the data differ from what "
                  "its run trained on (a shard replaced, reordered, resized) or are cut into other "
                  "batches (optim.max_tokens, run.seed on a branch)");
  return {train,
          [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::train_command(*o, std::cout, std::cerr);
          },
          /*trains=*/true};
}

}  // namespace normlab::verbs
