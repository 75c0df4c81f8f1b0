// `normlab forward RUN --input FILE`: tokens, log-probabilities and top-k logits as JSON.
#include <iostream>

#include "model_options.h"
#include "normlab/eval/eval_commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_forward(CLI::App& app, const Globals& g) {
  struct S {
    normlab::ForwardOptions opt;
    bool json = true;  // JSON is the only format; the flag is accepted for symmetry with eval
  };
  auto s = state<S>();
  auto* forward = app.add_subcommand(
      "forward", "tokens, log-probabilities and top-k logits of given inputs as JSON");
  add_model_options(forward, s->opt.model);
  forward
      ->add_option("--input", s->opt.input,
                   "encdec: SOURCE<TAB>TARGET PREFIX lines; lm: text lines")
      ->required();
  forward->add_flag("--ids", s->opt.ids,
                    "lm: each input line is token ids separated by spaces, not text");
  forward->add_option("--top-k", s->opt.top_k, "most likely next tokens per position")
      ->check(kPositive);
  forward->add_flag("--hidden", s->opt.hidden, "also every layer's output vectors");
  forward->add_flag("--json", s->json, "JSON output (the only format)");
  return {forward, [s, &g] {
            s->opt.model.plugin_paths = g.plugin_paths;
            return normlab::forward_command(s->opt, std::cout, std::cerr);
          }};
}

}  // namespace normlab::verbs
