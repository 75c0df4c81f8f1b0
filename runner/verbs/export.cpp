// `normlab export RUN... --to DIR`: a run's weights for PyTorch (several runs: one process, each
// into DIR/<its folder name>; LibTorch and the plugins start once).
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

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
                  "run directory; several: each exported to --to/<its folder name>, in order; "
                  "one that fails stops no other (exit code: the first failure's)")
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
            // Every run is tried (one that cannot be exported — no checkpoint yet, a damaged one —
            // holds back no other); the exit code is the first failure's, as for that run alone.
            int first_code = 0;
            std::vector<std::string> failed;
            for (const std::string& run : *runs) {
              normlab::ExportOptions one = *o;
              one.run_dir = run;
              one.to = (std::filesystem::path(o->to) / run_folder_name(run)).string();
              if (const int code = normlab::export_command(one, std::cout, std::cerr)) {
                if (first_code == 0) first_code = code;
                failed.push_back(run);
              }
            }
            if (!failed.empty()) {
              std::cerr << "normlab: error: exported " << runs->size() - failed.size() << " of "
                        << runs->size() << " runs; not exported (the errors above):";
              for (const std::string& run : failed) std::cerr << " " << run;
              std::cerr << "\n";
            }
            return first_code;
          }};
}

}  // namespace normlab::verbs
