"""`normlab report`: summary.csv, a self-contained HTML report and a Markdown version of a sweep.

usage: normlab_report.py SWEEP_OR_RUN_DIR... [--out DIR]   (default DIR: FIRST_DIR/report)

The HTML embeds every figure as base64 PNG and needs no network; the Markdown links the figures
written next to it (figures/*.png; `normlab plot` writes SVG too).
"""
import argparse
import base64
import csv
import datetime
import html
import math
import os
import sys
import tomllib
from collections import OrderedDict

sys.dont_write_bytecode = True  # no __pycache__ in the source tree or the install prefix
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import normlab_frontier  # noqa: E402
import normlab_html  # noqa: E402
import normlab_outdir  # noqa: E402
import normlab_paper as paper  # noqa: E402
import normlab_plots  # noqa: E402
import normlab_rundata as rd  # noqa: E402

STATUS_CLASS = {"completed": "ok", "stopped_early": "ok", "diverged": "bad", "failed": "fail", "running": "live",
                "interrupted": "live", "not started": "none"}

def _fmt(v, nd=3):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


class Row:
    """One summary line: a run, or a sweep entry without a run yet."""

    def __init__(self, run=None, missing=None):
        self.run = run
        if run is not None:
            nll, bleu, best_u = run.best_valid()
            self.id = run.label
            self.dir = run.path
            self.scheme = run.scheme
            self.arch = run.arch
            self.enc_layers = run.enc_layers if run.arch != "lm" else ""
            self.dec_layers = run.dec_layers
            self.depth = run.depth_text()
            self.depth_value = run.depth_value()
            self.seed = run.manifest.get("run", {}).get("seed", "")
            self.state = run.state
            self.status_text = run.status_text()
            self.updates = run.status.get("updates", "")
            self.best_nll, self.best_bleu, self.best_update = nll, bleu, best_u
            test = run.test or {}
            self.test_bleu, self.test_chrf = rd._number(test.get("bleu")), rd._number(test.get("chrf"))
            self.test_ppl = rd._number(test.get("ppl"))
            self.min_nll = run.min_valid_nll()
            self.last_train_nll = run.last_train_nll()
            spikes = run.spike_scores()  # OLMo 2's spike scores (%), as the run's summary record
            self.loss_spike_score, self.gnorm_spike_score = spikes["loss"][0], spikes["gnorm"][0]
            self.tokens_per_s = run.tokens_per_s()
            self.tokens = run.tokens_seen()
            self.parameters = run.env.get("parameters", "")
            self.values = run.sweep_values
            self.recipe = recipe_text(run.manifest.get("optim", {}), run.manifest.get("model", {}))
            # Downstream tasks scored in the loop: the newest evaluation of them all.
            self.tasks, self.tasks_update = run.last_tasks()
            self.task_average = run.task_average()
        else:
            m = missing
            self.id, self.dir, self.values = m.label, m.path, m.sweep_values
            v = self.values
            self.scheme = str(v.get("scheme", v.get("scheme.name", "?")))
            self.arch = str(v.get("model.arch", ""))
            self.enc_layers = v.get("model.enc_layers", "")
            self.dec_layers = v.get("model.dec_layers", "")
            enc, dec = str(self.enc_layers), str(self.dec_layers)
            self.depth = f"{dec}L" if self.arch == "lm" else (f"{enc}L-{dec}L" if enc and dec else
                                                               (f"{enc or dec}L" if enc or dec else "?"))
            try:
                self.depth_value = int(dec or enc)
            except ValueError:
                self.depth_value = 0
            self.seed = v.get("run.seed", "")
            self.state, self.status_text = "not started", m.why
            self.updates = ""
            self.best_nll = self.best_bleu = self.best_update = self.min_nll = None
            self.test_bleu = self.test_chrf = self.test_ppl = None
            self.last_train_nll = self.tokens_per_s = self.tokens = None
            self.loss_spike_score = self.gnorm_spike_score = None
            self.parameters = ""
            self.recipe = ""
            self.tasks, self.tasks_update, self.task_average = {}, None, None

    @property
    def valid_ppl(self):
        """exp of the lowest validation nll: the language models' usual figure."""
        return None if self.min_nll is None else math.exp(min(self.min_nll, 700.0))

    @property
    def css(self):
        return STATUS_CLASS.get(self.state, "none")

    def metric_text(self):
        parts = []
        if self.best_bleu is not None:
            parts.append(f"BLEU {self.best_bleu:.2f}")
        if self.min_nll is not None:
            parts.append(f"valid nll {self.min_nll:.3f}")
        if self.test_bleu is not None:
            parts.append(f"test BLEU {self.test_bleu:.2f}")
        elif self.test_ppl is not None:
            parts.append(f"test ppl {self.test_ppl:.2f}")
        if self.task_average is not None:
            parts.append(f"tasks acc {self.task_average:.3f}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tok/s")
        return " · ".join(parts)


