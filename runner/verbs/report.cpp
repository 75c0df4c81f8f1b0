// `normlab report DIR`: summary.csv, an HTML report and Markdown of a sweep.

#include "normlab/analysis/plot_command.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_report(CLI::App& app, const Globals&) {
  auto o = state<normlab::analysis::ReportOptions>();
  auto* report = app.add_subcommand(
      "report", "summary.csv, a self-contained HTML report and Markdown of a sweep");
  report->add_option("DIR", o->dirs, "sweep directory (and/or run directories)")->required();
  report->add_option("--out", o->out, "output directory (default: DIR/report)");
  report->footer(
      "Runs Python with matplotlib: $NORMLAB_PYTHON, else /usr/bin/python3, else python3.");
  return {report, [o] { return normlab::analysis::report_command(*o); }, /*trains=*/false,
          /*uses_blas=*/false};
}

}  // namespace normlab::verbs
