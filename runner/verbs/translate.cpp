// `normlab translate RUN`: stdin to stdout through a run's model.
#include <iostream>

#include "model_options.h"
#include "normlab/eval/eval_commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_translate(CLI::App& app, const Globals& g) {
  auto o = state<normlab::TranslateOptions>();
  auto* translate =
      app.add_subcommand("translate", "translate stdin (raw text, one sentence a line) to stdout");
  add_model_options(translate, o->model);
  add_decode_options(translate, o->decode);
  return {translate, [o, &g] {
            o->model.plugin_paths = g.plugin_paths;
            return normlab::translate_command(*o, std::cin, std::cout, std::cerr);
          }};
}

}  // namespace normlab::verbs