def recipe_text(optim, model):
    """The optimisation recipe of a resolved manifest in one line: AdamW's β₂, weight decay and the
    parameters it skips, warm-up, schedule, clipping (issue 45: schemes compared under their own
    papers' recipes say so)."""
    if not isinstance(optim, dict):
        return ""
    wd = optim.get("weight_decay", 0)
    rule = optim.get("no_decay", "auto")
    if rule == "auto":
        rule = "vectors+scheme" if model.get("family") == "llama" else "nothing"
    decay = f"wd {wd:g} (no_decay {rule})" if wd else "wd 0"
    schedule = optim.get("lr_schedule", "inverse_sqrt")
    floor = optim.get("min_lr_ratio", 0)
    floor = f"{floor:g}" if isinstance(floor, (int, float)) else str(floor)
    if schedule == "cosine":  # issue 69.4: the floor is part of the recipe
        schedule = f"cosine to {floor}·lr"
    elif schedule in ("wsd", "wsd_hagele2024"):  # and the cooldown's length and shape
        length = optim.get("decay_updates", 0)
        length = f"{length} updates" if isinstance(length, int) and length > 0 else "the last fifth"
        schedule = f"{schedule} (cooldown {length}, {optim.get('decay_shape', '1-sqrt')}, to {floor}·lr)"
    clip = optim.get("clip_norm", 0)
    lr = f"lr {optim['lr']:g}, " if isinstance(optim.get("lr"), (int, float)) else ""
    z_loss = optim.get("z_loss", 0)
    z_loss = f", z-loss {z_loss:g}" if isinstance(z_loss, (int, float)) and z_loss > 0 else ""
    return (f"AdamW {lr}β₂ {optim.get('beta2', 0.98):g}, {decay}, warm-up {optim.get('warmup_updates', 0)}, "
            f"{schedule}, " + (f"clip {clip:g}" if clip else "no clip") + z_loss)


CSV_FIELDS = ["id", "scheme", "arch", "enc_layers", "dec_layers", "depth", "seed", "status",
              "status_text", "updates", "best_valid_nll", "best_valid_ppl", "best_valid_bleu", "best_update",
              "last_train_nll", "loss_spike_score", "gnorm_spike_score", "tokens_per_s", "parameters", "test_bleu", "test_chrf", "test_ppl", "recipe", "dir"]


def task_names(rows):
    """Every task scored in the loop by any row's run, in first-seen order."""
    return list(dict.fromkeys(n for r in rows for n in r.tasks))


TASKS_NOTE = ("Per task, lm-evaluation-harness's metrics for it first (its YAML's metric_list, as the task's "
              "source record names it; else the harness's defaults for the task's kind, marked assumed), each "
              "± its standard error (acc, acc_norm: the sample stderr; perplexity: the harness's bootstrap); "
              "then, apart, normlab's own: a metric the harness does not report for that task, and bits per "
              "byte of the gold continuations (bpb: Σ −log-likelihood / (ln 2 · Σ UTF-8 bytes), pooled over "
              "the items; OLMo's downstream bpb is the mean of each item's ratio). chance: the mean of "
              "1/choices. Averages are over like metrics only, each naming the tasks it takes.")


def _task_metric(rec, m):
    if m == "perplexity":
        v, se = rd._number(rec.get("ppl")), rd._number(rec.get("ppl_stderr"))
        return None if v is None else f"perplexity {v:.2f}" + (f" ± {se:.2f}" if se is not None else "")
    v, se = rd._number(rec.get(m)), rd._number(rec.get(m + "_stderr"))
    return None if v is None else f"{m} {v:.3f}" + (f" ± {se:.3f}" if se is not None else "")


def task_texts(rec):
    """(lm-evaluation-harness's metrics, normlab's own) of one task result, as text (issue 69.2)."""
    harness, assumed = rd.harness_metrics_of(rec)
    own = [m for m in (["acc", "perplexity"] if rd.task_kind(rec) == "last_word" else ["acc", "acc_norm"])
           if m not in harness]
    h = [t for t in (_task_metric(rec, m) for m in harness) if t]
    o = [t for t in (_task_metric(rec, m) for m in own) if t]
    bpb = rd._number(rec.get("bits_per_byte"))
    if bpb is not None:
        o.append(f"bpb {bpb:.3f}")
    return ", ".join(h) + (" (assumed: the harness's defaults)" if assumed and h else ""), ", ".join(o)


