"""The matplotlib set-up shared by every normlab figure (normlab_frontier.py, normlab_plots.py):
the Agg backend, fonts and sizes, stable SVG output, the clean error when matplotlib is missing,
and the figure helpers both use.

Importing this module imports no matplotlib: load_matplotlib() does, when a figure is about to be
drawn, so bad inputs fail with their own error first. Until then plt, mcolors, mticker and Line2D
are None.
"""
import math
import sys

plt = mcolors = mticker = Line2D = None  # set by load_matplotlib(): bad inputs fail before the import


def load_matplotlib():
    global plt, mcolors, mticker, Line2D
    if plt is not None:
        return
    try:
        import matplotlib
    except ImportError:
        sys.exit(f"normlab: error: {sys.executable} cannot import matplotlib: install Debian's "
                 "python3-matplotlib, or set NORMLAB_PYTHON to a Python that has it")
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    from matplotlib import colors, ticker
    from matplotlib.lines import Line2D as line2d
    pyplot.rcParams.update({
        "svg.fonttype": "none",  # titles stay searchable text in the SVG
        "svg.hashsalt": "normlab",  # stable ids: the same data gives the same file
        "font.size": 9,
        "axes.titlesize": 9.5,
        "axes.labelsize": 9,
        "legend.fontsize": 8,
        "figure.titlesize": 11,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "lines.linewidth": 1.4,
        "text.usetex": False,  # a matplotlibrc's LaTeX would parse names (see plain_names)
    })
    plt, mcolors, mticker, Line2D = pyplot, colors, ticker, line2d


def plain_names(fig):
    """Every text of the figure drawn as it reads, never parsed as mathtext: run, task and scheme
    names come from the user's files, and a name such as "m$\\foo$" failed the whole figure. Tick
    labels and axis offsets keep their mathtext (a log axis's 10^k)."""
    from matplotlib.text import Text
    formatted = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            formatted.add(axis.get_offset_text())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                formatted.update((tick.label1, tick.label2))
    for text in fig.findobj(Text):
        if text in formatted:
            continue
        if hasattr(text, "set_parse_math"):  # matplotlib >= 3.5
            text.set_parse_math(False)
        else:  # an escaped $ is drawn as $
            text.set_text(text.get_text().replace("$", r"\$"))


def show_lone_values(fig, markers=True):
    """A lone value made visible. A line of one point draws nothing: it gets a marker (5 pt at
    least). A linear axis whose data is one value v spans 0..2v (v in the middle, the axis from the
    origin of updates, scores and counts) where matplotlib pads v by ±5%: one validation at update
    60 gave an axis 57–63 that reads like a close-up of a curve. Fixed limits are left alone."""
    for ax in fig.axes:
        if not ax.get_lines():
            continue
        for line in ax.get_lines() if markers else ():
            n = sum(1 for x, y in line.get_xydata() if math.isfinite(x) and math.isfinite(y))
            if n == 1:
                if line.get_marker() in (None, "None", "none", "", " "):
                    line.set_marker("o")
                line.set_markersize(max(line.get_markersize(), 5))
        for (lo, hi), auto, scale, set_lim in (
                (ax.dataLim.intervalx, ax.get_autoscalex_on(), ax.get_xscale(), ax.set_xlim),
                (ax.dataLim.intervaly, ax.get_autoscaley_on(), ax.get_yscale(), ax.set_ylim)):
            if auto and scale == "linear" and math.isfinite(lo) and lo == hi:
                set_lim(*sorted((0.0, 2.0 * lo)) if lo else (-1.0, 1.0))
