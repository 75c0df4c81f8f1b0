"""`normlab plot`: the figures of the papers from normlab run and sweep directories.

usage: normlab_plots.py RUN_OR_SWEEP_DIR... --out DIR [--format png,svg] [--update first,last]

Each figure is written as PNG and/or SVG (text kept as text in the SVG). A figure whose data is
absent is skipped with a printed note. Used as a module by normlab_report.py (make_figures).
"""
import argparse
import concurrent.futures
import contextlib
import json
import math
import multiprocessing
import os
import pickle
import re
import signal
import sys
import traceback
from collections import OrderedDict, defaultdict

sys.dont_write_bytecode = True  # no __pycache__ in the source tree or the install prefix
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import normlab_figures  # noqa: E402
import normlab_frontier  # noqa: E402
import normlab_outdir  # noqa: E402
import normlab_rundata as rd  # noqa: E402
import normlab_paper as paper  # noqa: E402

plt = mcolors = mticker = Line2D = None  # set by _load_matplotlib(): bad inputs fail before the import


def _load_matplotlib():
    """normlab_figures.load_matplotlib(), its modules bound here too."""
    global plt, mcolors, mticker, Line2D
    normlab_figures.load_matplotlib()
    plt, mcolors, mticker, Line2D = (normlab_figures.plt, normlab_figures.mcolors, normlab_figures.mticker,
                                     normlab_figures.Line2D)


LAYER_AXIS = "layer (1 = next to the embeddings)"
UPDATE_AXIS = "update (optimizer steps)"



def _probe_selected(run, probe):
    """Whether the run's resolved manifest selects `probe` (analysis.probes; "all" selects every
    probe). A run without a readable manifest counts as selecting it."""
    manifest = getattr(run, "manifest", None)
    if not isinstance(manifest, dict):
        return True
    probes = manifest.get("analysis", {}).get("probes")
    return not isinstance(probes, list) or "all" in probes or probe in probes

class Figure:
    """A written figure: key (file stem), title, caption, files, and the run it belongs to."""

    def __init__(self, key, title, caption, files, run=None, group=None):
        self.key, self.title, self.caption, self.files, self.run = key, title, caption, files, run
        self.group = group or key  # per-run figures of one kind share a group


# --- styles -------------------------------------------------------------------------------------

def styles(runs):
    """One colour per scheme (tab10), darker for deeper models; line styles separate runs that
    share scheme and depth."""
    base = plt.get_cmap("tab10").colors
    scheme_color = OrderedDict()
    for r in runs:
        scheme_color.setdefault(r.scheme, base[len(scheme_color) % len(base)])
    depths = defaultdict(set)
    for r in runs:
        depths[r.scheme].add(r.depth_value())
    seen = defaultdict(int)
    out = {}
    dashes = ["-", "--", ":", "-."]
    for r in runs:
        ds = sorted(depths[r.scheme])
        t = 1.0 if len(ds) == 1 else 0.45 + 0.55 * ds.index(r.depth_value()) / (len(ds) - 1)
        c = mcolors.to_rgb(scheme_color[r.scheme])
        color = tuple(1 - t + t * ch for ch in c)
        key = (r.scheme, r.depth_value())
        out[id(r)] = {"color": color, "linestyle": dashes[seen[key] % len(dashes)]}
        seen[key] += 1
    return out


def _positive(xs, ys):
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y) and y > 0]
    return [p[0] for p in pts], [p[1] for p in pts]


def _loglog(xs, ys):
    """Points drawable on log-log axes: update 0 (before training) has no place on a log x axis."""
    xs, ys = _positive(xs, ys)
    pts = [(x, y) for x, y in zip(xs, ys) if x > 0]
    return [p[0] for p in pts], [p[1] for p in pts]