def like_averages(recs):
    """The averages over like metrics of {task: result}: mean acc and mean acc_norm over the tasks
    whose harness metrics include them, mean bpb (normlab's) over all; [(text)] naming the tasks."""
    out = []
    for metric in ("acc", "acc_norm", "bits_per_byte"):
        vals = {n: rd._number(r.get(metric)) for n, r in recs.items()
                if metric == "bits_per_byte" or metric in rd.harness_metrics_of(r)[0]}
        vals = {n: v for n, v in vals.items() if v is not None and math.isfinite(v)}
        if vals:
            name = "bpb" if metric == "bits_per_byte" else metric
            out.append(f"mean {name} {sum(vals.values()) / len(vals):.3f} ({len(vals)} task"
                       f"{'' if len(vals) == 1 else 's'}: {', '.join(vals)})")
    return out


def _chance(rec):
    c = rd._number(rec.get("chance"))
    return "" if c is None or rd.task_kind(rec) == "last_word" else f"{c:.3f}"


def task_table(rows):
    """(head, [cells]) of the in-loop results at each run's newest complete evaluation, one row per
    run and task, then one averages row per run."""
    head = ["run", "update", "training tokens", "task", "items", "chance",
            "lm-evaluation-harness's metrics (± stderr)", "normlab's own"]
    out = []
    for r in rows:
        if not r.tasks:
            continue
        tokens = next((t.get("tokens") for t in r.tasks.values() if rd.is_update(t.get("tokens"))), None)
        for name, rec in r.tasks.items():
            h, o = task_texts(rec)
            out.append([r.id, r.tasks_update, "" if tokens is None else f"{tokens:,}", name, rec.get("items", ""),
                        _chance(rec), h, o])
        out.append([r.id, r.tasks_update, "" if tokens is None else f"{tokens:,}", "averages", "", "",
                    "; ".join(like_averages(r.tasks)), ""])
    return head, out


def offline_task_table(rows):
    """(head, [cells]) of every `normlab eval --tasks` call's results (RUN/eval/tasks.*.json)."""
    head = ["run", "file", "checkpoint", "shots", "limit", "task", "items", "chance",
            "lm-evaluation-harness's metrics (± stderr)", "normlab's own"]
    out = []
    for r in rows:
        for call in ([] if r.run is None else r.run.offline_tasks):
            for name, rec in call["tasks"].items():
                h, o = task_texts(rec)
                out.append([r.id, call["file"], call["checkpoint"] or "", call["shots"],
                            call["limit"] or "all", name, rec.get("items", ""), _chance(rec), h, o])
    return head, out


def _html_table(table_id, head, cells):
    esc = html.escape
    return (f"<table id='{table_id}'><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{esc(str(x))}</td>" for x in c) + "</tr>"
                                               for c in cells) + "</tbody></table>")


def _md_table(head, cells):
    return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(str(x).replace("|", "\\|") for x in c) + " |" for c in cells])


def task_acc(row, name):
    rec = row.tasks.get(name)
    return None if rec is None else rd._number(rec.get("acc"))


def write_csv(rows, path):
    value_keys = sorted({k for r in rows for k in r.values})
    tasks = task_names(rows)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS + [f"value:{k}" for k in value_keys]
                   + ([f"task:{n}:acc" for n in tasks] + ["tasks_average_acc", "tasks_update"] if tasks else []))
        for r in rows:
            # best_valid_nll: the lowest validation nll; best_valid_bleu: the highest BLEU
            w.writerow([r.id, r.scheme, r.arch, r.enc_layers, r.dec_layers, r.depth, r.seed, r.state,
                        r.status_text, r.updates, _fmt(r.min_nll, 4), _fmt(r.valid_ppl, 2), _fmt(r.best_bleu, 2),
                        "" if r.best_update is None else r.best_update, _fmt(r.last_train_nll, 4),
                        _fmt(r.loss_spike_score, 2), _fmt(r.gnorm_spike_score, 2),
                        _fmt(r.tokens_per_s, 1), r.parameters, _fmt(r.test_bleu, 2), _fmt(r.test_chrf, 2),
                        _fmt(r.test_ppl, 2), r.recipe, r.dir]
                       + [r.values.get(k, "") for k in value_keys]
                       + ([_fmt(task_acc(r, n), 4) for n in tasks]
                          + [_fmt(r.task_average, 4), "" if r.tasks_update is None else r.tasks_update]
                          if tasks else []))


