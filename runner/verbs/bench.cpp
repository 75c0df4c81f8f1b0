// `normlab bench`: timed training steps on a random batch (bench/run_bench.py drives it).
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "commands/commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_bench(CLI::App& app, const Globals& g) {
  struct S {
    normlab::BenchOptions opt;
    std::string arch = "encdec", family = "transformer";
  };
  auto s = state<S>();
  normlab::BenchOptions& o = s->opt;
  auto* bench = app.add_subcommand(
      "bench",
      "time training steps of a model on a random batch (JSON lines; see bench/run_bench.py)");
  bench->add_option("--arch", s->arch, "encdec | lm")->check(CLI::IsMember({"encdec", "lm"}));
  bench->add_option("--scheme", o.scheme, "scheme (default post-ln)");
  bench
      ->add_option("--family", s->family,
                   "transformer | llama (as model.family: RMSNorm with eps 1e-6, SwiGLU, RoPE)")
      ->check(CLI::IsMember({"transformer", "llama"}));
  bench->add_option("--enc-layers", o.geometry.enc_layers)->check(kPositive);
  bench->add_option("--dec-layers", o.geometry.dec_layers)->check(kPositive);
  bench->add_option("--d-model", o.geometry.d_model)->check(kPositive);
  bench->add_option("--ffn-dim", o.geometry.ffn_dim)->check(kPositive);
  bench->add_option("--heads", o.geometry.heads)->check(kPositive);
  bench->add_option("--batch", o.batch, "sentences (LM: blocks) per batch")->check(kPositive);
  bench->add_option("--length", o.length, "tokens per sentence (LM: per block)")->check(kPositive);
  bench->add_option("--vocab", o.vocab)->check(kPositive);
  bench->add_option("--dropout", o.dropout, "residual dropout (model.dropout)");
  bench->add_option("--attention-dropout", o.attention_dropout, "model.attention_dropout");
  bench->add_option("--activation-dropout", o.activation_dropout, "model.activation_dropout");
  bench->add_option("--label-smoothing", o.label_smoothing);
  bench
      ->add_option(
          "--threads", o.threads,
          "LibTorch intra-op threads (0, the default: as run.threads = 0, the cores not busy "
          "at the start)")
      ->check(kNonNegative);
  bench->add_option("--warmup", o.warmup, "untimed steps first");
  bench->add_option("--steps", o.steps, "timed steps (without --serve)");
  bench->add_option("--disable", o.disable, "speed levers to turn off, to measure them")
      ->check(CLI::IsMember({"dropout", "adamw", "loss", "attention", "ffn", "projection", "onednn",
                             "openblas", "linear", "norm", "bf16", "cuda"}));
  bench->add_option("--dtype", o.dtype, "fp32 | bf16 (autocast forward, as run.dtype)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  bench->add_flag("--serve", o.serve, "answer 'steps N', 'info', 'quit' lines on stdin");
  return {bench, [s, &g]() -> int {
            s->opt.geometry.arch = parse_arch(s->arch);
            if (s->family == "llama") {  // the manifest's llama defaults (scheme.norm, norm_eps)
              s->opt.geometry.family = normlab::Family::Llama;
              s->opt.geometry.norm = normlab::NormSpec::of(normlab::NormKind::RMSNorm);
              s->opt.geometry.norm.eps = 1e-6;
            }
            normlab::PluginRegistry registry(
                std::vector<std::filesystem::path>(g.plugin_paths.begin(), g.plugin_paths.end()));
            return normlab::bench(registry, s->opt, std::cin, std::cout);
          }};
}

}  // namespace normlab::verbs