def _finite(xs, ys):
    """Points drawable on a linear y axis: beyond ±1e300 (no measurement; a hostile file's 1e308)
    matplotlib's tick arithmetic overflows and raises."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y) and abs(y) <= 1e300]
    return [p[0] for p in pts], [p[1] for p in pts]


def _line_values(r):
    """What a run trained with, besides its depth and seed: its resolved manifest's model, scheme,
    optim and data keys (and run.dtype), as texts."""
    out = {}
    for sec in ("model", "scheme", "optim", "data"):
        for k, v in (r.manifest.get(sec) or {}).items():
            key = f"{sec}.{k}"
            if key not in ("model.enc_layers", "model.dec_layers", "scheme.name"):
                out[key] = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)
    if "dtype" in (r.manifest.get("run") or {}):
        out["run.dtype"] = str(r.manifest["run"]["dtype"])
    return out


def _depth_lines(runs, name_of):
    """The lines of a figure against depth: a run's line is its scheme (`name_of(run)`, or the
    sweep's label of the scheme's table) and what else differs between the runs' manifests besides
    depth and seed (an lr axis, a scheme's parameters, a model table's width), so that runs of other
    seeds are averaged and runs of other values are never joined into one zig-zag line.
    Returns [(label, runs)] in first-seen order."""
    values = {id(r): _line_values(r) for r in runs}
    schemes = OrderedDict()
    for r in runs:
        schemes.setdefault(name_of(r), []).append(r)
    lines = OrderedDict()
    for name, rs in schemes.items():  # what varies among one scheme's runs
        keys = sorted({k for r in rs for k in values[id(r)]})
        varying = [k for k in keys if len({values[id(r)].get(k) for r in rs}) > 1]
        for r in rs:
            # A scheme table axis records its label (or its variant's id text) under "scheme" and
            # the plugin under "scheme.name" (sweep.json).
            variant = r.sweep_values.get("scheme")
            named = variant if isinstance(variant, str) and variant != r.sweep_values.get("scheme.name", variant) \
                else None
            label = named or name
            for k in varying:
                if named and k.startswith("scheme."):
                    continue  # the label names the variant
                label += f", {k.rsplit('.', 1)[-1]}={values[id(r)].get(k, '—')}"
            key = (name, tuple(values[id(r)].get(k) for k in varying))
            lines.setdefault(key, (label, []))[1].append(r)
    return list(lines.values())


def _depth_axis(runs):
    """(depth of a run, the axis label) for a figure against depth: layers per stack, or where an
    encoder-decoder has N ≠ M, total layers N+M for every run (one axis, one meaning)."""
    if any(r.arch != "lm" and r.enc_layers != r.dec_layers for r in runs):
        return (lambda r: r.dec_layers if r.arch == "lm" else r.enc_layers + r.dec_layers), \
            "total layers N+M (a decoder-only model: its layers)"
    return (lambda r: r.depth_value()), "layers per stack (N for an NL-NL model)"


def _by_depth(rs, value, depth):
    """[(depth, mean, [each run's value])] of the runs' finite values, by depth(run)."""
    at = OrderedDict()
    for r in sorted(rs, key=depth):
        v = value(r)
        if v is not None and math.isfinite(v) and abs(v) <= 1e300:
            at.setdefault(depth(r), []).append(v)
    return [(d, sum(vs) / len(vs), vs) for d, vs in at.items()]


LINE_STYLES = ("-", "--", ":", "-.")


def _grid(nrow, ncol, w=4.2, h=2.7, title_lines=1, hgap=1.0, sharey=False):
    """Panels of w x h inches with fixed margins (no layout engine: several times faster, and
    savefig's tight box crops the rest)."""
    left, right, bottom = 0.8, 0.15, 0.6
    top = 0.45 + 0.2 * title_lines
    vgap = 0.7 + 0.2 * title_lines
    W = left + ncol * w + (ncol - 1) * hgap + right
    H = bottom + nrow * h + (nrow - 1) * vgap + top
    return plt.subplots(nrow, ncol, figsize=(W, H), squeeze=False, sharey=sharey, gridspec_kw=dict(
        left=left / W, right=1 - right / W, bottom=bottom / H, top=1 - top / H,
        wspace=hgap / w, hspace=vgap / h))


def _si_tokens(x, _pos=None):
    """A token count as a tick label: 500, 12.5K, 3M, 1.2B."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def _suptitle(fig, text):
    fig.suptitle(text, y=1 - 0.08 / fig.get_figheight(), va="top")


def _plain_log_formatter(**kw):
    """LogFormatter's choice of labelled ticks, written 0.3 / 40 instead of 3e-01 / 4e+01."""

    class PlainLogFormatter(mticker.LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:.3g}"

    return PlainLogFormatter(**kw)


def _log_y(ax):
    """Log y; below two decades plain numbers (40, not 4×10¹) on major and minor ticks."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo < 100:
        ax.yaxis.set_major_formatter(_plain_log_formatter())
        ax.yaxis.set_minor_formatter(_plain_log_formatter(minor_thresholds=(2, 0.5)))


def _exact_decimals(ticks, step):
    """The fewest decimals that write every tick exactly (multiples of `step`): 2.165, not 2.17."""
    for d in range(0, 10):
        if all(abs(float(f"{t:.{d}f}") - t) <= 1e-6 * step for t in ticks):
            return d
    return 9


def _readable_log_ticks(ax):
    """Ticks of a log y axis that read true (issue 46.3). Below two decades: about five evenly
    spaced ticks, each written with the decimals its spacing needs, and no minor labels (minor
    labels at 3 digits read 2.18, 2.18, 2.17). Wider: the decades, and labelled minor ticks when
    fewer than 3 decades are in view (a 0.6–1.8 axis showed only 0.6 and 1)."""
    lo, hi = ax.get_ylim()
    if not (lo > 0 and hi > lo and math.isfinite(hi)):
        return
    if hi / lo < 100:
        ticks = [t for t in mticker.MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
                 if lo <= t <= hi and t > 0]
        if len(ticks) < 2:
            return
        d = _exact_decimals(ticks, ticks[1] - ticks[0])
        ax.yaxis.set_major_locator(mticker.FixedLocator(ticks))
        ax.yaxis.set_major_formatter(mticker.FixedFormatter([f"{t:.{d}f}" for t in ticks]))
        ax.yaxis.set_minor_formatter(mticker.NullFormatter())
        ax.set_ylim(lo, hi)
        return
    majors = [t for t in ax.yaxis.get_majorticklocs() if lo <= t <= hi]
    if len(majors) < 3:
        ax.yaxis.set_minor_formatter(_plain_log_formatter(minor_thresholds=(3, 0.5)))


def _layer_x(ax):
    ax.set_xlabel(LAYER_AXIS)
    ax.xaxis.set_major_locator(mticker.MaxNLocator(integer=True, min_n_ticks=1))
    lo, hi = ax.dataLim.intervalx
    if lo == hi:  # one layer: its own slot (show_lone_values' 0..2v would show a layer 0)
        ax.set_xlim(lo - 0.5, hi + 0.5)


def _empty(ax, text="no data recorded"):
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def _run_legend(fig, runs, style, extra=()):
    """A legend right of the panels, one line per run (several columns when long)."""
    handles = [Line2D([], [], color=style[id(r)]["color"], linestyle=style[id(r)]["linestyle"],
                      label=r.legend_label()) for r in runs]
    handles += list(extra)
    ncol = 1 if len(handles) <= 16 else 2
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), ncol=ncol,
               frameon=False, title="run")


def _diverged_handle(runs):
    """The legend entry for the × marker, when a run diverged."""
    if not any(r.diverged_at() is not None for r in runs):
        return []
    return [Line2D([], [], marker="x", color="0.2", linestyle="none", label="diverged")]


def _stacks(runs):
    have = {s for r in runs for s in r.stacks}
    return [s for s in rd.STACKS if s in have]


def _stack_title(stack, runs):
    if stack == "decoder" and any(r.arch == "lm" for r in runs):
        return "decoder (LM runs: all layers)" if any(r.arch != "lm" for r in runs) \
            else "decoder-only model"
    return stack


class Plotter:
    def __init__(self, runs, out_dir, formats, update_specs, log):
        self.runs = runs
        self.out_dir = out_dir
        self.formats = formats
        self.update_specs = update_specs
        self.log = log
        self.style = styles(runs)
        self.figures = []
        os.makedirs(out_dir, exist_ok=True)

    def skip(self, what, why):
        self.log(f"note: skipping {what}: {why}")

    def save(self, fig, key, title, caption, run=None, group=None):
        normlab_figures.show_lone_values(fig)
        for ax in fig.axes:
            if ax.get_yscale() == "log":
                _readable_log_ticks(ax)
        normlab_figures.plain_names(fig)
        files = []
        for fmt in self.formats:
            path = os.path.join(self.out_dir, f"{key}.{fmt}")
            kw = {"metadata": {"Date": None}} if fmt == "svg" else {"dpi": 110}
            fig.savefig(path, bbox_inches="tight", **kw)
            files.append(path)
        plt.close(fig)
        self.figures.append(Figure(key, title, caption, files, run, group))

    def with_metric(self, metric):
        return [r for r in self.runs if r.analysis is not None and r.analysis.has(metric)]

    def pick_update(self, run, metric, spec):
        ups = run.analysis.updates(metric)
        if not ups:
            return None
        if spec == "first":
            return ups[0]
        if spec == "last":
            return ups[-1]
        return run.analysis.nearest_update(metric, int(spec))

    @staticmethod
    def spec_title(spec, chosen):
        """Panel title naming the update shown; runs that stopped earlier say so in the legend."""
        values = sorted(set(u for u in chosen.values() if u is not None))
        if spec in ("first", "last"):
            name = f"{spec} recorded update"
            return f"{name} ({values[0]})" if len(values) == 1 else f"{name} of each run"
        if len(values) == 1 and values[0] == int(spec):
            return f"update {spec}"
        return f"recorded update nearest to {spec}" + (f" ({values[0]})" if len(values) == 1 else "")

    def layer_gradient_panel(self, ax, runs, stack, per_layer):
        """One line per run of per_layer(run) (a value per layer, from layer 1) on a log axis;
        False (and an empty panel) when no run has a positive value."""
        drawn = False
        for r in runs:
            if stack not in r.stacks:
                continue
            values = per_layer(r)
            xs, ys = _positive(range(1, len(values) + 1), values)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=2.5, **self.style[id(r)])
                drawn = True
        if not drawn:
            _empty(ax)
            return False
        _log_y(ax)
        _layer_x(ax)
        ax.set_ylabel("‖∇θ loss‖₂ of the layer's parameters")
        return True

    # --- 1. gradient norm per layer -----------------------------------------------------------
    def grad_norm_layers(self):
        runs = self.with_metric("grad_norm")
        if not runs:
            return self.skip("gradient norm per layer", "no grad_norm rows in any run")
        stacks = _stacks(runs)
        specs = self.update_specs
        fig, axes = _grid(len(specs), len(stacks))
        for row, spec in enumerate(specs):
            chosen = {r.label: self.pick_update(r, "grad_norm", spec) for r in runs}
            for col, stack in enumerate(stacks):
                def per_layer(r, stack=stack):
                    vals = r.analysis.at("grad_norm", chosen[r.label])
                    L = r.enc_layers if stack == "encoder" else r.dec_layers
                    return [vals.get((stack, i, "all")) for i in range(L)]
                if self.layer_gradient_panel(axes[row][col], runs, stack, per_layer):
                    axes[row][col].set_title(f"{_stack_title(stack, runs)} — " + self.spec_title(spec, chosen))
        _suptitle(fig, "Gradient norm per layer (B2T Fig. 3, DeepNet Fig. 3d)")
        _run_legend(fig, runs, self.style)
        self.save(fig, "grad_norm_layers", "Gradient norm per layer",
                  "L2 norm of the gradient of each layer's parameters, before clipping, at the "
                  "first and last recorded update. Post-LN's decoder shows the vanishing gradient "
                  "toward the bottom layers (B2T Fig. 3).")

    # --- 2. model update ||ΔF|| ---------------------------------------------------------------
    def update_norm(self):
        runs = [r for r in self.with_metric("update_norm")
                if r.analysis.series("update_norm", "model", -1, "logits")[0]]
        prun = [r for r in self.with_metric("param_update")
                if r.analysis.series("param_update", "model", -1, "total")[0]]
        if not runs and not prun:
            return self.skip("model update ‖ΔF‖", "no update_norm/param_update rows for the model")
        panels = [p for p in (("update_norm", "logits", runs), ("param_update", "total", prun)) if p[2]]
        fig, axes = _grid(1, len(panels))
        for ax, (metric, sub, rs) in zip(axes[0], panels):
            for r in rs:
                xs, ys = _loglog(*r.analysis.series(metric, "model", -1, sub))
                if not xs:
                    continue
                ax.plot(xs, ys, **self.style[id(r)])
                if r.diverged_at() is not None:
                    ax.plot([xs[-1]], [ys[-1]], marker="x", markersize=9, mew=2,
                            color=self.style[id(r)]["color"], linestyle="none")
            ax.set_xscale("log")
            _log_y(ax)
            ax.set_xlabel(UPDATE_AXIS + ", log scale")
            if metric == "update_norm":
                ax.set_title("model update ‖F(x,θ_t) − F(x,θ_0)‖ on a fixed batch")
                ax.set_ylabel("‖ΔF‖₂ of the logits (mean per token)")
            else:
                ax.set_title("relative parameter change of one step")
                ax.set_ylabel("‖Δθ‖₂ / ‖θ‖₂")
        diverged = _diverged_handle(set(runs) | set(prun))
        _suptitle(fig, "Model update over training (DeepNet Fig. 3a" + ("; × = diverged)" if diverged else ")"))
        _run_legend(fig, sorted(set(runs) | set(prun), key=self.runs.index), self.style, diverged)
        self.save(fig, "update_norm", "Model update ‖ΔF‖ over training",
                  "How far the model's output on a fixed probe batch has moved from its initial "
                  "output, and the relative size of each optimizer step. DeepNet Fig. 3a: Post-LN "
                  "jumps in the first updates and then stalls; DeepNorm grows smoothly.")

    def update_norm_depth(self):
        runs = [r for r in self.with_metric("update_norm")
                if _positive(*r.analysis.series("update_norm", "model", -1, "logits"))[0]]
        depth, depth_label = _depth_axis(runs)
        depths = {depth(r) for r in runs}
        if len(depths) < 2:
            return self.skip("final ‖ΔF‖ vs depth", "fewer than two depths with update_norm data")
        fig, axes = _grid(1, 1, w=4.4, h=3.0, title_lines=2)
        ax = axes[0][0]
        mixed_arch = len({r.arch for r in runs}) > 1
        lines = _depth_lines(runs, lambda r: r.scheme + (" (decoder-only)" if mixed_arch and r.arch == "lm" else ""))
        handles, averaged, styles = [], False, {}

        def final(r):
            return _positive(*r.analysis.series("update_norm", "model", -1, "logits"))[1][-1]
        for label, rs in lines:
            color = max((self.style[id(r)]["color"] for r in rs), key=lambda c: -sum(c))
            ls = LINE_STYLES[styles.setdefault(color, 0) % len(LINE_STYLES)]
            styles[color] += 1
            pts = _by_depth(rs, final, depth)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker="o", linestyle=ls)
            for d, _, vs in pts:
                if len(vs) > 1:  # several runs (seeds) at this depth: the line is their mean
                    averaged = True
                    ax.plot([d] * len(vs), vs, linestyle="none", marker=".", color=color, alpha=0.6)
            for r in rs:
                if r.diverged_at() is not None:
                    ax.plot([depth(r)], [final(r)], marker="x", markersize=10, mew=2, color="black")
            handles.append(Line2D([], [], color=color, marker="o", linestyle=ls, label=label))
        if any(r.diverged_at() is not None for r in runs):  # the × explained only when drawn
            handles.append(Line2D([], [], color="black", marker="x", linestyle="none",
                                  label="diverged (value when it stopped)"))
        _log_y(ax)
        ax.set_xlabel(depth_label)
        ax.set_ylabel("final ‖ΔF‖₂ of the logits (mean per token)")
        ax.set_xticks(sorted(depths))
        ax.set_title("Model update at each run's last recorded update vs depth\n(DeepNet Fig. 4)")
        ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                  title="scheme")
        self.save(fig, "update_norm_vs_depth", "Final model update ‖ΔF‖ vs depth",
                  "‖ΔF‖ at each run's last recorded update, one line per scheme (and per other swept "
                  "value)" + ("; where several runs (seeds) share a depth, the line goes through their "
                             "mean and each run is a dot" if averaged else "")
                  + ". A scheme that bounds the model update (DeepNet) stays flat as depth grows.")

    def depth_table(self):
        """The depth table as a figure: each run's test score and best validation nll vs depth."""
        runs = [r for r in self.runs if r.test is not None or r.diverged_at() is not None or r.valid]
        depth, depth_label = _depth_axis(runs)
        if len({depth(r) for r in runs}) < 2:
            return self.skip("test score vs depth", "fewer than two depths with validation or test records")
        translation = any(r.test is not None and rd._number(r.test.get("bleu")) is not None for r in runs)
        test_key, test_label = ("bleu", "test BLEU (beam search, sacreBLEU 13a)") if translation else \
            ("ppl", "test perplexity")

        def test_score(r):
            return rd._number((r.test or {}).get(test_key))

        # No test score anywhere (eval.test_beam = 0, no test set): no test panel, rather than an
        # empty one labelled with a score nobody measured.
        scores = [test_score(r) for r in runs if r.diverged_at() is None]
        has_test = bool(_finite(scores, scores)[1])  # a score the panel would draw
        if not has_test:
            self.skip("the depth table's test-score panel",
                      "no run recorded a test score (eval.test_beam = 0, or no test set)")
        panels = ([test_score] if has_test else []) + [lambda r: r.min_valid_nll()]
        fig, axes = _grid(1, len(panels), w=4.4, h=3.0, title_lines=2)
        handles, averaged, styles = [], False, {}
        diverged = any(r.diverged_at() is not None for r in runs)
        for label, rs in _depth_lines(runs, lambda r: r.scheme):
            color = max((self.style[id(r)]["color"] for r in rs), key=lambda c: -sum(c))
            ls = LINE_STYLES[styles.setdefault(color, 0) % len(LINE_STYLES)]
            styles[color] += 1
            for ax, value in zip(axes[0], panels):
                pts = _by_depth([r for r in rs if r.diverged_at() is None], value, depth)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker="o", linestyle=ls)
                for d, _, vs in pts:
                    if len(vs) > 1:  # several runs (seeds) at this depth: the line is their mean
                        averaged = True
                        ax.plot([d] * len(vs), vs, linestyle="none", marker=".", color=color, alpha=0.6)
                for r in rs:  # a diverged run has no score: marked on the axis at its depth
                    if r.diverged_at() is not None:
                        ax.plot([depth(r)], [0], marker="x", markersize=10, mew=2, color=color,
                                transform=ax.get_xaxis_transform(), clip_on=False)
            handles.append(Line2D([], [], color=color, marker="o", linestyle=ls, label=label))
        if diverged:  # the × explained only when drawn
            handles.append(Line2D([], [], color="black", marker="x", linestyle="none",
                                  label="diverged (no score)"))
        depths = sorted({depth(r) for r in runs})
        for ax in axes[0]:
            ax.set_xticks(depths)
            ax.set_xlabel(depth_label)
        if has_test:
            axes[0][0].set_ylabel(test_label)
            axes[0][0].set_title("Final test score vs depth")
        axes[0][-1].set_ylabel("best validation nll (nats/token)")
        axes[0][-1].set_title("Best validation nll vs depth")
        _suptitle(fig, "Depth table (DeepNet Table 1, BranchNorm Table 1)"
                  + ("" if has_test else " — no test score recorded"))
        axes[0][-1].legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                           title="scheme")
        self.save(fig, "depth_table", "Test score and validation nll vs depth" if has_test else
                  "Validation nll vs depth",
                  ("Each run's final test score (BLEU with the run's eval.test_beam, or perplexity) and "
                   "its best validation nll" if has_test else
                   "Each run's best validation nll (no run recorded a test score: eval.test_beam = 0, "
                   "or no test set)") + ", one line per scheme (and per other swept value)"
                  + ("; where several runs (seeds) share a depth, the line goes through their mean "
                     "and each run is a dot" if averaged else "")
                  + ("; × marks a run that diverged." if diverged else "."))

    # --- 3. FFN sparsity ----------------------------------------------------------------------
    def ffn_sparsity(self):
        self._per_layer("ffn_zero_fraction", "ffn", "ffn_sparsity", "FFN activation sparsity per layer",
                        "share of exact zeros after the FFN ReLU",
                        "Share of exact zeros after the FFN's ReLU on the probe batch, per layer, at the "
                        "last recorded update (higher = sparser). BranchNorm Fig. 7 plots the share of "
                        "non-zeros, i.e. one minus this.", ylim=(0, 1),
                        suptitle="FFN activation sparsity: share of zeros (BranchNorm Fig. 7 shows 1 − this)")

    # --- 4. LayerNorm input norms -------------------------------------------------------------
    def ln_input_norm(self):
        runs = self.with_metric("ln_input_norm")
        if not runs:
            return self.skip("LayerNorm input norm", "no ln_input_norm rows in any run")
        stacks = _stacks(runs)
        fig, axes = _grid(2, len(stacks), title_lines=2)
        dims = sorted({r.d_model for r in runs if r.d_model})
        chosen = {r.label: r.analysis.updates("ln_input_norm")[-1] for r in runs}
        for col, stack in enumerate(stacks):
            ax_t, ax_l = axes[0][col], axes[1][col]
            drawn_t = drawn_l = False
            for r in runs:
                if stack not in r.stacks:
                    continue
                keys = [k for k in r.analysis.keys("ln_input_norm") if k[0] == stack]
                if not keys:
                    continue
                # mean over the stack's LayerNorms, per update (DeepNet Fig. 3b/c)
                acc = defaultdict(list)
                for k in keys:
                    for u, v in zip(*r.analysis.series("ln_input_norm", *k)):
                        if math.isfinite(v):
                            acc[u].append(v)
                xs = sorted(acc)
                xs, ys = _loglog(xs, [sum(acc[u]) / len(acc[u]) for u in xs])
                if xs:
                    ax_t.plot(xs, ys, **self.style[id(r)])
                    drawn_t = True
                u = chosen[r.label]
                vals = r.analysis.at("ln_input_norm", u)
                L = r.enc_layers if stack == "encoder" else r.dec_layers
                per_layer = []
                for i in range(L):
                    vs = [v for (s, l, _), v in vals.items() if s == stack and l == i and math.isfinite(v)]
                    per_layer.append(sum(vs) / len(vs) if vs else None)
                xs, ys = _positive(range(1, L + 1), per_layer)
                if xs:
                    ax_l.plot(xs, ys, marker="o", markersize=2.5, **self.style[id(r)])
                    drawn_l = True
            for ax, drawn in ((ax_t, drawn_t), (ax_l, drawn_l)):
                if not drawn:
                    _empty(ax)
                    continue
                for d in dims:
                    ax.axhline(math.sqrt(d), color="black", linestyle="--", linewidth=1)
                    ax.annotate(f"√d = {math.sqrt(d):.3g} (d = {d})", xy=(1.0, math.sqrt(d)),
                                xycoords=("axes fraction", "data"), xytext=(-4, 3),
                                textcoords="offset points", ha="right", va="bottom", fontsize=7.5)
                _log_y(ax)
                ax.set_ylabel("LN input ‖x‖₂ (mean per token)")
            if drawn_t:
                ax_t.set_xscale("log")
                ax_t.set_xlabel(UPDATE_AXIS + ", log scale")
                ax_t.set_title(f"{_stack_title(stack, runs)} — mean over the stack's LayerNorms")
            if drawn_l:
                _layer_x(ax_l)
                ax_l.set_title(f"{_stack_title(stack, runs)} — " + self.spec_title("last", chosen)
                               + "\nmean over the layer's LayerNorms")
        _suptitle(fig, "Norm of the LayerNorm inputs vs √d (DeepNet Fig. 3b/c)")
        _run_legend(fig, runs, self.style,
                    [Line2D([], [], color="black", linestyle="--", label="√d_model")])
        self.save(fig, "ln_input_norm", "LayerNorm input norm vs √d",
                  "Mean per-token L2 norm of the inputs of the LayerNorms, over training (top) and "
                  "per layer (bottom), against √d. Inputs much larger than √d shrink the gradient "
                  "through LN (DeepNet Fig. 3b/c, Xiong et al.).")

    # --- 5. loss curves -----------------------------------------------------------------------
    def loss_curves(self):
        # A run that diverged before its first log line has only the diverged record: its × and
        # legend entry still belong here (issue 46.1).
        runs = [r for r in self.runs if r.train or r.valid or r.diverged_at() is not None]
        if not runs:
            return self.skip("loss curves", "no train.jsonl lines in any run")
        has_bleu = any(v.get("bleu") is not None for r in runs for v in r.valid)
        has_valid = any(r.valid for r in runs)
        has_gnorm = any(t.get("gnorm") is not None for r in runs for t in r.train)
        panels = ["train"] + (["valid"] if has_valid else []) + (["gnorm"] if has_gnorm else []) + \
            (["bleu"] if has_bleu else [])
        ncol = 2 if len(panels) == 4 else len(panels)
        nrow = math.ceil(len(panels) / ncol)
        fig, axes = _grid(nrow, ncol)
        flat = [ax for row in axes for ax in row]
        for ax in flat[len(panels):]:
            ax.remove()
        spikes = {id(r): r.spike_scores() for r in runs}  # OLMo 2's spike score (issue 67.5)
        any_spike = False
        for ax, panel in zip(flat, panels):
            for r in runs:
                st = self.style[id(r)]
                if panel in ("train", "gnorm"):
                    key = "nll" if panel == "train" else "gnorm"
                    xs = [t.get("update") for t in r.train]
                    ys = [rd._number(t.get(key)) for t in r.train]
                else:
                    key = "nll" if panel == "valid" else "bleu"
                    xs = [v.get("update") for v in r.valid]
                    ys = [rd._number(v.get(key)) for v in r.valid]
                xs, ys = _positive(xs, ys) if panel != "bleu" else _finite(xs, ys)
                if xs:
                    ax.plot(xs, ys, marker="o" if panel in ("valid", "bleu") or len(xs) == 1 else None,
                            markersize=3, **st)
                self._mark_divergence(ax, r, panel, ys)
                if panel in ("train", "gnorm"):
                    any_spike = self._mark_spikes(ax, r, panel, spikes[id(r)]) or any_spike
            ax.set_xlabel(UPDATE_AXIS)
            if panel == "train":
                _log_y(ax)
                ax.set_title("training nll")
                ax.set_ylabel("nll (nats per target token)")
            elif panel == "valid":
                _log_y(ax)
                ax.set_title("validation nll")
                ax.set_ylabel("nll (nats per target token)")
            elif panel == "gnorm":
                _log_y(ax)
                ax.set_title("gradient norm before clipping (BranchNorm Fig. 4)")
                ax.set_ylabel("‖∇θ loss‖₂ (whole model)")
            else:
                ax.set_title("validation BLEU (greedy)")
                ax.set_ylabel("BLEU (sacreBLEU 13a)")
        diverged = _diverged_handle(runs)
        marks = (["× = diverged at that update"] if diverged else []) + \
            (["▲ = a spike (OLMo 2's spike score)"] if any_spike else [])
        _suptitle(fig, "Loss curves" + (f" ({'; '.join(marks)})" if marks else ""))
        _run_legend(fig, runs, self.style, diverged)
        self.save(fig, "loss", "Loss curves",
                  "Training and validation nll (log scale), the gradient norm before clipping and, "
                  "for translation, validation BLEU. A × marks the update at which a run diverged; a ▲ a "
                  "spike: a logged value at least 7 standard deviations from the mean of the up to 1000 "
                  "before it (OLMo 2's spike score; docs/analysis.md#loss-spikes).")

    def downstream_tasks(self):
        """Each in-loop task (eval.tasks) against training tokens: acc ± 1 stderr with the task's
        chance line, bits per byte beside it, and perplexity (a last-word task's, the validation's)."""
        runs = [r for r in self.runs if r.tasks]
        if not runs:
            return self.skip("downstream tasks", "no task records (eval.tasks) in any run")
        names = list(dict.fromkeys(n for r in runs for n in r.task_names()))
        by_tokens = all("tokens" in t for r in runs for t in r.tasks)
        x_key, x_label = ("tokens", "training tokens") if by_tokens else ("update", UPDATE_AXIS)
        cols = names + (["average"] if len(names) > 1 else [])
        kinds = {t["task"]: rd.task_kind(t) for r in runs for t in r.tasks}
        fig, axes = _grid(3, len(cols), w=3.6)
        ppl_used = set()
        for c, name in enumerate(cols):
            chance = []
            for r in runs:
                st = self.style[id(r)]
                per_x = {}
                for t in r.tasks:
                    per_x.setdefault(t.get(x_key), {})[t["task"]] = t
                pts = []  # (x, acc, acc stderr, bpb, ppl, ppl stderr)
                for x in sorted(k for k in per_x if isinstance(k, (int, float))):
                    recs = per_x[x]
                    chosen = list(recs.values()) if name == "average" else [recs.get(name)]
                    if None in chosen or (name == "average" and len(recs) < len(names)):
                        continue
                    acc = [rd._number(t.get("acc")) for t in chosen]
                    bpb = [rd._number(t.get("bits_per_byte")) for t in chosen]
                    if any(v is None for v in acc + bpb):
                        continue
                    se = [rd._number(t.get("acc_stderr")) for t in chosen]
                    # the mean's stderr: √(Σ se²)/n (the tasks' items are independent)
                    se = None if any(v is None for v in se) else math.sqrt(sum(v * v for v in se)) / len(se)
                    one = chosen[0] if name != "average" else {}
                    pts.append((x, sum(acc) / len(acc), se, sum(bpb) / len(bpb),
                                rd._number(one.get("ppl")), rd._number(one.get("ppl_stderr"))))
                    ch = [rd._number(t.get("chance")) for t in chosen]
                    if all(v is not None and v > 0 for v in ch):
                        chance.append(sum(ch) / len(ch))
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                axes[0][c].plot(xs, [p[1] for p in pts], marker="o", markersize=3, **st)
                band = [p for p in pts if p[2] is not None]
                if band:
                    axes[0][c].fill_between([p[0] for p in band], [p[1] - p[2] for p in band],
                                            [p[1] + p[2] for p in band], color=st["color"], alpha=0.2, linewidth=0)
                axes[1][c].plot(xs, [p[3] for p in pts], marker="o", markersize=3, **st)
                ppl = [p for p in pts if p[4] is not None]
                if ppl and kinds.get(name) == "last_word":
                    ppl_used.add(c)
                    axes[2][c].plot([p[0] for p in ppl], [p[4] for p in ppl], marker="o", markersize=3, **st)
                    band = [p for p in ppl if p[5] is not None]
                    if band:
                        axes[2][c].fill_between([p[0] for p in band], [p[4] - p[5] for p in band],
                                                [p[4] + p[5] for p in band], color=st["color"], alpha=0.2,
                                                linewidth=0)
            if chance:
                axes[0][c].axhline(chance[0], color="0.4", linestyle=":", linewidth=1, label="chance")
                axes[0][c].text(1.0, chance[0], " chance", transform=axes[0][c].get_yaxis_transform(),
                                va="center", ha="left", fontsize=7, color="0.4", clip_on=False)
            title = f"mean of the {len(names)} tasks" if name == "average" else name
            axes[0][c].set_title(title)
            axes[0][c].set_ylabel("acc ± 1 stderr" + (" (mean)" if name == "average" else ""))
            axes[1][c].set_ylabel("bits per byte (gold, normlab's)" + (" (mean)" if name == "average" else ""))
            if c in ppl_used:
                axes[2][c].set_title(f"{name}: perplexity ± 1 stderr")
                axes[2][c].set_ylabel("perplexity (the harness's)")
        # Perplexity against tokens: the validation's, in the first free panel of the last row.
        free = [c for c in range(len(cols)) if c not in ppl_used]
        drawn = False
        if free and by_tokens:
            ax = axes[2][free[-1]]
            for r in runs:
                xs, ys = self._valid_ppl_by_tokens(r)
                if xs:
                    drawn = True
                    ax.plot(xs, ys, marker="o", markersize=3, **self.style[id(r)])
            if drawn:
                ax.set_yscale("log")
                ax.set_title("validation perplexity")
                ax.set_ylabel("perplexity (log)")
                free = free[:-1]
        for c in free:
            axes[2][c].set_visible(False)
        for row in axes:
            for ax in row:
                ax.set_xlabel(x_label)
                if by_tokens:
                    ax.xaxis.set_major_formatter(mticker.FuncFormatter(_si_tokens))
        _suptitle(fig, "Downstream tasks during training")
        _run_legend(fig, runs, self.style)
        self.save(fig, "downstream_tasks", "Downstream tasks during training",
                  "Each in-loop task's accuracy (acc, the harness's metric: the choice of highest log-likelihood "
                  "is the gold one) with a band of ±1 standard error and the task's chance level (dotted: the "
                  "mean of 1/choices), bits per byte of its gold continuations (normlab's own), and perplexity "
                  "(a last-word task's, ±1 bootstrap stderr; the validation perplexity), against the tokens "
                  "trained on; the last column averages the tasks (eval.tasks, eval.tasks_limit items each).")

    @staticmethod
    def _valid_ppl_by_tokens(r):
        """The run's validation perplexities against training tokens: the tokens at each validation's
        update from its train or task records (interpolated between them when none is at it)."""
        known = {}
        for t in list(r.train) + list(r.tasks):
            if rd.is_update(t.get("update")) and rd.is_update(t.get("tokens")):
                known[t["update"]] = t["tokens"]
        known.setdefault(0, 0)
        ups = sorted(known)
        xs, ys = [], []
        for v in r.valid:
            u, nll = v.get("update"), rd._number(v.get("nll"))
            if not rd.is_update(u) or nll is None or not math.isfinite(nll) or u > ups[-1] or len(ups) < 2:
                continue
            hi = next(i for i, k in enumerate(ups) if k >= u)
            lo = max(hi - 1, 0)
            a, b = ups[lo], ups[hi]
            tok = known[b] if a == b else known[a] + (known[b] - known[a]) * (u - a) / (b - a)
            xs.append(tok)
            ys.append(math.exp(min(nll, 700.0)))
        return xs, ys

    def lr_tokens(self):
        """Each run's learning rate and tokens trained on, against the update (issue 59.10)."""
        runs = [r for r in self.runs if any(rd._number(t.get("lr")) is not None for t in r.train)]
        if not runs:
            return self.skip("learning rate and tokens", "no train.jsonl lines with lr in any run")
        fig, axes = _grid(1, 2)
        for r in runs:
            st = self.style[id(r)]
            xs, ys = _finite([t.get("update") for t in r.train], [rd._number(t.get("lr")) for t in r.train])
            if xs:
                axes[0][0].plot(xs, ys, **st)
            pts = [(t.get("update"), rd._number(t.get("tokens"))) for t in r.train]
            pts = [(u, n) for u, n in pts if rd.is_update(u) and n is not None and n >= 0]
            if pts:
                axes[0][1].plot([p[0] for p in pts], [p[1] for p in pts], **st)
        axes[0][0].set_title("learning rate")
        axes[0][0].set_ylabel("lr (the interval's last update)")
        axes[0][1].set_title("tokens trained on")
        axes[0][1].set_ylabel("target tokens, all ranks")
        for ax in axes[0]:
            ax.set_xlabel(UPDATE_AXIS)
        _suptitle(fig, "Learning rate and tokens trained on")
        _run_legend(fig, runs, self.style)
        self.save(fig, "lr_tokens", "Learning rate and tokens trained on",
                  "Each run's learning rate (warm-up, then its schedule) and the target tokens its updates "
                  "trained on, against the update, from train.jsonl.")

    def _mark_spikes(self, ax, r, panel, spikes):
        """▲ at each spike of the panel's series (Run.spike_scores); True when there was one."""
        _, at, _ = spikes["loss" if panel == "train" else "gnorm"]
        key = "nll" if panel == "train" else "gnorm"
        pts = [(r.train[i].get("update"), rd._number(r.train[i].get(key))) for i in at]
        pts = [(u, y) for u, y in pts if rd.is_update(u) and y is not None and y > 0]
        if not pts:
            return False
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="^", markersize=7, linestyle="none",
                color=self.style[id(r)]["color"], markeredgecolor="black", markeredgewidth=0.6)
        return True

    def _mark_divergence(self, ax, r, panel, ys):
        """× at the diverged update: at the value the trainer recorded then, else the last logged."""
        k = r.diverged_at()
        if k is None or panel not in ("train", "gnorm"):
            return
        key = "nll" if panel == "train" else "gnorm"
        y = rd._number((r.diverged or {}).get(key))
        if y is None or not math.isfinite(y) or y <= 0:
            if not ys:
                return
            y = ys[-1]
        ax.plot([k], [y], marker="x", markersize=10, mew=2.2, color=self.style[id(r)]["color"],
                linestyle="none")

    # --- 6. layer similarity heatmaps ---------------------------------------------------------
    def layer_cosine(self):
        runs = self.with_metric("layer_cosine")
        if not runs:
            return self.skip("layer-similarity heatmaps", "no layer_cosine rows in any run")
        for r in runs:
            u = r.analysis.updates("layer_cosine")[-1]
            vals = r.analysis.at("layer_cosine", u)
            stacks = [s for s in r.stacks if any(k[0] == s for k in vals)]
            fig, axes = _grid(1, len(stacks), w=3.4, h=3.4, hgap=0.8)
            image = None
            for ax, stack in zip(axes[0], stacks):
                L = r.enc_layers if stack == "encoder" else r.dec_layers
                cells = {}
                for (s, i, sub), v in vals.items():
                    pair = re.fullmatch(r"layer:([0-9]{1,9})", sub) if s == stack else None
                    if pair and 0 <= i < L and 0 <= int(pair.group(1)) < L:  # else not a layer pair
                        cells[(i, int(pair.group(1)))] = v
                # only the layers the probe recorded (a deep model's probes may sample layers)
                layers = sorted({i for i, _ in cells} | {j for _, j in cells})
                n = len(layers)
                pos = {layer: k for k, layer in enumerate(layers)}
                m = [[math.nan] * n for _ in range(n)]
                for (i, j), v in cells.items():
                    m[pos[i]][pos[j]] = v
                for a in range(n):
                    for b in range(n):
                        if math.isnan(m[a][b]):
                            m[a][b] = 1.0 if a == b else m[b][a]  # symmetric, unit diagonal
                flat = [v for row in m for v in row if not math.isnan(v)]
                vmin = min(0.0, min(flat)) if flat else 0.0
                image = ax.imshow(m, origin="lower", cmap="viridis", vmin=vmin, vmax=1.0, aspect="auto",
                                  extent=(-0.5, n - 0.5, -0.5, n - 0.5), interpolation="nearest")
                ticks = list(range(n)) if n <= 12 else list(range(0, n, max(1, n // 6)))
                labels = [str(layers[k] + 1) for k in ticks]
                ax.set_xticks(ticks, labels)
                ax.set_yticks(ticks, labels)
                ax.grid(False)
                if n <= 12:
                    for a in range(n):
                        for b in range(n):
                            if not math.isnan(m[a][b]):
                                ax.text(b, a, f"{m[a][b]:.2f}", ha="center", va="center",
                                        fontsize=6.5 if n > 8 else 7.5,
                                        color="black" if m[a][b] > 0.6 else "white")
                ax.set_xlabel("layer j")
                ax.set_ylabel("layer i")
                ax.set_title(f"{_stack_title(stack, [r])}")
            if image is not None:
                fig.colorbar(image, ax=axes[0].tolist(), shrink=0.9, label="mean per-token cosine similarity")
            _suptitle(fig, f"Cosine similarity of layer outputs — {r.label}, update {u} (B2T Fig. 5)")
            key = "layer_cosine_" + r.file_stem
            self.save(fig, key, f"Layer similarity — {r.label}",
                      "Mean per-token cosine similarity between the outputs of layers i and j on the "
                      "probe batch at the last update it was recorded. High off-diagonal values "
                      "(Pre-LN) mean the upper layers change the representation little (B2T Fig. 5).",
                      run=r, group="layer_cosine")

    # --- 7. activation gradients at LN in/out -------------------------------------------------
    def act_grad_norm(self):
        runs = self.with_metric("act_grad_norm")
        if not runs:
            return self.skip("activation-gradient norms", "no act_grad_norm rows in any run")
        for r in runs:
            stacks = list(r.stacks)
            specs = self.update_specs
            fig, axes = _grid(len(specs), len(stacks))
            subs = sorted({k[2] for k in r.analysis.keys("act_grad_norm")})
            norm_names = sorted({s.rsplit(".", 1)[0] for s in subs if s.endswith((".in", ".out"))})
            colors = dict(zip(norm_names, plt.get_cmap("tab10").colors))
            lines = [(f"{n}.in", colors[n], "-", "o", f"{n} input") for n in norm_names] + \
                    [(f"{n}.out", colors[n], "--", "s", f"{n} output") for n in norm_names] + \
                    [("output", "black", ":", None, "layer output")]
            # Series equal at every layer and update (a norm's input is the previous norm's output)
            # are drawn once, their names joined in one legend entry (issue 46.4).
            picked = [r.analysis.at("act_grad_norm", self.pick_update(r, "act_grad_norm", spec))
                      for spec in specs]

            def values(sub):
                return tuple(v.get((stack, i, sub)) for v in picked for stack in stacks
                             for i in range(r.enc_layers if stack == "encoder" else r.dec_layers))

            first_with, names_of = {}, OrderedDict()
            for sub, _, _, _, label in lines:
                vs = values(sub)
                if all(v is None for v in vs):
                    continue
                rep = first_with.setdefault(vs, sub)
                names_of.setdefault(rep, []).append(label)
            lines = [ln for ln in lines if ln[0] in names_of]
            handles = [Line2D([], [], color=color, linestyle=ls, marker=mk, markersize=3,
                              label=" = ".join(names_of[sub])) for sub, color, ls, mk, _ in lines]
            for row, spec in enumerate(specs):
                u = self.pick_update(r, "act_grad_norm", spec)
                vals = r.analysis.at("act_grad_norm", u)
                for col, stack in enumerate(stacks):
                    ax = axes[row][col]
                    L = r.enc_layers if stack == "encoder" else r.dec_layers
                    drawn = False
                    for sub, color, ls, mk, _ in lines:
                        xs, ys = _positive(range(1, L + 1), [vals.get((stack, i, sub)) for i in range(L)])
                        if xs:
                            ax.plot(xs, ys, color=color, linestyle=ls, marker=mk, markersize=2.5)
                            drawn = True
                    if not drawn:
                        _empty(ax)
                        continue
                    _log_y(ax)
                    _layer_x(ax)
                    ax.set_ylabel("‖∂loss/∂h‖₂ (activation gradient)")
                    ax.set_title(f"{_stack_title(stack, [r])} — "
                                 + self.spec_title(spec, {r.label: u}))
            _suptitle(fig, f"Gradient norms at LayerNorm inputs and outputs — {r.label} (B2T Fig. 4)")
            fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                       title="where")
            key = "act_grad_norm_" + r.file_stem
            self.save(fig, key, f"Gradients at LN in/out — {r.label}",
                      "L2 norm of the loss gradient with respect to each LayerNorm's input (solid) "
                      "and output (dashed), and the layer output (dotted). A large drop from output "
                      "to input means the LN shrinks the gradient (B2T Fig. 4).", run=r,
                      group="act_grad_norm")

    # --- 8. scheme state ----------------------------------------------------------------------
    def scheme_state(self):
        runs = self.with_metric("scheme_state")
        if not runs:
            if not any(_probe_selected(r, "scheme_state") for r in self.runs):
                return self.skip("scheme state", "probe not selected (analysis.probes has no "
                                 "scheme_state or all)")
            return self.skip("scheme state", "no scheme_state rows in any run (schemes without state)")
        names = OrderedDict()
        for r in runs:
            for k in r.analysis.keys("scheme_state"):
                names.setdefault(k[2], []).append((r, k))
        n = len(names)
        ncol = min(n, 2)
        nrow = math.ceil(n / ncol)
        fig, axes = _grid(nrow, ncol)
        flat = [ax for row in axes for ax in row]
        for ax in flat[n:]:
            ax.remove()
        # One colour per run and stack for the whole figure (issue 46.2: a colour meant one run in
        # one panel and another run in the next); layers of one stack differ by line style and
        # marker, or share one style when there are too many to tell apart.
        cycle = plt.get_cmap("tab10").colors
        colour_of = OrderedDict()

        def colour(r, stack):
            return colour_of.setdefault((id(r), stack), cycle[len(colour_of) % len(cycle)])

        layer_styles = [(ls, mk) for mk in ("o", "s", "^", "v", "D") for ls in ("-", "--", ":", "-.")]
        for ax, (name, series) in zip(flat, names.items()):
            few = len(series) <= 10
            per_run = defaultdict(int)
            for r, _ in series:
                per_run[id(r)] += 1
            labelled = set()
            for r, (stack, layer, sub) in series:
                xs, ys = _finite(*r.analysis.series("scheme_state", stack, layer, sub))
                if not xs:
                    continue
                where = stack if layer < 0 else f"{stack} layer {layer + 1}"
                kw = {"color": colour(r, stack)}
                if per_run[id(r)] == 1:
                    kw["label"] = r.label
                elif few:
                    ls, mk = layer_styles[(max(layer, 0)) % len(layer_styles)]
                    kw.update(linestyle=ls, marker=mk, markevery=max(1, len(xs) // 8), markersize=4,
                              label=f"{r.label}: {where}")
                else:
                    kw.update(linestyle="--" if stack == "decoder" else "-", alpha=0.6)
                    if (id(r), stack) not in labelled:
                        kw["label"] = f"{r.label}: {stack} (one line per layer)"
                        labelled.add((id(r), stack))
                ax.plot(xs, ys, **kw)
            ax.set_xlabel(UPDATE_AXIS)
            ax.set_ylabel(name)
            ax.set_title(f"scheme state: {name}")
            ax.legend(loc="best", frameon=True, framealpha=0.85)
        _suptitle(fig, "Schemes' own state over training (e.g. BranchNorm α_t, Admin ω)")
        self.save(fig, "scheme_state", "Scheme state over training",
                  "The quantities a scheme keeps and changes during training, as it reports them "
                  "(BranchNorm's α_t schedule, Admin's ω profile, ReZero's gates).")

    # --- paper figures (docs/reproducing.md; statistics in normlab_paper.py) -------
    def update_norm_depths(self):
        """DeepNet Fig. 4: ‖ΔF‖ over the first updates, one panel per scheme, a line per depth."""
        runs = [r for r in self.with_metric("update_norm")
                if _positive(*r.analysis.series("update_norm", "model", -1, "logits"))[0]]
        by_scheme = OrderedDict()
        for r in runs:
            by_scheme.setdefault(r.scheme, []).append(r)
        if not any(len({r.depth_value() for r in rs}) > 1 for rs in by_scheme.values()):
            return self.skip("‖ΔF‖ per depth", "no scheme with update_norm data at two depths")
        depths = sorted({r.depth_value() for r in runs})
        cmap = plt.get_cmap("viridis")
        color = {d: cmap(0.85 * i / max(1, len(depths) - 1)) for i, d in enumerate(depths)}
        fig, axes = _grid(1, len(by_scheme), w=3.6, sharey=True)
        for ax, (scheme, rs) in zip(axes[0], by_scheme.items()):
            for r in sorted(rs, key=lambda r: r.depth_value()):
                xs, ys = _loglog(*r.analysis.series("update_norm", "model", -1, "logits"))
                if not xs:
                    continue
                ax.plot(xs, ys, color=color[r.depth_value()], marker="o", markersize=2)
                if r.diverged_at() is not None:
                    ax.plot([xs[-1]], [ys[-1]], marker="x", markersize=9, mew=2, color="black")
            _log_y(ax)
            ax.set_xlabel(UPDATE_AXIS)
            ax.set_title(scheme)
        axes[0][0].set_ylabel("‖F(x,θ_t) − F(x,θ_0)‖₂ of the logits")
        _suptitle(fig, "Model update over the first updates, per depth (DeepNet Fig. 4)")
        handles = [Line2D([], [], color=color[d], marker="o", label=f"{d}L-{d}L" if all(
            r.arch != "lm" and r.enc_layers == r.dec_layers for r in runs) else f"{d}") for d in depths]
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                   title="depth")
        self.save(fig, "update_norm_depths", "Model update ‖ΔF‖ per depth (DeepNet Fig. 4)",
                  "‖ΔF‖ of the logits on the fixed probe batch over the first updates, one panel "
                  "per scheme, one line per depth. DeepNet Fig. 4: Post-LN's lines rise with "
                  "depth, DeepNet's stay low and close together.")

    def grad_norm_start(self):
        """B2T Fig. 3: per-layer gradient norms at the beginning of training."""
        runs = [r for r in self.with_metric("grad_norm")
                if any(1 <= u <= paper.START_WINDOW for u in r.analysis.updates("grad_norm"))]
        if not runs:
            return self.skip("gradient norm at the start", "no grad_norm rows in the first updates")
        stacks = _stacks(runs)
        fig, axes = _grid(1, len(stacks))
        for ax, stack in zip(axes[0], stacks):
            if self.layer_gradient_panel(ax, runs, stack, lambda r, stack=stack: paper.start_grad_norms(r, stack)):
                ax.set_title(f"{_stack_title(stack, runs)} — mean over updates 1–{paper.START_WINDOW}")
        _suptitle(fig, "Gradient norm per layer at the beginning of training (B2T Fig. 3)")
        _run_legend(fig, runs, self.style)
        self.save(fig, "grad_norm_start", "Gradient norm per layer at the start (B2T Fig. 3)",
                  f"L2 norm of each layer's parameter gradient, averaged over the recorded updates "
                  f"1–{paper.START_WINDOW}. B2T Fig. 3b: Post-LN's decoder norms shrink toward "
                  f"layer 1 (vanishing gradient), B2T keeps them, Pre-LN's fall with the layer.")

    def grad_norm_smoothness(self):
        """BranchNorm Fig. 4: the gradient norm at every update, and its update-to-update change."""
        runs = [r for r in self.runs if paper.log_gnorm_roughness(r) is not None]
        if not runs:
            return self.skip("gradient norm smoothness", "no run logged the gradient norm at 10+ "
                             "consecutive updates (run.log_interval = 1)")
        fig, axes = _grid(2, 1, w=6.0, h=2.4)
        handles = []
        for r in runs:
            us, gs = paper.gnorm_series(r)
            st = self.style[id(r)]
            axes[0][0].plot(us, gs, linewidth=0.9, **st)
            pairs = [(us[i + 1], math.log(gs[i + 1]) - math.log(gs[i])) for i in range(len(us) - 1)
                     if us[i + 1] == us[i] + 1]
            axes[1][0].plot([p[0] for p in pairs], [p[1] for p in pairs], linewidth=0.7, **st)
            handles.append(Line2D([], [], color=st["color"], linestyle=st["linestyle"],
                                  label=f"{r.legend_label()}: σ(Δ ln‖g‖) = "
                                        f"{paper.log_gnorm_roughness(r):.3f}, σ(ln‖g‖) = "
                                        f"{paper.log_gnorm_std(r):.3f}"))
        _log_y(axes[0][0])
        axes[0][0].set_ylabel("‖∇θ loss‖₂ (whole model)")
        axes[0][0].set_title("gradient norm before clipping, every update")
        axes[1][0].set_ylabel("Δ ln‖g‖ (update to update)")
        axes[1][0].set_title("its change from one update to the next (spread = roughness)")
        axes[1][0].set_xlabel(UPDATE_AXIS)
        _suptitle(fig, "Gradient norm at the beginning of training (BranchNorm Fig. 4)")
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                   title="run (lower σ = smoother)")
        self.save(fig, "grad_norm_smoothness", "Gradient norm smoothness (BranchNorm Fig. 4)",
                  "The whole model's gradient norm at every update (train.jsonl, log_interval 1) "
                  "and its change Δ ln‖g‖ between consecutive updates; the legend gives σ(Δ ln‖g‖), "
                  "the roughness, and σ(ln‖g‖). BranchNorm Fig. 4: BranchNorm's curve is smoother "
                  "than DeepNorm's.")

    def ffn_nonzero(self):
        """BranchNorm Fig. 7: share of non-zero FFN activations per layer, bars side by side."""
        runs = [r for r in self.runs if paper.ffn_nonzero(r)]
        if not runs:
            return self.skip("FFN non-zero share", "no ffn_nonzero_fraction rows in any run")
        stacks = _stacks(runs)
        fig, axes = _grid(len(stacks), 1, w=7.0, h=2.4)
        width = 0.8 / len(runs)
        for row, stack in enumerate(stacks):
            ax = axes[row][0]
            for k, r in enumerate(runs):
                vals = paper.ffn_nonzero(r)
                pts = sorted((l + 1, v) for (s, l), v in vals.items() if s == stack)
                if pts:
                    ax.bar([p[0] - 0.4 + width * (k + 0.5) for p in pts], [100 * p[1] for p in pts],
                           width=width, color=self.style[id(r)]["color"])
            _layer_x(ax)
            ax.set_ylabel("non-zero after ReLU (%)")
            ax.set_title(stack)
        _suptitle(fig, "FFN activation sparsity: share of non-zero entries per layer (BranchNorm Fig. 7)")
        _run_legend(fig, runs, self.style)
        self.save(fig, "ffn_nonzero", "FFN non-zero share per layer (BranchNorm Fig. 7)",
                  "Percentage of non-zero entries after the FFN's ReLU on the probe batch, per "
                  "layer, at the last recorded update, as BranchNorm Fig. 7 plots it (lower = "
                  "sparser). BranchNorm Fig. 7: BranchNorm's is lower than DeepNorm's in every layer.")

    # --- LLaMA-era depth analyses (Mix-LN, LayerNorm-Scaling, Peri-LN) -----------------------
    def _per_layer(self, metric, sublayer, key, title, ylabel, caption, log_y=False, ylim=None, suptitle=None):
        """One line per run of a per-layer metric at its last recorded update, a panel per stack."""
        runs = self.with_metric(metric)
        if not runs:
            return self.skip(title, f"no {metric} rows in any run")
        stacks = _stacks(runs)
        fig, axes = _grid(1, len(stacks))
        chosen = {r.label: r.analysis.updates(metric)[-1] for r in runs}
        for ax, stack in zip(axes[0], stacks):
            drawn = False
            for r in runs:
                if stack not in r.stacks:
                    continue
                vals = r.analysis.at(metric, chosen[r.label])
                L = r.enc_layers if stack == "encoder" else r.dec_layers
                xs, ys = (_positive if log_y else _finite)(range(1, L + 1),
                                                          [vals.get((stack, i, sublayer)) for i in range(L)])
                if xs:
                    ax.plot(xs, ys, marker="o", markersize=2.5, **self.style[id(r)])
                    drawn = True
            if not drawn:
                _empty(ax)
                continue
            if log_y:
                ax.set_yscale("log")
            if ylim:
                ax.set_ylim(*ylim)
            _layer_x(ax)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{_stack_title(stack, runs)} — " + self.spec_title("last", chosen))
        _suptitle(fig, suptitle or title)
        _run_legend(fig, runs, self.style)
        self.save(fig, key, title, caption)

    def hidden_state_norm(self):
        self._per_layer("hidden_rms", "output", "hidden_state_norm", "Hidden-state RMS per layer",
                        "RMS of the residual stream after the layer",
                        "√(mean h²) of each layer's output on the probe batch at the last recorded update. "
                        "Pre-LN's stream grows with depth; Peri-LN and LayerNorm-Scaling are built to "
                        "stop that growth (docs/schemes/ln_scaling.md, peri_ln.md).", log_y=True)

    def layer_angular_distance(self):
        self._per_layer("layer_angular_distance", "layer", "layer_angular_distance",
                        "Angular distance between each layer's input and output",
                        "(1/π)·arccos cos(h_in, h_out)",
                        "Mean over the probe batch's tokens of (1/π)·arccos of the cosine between a layer's "
                        "input and output (Gromov et al. 2024). Near 0: the layer barely turns the stream — "
                        "LayerNorm-Scaling's 'ineffective deep layers' of Pre-LN.")

    def layer_ablation(self):
        tables = [(r,) + r.ablation for r in self.runs if r.ablation]  # read and checked by normlab_rundata
        stacks = sorted({row[0] for _, _, rows in tables for row in rows}, key=lambda s: s != "encoder")
        if not stacks:
            return self.skip("layer ablation", "no eval/ablate.*.csv with a dropped layer in any run "
                                               "(normlab ablate RUN)")
        fig, axes = _grid(1, len(stacks))
        # A symmetric log scale (issue 59.9): the first layer's nats do not flatten the deep layers'
        # thousandths; linear only below the smallest increase measured (and for decreases).
        small = [abs(d) for _, _, rows in tables for _, _, d in rows if d is not None and math.isfinite(d) and d != 0]
        linthresh = max(1e-4, min(small)) if small else 1e-3
        for ax, stack in zip(axes[0], stacks):
            for r, _, rows in tables:
                pts = sorted((layer + 1, delta) for s, layer, delta in rows if s == stack)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=2.5, **self.style[id(r)])
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_yscale("symlog", linthresh=linthresh)
            _layer_x(ax)
            ax.set_ylabel("validation nll increase with the layer dropped\n(symmetric log scale)")
            ax.set_title(stack)
        _suptitle(fig, "How much each layer matters: loss with the layer skipped")
        _run_legend(fig, [r for r, _, _ in tables], self.style)
        self.save(fig, "layer_ablation", "Loss with each layer dropped (normlab ablate)",
                  "Increase of the validation nll when one layer is skipped (its residual branches "
                  "removed), from each run's eval/ablate.<split>.<checkpoint>.csv. LayerNorm-Scaling: in "
                  "Pre-LN models many deep layers can be removed at little cost.")

    # --- probes that see an instability coming (issue 67.4) --------------------------------
    def _worst_over_layers(self, metric, panels, key, title, ylabel, caption, worst=max, log_y=True,
                           where=None):
        """Top row: the worst value over a stack's recorded layers of `metric` vs update (what
        grows before a divergence); bottom row: each layer at the last recorded update. One column
        per (stack, sublayer, panel title) of `panels` that some run recorded. `where(run, stack,
        layer)`: a label written next to a layer's point (one run only)."""
        runs = self.with_metric(metric)
        if not runs:
            return self.skip(title, f"no {metric} rows in any run")
        have = [p for p in panels if any((p[0], layer, p[1]) in set(r.analysis.keys(metric))
                                         for r in runs for layer in range(max(r.enc_layers, r.dec_layers)))]
        if not have:
            return self.skip(title, f"no per-layer {metric} rows in any run")
        fig, axes = _grid(2, len(have))
        chosen = {r.label: r.analysis.updates(metric)[-1] for r in runs}
        pick = _positive if log_y else _finite
        for col, (stack, sub, name) in enumerate(have):
            top, bottom = axes[0][col], axes[1][col]
            for r in runs:
                L = r.enc_layers if stack == "encoder" else r.dec_layers
                by_update = defaultdict(list)
                for layer in range(L):
                    for u, v in zip(*pick(*r.analysis.series(metric, stack, layer, sub))):
                        by_update[u].append(v)
                us = sorted(by_update)
                if us:
                    top.plot(us, [worst(by_update[u]) for u in us], **self.style[id(r)])
                vals = r.analysis.at(metric, chosen[r.label])
                xs, ys = pick(range(1, L + 1), [vals.get((stack, i, sub)) for i in range(L)])
                if xs:
                    bottom.plot(xs, ys, marker="o", markersize=2.5, **self.style[id(r)])
                    if where and len(runs) == 1 and len(xs) <= 12:
                        for x, y in zip(xs, ys):
                            label = where(r, stack, x - 1, chosen[r.label])
                            if label:
                                bottom.annotate(label, (x, y), textcoords="offset points", xytext=(0, 4),
                                                ha="center", fontsize=6, color="0.3")
            for ax in (top, bottom):
                if not ax.get_lines():
                    _empty(ax)
                elif log_y:
                    ax.set_yscale("log")
                ax.set_ylabel(ylabel)
            if top.get_lines():
                top.set_xlabel(UPDATE_AXIS)
                top.set_title(f"{name}: {'largest' if worst is max else 'smallest'} over the layers")
            if bottom.get_lines():
                _layer_x(bottom)
                bottom.set_title(f"{name} — " + self.spec_title("last", chosen))
        _suptitle(fig, title)
        _run_legend(fig, runs, self.style)
        self.save(fig, key, title, caption)

    @staticmethod
    def _attention_panels(runs):
        lm_only = all(r.arch == "lm" for r in runs)
        return [("encoder", "self_attn", "encoder self-attention"),
                ("decoder", "self_attn", "self-attention" if lm_only else "decoder self-attention"),
                ("decoder", "cross_attn", "cross-attention")]

    def attn_logit_max(self):
        self._worst_over_layers(
            "attn_logit_max", self._attention_panels(self.runs), "attn_logit_max",
            "Attention logit growth: largest |q·kᵀ/√dh| (Wortsman et al. 2023 Fig. 2)",
            "max |attention logit| over heads",
            "The largest attention logit |q·kᵀ/√dh| (before any soft-cap) over the heads and the "
            "probe batch's query/key pairs, per layer. Logits growing without bound make the "
            "attention one-hot and precede loss divergence (Dehghani et al. 2023; Wortsman et al. 2023, "
            "Fig. 2); QK-norm keeps them bounded.")

    def attn_entropy(self):
        self._worst_over_layers(
            "attn_entropy", self._attention_panels(self.runs), "attn_entropy",
            "Attention entropy (Zhai et al. 2023)", "attention entropy (nats), mean over heads",
            "Mean Shannon entropy of the attention distributions of the probe batch's non-padding "
            "queries, averaged over the heads, per layer; the top row shows the lowest layer. A "
            "collapse toward 0 (one key per query) comes before divergence (Zhai et al. 2023, "
            "'Stabilizing Transformer Training by Preventing Attention Entropy Collapse').",
            worst=min, log_y=False)

    def activation_kurtosis(self):
        panels = [("encoder", "output", "encoder"), ("decoder", "output", "decoder")]
        self._worst_over_layers(
            "activation_kurtosis", panels, "activation_kurtosis",
            "Outlier features: kurtosis of the per-feature RMS (He et al. 2024)",
            "Kurt = mean s⁴ / (mean s²)²",
            "Kurtosis of the residual stream's per-feature RMS s_j over the probe batch's tokens, "
            "mean_j s_j⁴ / (mean_j s_j²)² (He et al. 2024, eq. 1): 1 when every feature has the same "
            "size, d when one feature holds the stream. Outlier features raise it by orders of magnitude.")

    def massive_activations(self):
        def where(run, stack, layer, update):
            vals = {m: run.analysis.at(m, update).get((stack, layer, "output"))
                    for m in ("massive_activation_position", "massive_activation_feature")}
            if None in vals.values():
                return None
            return f"t{int(vals['massive_activation_position'])} f{int(vals['massive_activation_feature'])}"
        panels = [("encoder", "output", "encoder"), ("decoder", "output", "decoder")]
        self._worst_over_layers(
            "massive_activation_ratio", panels, "massive_activations",
            "Massive activations: largest |h| over the median |h| (Sun et al. 2024)",
            "max |h| / median |h|",
            "The largest |h| of each layer's output (the residual stream) on the probe batch divided "
            "by the median |h| there; with one run the points name the token position t and the "
            "feature f where it sits. Sun et al. 2024: a few activations 10³–10⁴ times the median, "
            "at fixed features of the first and delimiter tokens.", where=where)

    def output_logits(self):
        runs = [r for r in self.runs if r.analysis is not None and
                r.analysis.series("output_log_z", "model", -1, "logits")[0]]
        if not runs:
            return self.skip("output logits", "no output_log_z rows in any run")
        fig, axes = _grid(1, 2)
        for r in runs:
            xs, ys = _finite(*r.analysis.series("output_log_z", "model", -1, "logits"))
            if xs:
                axes[0][0].plot(xs, ys, **self.style[id(r)])
            for metric, dash in (("output_logit_max_abs", "-"), ("output_logit_mean_abs", ":")):
                xs, ys = _positive(*r.analysis.series(metric, "model", -1, "logits"))
                if xs:
                    axes[0][1].plot(xs, ys, **dict(self.style[id(r)], linestyle=dash))
        axes[0][0].set_ylabel("mean log Z = logsumexp of the logits")
        axes[0][0].set_title("log-partition (0 = self-normalized)")
        axes[0][1].set_ylabel("|logit|")
        axes[0][1].set_title("largest (solid) and mean (dotted) |logit|")
        if axes[0][1].get_lines():
            axes[0][1].set_yscale("log")
        for ax in axes[0]:
            ax.set_xlabel(UPDATE_AXIS)
        _suptitle(fig, "Output logit divergence (Wortsman et al. 2023)")
        _run_legend(fig, runs, self.style)
        self.save(fig, "output_logits", "Output logits: log Z and |logit|",
                  "Mean log Z (logsumexp of the output logits) over the probe batch's target positions, "
                  "and the mean and largest |logit|. Wortsman et al. 2023: log Z drifting far from 0 "
                  "(logit divergence) precedes instability; the z-loss pulls it back.")

    # The figure steps, in the order of the report; each is independent of the others.
    STEPS = ("loss_curves", "grad_norm_layers", "update_norm", "update_norm_depth", "depth_table",
             "ffn_sparsity", "ln_input_norm", "act_grad_norm", "layer_cosine", "scheme_state",
             "update_norm_depths", "grad_norm_start", "grad_norm_smoothness", "ffn_nonzero",
             "hidden_state_norm", "layer_angular_distance", "layer_ablation", "downstream_tasks",
             "lr_tokens", "attn_logit_max", "attn_entropy", "output_logits", "activation_kurtosis",
             "massive_activations")

    def all(self, only=None):
        """Every figure the data allows; with `only`, the steps of those names alone."""
        for name in self.STEPS:
            if only is None or name in only:
                getattr(self, name)()
        return self.figures


JOBS = None  # processes that render the figures; None: NORMLAB_PLOT_JOBS, else one per core, at most 4
_forked_plotter_args = None  # (runs, out_dir, formats, update_specs), inherited by the workers


class FigureWorkerError(RuntimeError):
    """A worker process died while drawing a figure (killed, out of memory): said in one line."""


class _WorkerTraceback(Exception):
    """The traceback of an error in a worker, shown as the cause of the error the parent raises."""


def _worker_start():
    """Ctrl-C stops the parent, whose pool then ends the workers (one traceback, not one per
    worker); a parent that dies otherwise takes its workers with it (Linux: PR_SET_PDEATHSIG)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before prctl
        os._exit(1)


def _portable(e):
    """`e` if it survives the trip to the parent (pickle), else a RuntimeError that says it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 (any failure to rebuild it)
        return RuntimeError(f"{type(e).__name__}: {e}")


def _figures_of_step(name):
    """One step in a worker process: its Figure records, its notes, and its error (with the
    traceback) or None; the notes and figures it made before an error come back too, as one process
    would have printed and written them."""
    notes = []
    plotter = Plotter(*_forked_plotter_args, notes.append)
    try:
        getattr(plotter, name)()
    except Exception as e:  # noqa: BLE001 (re-raised in the parent, in the steps' order)
        return plotter.figures, notes, _portable(e), traceback.format_exc()
    return plotter.figures, notes, None, None


def plot_jobs():
    """NORMLAB_PLOT_JOBS (a whole number >= 1), else one per core, at most 4."""
    text = os.environ.get("NORMLAB_PLOT_JOBS")
    if text is None:
        return min(os.cpu_count() or 1, 4)
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"NORMLAB_PLOT_JOBS: expected a whole number >= 1, got '{text}'")
    return int(text)


