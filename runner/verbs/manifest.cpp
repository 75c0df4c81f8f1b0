// `normlab manifest reference`: the table of every manifest key.
#include <iostream>

#include "commands/commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_manifest(CLI::App& app, const Globals&) {
  auto* manifest = app.add_subcommand("manifest", "manifest tools");
  manifest->require_subcommand(1);
  manifest->add_subcommand("reference", "markdown table of every manifest key");
  return {manifest, [] { return normlab::manifest_reference_command(std::cout); }, /*trains=*/false,
          /*uses_blas=*/false};
}

}  // namespace normlab::verbs
