"""Stability-frontier directories (`normlab frontier`): read frontier.json, draw the `frontier` and
`lr_sensitivity` figures, and the report's frontier section.

A frontier directory holds frontier.json, frontier.csv and one run directory per trial. Used by
normlab_plots.py and normlab_report.py; standard library only until a figure is drawn.
"""
import base64
import html
import math
import os

import normlab_figures
import normlab_html
import normlab_outdir
import normlab_rundata

VERDICTS = ("frontier", "all_stable", "none_stable", "searching")
# One hatch per scheme: overlapping bands show both patterns, not one blended tint.
BAND_HATCHES = ("////", "\\\\\\\\", "||||", "----", "xxx", "...", "+++", "ooo")


class FrontierError(Exception):
    """A missing or malformed frontier.json; the message names the file."""


def is_frontier_dir(path):
    return os.path.isfile(os.path.join(path, "frontier.json"))


def _num(v, where):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise FrontierError(f"{where}: expected a finite number or null, got {v!r}")
    return float(v)


def load_frontier(path):
    """frontier.json of a frontier directory, validated: a dict with `cells` (scheme, depth,
    verdict, max_stable_lr, min_unstable_lr, lr_sensitivity, non_monotone, trials) and the
    search's settings (lr_min, lr_max, grid, seeds, updates, definition)."""
    fp = os.path.join(path, "frontier.json")
    try:
        data = normlab_rundata._read_json(fp)  # the run files' careful reader (UTF-8, folders, nesting)
    except normlab_rundata.DataError as e:
        raise FrontierError(str(e)) from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise FrontierError(f"{fp}: expected an object with a \"cells\" list")
    for key in ("lr_min", "lr_max", "updates"):
        if _num(data.get(key), f"{fp}: {key}") is None:
            raise FrontierError(f"{fp}: {key}: missing")
    for i, c in enumerate(data["cells"]):
        where = f"{fp}: cells[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("scheme"), str) or not isinstance(c.get("depth"), int):
            raise FrontierError(f"{where}: expected scheme (string) and depth (integer)")
        if c.get("verdict") not in VERDICTS:
            raise FrontierError(f"{where}: verdict: expected one of {', '.join(VERDICTS)}, got {c.get('verdict')!r}")
        for key in ("max_stable_lr", "min_unstable_lr", "lr_sensitivity", "best_loss"):
            c[key] = _num(c.get(key), f"{where}: {key}")
        if not isinstance(c.get("trials", []), list):
            raise FrontierError(f"{where}: trials: expected a list")
    data["path"] = path
    return data


def _schemes(data):
    out = []
    for c in data["cells"]:
        if c["scheme"] not in out:
            out.append(c["scheme"])
    return out


def _cells_of(data, scheme):
    return sorted((c for c in data["cells"] if c["scheme"] == scheme), key=lambda c: c["depth"])


def _title(data):
    name = os.path.basename(os.path.normpath(data["path"]))
    return (f"{name}: {data.get('arch', '?')}, {int(data['updates'])} updates per trial, "
            f"seeds {','.join(str(s) for s in data.get('seeds', []))}")


