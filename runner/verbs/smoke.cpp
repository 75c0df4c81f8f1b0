// `normlab smoke`: one forward and backward pass of a default model per scheme.
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "commands/commands.h"
#include "run/build_info.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_smoke(CLI::App& app, const Globals& g) {
  struct S {
    normlab::SmokeOptions opt;
    std::string arch = "encdec", family = "transformer";
  };
  auto s = state<S>();
  auto* smoke = app.add_subcommand(
      "smoke", "one forward and backward pass of a default model per scheme (the default job)");
  smoke->add_option("--scheme", s->opt.schemes, "scheme(s) to run (default: all)");
  smoke->add_option("--arch", s->arch, "encdec | lm")->check(CLI::IsMember({"encdec", "lm"}));
  smoke
      ->add_option("--family", s->family,
                   "transformer | llama (decoder-only: implies --arch lm; RMSNorm)")
      ->check(CLI::IsMember({"transformer", "llama"}));
  smoke->add_option("--enc-layers", s->opt.geometry.enc_layers)->check(kPositive);
  smoke->add_option("--dec-layers", s->opt.geometry.dec_layers)->check(kPositive);
  smoke->add_option("--d-model", s->opt.geometry.d_model)->check(kPositive);
  smoke->add_option("--ffn-dim", s->opt.geometry.ffn_dim)->check(kPositive);
  smoke->add_option("--heads", s->opt.geometry.heads)->check(kPositive);
  smoke->add_option("--device", s->opt.device, "cpu | cuda");
  smoke->add_option("--threads", s->opt.threads, "LibTorch intra-op threads");
  return {smoke, [s, &g]() -> int {
            if (const std::string problem = normlab::device_problem(s->opt.device);
                !problem.empty()) {
              std::cerr << "normlab: error: --device " << problem << "\n";
              return kExitUsage;
            }
            s->opt.geometry.arch = parse_arch(s->family == "llama" ? "lm" : s->arch);
            if (s->family == "llama") {
              s->opt.geometry.family = normlab::Family::Llama;
              s->opt.geometry.norm = normlab::NormSpec::of(normlab::NormKind::RMSNorm);
            }
            if (s->opt.geometry.arch == normlab::Arch::LM) s->opt.geometry.enc_layers = 0;
            normlab::PluginRegistry registry(
                std::vector<std::filesystem::path>(g.plugin_paths.begin(), g.plugin_paths.end()));
            return normlab::smoke(registry, s->opt, std::cout);
          }};
}

}  // namespace normlab::verbs
