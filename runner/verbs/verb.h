// A `normlab` subcommand (a verb): its CLI11 options and what running it does. Each verb is one
// file, runner/verbs/<name>.cpp, defining add_<name>; NORMLAB_VERBS below is the one list of them.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "normlab/sdk/geometry.h"

namespace normlab::verbs {

// Usage errors exit 2 (the shell convention, and normlab's code for bad input) rather than
// CLI11's own codes (105, 106, 109, …); --help and --version still exit 0.
constexpr int kExitUsage = 2;

// What every subcommand may need of the global options.
struct Globals {
  std::vector<std::string> plugin_paths;  // --plugin-path
  bool allow_unsafe_plugin_path = false;
};

// A subcommand: its CLI11 options, bound to state the closure owns, and what running it does.
struct Verb {
  CLI::App* cmd;
  std::function<int()> run;
  // Trains in this process: its training session decides on normlab's malloc thresholds
  // (normlab::tune_malloc), main does for every other verb.
  bool trains = false;
  // Multiplies matrices in this process (or starts workers that do): main lets OpenBLAS use its
  // fastest kernels first, which may re-execute normlab (normlab::choose_blas_kernels, ~0.4 s).
  // The verbs that only read and write files (plot, report, …) skip that.
  bool uses_blas = true;
};

// The state a verb's options are bound to: shared by its closure, so it outlives add_<name>.
template <class T>
std::shared_ptr<T> state() {
  return std::make_shared<T>();
}

inline Arch parse_arch(const std::string& s) { return s == "lm" ? Arch::LM : Arch::EncDec; }

// The subcommands, in the order `normlab --help` lists them: X(name) for each
// `Verb add_name(CLI::App&, const Globals&)` of runner/verbs/name.cpp (run-one: run_one).
// clang-format off
#define NORMLAB_VERBS(X) \
  X(plugins) \
  X(smoke) \
  X(bench) \
  X(train) \
  X(sweep) \
  X(frontier) \
  X(run_one) \
  X(data) \
  X(export) \
  X(checkpoint) \
  X(manifest) \
  X(bleu) \
  X(eval) \
  X(ablate) \
  X(translate) \
  X(forward) \
  X(plot) \
  X(report)
// clang-format on

using AddVerb = Verb (*)(CLI::App&, const Globals&);
#define NORMLAB_DECLARE_VERB(name) Verb add_##name(CLI::App& app, const Globals& g);
NORMLAB_VERBS(NORMLAB_DECLARE_VERB)
#undef NORMLAB_DECLARE_VERB

#define NORMLAB_VERB_ENTRY(name) add_##name,
inline constexpr AddVerb kVerbs[] = {NORMLAB_VERBS(NORMLAB_VERB_ENTRY)};
#undef NORMLAB_VERB_ENTRY

}  // namespace normlab::verbs
