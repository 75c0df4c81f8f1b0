// `normlab plot` and `normlab report`: the figures and the report are drawn by Python scripts with
// Debian's matplotlib (analysis/python, installed to share/normlab/python); these functions find
// the interpreter and the script and run it, passing its exit code through. No LibTorch.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace normlab::analysis {

struct PlotOptions {
  std::vector<std::string> dirs;  // run and/or sweep directories
  std::string out;                // output directory (required)
  std::string formats = "png,svg";
  std::string updates;  // "first,last" when empty (the script's default)
  std::string only;     // comma-separated figure names; empty: every figure
};

struct ReportOptions {
  std::vector<std::string> dirs;  // sweep and/or run directories
  std::string out;                // empty: FIRST_DIR/report
};

// The interpreter: $NORMLAB_PYTHON, else /usr/bin/python3 (Debian's, which has python3-matplotlib),
// else python3 on PATH. Throws std::runtime_error when $NORMLAB_PYTHON names no executable file.
std::string find_python();

// The directory holding the scripts: $NORMLAB_PYTHON_DIR, else <exe>/../share/normlab/python when
// normlab is installed, else the source tree's analysis/python (build tree), else the configured
// install directory. Throws std::runtime_error naming the places tried when none has `script`.
std::filesystem::path find_script(const std::string& script);

// Runs `python script args…` in a child process and waits; returns its exit code (128+signal when
// it was killed). Throws std::runtime_error when the interpreter cannot be started.
int run_python_script(const std::string& script, const std::vector<std::string>& args);

int plot_command(const PlotOptions& opt);
int report_command(const ReportOptions& opt);

}  // namespace normlab::analysis
