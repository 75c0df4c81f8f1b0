// `normlab plot DIR... --out OUT`: figures of the analysis quantities.

#include "normlab/analysis/plot_command.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_plot(CLI::App& app, const Globals&) {
  auto o = state<normlab::analysis::PlotOptions>();
  auto* plot = app.add_subcommand(
      "plot", "figures of the analysis quantities (PNG/SVG) from run and sweep directories");
  plot->add_option("DIR", o->dirs, "run directories and/or sweep directories (sweep.json)")
      ->required();
  plot->add_option("--out", o->out, "output directory")->required();
  plot->add_option("--format", o->formats, "comma-separated: png, svg, pdf (default png,svg)");
  plot->add_option("--update", o->updates,
                   "updates for the per-layer gradient figures: first, last or numbers, "
                   "comma-separated (default first,last)");
  plot->add_option("--only", o->only,
                   "comma-separated figures to draw (e.g. layer_ablation; default: all)");
  plot->footer(
      "Runs Python with matplotlib: $NORMLAB_PYTHON, else /usr/bin/python3, else python3.");
  return {plot, [o] { return normlab::analysis::plot_command(*o); }, /*trains=*/false,
          /*uses_blas=*/false};
}

}  // namespace normlab::verbs