def make_figures(runs, out_dir, formats=("png", "svg"), update_specs=("first", "last"), log=print,
                 only=None):
    """Writes every figure the data allows (with `only`: those figures); returns the Figure records
    in a stable order. The steps render in JOBS forked processes (None: plot_jobs()), each a step
    at a time; notes, figures and the first error come back in the steps' order, as one process
    gives them, and the files of the steps after a failed one are removed (one process would not
    have drawn them). A report of the quickstart sweep: 5.0 s of rendering serially, ~2.6 s on 2 cores."""
    global _forked_plotter_args
    _load_matplotlib()
    args = (runs, out_dir, list(formats), list(update_specs))
    names = [n for n in Plotter.STEPS if only is None or n in only]
    jobs = min(JOBS or plot_jobs(), len(names))
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return Plotter(*args, log).all(only)
    _forked_plotter_args = args
    figures, failure, later_files = [], None, []
    pool = concurrent.futures.ProcessPoolExecutor(jobs, multiprocessing.get_context("fork"), _worker_start)
    try:
        futures = [pool.submit(_figures_of_step, n) for n in names]
        for i, (name, future) in enumerate(zip(names, futures)):
            try:
                step_figures, notes, error, trace = future.result()
            except concurrent.futures.process.BrokenProcessPool:
                step_figures, notes, trace = [], [], None
                error = FigureWorkerError(
                    f"a figure process died while drawing '{name}' (killed, or out of memory?); "
                    "NORMLAB_PLOT_JOBS=1 draws the figures in one process")
            for note in notes:
                log(note)
            if error is None:
                figures.extend(step_figures)
                continue
            failure = error
            if trace:
                failure.__cause__ = _WorkerTraceback(trace.rstrip())
            for f in futures[i + 1:]:
                f.cancel()
            for f in futures[i + 1:]:  # those already drawing finish; their files go below
                if not f.cancelled():
                    with contextlib.suppress(concurrent.futures.process.BrokenProcessPool):
                        later_files += [p for fig in f.result()[0] for p in fig.files]
            break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _forked_plotter_args = None
    if failure is not None:
        for p in later_files:
            with contextlib.suppress(OSError):
                os.remove(p)
        raise failure
    return figures


