// The whole `normlab` command line, in libnormlab_cli (main.cpp loads it for every verb that needs
// LibTorch): the global options, then each verb of runner/verbs/ (NORMLAB_VERBS in verb.h) adds its
// subcommand; every subcommand is a core function.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <vector>

#include "normlab/plugins/registry.h"
#include "normlab/runtime_env.h"
#include "run/build_info.h"
#include "verbs/verb.h"

extern "C" __attribute__((visibility("default"))) int normlab_cli_main(int argc, char** argv) {
  using normlab::verbs::usage_exit;
  CLI::App app{normlab::verbs::kDescription};
  app.set_version_flag(
      "--version", [] { return normlab::version_text(); },
      "normlab version, git commit, LibTorch version, CUDA, SDK ABI");
  normlab::verbs::Globals g;
  normlab::verbs::add_global_options(app, g);
  std::vector<normlab::verbs::Verb> verbs;
  for (normlab::verbs::AddVerb add : normlab::verbs::kVerbs) verbs.push_back(add(app, g));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return usage_exit(app, e);
  }
  // Through the environment, so sweep workers (`normlab run-one`) inherit the choice.
  if (g.allow_unsafe_plugin_path) ::setenv(normlab::PluginRegistry::kAllowUnsafeEnv, "1", 1);
  try {
    for (const normlab::verbs::Verb& v : verbs)
      if (v.cmd->parsed()) {
        // main.cpp chose the wait policy and OpenBLAS's kernels before loading this library.
        if (v.uses_blas) {
          try {  // a bad NORMLAB_CPU_ISA, _BLAS_AUTO or _OMP_AUTO: a usage error, before any work
            normlab::kernel_isa_from_env();
            normlab::automatic_choice_on("NORMLAB_BLAS_AUTO");
            normlab::automatic_choice_on("NORMLAB_OMP_AUTO");
          } catch (const std::invalid_argument& e) {
            std::cerr << "normlab: error: " << e.what() << "\n";
            return normlab::verbs::kExitUsage;
          }
        }
        if (!v.trains) normlab::tune_malloc();
        return v.run();
      }
  } catch (const CLI::Error& e) {
    return usage_exit(app, e);
  } catch (const normlab::PluginError& e) {  // bad input: exit code 2, like a bad manifest
    std::cerr << "normlab: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "normlab: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
