#!/usr/bin/env python3
"""The llama depth study's table (scripts/reproduce/llama-depth.sh): per scheme, the mean over seeds of
what the 2024-25 papers claim about depth (docs/schemes/index.md, "What the depth papers claim"), read from each run's
status.json, analysis.csv (last update) and eval/ablate.valid.*.csv:
  ppl            exp(best validation nll, from train.jsonl)                  (e)
Rows are the sweep's run ids without the seed: a scheme, or Pre-LN under another paper's recipe
(pre-ln.lns-recipe, pre-ln.dyt-recipe, pre-ln.ngpt-recipe: issue 60.1).
  rms L/1        hidden-state RMS after the last layer / after the first     (a) Pre-LN's growth
  max abs h      the largest |h| after any layer                             (a) "massive activations"
  angle deep     mean angular distance of the deeper half of the layers      (b) LNS: deep layers idle
  drop deep      mean nll increase when one deeper-half layer is skipped     (c)
  drop shallow   the same for the shallower half
  grad L/1       per-layer gradient norm, last layer / first layer           (d) Mix-LN: Pre-LN's fall

usage: llama_depth_summary.py SWEEP_DIR > summary.md
"""
import csv
import glob
import json
import math
import os
import re
import sys
from collections import defaultdict


def last_update(rows):
    return max(int(r["update"]) for r in rows)


def per_layer(rows, metric, sublayer, u):
    vals = {int(r["layer"]): float(r["value"]) for r in rows
            if r["metric"] == metric and r["sublayer"] == sublayer and int(r["update"]) == u and int(r["layer"]) >= 0}
    return [vals[i] for i in sorted(vals)]


def mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def best_valid_nll(run, status):
    """The lowest validation nll of the run's train.jsonl (issue 60.7: status.json's valid_nll is the
    last one, which the table had called best)."""
    best = None
    path = os.path.join(run, "train.jsonl")
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a last line cut by a kill
            if r.get("kind") == "valid" and isinstance(r.get("nll"), (int, float)) and math.isfinite(r["nll"]):
                best = r["nll"] if best is None else min(best, r["nll"])
    return best if best is not None else status.get("valid_nll")


def run_stats(run):
    status = json.load(open(os.path.join(run, "status.json")))
    # The run's id without its seed: the scheme, or its label (pre-ln.lns-recipe: Pre-LN under
    # LN-Scaling's recipe, issue 60.1).
    scheme = re.sub(r"_seed\d+$", "", os.path.basename(os.path.normpath(run)))
    rows = list(csv.DictReader(open(os.path.join(run, "analysis.csv"))))
    u = last_update(rows)
    rms = per_layer(rows, "hidden_rms", "output", u)
    angle = per_layer(rows, "layer_angular_distance", "layer", u)
    grad = per_layer(rows, "grad_norm", "all", u)
    L = len(rms)
    out = {"scheme": scheme, "max_abs": max(per_layer(rows, "hidden_max_abs", "output", u)), "status": status["status"], "ppl": math.exp(best) if (best := best_valid_nll(run, status)) is not None else None,
           "rms": rms[-1] / rms[0], "angle_deep": mean(angle[L // 2:]), "angle_shallow": mean(angle[:L // 2]),
           "grad": grad[-1] / grad[0] if grad[0] > 0 else float("nan")}  # nan: no gradient reached layer 1
    ablate = sorted(glob.glob(os.path.join(run, "eval", "ablate.valid.*.csv")))
    if ablate:
        d = {int(r["layer"]): float(r["delta_nll"]) for r in csv.DictReader(open(ablate[-1])) if r["stack"] == "decoder"}
        out["drop_deep"] = mean([d[i] for i in d if i >= L // 2])
        out["drop_shallow"] = mean([d[i] for i in d if i < L // 2])
    return out


def main():
    sweep = sys.argv[1]
    by_scheme = defaultdict(list)
    for run in sorted(glob.glob(os.path.join(sweep, "*", "status.json"))):
        s = run_stats(os.path.dirname(run))
        by_scheme[s["scheme"]].append(s)
    keys = [("ppl", "valid ppl", "{:.1f}"), ("rms", "rms L/1", "{:.2f}"), ("max_abs", "max abs h", "{:.1f}"), ("angle_shallow", "angle shallow", "{:.3f}"),
            ("angle_deep", "angle deep", "{:.3f}"), ("drop_shallow", "drop shallow", "{:+.3f}"),
            ("drop_deep", "drop deep", "{:+.3f}"), ("grad", "grad L/1", "{:.2f}")]
    print("| scheme | runs | " + " | ".join(k[1] for k in keys) + " |")
    print("|---|---:|" + "---:|" * len(keys))
    for scheme, runs in by_scheme.items():
        done = [r for r in runs if r["status"] == "completed"]
        cells = [fmt.format(mean([r.get(k) for r in done])) if done else "–" for k, _, fmt in keys]
        print(f"| {scheme} | {len(done)}/{len(runs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
