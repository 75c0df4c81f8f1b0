"""`normlab plot`'s script run in this process, writing what each figure holds as JSON: what a PNG
or SVG shows only as pixels or paths (axis limits, markers, line styles, hatches, legend entries),
for check_plots.py. Run it with the Python that `normlab` runs (it needs matplotlib).

usage: describe_figures.py ANALYSIS_PYTHON_DIR OUT_JSON NORMLAB_PLOTS_ARGS...
OUT_JSON: {file stem: {"suptitle", "legends": [entries], "axes": [{"title", "xlabel", "ylabel",
"xscale", "yscale", "xlim", "ylim", "texts", "lines": [{"label", "color", "linestyle", "marker",
"markersize", "points"}], "bands": [{"hatch", "facecolor", "edgecolor"}], "legend": [entries],
"yticks": [[value, label]], "xticks": [label], "visible"}]}}, an entry being
{"text", "color", "linestyle", "hatch"} of a legend line; the figure as it was when first saved.
"""
import json
import math
import os
import sys

pydir, out_json, args = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, pydir)
import normlab_plots  # noqa: E402

normlab_plots._load_matplotlib()
normlab_plots.JOBS = 1  # the figures in this process, where the savefig below sees them
from matplotlib import colors  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def _hex(c):
    return colors.to_hex(c, keep_alpha=True)


def _legend(leg):
    if leg is None:
        return []
    handles = getattr(leg, "legend_handles", None) or leg.legendHandles  # matplotlib < 3.7
    out = []
    for text, h in zip(leg.get_texts(), handles):
        e = {"text": text.get_text(), "color": None, "linestyle": None, "hatch": None}
        if hasattr(h, "get_linestyle") and hasattr(h, "get_color"):
            e.update(color=_hex(h.get_color()), linestyle=h.get_linestyle())
        if hasattr(h, "get_hatch"):  # a patch: a band's entry (its first artist when a tuple)
            e["hatch"] = h.get_hatch()
        out.append(e)
    return out


def _yticks(ax):
    """[[value, label]] of the labelled y ticks (major and minor) inside the view."""
    lo, hi = sorted(ax.get_ylim())
    out = []
    for axis_ticks, fmt in ((ax.yaxis.get_majorticklocs(), ax.yaxis.get_major_formatter()),
                            (ax.yaxis.get_minorticklocs(), ax.yaxis.get_minor_formatter())):
        fmt.set_axis(ax.yaxis)
        labels = fmt.format_ticks(list(axis_ticks))
        out += [[float(v), t] for v, t in zip(axis_ticks, labels) if t and lo <= v <= hi]
    return sorted(out)


def _xticks(ax):
    """The labels of the major x ticks inside the view."""
    lo, hi = sorted(ax.get_xlim())
    fmt = ax.xaxis.get_major_formatter()
    fmt.set_axis(ax.xaxis)
    locs = [v for v in ax.xaxis.get_majorticklocs() if lo <= v <= hi]
    return [t for t in fmt.format_ticks(list(locs)) if t]


def _describe(fig):
    axes = []
    for ax in fig.axes:
        lines = [{"label": ln.get_label(), "color": _hex(ln.get_color()), "linestyle": ln.get_linestyle(),
                  "marker": ln.get_marker(), "markersize": ln.get_markersize(),
                  "points": sum(1 for x, y in ln.get_xydata() if math.isfinite(x) and math.isfinite(y)),
                  "y0": float(ln.get_xydata()[0][1]) if len(ln.get_xydata()) else None,
                  "xs": [float(x) for x, _ in ln.get_xydata()]}
                 for ln in ax.get_lines()]
        bands = [{"hatch": c.get_hatch(), "facecolor": _hex(c.get_facecolor()[0]),
                  "edgecolor": _hex(c.get_edgecolor()[0])}
                 for c in ax.collections if isinstance(c, PolyCollection)]
        axes.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                     "xscale": ax.get_xscale(), "yscale": ax.get_yscale(), "xlim": list(ax.get_xlim()),
                     "ylim": list(ax.get_ylim()), "texts": [t.get_text() for t in ax.texts],
                     "lines": lines, "bands": bands, "legend": _legend(ax.get_legend()),
                     "yticks": _yticks(ax), "xticks": _xticks(ax), "visible": ax.get_visible()})
    sup = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return {"suptitle": sup, "legends": [_legend(leg) for leg in fig.legends], "axes": axes}


described = {}
_savefig = Figure.savefig


def savefig(fig, fname, *a, **kw):
    described.setdefault(os.path.splitext(os.path.basename(str(fname)))[0], _describe(fig))
    return _savefig(fig, fname, *a, **kw)


Figure.savefig = savefig
rc = normlab_plots.main(args)
with open(out_json, "w", encoding="utf-8") as f:
    json.dump(described, f, indent=1)
sys.exit(rc)
