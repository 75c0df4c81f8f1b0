// `normlab bleu --hyp H --ref R` (hidden): corpus BLEU as sacreBLEU computes it.
#include <iostream>

#include "commands/commands.h"
#include "verb.h"

namespace normlab::verbs {

// Hidden (empty group): sacreBLEU-compatible corpus BLEU, for evaluation scripts and tests.
Verb add_bleu(CLI::App& app, const Globals&) {
  auto o = state<normlab::BleuOptions>();
  auto* bleu =
      app.add_subcommand("bleu", "corpus BLEU as sacreBLEU computes it by default (13a, exp)");
  bleu->group("");
  auto* hyp =
      bleu->add_option("--hyp", o->hyp, "hypotheses, one per line")->check(CLI::ExistingFile);
  auto* ref =
      bleu->add_option("--ref", o->ref, "references, one per line")->check(CLI::ExistingFile);
  hyp->needs(ref);
  ref->needs(hyp);
  bleu->add_flag("--json", o->json, "score, counts, totals, sys_len, ref_len as JSON");
  bleu->add_option("--tokenize-13a", o->tokenize_13a, "print FILE's lines tokenized by 13a instead")
      ->check(CLI::ExistingFile)
      ->excludes(hyp)
      ->excludes(ref);
  return {bleu,
          [o] {
            if (o->tokenize_13a.empty() && o->hyp.empty())
              throw CLI::RequiredError("--hyp and --ref (or --tokenize-13a)");
            return normlab::bleu(*o, std::cout);
          },
          /*trains=*/false, /*uses_blas=*/false};
}

}  // namespace normlab::verbs
