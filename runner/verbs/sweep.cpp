// `normlab sweep MANIFEST`: the runs of a manifest's [sweep], here or as a Slurm job array.
#include <iostream>

#include "commands/commands.h"
#include "slurm_cli.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_sweep(CLI::App& app, const Globals& g) {
  auto o = state<normlab::SweepOptions>();
  auto* sweep = app.add_subcommand("sweep", "run every run of a manifest's [sweep] (resumable)");
  sweep->add_option("MANIFEST", o->manifest, "sweep manifest (.toml with a [sweep] section)")
      ->required();
  sweep->add_option("--set", o->overrides,
                    "override a key of every run: section.key=value (repeatable)");
  sweep
      ->add_option("--jobs,-j", o->jobs,
                   "worker processes at a time (each uses its manifest's run.threads)")
      ->check(kPositive);
  sweep
      ->add_option(
          "--threads-per-run", o->threads_per_run,
          "override every run's run.threads (recorded in its env.json; results depend on threads)")
      ->check(kPositive);
  auto* dry =
      sweep->add_flag("--dry-run", o->dry_run, "list the runs (validated) and start nothing");
  auto* status = sweep->add_flag("--status", o->status, "table of the sweep directory's runs");
  sweep->add_flag("--json", o->json, "with --status: one JSON object instead of the table")
      ->needs(status);
  sweep
      ->add_option(
          "--watch", o->watch_s,
          "with --status: the table again every SECONDS until no run is pending or running")
      ->check(kPositiveSeconds)
      ->needs(status);
  sweep->add_flag("--retry-failed", o->retry_failed, "also run the runs that failed before");
  dry->excludes(status);
  auto* slurm = normlab::add_slurm_options(sweep, o->slurm_opt);
  slurm->excludes(status);
  return {sweep, [o, &g, slurm] {
            o->plugin_paths = g.plugin_paths;
            o->slurm = slurm->count() > 0;
            return normlab::sweep_command(*o, std::cout, std::cerr);
          }};
}

}  // namespace normlab::verbs
