// `normlab export RUN --to DIR`: a run's weights for PyTorch.
#include <iostream>

#include "normlab/interop_commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_export(CLI::App& app, const Globals& g) {
  auto o = state<normlab::ExportOptions>();
  auto* cmd = app.add_subcommand(
      "export",
      "a run's weights as a PyTorch state_dict + config.json (python/normlab_torch.py loads them)");
  cmd->add_option("RUN", o->run_dir, "run directory")->required();
  cmd->add_option("--to", o->to, "output directory")->required();
  cmd->add_option("--checkpoint", o->checkpoint, "best | last | step_N (default: best, else last)");
  cmd->add_flag("--allow-unverified", o->allow_unverified,
                "export even when checkpoints/SHA256SUMS does not list the checkpoint's SHA-256");
  cmd->add_option(
      "--format", o->format,
      "torch: model.pt (torch.load); hf: model.safetensors, a HuggingFace-style folder");
  cmd->add_flag("--reference-logits", o->reference_logits,
                "also write reference.pt: a fixed input and normlab's logits (for checks)")
      ->group("");
  return {cmd, [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::export_command(*o, std::cout, std::cerr);
          }};
}

}  // namespace normlab::verbs