def draw(data, out_dir, formats, prefix=""):
    """Writes <prefix>frontier and <prefix>lr_sensitivity; returns [(key, title, caption, files)]."""
    normlab_figures.load_matplotlib()  # Agg, fonts, the error when matplotlib is missing
    plt, Line2D = normlab_figures.plt, normlab_figures.Line2D
    from matplotlib.patches import Patch

    os.makedirs(out_dir, exist_ok=True)
    schemes = _schemes(data)
    colors = plt.get_cmap("tab10")
    lr_min, lr_max = data["lr_min"], data["lr_max"]
    depths = sorted({c["depth"] for c in data["cells"]})
    written = []

    def save(fig, key, title, caption):
        normlab_figures.show_lone_values(fig, markers=False)  # one depth: a sensible linear y axis
        normlab_figures.plain_names(fig)
        files = []
        for ext in formats:
            p = os.path.join(out_dir, f"{prefix}{key}.{ext}")
            fig.savefig(p, dpi=130, bbox_inches="tight")
            files.append(p)
        plt.close(fig)
        written.append((prefix + key, title, caption, files))

    # frontier: x = depth, log y = max stable lr; the band up to the smallest unstable lr.
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    handles, labels = [], []
    for i, s in enumerate(schemes):
        col = colors(i % 10)
        # Schemes with the same frontier would hide each other: each is shifted a little along x.
        shift = 1 + 0.035 * (i - (len(schemes) - 1) / 2)
        cells = [dict(c, depth=c["depth"] * shift) for c in _cells_of(data, s)]
        xs = [c["depth"] for c in cells if c["verdict"] == "frontier"]
        lo = [c["max_stable_lr"] for c in cells if c["verdict"] == "frontier"]
        hi = [c["min_unstable_lr"] for c in cells if c["verdict"] == "frontier"]
        # Off-range cells sit on the range's edge with a triangle pointing where the frontier is.
        line_x = [c["depth"] for c in cells if c["verdict"] in ("frontier", "all_stable", "none_stable")]
        line_y = [c["max_stable_lr"] if c["verdict"] != "none_stable" else lr_min for c in cells
                  if c["verdict"] in ("frontier", "all_stable", "none_stable")]
        # Dashed where a cell is off the range (its value is only a bound), solid between frontiers.
        ax.plot(line_x, line_y, "--", color=col, lw=1.0, alpha=0.7, zorder=3)
        line, = ax.plot(xs, lo, "o-", color=col, ms=5, lw=1.4, zorder=4)
        handles.append(line)
        labels.append(s)
        if xs:
            # A light tint, the scheme's hatch and an outline in its colour: where two bands
            # overlap both stay readable (tints alone blend into one colour).
            band = dict(facecolor=(*col[:3], 0.1), edgecolor=(*col[:3], 0.8),
                        hatch=BAND_HATCHES[i % len(BAND_HATCHES)])
            ax.fill_between(xs, lo, hi, lw=0.8, zorder=2, **band)
            ax.plot(xs, hi, "_", color=col, ms=9, mew=1.5, zorder=4)
            handles[-1] = (Patch(lw=0.8, **band), line)  # the legend shows the band with the line
        for c in cells:
            if c["verdict"] == "all_stable":
                ax.plot([c["depth"]], [lr_max], "^", color=col, ms=7, mfc="none", mew=1.5, zorder=4)
            elif c["verdict"] == "none_stable":
                ax.plot([c["depth"]], [lr_min], "v", color=col, ms=7, mfc="none", mew=1.5, zorder=4)
            if c.get("non_monotone") and c["max_stable_lr"]:
                ax.annotate("*", (c["depth"], c["max_stable_lr"]), textcoords="offset points", xytext=(4, 2),
                            color=col, fontsize=11)
    for y in (lr_min, lr_max):
        ax.axhline(y, color="0.5", lw=0.8, ls=":", zorder=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(depths)
    ax.set_xticklabels([str(d) for d in depths])
    ax.minorticks_off()
    ax.set_xlabel("layers" + (" (encoder = decoder)" if data.get("arch") == "encdec" else ""))
    ax.set_ylabel("peak learning rate")
    ax.set_title("Stability frontier: largest stable peak lr\n" + _title(data))
    handles += [Line2D([], [], color="0.4", marker="o", ls="-"), Line2D([], [], color="0.4", marker="_", ls="", ms=9),
                Line2D([], [], color="0.4", marker="^", mfc="none", ls=""),
                Line2D([], [], color="0.4", marker="v", mfc="none", ls="")]
    labels += ["max stable lr", "min unstable lr (band: frontier inside)", "all stable (above the range)",
               "none stable (below the range)"]
    ax.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save(fig, "frontier", "Stability frontier",
         "Per scheme and depth, the largest peak lr at which every seed trained without divergence "
         "(dots) and the smallest at which one did not (bars); the frontier lies in the band (a hatch "
         "per scheme). "
         "Dotted lines: the searched range; open triangles: every lr stable (up) or none (down); "
         "* : a larger grid lr was stable again (non-monotone).")

    # lr_sensitivity vs depth, and beside it the best loss it is measured from
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9.6, 3.8))
    for i, s in enumerate(schemes):
        col = colors(i % 10)
        cells = [c for c in _cells_of(data, s) if c["lr_sensitivity"] is not None]
        ax.plot([c["depth"] for c in cells], [c["lr_sensitivity"] for c in cells], "o-", color=col, label=s)
        cells = [c for c in _cells_of(data, s) if c.get("best_loss") is not None]
        ax2.plot([c["depth"] for c in cells], [c["best_loss"] for c in cells], "o-", color=col, label=s)
    for a, ylabel in ((ax, "LR sensitivity (nats)"), (ax2, "best final training nll over the grid")):
        a.set_xscale("log")
        a.set_xticks(depths)
        a.set_xticklabels([str(d) for d in depths])
        a.minorticks_off()
        a.set_xlabel("layers" + (" (encoder = decoder)" if data.get("arch") == "encdec" else ""))
        a.set_ylabel(ylabel)
    ax.set_title("LR sensitivity (Wortsman et al. 2023)")
    ax2.set_title("best loss (the sensitivity's reference)")
    fig.suptitle(_title(data), fontsize=9)
    ax2.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    normlab_figures.plain_names(fig)  # before the layout measures the texts
    fig.tight_layout()
    save(fig, "lr_sensitivity", "LR sensitivity",
         "Left: mean over the lr grid of min(final training nll, initial nll), minus the best of the grid "
         "(mean over seeds; a diverged trial counts as its initial loss); lower: about as good over a wider "
         "range of learning rates. Right: that best value; a scheme that trains at no lr is insensitive too, "
         "so read the two together.")
    return written


