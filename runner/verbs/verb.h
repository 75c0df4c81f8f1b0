// A `normlab` subcommand (a verb): its CLI11 options and what running it does. Each verb is one
// file, runner/verbs/<name>.cpp, defining add_<name>; NORMLAB_VERBS below is the one list of them.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
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

inline constexpr const char* kDescription =
    "normlab — residual/normalization schemes for deep Transformers";

// The options before any verb, shared by main.cpp's light verbs and the whole CLI (cli.cpp), so a
// command line parses the same in both.
inline void add_global_options(CLI::App& app, Globals& g) {
  app.require_subcommand(1);
  app.fallthrough();  // global options (--plugin-path) may follow the subcommand
  // One value per occurrence (`--plugin-path A --plugin-path B`): a second value would be taken for
  // the verb by main.cpp, which routes the verbs before CLI11 parses.
  app.add_option("--plugin-path", g.plugin_paths, "extra plugin directory or file (repeatable)")
      ->allow_extra_args(false);
  app.add_flag("--allow-unsafe-plugin-path", g.allow_unsafe_plugin_path,
               "accept world-writable plugin folders/files and files of other users (warns)");
}

inline int usage_exit(CLI::App& app, const CLI::Error& e) {
  const int code = app.exit(e);
  return code == 0 ? 0 : kExitUsage;
}

// A subcommand: its CLI11 options, bound to state the closure owns, and what running it does.
struct Verb {
  CLI::App* cmd;
  std::function<int()> run;
  // Trains in this process: its training session decides on normlab's malloc thresholds
  // (normlab::tune_malloc), main does for every other verb.
  bool trains = false;
  // Multiplies matrices in this process (or starts workers that do): OpenBLAS's fastest kernels
  // and the OpenMP wait policy are chosen for it before LibTorch loads (main.cpp names the verbs
  // that only read and write files — plot, report, … — which skip that).
  bool uses_blas = true;
};

// The state a verb's options are bound to: shared by its closure, so it outlives add_<name>.
template <class T>
std::shared_ptr<T> state() {
  return std::make_shared<T>();
}

// A whole number of 1 or more. CLI11's PositiveNumber said "not in range 0.000000 to 1797…"
// (DBL_MAX in 309 digits, 0 included: issue 56.20).
inline const CLI::Validator kPositive(
    [](std::string& text) -> std::string {
      long long v = 0;
      size_t used = 0;
      try {
        v = std::stoll(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != text.size() || used == 0 || v < 1)
        return "expected a whole number of 1 or more, got '" + text + "'";
      return {};
    },
    "INT>=1", "positive");

// A finite number (fractions allowed) above `least`, or from it with `or_equal`.
inline CLI::Validator number_from(double least, bool or_equal) {
  return CLI::Validator(
      [least, or_equal](std::string& text) -> std::string {
        double v = 0;
        size_t used = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != text.size() || used == 0 || !std::isfinite(v) ||
            !(or_equal ? v >= least : v > least))
          return "expected a number " + std::string(or_equal ? "of " : "above ") +
                 CLI::detail::to_string(least) + (or_equal ? " or more" : "") + ", got '" + text +
                 "'";
        return {};
      },
      or_equal ? "NUMBER>=0" : "NUMBER>0", "number");
}
inline const CLI::Validator kNonNegative = number_from(0, true);
inline const CLI::Validator kPositiveSeconds = number_from(0, false);

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
