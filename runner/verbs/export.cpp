// `normlab export RUN... --to DIR`: a run's weights for PyTorch (several runs: one process, each
// into DIR/<its folder name>; LibTorch and the plugins start once).
#include <filesystem>
#include <iostream>
#include <set>

#include "normlab/interop_commands.h"
#include "verb.h"

namespace normlab::verbs {

namespace {

// The folder name a run exports to beside the others (runs/a/ and runs/a both give "a").
std::string run_folder_name(const std::string& run_dir) {
  namespace fs = std::filesystem;
  return (fs::absolute(run_dir) / "").lexically_normal().parent_path().filename().string();
}

}  // namespace

Verb add_export(CLI::App& app, const Globals& g) {
  auto o = state<normlab::ExportOptions>();
  auto runs = state<std::vector<std::string>>();
  auto* cmd = app.add_subcommand(
      "export",
      "a run's weights as a PyTorch state_dict + config.json (python/normlab_torch.py loads them)");
  cmd->add_option("RUN", *runs,
                  "run directory; several: each exported to --to/<its folder name>, in order, "
                  "stopping at the first that fails")
      ->required();
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
  return {cmd, [o, runs, &g] {
            o->plugin_paths = g.plugin_paths;
            if (runs->size() == 1) {
              o->run_dir = runs->front();
              return normlab::export_command(*o, std::cout, std::cerr);
            }
            // A typo in the last of several runs, or two runs of one folder name (the same output
            // folder), is refused before anything is written.
            std::set<std::string> names;
            for (const std::string& run : *runs) {
              if (!std::filesystem::is_regular_file(std::filesystem::path(run) /
                                                    "manifest.resolved.toml")) {
                std::cerr << "normlab: error: " << run
                          << ": not a run directory (no manifest.resolved.toml)\n";
                return kExitUsage;
              }
              if (!names.insert(run_folder_name(run)).second) {
                std::cerr << "normlab: error: RUN: two runs named '" << run_folder_name(run)
                          << "' would both export to " << o->to << "/" << run_folder_name(run)
                          << "\n";
                return kExitUsage;
              }
            }
            for (const std::string& run : *runs) {
              normlab::ExportOptions one = *o;
              one.run_dir = run;
              one.to = (std::filesystem::path(o->to) / run_folder_name(run)).string();
              if (const int code = normlab::export_command(one, std::cout, std::cerr)) return code;
            }
            return 0;
          }};
}

}  // namespace normlab::verbs
