// `normlab ablate RUN`: the validation loss with each layer skipped.
#include <iostream>

#include "model_options.h"
#include "normlab/eval/eval_commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_ablate(CLI::App& app, const Globals& g) {
  auto o = state<normlab::AblateOptions>();
  auto* ablate = app.add_subcommand(
      "ablate", "how much each layer matters: the validation loss with each layer skipped");
  add_model_options(ablate, o->model);
  ablate->add_option("--drop-layer", o->drop_layer,
                     "each | comma list of layer indices (negative from the top)");
  ablate->add_option("--split", o->split, "valid | test")->check(CLI::IsMember({"valid", "test"}));
  ablate->add_option("--batch-tokens", o->batch_tokens, "target tokens per batch")
      ->check(kPositive);
  ablate->add_flag("--json", o->json, "one JSON object instead of text");
  ablate->add_option("--jobs", o->jobs, "RUN a sweep directory: runs ablated at a time")
      ->check(kPositive);
  return {ablate, [o, &g] {
            o->model.plugin_paths = g.plugin_paths;
            return normlab::ablate_command(*o, std::cout, std::cerr);
          }};
}

}  // namespace normlab::verbs