# What must be equal for a Pre-LN run to be a scheme's control (issue 60.1): the whole recipe and
# everything but the scheme, with the precision, the data-parallel ranks (issue 66.19: ranks
# multiply the update's batch; a bf16 control is no control of an fp32 run), the device and TF32
# (issue 69.4: other kernels, other rounding) and optim.max_epochs (another length of training).
_RECIPE_KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay", "no_decay", "warmup_updates", "lr_schedule",
                "min_lr_ratio", "decay_updates", "decay_shape", "clip_norm", "label_smoothing", "max_tokens",
                "update_freq", "max_updates", "max_epochs")


def _control_fields(row):
    """{field: value} of what a control must share with the run, by the name a reason quotes."""
    m = row.run.manifest
    optim, run = m.get("optim", {}), m.get("run", {})
    fields = {f"model.{k}": v for k, v in m.get("model", {}).items()}
    fields.update({f"data.{k}": v for k, v in m.get("data", {}).items()})
    # Every optim key of the resolved manifest (z_loss changes the training loss too: hostile review
    # of 69.4), at least those of _RECIPE_KEYS (unset where an older manifest lacks one).
    fields.update({f"optim.{k}": optim.get(k) for k in _RECIPE_KEYS})
    fields.update({f"optim.{k}": v for k, v in optim.items() if not isinstance(v, dict)})
    fields.update({"run.seed": run.get("seed"), "run.dtype": row.run.dtype,
                   "data-parallel ranks": row.run.world_size, "run.device": run.get("device", "cpu"),
                   "run.tf32": run.get("tf32")})
    return fields


