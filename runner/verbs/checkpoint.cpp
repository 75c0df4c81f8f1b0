// `normlab checkpoint convert RUN`: old TorchScript checkpoints as .safetensors.
#include <iostream>

#include "commands/commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_checkpoint(CLI::App& app, const Globals& g) {
  auto o = state<normlab::CheckpointConvertOptions>();
  auto* cmd = app.add_subcommand("checkpoint", "checkpoint tools");
  cmd->require_subcommand(1);
  auto* convert = cmd->add_subcommand(
      "convert",
      "rewrite a run's old TorchScript checkpoints (*.pt) as .safetensors (needs --trust-code)");
  convert->add_option("RUN", o->run, "run directory")->required();
  convert->add_flag("--trust-code", o->trust_code,
                    "required: loading a TorchScript archive can run code stored in it; only for "
                    "files you trust");
  return {cmd, [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::checkpoint_convert_command(*o, std::cout, std::cerr);
          }};
}

}  // namespace normlab::verbs
