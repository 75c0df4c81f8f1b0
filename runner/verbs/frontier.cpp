// `normlab frontier MANIFEST`: the largest stable peak lr per scheme and depth.
#include <iostream>

#include "commands/commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_frontier(CLI::App& app, const Globals& g) {
  auto o = state<normlab::FrontierOptions>();
  auto* frontier = app.add_subcommand("frontier",
                                      "per scheme and depth, the largest peak lr that trains K "
                                      "updates without divergence (resumable)");
  frontier->add_option("MANIFEST", o->manifest, "base manifest (no [sweep] section)")->required();
  frontier->add_option("--schemes", o->schemes, "comma-separated scheme names")
      ->delimiter(',')
      ->required();
  frontier
      ->add_option("--depths", o->depths,
                   "comma-separated layer counts (encdec: enc_layers = dec_layers; lm: dec_layers)")
      ->delimiter(',')
      ->required();
  frontier->add_option("--lr", o->lr, "MIN:MAX of the half-decade lr grid (default 3e-4:3e-1)");
  frontier
      ->add_option("--seeds", o->seeds,
                   "comma-separated seeds; an lr is stable when every seed is (default 1,2)")
      ->delimiter(',');
  frontier->add_option("--updates", o->updates, "K: updates per trial (default 100)");
  frontier->add_option("--bisect", o->bisect, "bisection steps after the grid (default 2)");
  frontier->add_option("--out", o->out,
                       "directory of the trials and results (default: the manifest's run.out_dir)");
  frontier->add_option("--jobs,-j", o->jobs,
                       "worker processes at a time (each uses its manifest's run.threads)");
  frontier->add_option("--set", o->overrides,
                       "override a key of every trial: section.key=value (repeatable)");
  frontier->add_flag("--dry-run", o->dry_run,
                     "validate and list the trials the next round needs; start nothing");
  frontier->add_flag("--retry-failed", o->retry_failed,
                     "also rerun trials whose worker failed before");
  return {frontier, [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::frontier_command(*o, std::cout, std::cerr);
          }};
}

}  // namespace normlab::verbs
