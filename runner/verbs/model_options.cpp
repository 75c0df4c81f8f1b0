// The options of the verbs that reopen a run's model (eval, ablate, translate, forward).
#include "model_options.h"

namespace normlab::verbs {

void add_model_options(CLI::App* cmd, normlab::RunModelOptions& m) {
  cmd->add_option("RUN", m.run, "run directory (runs/NAME)")->required();
  cmd->add_option(
      "--checkpoint", m.checkpoint,
      "best | last | step_N | avg:K (mean of the newest K step_N.safetensors) | FILE.safetensors "
      "(default: best, else last)");
  cmd->add_option("--device", m.device, "cpu | cuda | cuda:N (default: the run's)");
  cmd->add_flag("--allow-unverified", m.allow_unverified,
                "use the checkpoint even when the SHA256SUMS beside it does not list its SHA-256");
}

void add_decode_options(CLI::App* cmd, normlab::DecodeOptions& d) {
  cmd->add_option("--beam", d.beam, "beam size (1: greedy)")->check(kPositive);
  cmd->add_option("--lenpen", d.lenpen, "length penalty: score / length^lenpen (fairseq)");
  cmd->add_option("--max-len-a", d.max_len_a,
                  "output limit a*src_len + b (default: the run's eval.max_len_a)")
      ->check(kNonNegative);
  cmd->add_option("--max-len-b", d.max_len_b,
                  "output limit a*src_len + b (default: the run's eval.max_len_b)")
      ->check(kNonNegative);
  cmd->add_option("--batch-tokens", d.batch_tokens,
                  "sentences x beam x (source + output limit) per batch")
      ->check(kPositive);
}

}  // namespace normlab::verbs
