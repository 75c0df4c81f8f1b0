// `normlab eval RUN`: a run's test/valid score.
#include <iostream>

#include "model_options.h"
#include "normlab/eval/eval_commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_eval(CLI::App& app, const Globals& g) {
  auto o = state<normlab::EvalOptions>();
  auto* eval = app.add_subcommand(
      "eval", "test/valid score of a run: beam search, sacreBLEU-signed BLEU and chrF, perplexity");
  add_model_options(eval, o->model);
  add_decode_options(eval, o->decode);
  eval->add_option("--split", o->split, "valid | test")->check(CLI::IsMember({"valid", "test"}));
  eval->add_flag("--json", o->json, "one JSON object instead of text");
  eval->add_flag("--all-tokens", o->model.all_tokens,
                 "language models: score the whole valid/test split, not its first "
                 "eval.valid_tokens (the split is read into memory)");
  eval->add_option("--tasks", o->tasks,
                   "downstream tasks instead of the split: JSONL files (comma-separated), each "
                   "scored as lm-evaluation-harness scores it (docs/downstream.md)")
      ->delimiter(',');
  eval->add_option("--shots", o->shots, "with --tasks: few-shot examples per item")
      ->check(CLI::Range(0, 64));
  eval->add_option("--limit", o->limit, "with --tasks: the first N items of each task")
      ->check(kPositive);
  eval->add_flag("--separate-choices", o->separate_choices,
                 "with --tasks: score every choice as a sequence of its own, as the harness runs "
                 "them (the reference of the default, which reads each context once)");
  eval->add_option("--nproc", o->nproc,
                   "with --tasks: split the items across N processes on this machine (under "
                   "torchrun/srun: across the job's ranks); the same scores as one")
      ->check(CLI::Range(1, 1024));
  eval->add_option("--threads", o->model.threads,
                   "LibTorch intra-op threads, 1 to 1024 (default: the run's run.threads, as it "
                   "trained)")
      ->check(kPositive)
      ->check(CLI::Range(1, 1024));  // 100000 made 22,000 threads and stalled the machine
  eval->add_option("--seed", o->seed,
                   "with --tasks: the few-shot draw (the harness's fewshot_random_seed)")
      ->capture_default_str();
  return {eval, [o, &g] {
            o->model.plugin_paths = g.plugin_paths;
            return normlab::eval_command(*o, std::cout, std::cerr);
          }};
}

}  // namespace normlab::verbs