def parse_updates(text):
    specs = [s.strip() for s in text.split(",") if s.strip()]
    for s in specs:
        if s not in ("first", "last") and not s.isdigit():
            raise argparse.ArgumentTypeError(f"--update: expected first, last or an update number, got '{s}'")
    if not specs:
        raise argparse.ArgumentTypeError("--update: empty")
    return specs


def parse_formats(text):
    fmts = [s.strip().lower() for s in text.split(",") if s.strip()]
    for f in fmts:
        if f not in ("png", "svg", "pdf"):
            raise argparse.ArgumentTypeError(f"--format: expected png, svg or pdf, got '{f}'")
    if not fmts:
        raise argparse.ArgumentTypeError("--format: empty")
    return fmts


# The figure names of docs/analysis.md's table (file names) that differ from their step's name.
FIGURE_FILE_STEPS = {"loss": "loss_curves", "update_norm_vs_depth": "update_norm_depth"}


def parse_only(text):
    """Figure names as the docs' table gives them (`loss`, `act_grad_norm_<run>`) or as the steps
    that draw them (`loss_curves`, `act_grad_norm`)."""
    names = [n.strip().removesuffix("_<run>") for n in text.split(",") if n.strip()]
    names = [FIGURE_FILE_STEPS.get(n, n) for n in names]
    bad = [n for n in names if n not in Plotter.STEPS]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"--only: expected figures among {', '.join(Plotter.STEPS)} (or the file names "
            f"{', '.join(FIGURE_FILE_STEPS)}), got '{text}'")
    return set(names)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="normlab plot", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="RUN_OR_SWEEP_DIR")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--format", type=parse_formats, default=["png", "svg"], help="png,svg (default)")
    ap.add_argument("--update", type=parse_updates, default=["first", "last"],
                    help="updates for the per-layer gradient figures: first, last or numbers, "
                         "comma-separated (default first,last)")
    ap.add_argument("--only", type=parse_only, default=None,
                    help="comma-separated figures to draw (e.g. layer_ablation); default all")
    args = ap.parse_args(argv)
    try:
        plot_jobs()
    except ValueError as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        return 2
    # `normlab frontier` directories: the frontier figures (not one line per trial). Every input is
    # read before --out is claimed: bad inputs leave it untouched.
    frontier_dirs = [d for d in args.dirs if normlab_frontier.is_frontier_dir(d)]
    frontiers = []
    for d in frontier_dirs:
        try:
            frontiers.append(normlab_frontier.load_frontier(d))
        except normlab_frontier.FrontierError as e:
            print(f"normlab: error: {e}", file=sys.stderr)
            return 2
    args.dirs = [d for d in args.dirs if d not in frontier_dirs]
    runs = []
    if args.dirs:
        try:
            runs, missing, _, notes = rd.load(args.dirs)
        except rd.DataError as e:
            print(f"normlab: error: {e}", file=sys.stderr)
            return 2
        for n in notes:
            print(f"note: {n}")
        if not runs:
            print("normlab: error: no runs with data in " + ", ".join(args.dirs), file=sys.stderr)
            return 2
    try:
        normlab_outdir.claim(args.out, "plots")
    except normlab_outdir.OutDirError as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        return 2
    try:
        return _write(args, frontiers, runs)
    except OSError as e:  # a full disk, the folder removed meanwhile, ...
        print(normlab_outdir.write_error(args.out, e), file=sys.stderr)
        return 1
    except FigureWorkerError as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        return 1


def _write(args, frontiers, runs):
    frontier_files = []
    for data in frontiers:
        prefix = "" if len(frontiers) == 1 else os.path.basename(os.path.normpath(data["path"])) + "_"
        for _, _, _, files in normlab_frontier.draw(data, args.out, args.format, prefix):
            frontier_files += files
    if frontier_files:
        print(f"wrote {len(frontier_files)} files (frontier figures of {len(frontiers)} frontier director"
              f"{'y' if len(frontiers) == 1 else 'ies'}):")
        for p in frontier_files:
            print(f"  {p}")
    if not runs:
        return 0
    figures = make_figures(runs, args.out, args.format, args.update, only=args.only)
    print(f"wrote {sum(len(f.files) for f in figures)} files ({len(figures)} figures, "
          f"{len(runs)} runs):")
    for f in figures:
        for p in f.files:
            print(f"  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