def _differences(a, b):
    """The fields in which two runs' _control_fields differ, sorted."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _sweep_optim_overrides(row):
    """The optim.* values a sweep axis gave this run ({} outside a sweep)."""
    out = {}
    for k, v in row.values.items():
        if k == "optim" and isinstance(v, dict):
            out.update({f"optim.{kk}": vv for kk, vv in v.items()})
        elif k.startswith("optim."):
            out[k] = v
    return out


def _is_baseline(row, sweep_optim):
    """A Pre-LN run under its sweep's own recipe: no sweep axis set an optim key to a value other
    than the sweep manifest's [optim] (pre-ln of experiments/paper/llama-depth.toml, not its
    pre-ln.<paper>-recipe controls)."""
    if row.scheme != "pre-ln" or sweep_optim is None:
        return False
    return all(k.split(".", 1)[1] in sweep_optim and sweep_optim[k.split(".", 1)[1]] == v
               for k, v in _sweep_optim_overrides(row).items())


def control_rows(rows, sweeps=()):
    """Every run of a scheme other than Pre-LN, in order, as (run row, its control row or None, the
    baseline Pre-LN row or None, why there is no control). The control: a Pre-LN run of the same
    model, data, seed, optimisation recipe, run.dtype, data-parallel ranks, run.device and
    run.tf32 (each paper's scheme against Pre-LN under that paper's recipe: that gap is the
    scheme's). The baseline: the Pre-LN run with all of these but the recipe equal, trained under
    its sweep manifest's own recipe: control − baseline is the recipe's part of the gap."""
    sweep_optim = {}
    for sw in sweeps:
        try:
            optim = tomllib.loads(sw.manifest_text() or "").get("optim", {})
        except tomllib.TOMLDecodeError:
            optim = None
        sweep_optim[sw.path] = optim if isinstance(optim, dict) else None
    pre = [(r, _control_fields(r)) for r in rows if r.run is not None and r.scheme == "pre-ln"]
    out = []
    for r in rows:
        if r.run is None or r.scheme == "pre-ln":
            continue
        fields = _control_fields(r)
        control = next((c for c, f in pre if not _differences(fields, f)), None)
        baseline = None
        for c, f in pre:
            if all(d.startswith("optim.") for d in _differences(fields, f)) and _is_baseline(
                    c, sweep_optim.get(os.path.dirname(os.path.normpath(c.dir)))):
                baseline = c
                break
        why = ""
        if control is None:
            if not pre:
                why = "no Pre-LN run in this report"
            else:
                closest, diff = min(((c, _differences(fields, f)) for c, f in pre), key=lambda x: len(x[1]))
                mine, theirs = fields, _control_fields(closest)
                shown = ", ".join(f"{k} {_show_value(theirs.get(k))} (this run: {_show_value(mine.get(k))})"
                                  for k in diff[:3]) + (f" and {len(diff) - 3} more" if len(diff) > 3 else "")
                why = f"no control: the closest Pre-LN run, {closest.id}, differs in {shown}"
        out.append((r, control, baseline, why))
    return out


def _show_value(v):
    return "unset" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))


def _gap(a, b):
    return None if a is None or b is None else a - b


def _pair_cells(scheme, control, baseline, why):
    ppl = lambda r: None if r is None else r.valid_ppl  # noqa: E731
    total, recipe, own = (_gap(ppl(scheme), ppl(baseline)), _gap(ppl(control), ppl(baseline)),
                          _gap(ppl(scheme), ppl(control)))
    sign = lambda v: "" if v is None else f"{v:+.2f}"  # noqa: E731
    return [scheme.id, control.id if control is not None else why, scheme.depth, _fmt(ppl(scheme), 2),
            _fmt(ppl(control), 2), _fmt(ppl(baseline), 2) if baseline is not None else "",
            sign(total), sign(recipe), sign(own), scheme.recipe]


# Issue 59.10: throughput is the wall clock's, as each run was timed.
THROUGHPUT_NOTE = ("tokens: target tokens the run's updates trained on; tokens/s: each run's mean throughput as "
                   "timed, under whatever load its machine had then: compare it across runs only when they ran "
                   "alone on the same machine.")
# Issue 67.5: OLMo 2's spike score.
SPIKE_NOTE = ("loss / gnorm spikes %: OLMo 2's spike score of the logged training nll and gradient norm, the "
              "percentage of values at least 7 standard deviations from the mean of the up to 1000 before "
              "them (docs/analysis.md#loss-spikes); ▲ on the loss figure.")

PAIR_HEAD = ["run", "its control (Pre-LN, same recipe), or why none", "depth", "valid ppl",
             "control's valid ppl", "baseline Pre-LN's valid ppl", "gap to the baseline",
             "the recipe's part (control − baseline)", "the scheme's part (run − control)", "recipe"]
CONTROL_NOTE = ("Every run of a scheme other than Pre-LN beside its control: the Pre-LN run of the same model, "
                "data, seed, optimisation recipe, run.dtype, data-parallel ranks, run.device and run.tf32 "
                "(lowest validation perplexity). Its gap to the baseline Pre-LN (the Pre-LN run trained under "
                "the sweep manifest's own recipe) splits into the recipe's part (control − baseline) and the "
                "scheme's (run − control). A run without a control says why.")


def matrix(rows):
    """{scheme: {depth_text: [rows]}}, schemes in sweep order, depths sorted by size."""
    depths = sorted({(r.depth_value, r.depth) for r in rows})
    m = OrderedDict()
    for r in rows:
        m.setdefault(r.scheme, OrderedDict((d[1], []) for d in depths))[r.depth].append(r)
    return [d[1] for d in depths], m


def paper_views(runs, sweeps):
    """[(key, view, runs)] for the sweeps named after a paper figure (normlab_paper.PAPER_VIEWS),
    each with the runs of that sweep."""
    out = []
    for s in sweeps:
        key = paper.view_of(s)
        near = paper.near_view(s.name)
        if near is not None:
            print(f"normlab report: note: sweep '{s.name}' ({s.path}) has no paper view; did you mean "
                  f"'{near}'? The view is chosen by the exact [sweep] name.", file=sys.stderr)
        if key is not None:
            mine = [r for r in runs if os.path.dirname(os.path.normpath(r.path)) == s.path]
            out.append((key, paper.PAPER_VIEWS[key], mine))
    return out


def _paper_html(views, figures):
    esc = html.escape
    by_key = {f.key: f for f in figures}
    parts = ["<h2 id='paper-view'>Paper view</h2><p class='small'>Sweeps named after a paper figure "
             "(<code>[sweep] name</code>): each of our figures beside what the paper's figure "
             "shows, and the statistic we measured (docs/reproducing.md).</p>"]
    for key, v, runs in views:
        figs = [by_key[k] for k in v["figures"] if k in by_key]
        measured = paper.measured_lines(key, runs)
        parts.append(f"<h3 id='paper-{esc(key)}'>{esc(v['paper'])}, {esc(v['figure'])}: {esc(v['title'])}</h3>")
        parts.append("<div class='paper'><div>" + ("".join(_figure_html(f) for f in figs) or
                     "<p>No figure: the runs hold none of this view's data yet.</p>") + "</div>")
        parts.append(f"<div class='paper-text'><h3>{esc(v['paper'])} — {esc(v['figure'])}</h3>"
                     f"<p><b>What the paper shows.</b> {esc(v['shows'])}</p>"
                     f"<p><b>What to compare.</b> {esc(v['compare'])}</p>"
                     f"<p><b>Measured here</b> ({len(runs)} runs):</p><ul>"
                     + "".join(f"<li>{esc(m)}</li>" for m in measured) + "</ul></div></div>")
    return parts


def _paper_markdown(views, figures, base):
    by_key = {f.key: f for f in figures}
    md = ["## Paper view", "", "Sweeps named after a paper figure (`[sweep] name`): each of our "
          "figures beside what the paper's figure shows.", ""]
    for key, v, runs in views:
        md += [f"### {v['paper']}, {v['figure']}: {v['title']}", "",
               f"- **What the paper shows.** {v['shows']}", f"- **What to compare.** {v['compare']}",
               f"- **Measured here** ({len(runs)} runs):"]
        md += [f"  - {m}" for m in paper.measured_lines(key, runs)]
        md.append("")
        for k in v["figures"]:
            if k in by_key:
                f = by_key[k]
                png = next((p for p in f.files if p.endswith(".png")), f.files[0])
                md += [f"![{f.title}]({os.path.relpath(png, base)})", ""]
    return md


def html_report(title, rows, figures, sweeps, notes, out_path, views=()):
    depths, m = matrix(rows)
    esc = html.escape
    parts = [f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title>"
             f"<style>{normlab_html.CSS}</style></head><body>",
             f"<h1>{esc(title)}</h1>",
             f"<p class='meta'>normlab report · {len(rows)} runs · written "
             f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}</p>"]
    parts.append("<h2>Scheme × depth</h2><p class='small'>Status, best validation result "
                 "(lowest nll; highest BLEU for translation) and mean training throughput. "
                 "Green: completed (or stopped early); red: diverged; yellow: running or interrupted; grey: failed or "
                 "not started.</p>")
    parts.append("<table id='matrix'><thead><tr><th>scheme</th>"
                 + "".join(f"<th>{esc(d)}</th>" for d in depths) + "</tr></thead><tbody>")
    for scheme, cols in m.items():
        parts.append(f"<tr><th>{esc(scheme)}</th>")
        for d in depths:
            cell = cols[d]
            if not cell:
                parts.append("<td></td>")
                continue
            css = cell[0].css if len(cell) == 1 else ""
            inner = "".join(
                f"<div class='{r.css}'>" + (f"<span class='small'>{esc(r.id)}</span><br>" if len(cell) > 1 else "")
                + f"<span class='status'>{esc(r.status_text)}</span><br>"
                f"<span class='small'>{esc(r.metric_text())}</span></div>" for r in cell)
            parts.append(f"<td class='cell {css}'>{inner}</td>")
        parts.append("</tr>")
    parts.append("</tbody></table>")

    if views:
        parts += _paper_html(views, figures)

    parts.append("<h2>Runs</h2><table id='runs'><thead><tr>"
                 "<th>run</th><th>scheme</th><th>depth</th><th>status</th><th>updates</th>"
                 "<th>best valid nll</th><th>valid ppl</th><th>best BLEU</th><th>test BLEU</th><th>test ppl</th><th>last train nll</th>"
                 "<th>loss spikes %</th><th>gnorm spikes %</th><th>tokens</th><th>tokens/s</th><th>parameters</th><th>recipe</th></tr></thead><tbody>")
    for r in rows:
        parts.append(
            f"<tr class='{r.css}'><td>{esc(r.id)}</td><td>{esc(r.scheme)}</td><td>{esc(r.depth)}</td>"
            f"<td>{esc(r.status_text)}</td><td class='num'>{esc(str(r.updates))}</td>"
            f"<td class='num'>{_fmt(r.min_nll)}</td><td class='num'>{_fmt(r.valid_ppl, 2)}</td>"
            f"<td class='num'>{_fmt(r.best_bleu, 2)}</td>"
            f"<td class='num'>{_fmt(r.test_bleu, 2)}</td><td class='num'>{_fmt(r.test_ppl, 2)}</td>"
            f"<td class='num'>{_fmt(r.last_train_nll)}</td>"
            f"<td class='num'>{_fmt(r.loss_spike_score, 2)}</td><td class='num'>{_fmt(r.gnorm_spike_score, 2)}</td>"
            f"<td class='num'>{'' if r.tokens is None else f'{r.tokens:,}'}</td>"
            f"<td class='num'>{'' if r.tokens_per_s is None else f'{r.tokens_per_s:,.0f}'}</td>"
            f"<td class='num'>{esc(str(r.parameters))}</td><td>{esc(r.recipe)}</td></tr>")
    parts.append("</tbody></table>")
    parts.append(f"<p class='small'>{esc(THROUGHPUT_NOTE)}</p><p class='small'>{esc(SPIKE_NOTE)}</p>")
    pairs = control_rows(rows, sweeps)
    if pairs and any(c is not None for _, c, _, _ in pairs):
        parts.append(f"<h2>Each scheme against its control</h2><p class='small'>{esc(CONTROL_NOTE)}</p>"
                     "<table id='controls'><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in PAIR_HEAD)
                     + "</tr></thead><tbody>")
        for p in pairs:
            parts.append("<tr>" + "".join(f"<td>{esc(str(x))}</td>" for x in _pair_cells(*p)) + "</tr>")
        parts.append("</tbody></table>")
    head, cells = task_table(rows)
    if cells:
        parts.append(f"<h2>Downstream tasks</h2><p class='small'>In the training loop (eval.tasks), at each run's "
                     f"newest evaluation. {html.escape(TASKS_NOTE)}</p>" + _html_table("tasks", head, cells))
    head, cells = offline_task_table(rows)
    if cells:
        parts.append("<h2>Downstream tasks scored by normlab eval --tasks</h2><p class='small'>Every call's "
                     f"results, RUN/eval/tasks.*.json (limit: the first N items). {html.escape(TASKS_NOTE)}</p>"
                     + _html_table("eval-tasks", head, cells))

    shared = [f for f in figures if f.run is None]
    per_run = OrderedDict()
    for f in figures:
        if f.run is not None:
            per_run.setdefault(f.group, []).append(f)
    parts.append("<h2>Schemes side by side</h2>")
    if not shared:
        parts.append("<p>No figures: the runs hold no logged data yet.</p>")
    for f in shared:
        parts.append(_figure_html(f))
    for group, figs in per_run.items():
        heading = {"layer_cosine": "Layer similarity (B2T Fig. 5), one per run",
                   "act_grad_norm": "Gradients at LayerNorm inputs and outputs (B2T Fig. 4), one per run"}
        parts.append(f"<h2>{esc(heading.get(group, group))}</h2>")
        parts.append(f"<p class='small'>{esc(figs[0].caption)}</p><div class='grid'>")
        for f in figs:
            parts.append(_figure_html(f, caption=False))
        parts.append("</div>")

    for s in sweeps:
        text = s.manifest_text()
        parts.append(f"<h2>Sweep manifest</h2><p class='small'>{esc(str(s.manifest_path or ''))}</p>")
        parts.append(f"<pre>{esc(text)}</pre>" if text is not None else
                     "<p>The sweep manifest file was not found.</p>")
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    parts.append("</body></html>\n")
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def _figure_html(f, caption=True):
    png = next((p for p in f.files if p.endswith(".png")), None)
    with open(png, "rb") as fh:
        data = base64.b64encode(fh.read()).decode("ascii")
    cap = f"<figcaption><b>{html.escape(f.title)}.</b> {html.escape(f.caption)}</figcaption>" if caption \
        else f"<figcaption>{html.escape(f.title)}</figcaption>"
    return (f"<figure id='fig-{html.escape(f.key)}'><img alt='{html.escape(f.title)}' "
            f"src='data:image/png;base64,{data}'>{cap}</figure>")


def markdown_report(title, rows, figures, sweeps, notes, out_path, views=()):
    depths, m = matrix(rows)
    md = [f"# {title}", "", f"normlab report · {len(rows)} runs", "", "## Scheme × depth", "",
          "| scheme | " + " | ".join(depths) + " |", "|---|" + "---|" * len(depths)]
    for scheme, cols in m.items():
        cells = []
        for d in depths:
            cells.append("<br>".join(
                (f"{r.id}: " if len(cols[d]) > 1 else "") + f"**{r.status_text}**"
                + (f" ({r.metric_text()})" if r.metric_text() else "") for r in cols[d]))
        md.append(f"| {scheme} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if views:
        md += [""] + _paper_markdown(views, figures, os.path.dirname(out_path))
    md += ["", "## Runs", "", "| run | scheme | depth | status | updates | best valid nll | valid ppl | best BLEU | "
           "test BLEU | test ppl | last train nll | loss spikes % | gnorm spikes % | tokens | tokens/s | recipe |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        md.append(f"| {r.id} | {r.scheme} | {r.depth} | {r.status_text} | {r.updates} | {_fmt(r.min_nll)} | "
                  f"{_fmt(r.valid_ppl, 2)} | "
                  f"{_fmt(r.best_bleu, 2)} | {_fmt(r.test_bleu, 2)} | {_fmt(r.test_ppl, 2)} | {_fmt(r.last_train_nll)} | "
                  f"{_fmt(r.loss_spike_score, 2)} | {_fmt(r.gnorm_spike_score, 2)} | "
                  f"{'' if r.tokens is None else f'{r.tokens:,}'} | "
                  f"{'' if r.tokens_per_s is None else f'{r.tokens_per_s:,.0f}'} | {r.recipe} |")
    md += ["", THROUGHPUT_NOTE, "", SPIKE_NOTE]
    pairs = control_rows(rows, sweeps)
    if pairs and any(c is not None for _, c, _, _ in pairs):
        md += ["", "## Each scheme against its control", "", CONTROL_NOTE, "",
               "| " + " | ".join(PAIR_HEAD) + " |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
        md += ["| " + " | ".join(str(x).replace("|", "\\|") for x in _pair_cells(*p)) + " |" for p in pairs]
    head, cells = task_table(rows)
    if cells:
        md += ["", "## Downstream tasks", "", "In the training loop (eval.tasks), at each run's newest evaluation. "
               + TASKS_NOTE, ""] + _md_table(head, cells)
    head, cells = offline_task_table(rows)
    if cells:
        md += ["", "## Downstream tasks scored by normlab eval --tasks", "",
               "Every call's results, RUN/eval/tasks.*.json (limit: the first N items). " + TASKS_NOTE, ""] \
            + _md_table(head, cells)
    md += ["", "## Figures", ""]
    base = os.path.dirname(out_path)
    for f in figures:
        png = next((p for p in f.files if p.endswith(".png")), f.files[0])
        md += [f"### {f.title}", "", f"![{f.title}]({os.path.relpath(png, base)})", "",
               f.caption, ""]
    for s in sweeps:
        text = s.manifest_text()
        md += ["## Sweep manifest", "", f"`{s.manifest_path}`", ""]
        md += ["```toml", text.rstrip("\n"), "```", ""] if text is not None else ["(not found)", ""]
    if notes:
        md += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(md))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="normlab report", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="SWEEP_OR_RUN_DIR")
    ap.add_argument("--out", help="output directory (default: FIRST_DIR/report)")
    args = ap.parse_args(argv)
    try:
        normlab_plots.plot_jobs()
    except ValueError as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        return 2
    out = args.out or os.path.join(args.dirs[0], "report")
    frontier_dirs = [d for d in args.dirs if normlab_frontier.is_frontier_dir(d)]
    if frontier_dirs:  # `normlab frontier` directories: their own report (hundreds of short trials)
        if len(frontier_dirs) != len(args.dirs):
            print("normlab: error: frontier directories (frontier.json) cannot share a report with run or "
                  "sweep directories; report them separately", file=sys.stderr)
            return 2
        try:
            return normlab_frontier.write_report(args.dirs, out)
        except (normlab_frontier.FrontierError, normlab_outdir.OutDirError) as e:
            print(f"normlab: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:  # a full disk, ...
            print(normlab_outdir.write_error(out, e), file=sys.stderr)
            return 1
    try:
        runs, missing, sweeps, notes = rd.load(args.dirs)
    except rd.DataError as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        return 2
    for n in notes:
        print(f"note: {n}")
    if not runs and not missing:
        print("normlab: error: no runs in " + ", ".join(args.dirs), file=sys.stderr)
        return 2
    try:
        normlab_outdir.claim(out, "report")
    except normlab_outdir.OutDirError as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        return 2
    try:
        return _write(out, runs, missing, sweeps, notes)
    except OSError as e:  # a full disk, the folder removed meanwhile, ...
        print(normlab_outdir.write_error(out, e), file=sys.stderr)
        return 1
    except normlab_plots.FigureWorkerError as e:
        print(f"normlab: error: {e}", file=sys.stderr)
        return 1


def _write(out, runs, missing, sweeps, notes):
    title = "normlab report: " + (", ".join(s.name for s in sweeps) if sweeps else
                                  ", ".join(r.label for r in runs))
    rows = [Row(run=r) for r in runs] + [Row(missing=m) for m in missing]
    order = {id(x): i for i, x in enumerate(rows)}
    index = {}
    for s in sweeps:  # a sweep's runs in its own order, started or not
        for i, e in enumerate(sorted(s.info["runs"], key=lambda e: e.get("index", 0))):
            index[os.path.normpath(os.path.join(s.path, e["dir"]))] = (s.path, i)
    rows.sort(key=lambda r: index.get(os.path.normpath(r.dir), ("~", order[id(r)])))
    fig_notes = []
    figures = normlab_plots.make_figures(runs, os.path.join(out, "figures"), ("png",),
                                         log=lambda msg: (print(msg), fig_notes.append(msg)))
    csv_path = os.path.join(out, "summary.csv")
    html_path = os.path.join(out, "report.html")
    md_path = os.path.join(out, "report.md")
    write_csv(rows, csv_path)
    all_notes = notes + [n.removeprefix("note: ") for n in fig_notes]
    views = paper_views(runs, sweeps)
    html_report(title, rows, figures, sweeps, all_notes, html_path, views)
    markdown_report(title, rows, figures, sweeps, all_notes, md_path, views)
    print(f"wrote {csv_path}")
    print(f"wrote {md_path} ({len(figures)} figures in {os.path.join(out, 'figures')})")
    print(f"report: {html_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