def _lr(v):
    return "" if v is None else f"{v:.4g}"


def table_rows(data):
    """(scheme, depth, verdict text, max stable, min unstable, sensitivity, trials) per cell."""
    rows = []
    for c in data["cells"]:
        verdict = {"frontier": "frontier", "all_stable": f"all stable (frontier above {data['lr_max']:.4g})",
                   "none_stable": f"none stable (frontier below {data['lr_min']:.4g})",
                   "searching": "searching (unfinished)"}[c["verdict"]]
        if c.get("non_monotone"):
            verdict += ", non-monotone"
        sens = "" if c["lr_sensitivity"] is None else f"{c['lr_sensitivity']:.3f}"
        best = "" if c["best_loss"] is None else f"{c['best_loss']:.3f}"
        rows.append((c["scheme"], c["depth"], verdict, _lr(c["max_stable_lr"]), _lr(c["min_unstable_lr"]), sens, best,
                     len(c.get("trials", []))))
    return rows


HEAD = ("scheme", "depth", "verdict", "max stable lr", "min unstable lr", "LR sensitivity", "best loss", "trials")


def html_section(data, figures):
    """The report's frontier section: settings, definition, table, figures (embedded PNG)."""
    esc = html.escape
    parts = [f"<h2>Stability frontier — {esc(os.path.basename(os.path.normpath(data['path'])))}</h2>",
             f"<p class='meta'>manifest {esc(str(data.get('manifest', '')))} · lr grid "
             f"{esc(', '.join(f'{g:.4g}' for g in data.get('grid', [])))} · {int(data['updates'])} updates · "
             f"seeds {esc(','.join(str(s) for s in data.get('seeds', [])))} · {data.get('bisect', 0)} bisection "
             f"step(s)</p>",
             f"<p class='small'>{esc(str(data.get('definition', '')))}</p>",
             "<table><tr>" + "".join(f"<th>{h}</th>" for h in HEAD) + "</tr>"]
    for r in table_rows(data):
        css = "ok" if r[2] == "frontier" else ("bad" if r[2].startswith("none") else "live")
        parts.append("<tr>" + "".join(f"<td class='{css if i == 2 else ('num' if i in (1, 3, 4, 5, 6, 7) else '')}'>"
                                      f"{esc(str(v))}</td>" for i, v in enumerate(r)) + "</tr>")
    parts.append("</table>")
    for key, title, caption, files in figures:
        png = next((f for f in files if f.endswith(".png")), None)
        if png is None:
            continue
        with open(png, "rb") as f:
            b64 = base64.b64encode(f.read()).decode("ascii")
        parts.append(f"<figure><img alt='{esc(title)}' src='data:image/png;base64,{b64}'>"
                     f"<figcaption><b>{esc(title)}</b> ({esc(key)}). {esc(caption)}</figcaption></figure>")
    return "\n".join(parts)


def markdown_section(data, figures, rel_to):
    name = os.path.basename(os.path.normpath(data["path"]))
    md = [f"## Stability frontier — {name}", "",
          f"lr grid {', '.join(f'{g:.4g}' for g in data.get('grid', []))}; {int(data['updates'])} updates; seeds "
          f"{','.join(str(s) for s in data.get('seeds', []))}; {data.get('bisect', 0)} bisection step(s).", "",
          str(data.get("definition", "")), "",
          "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    md += ["| " + " | ".join(str(v) for v in r) + " |" for r in table_rows(data)]
    md.append("")
    for key, title, caption, files in figures:
        png = next((f for f in files if f.endswith(".png")), None)
        if png:
            md += [f"![{title}]({os.path.relpath(png, rel_to)})", "", f"*{title}.* {caption}", ""]
    return md


def write_report(dirs, out):
    """`normlab report` on frontier directories: report.html, report.md and figures/. Raises
    FrontierError on a bad frontier.json, OutDirError when `out` is not normlab's to write."""
    datas = [load_frontier(d) for d in dirs]
    normlab_outdir.claim(out, "report")
    fig_dir = os.path.join(out, "figures")
    sections_html, sections_md, n = [], [], 0
    for d in datas:
        prefix = "" if len(datas) == 1 else os.path.basename(os.path.normpath(d["path"])) + "_"
        figs = draw(d, fig_dir, ("png",), prefix)
        n += len(figs)
        sections_html.append(html_section(d, figs))
        sections_md += markdown_section(d, figs, out)
    title = "normlab report: " + ", ".join(os.path.basename(os.path.normpath(d)) for d in dirs)
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{normlab_html.CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            + "\n".join(sections_html) + "</body></html>\n")
    html_path, md_path = os.path.join(out, "report.html"), os.path.join(out, "report.md")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(page)
    with open(md_path, "w", encoding="utf-8") as f:
        f.write("\n".join([f"# {title}", ""] + sections_md) + "\n")
    print(f"wrote {md_path} ({n} figures in {fig_dir})")
    print(html_path)
    return 0
