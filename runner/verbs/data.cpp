// `normlab data list | fetch | path`: the named datasets.
#include <iostream>
#include <string>

#include "normlab/interop_commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_data(CLI::App& app, const Globals&) {
  auto o = state<normlab::DataOptions>();
  auto* data =
      app.add_subcommand("data", "named datasets: list, fetch (resumable, SHA-256 checked), path");
  data->require_subcommand(1);
  data->add_subcommand("list", "the datasets, whether fetched, whether their SHA-256 is pinned");
  for (const char* action : {"fetch", "path"}) {
    auto* sub = data->add_subcommand(
        action, std::string(action) == "fetch"
                    ? "download, verify and unpack NAME (from $NORMLAB_DATA_MIRROR when set)"
                    : "print NAME's folder (exit 1 when not fetched)");
    sub->add_option("NAME", o->name, "dataset name (normlab data list)")->required();
  }
  return {data, [o, data] {
            o->action = data->get_subcommands().front()->get_name();
            return normlab::data_command(*o, std::cout, std::cerr);
          }};
}

}  // namespace normlab::verbs
