#!/usr/bin/env python3
"""Figures and table of scripts/reproduce/wortsman-qknorm.sh (Wortsman et al. 2023 at CPU scale).

Usage: wortsman_summary.py OUT FIGURES
  OUT      the script's output folder: one `normlab frontier` directory per <scheme>.<variant>
  FIGURES  where final_loss_vs_lr.png, attn_logit_max.png and summary.csv go
Prints the Markdown table (docs/reproducing.md quotes it). Needs matplotlib (Debian's python3).

LR sensitivity, three ways (each over the 8 grid lrs, L* the smallest of the clipped values):
  normlab     `normlab frontier`'s lr_sensitivity: training nll (mean of the last tenth of the
              updates), a trial the frontier calls unstable (nll above 1.1 x its initial nll at some
              update, or diverged) counted as its initial nll L0;
  train       Wortsman et al.'s E_lr[min(L(lr), L0) - L*] on the same final training nll, with no
              stability verdict (a run that spiked and recovered keeps its final loss);
  valid       the same on the final validation nll (their L is the final loss of the run).
"""
import csv
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SCHEMES = ["pre-ln", "post-ln", "peri-ln"]
VARIANTS = ["none", "qk", "zloss", "qk-zloss"]
LABEL = {"none": "no QK-norm", "qk": "QK-layernorm", "zloss": "z-loss 1e-4",
         "qk-zloss": "QK-layernorm + z-loss"}
STYLE = {"none": ("tab:red", "-", "o"), "qk": ("tab:blue", "-", "s"),
         "zloss": ("tab:orange", "--", "^"), "qk-zloss": ("tab:green", "--", "v")}


def read_jsonl(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    return rows


def final_valid(run):
    valid = [r for r in read_jsonl(os.path.join(run, "train.jsonl")) if r.get("kind") == "valid"]
    return valid[-1]["nll"] if valid else math.nan


def attn_logit_max(run):
    """{update: max over layers of the attention-logit maximum} from analysis.csv."""
    out = {}
    path = os.path.join(run, "analysis.csv")
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["metric"] == "attn_logit_max" and r["sublayer"] == "self_attn":
                u = int(r["update"])
                out[u] = max(out.get(u, 0.0), float(r["value"]))
    return out


def final_log_z(run):
    """The output_logits probe's mean log Z at the last recorded update."""
    value = math.nan
    path = os.path.join(run, "analysis.csv")
    if os.path.exists(path):
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["metric"] == "output_log_z":
                    value = float(r["value"])
    return value


def sensitivity(losses, initial):
    clipped = [min(l, initial) if math.isfinite(l) else initial for l in losses]
    return sum(clipped) / len(clipped) - min(clipped)


def main():
    out, figures = sys.argv[1], sys.argv[2]
    os.makedirs(figures, exist_ok=True)
    cells = {}
    for scheme in SCHEMES:
        for variant in VARIANTS:
            path = os.path.join(out, f"{scheme}.{variant}", "frontier.json")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                fr = json.load(f)
            cell = fr["cells"][0]
            trials = sorted(cell["trials"], key=lambda t: t["lr"])
            if len(trials) < len(fr["grid"]) or any(
                    t["status"] not in ("completed", "diverged") for t in trials):
                print(f"note: {scheme}.{variant} is unfinished (rerun the script to resume it); "
                      "left out", file=sys.stderr)
                continue
            runs = [os.path.join(out, f"{scheme}.{variant}", t["id"]) for t in trials]
            cells[(scheme, variant)] = {
                "normlab": cell["lr_sensitivity"],
                "initial": trials[0]["initial_loss"],  # the same for every lr of a seed
                "trials": trials,
                "valid": [final_valid(r) for r in runs],
                "logits": [attn_logit_max(r) for r in runs],
                "log_z": [final_log_z(r) for r in runs],
            }
    if not cells:
        sys.exit(f"error: no frontier.json under {out}/<scheme>.<variant>/")
    lrs = [t["lr"] for t in next(iter(cells.values()))["trials"]]
    initial = next(iter(cells.values()))["trials"][0]["initial_loss"]

    # Figure 1: final validation loss vs lr, a panel per scheme (Wortsman et al. Fig. 1).
    present = [s for s in SCHEMES if any((s, v) in cells for v in VARIANTS)]
    fig, axes = plt.subplots(1, len(present), figsize=(4.2 * len(present), 3.4), sharey=True,
                             squeeze=False)
    for ax, scheme in zip(axes[0], present):
        for variant in VARIANTS:
            c = cells.get((scheme, variant))
            if not c:
                continue
            color, ls, marker = STYLE[variant]
            ax.plot([t["lr"] for t in c["trials"]], c["valid"], color=color, ls=ls, marker=marker,
                    ms=4, label=f"{LABEL[variant]} (LR sens. {sensitivity(c['valid'], c['initial']):.2f})")
        ax.axhline(initial, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_title(scheme)
        ax.set_xlabel("peak learning rate")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final validation loss (nats)")
    fig.suptitle("2-layer LLaMA body, d 128, 300 updates (dotted: loss at init)", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(figures, "final_loss_vs_lr.png"), dpi=80)
    plt.close(fig)

    # Figure 2: attention-logit maximum vs update at the two highest lrs (Wortsman et al. Fig. 2),
    # and its final value vs lr.
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, k in zip(axes[:2], (len(lrs) - 2, len(lrs) - 1)):
        for (scheme, variant), c in cells.items():
            curve = c["logits"][k]
            if not curve:
                continue
            color, ls, marker = STYLE[variant]
            lw = {"pre-ln": 1.8, "post-ln": 1.0, "peri-ln": 1.0}[scheme]
            sls = {"pre-ln": ls, "post-ln": "-.", "peri-ln": ":"}[scheme]
            us = sorted(curve)
            ax.plot(us, [curve[u] for u in us], color=color, ls=sls, lw=lw,
                    label=f"{scheme}, {LABEL[variant]}")
        ax.set_yscale("log")
        ax.set_xlabel("update")
        ax.set_title(f"lr {lrs[k]:.3g}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("max |attention logit| (over layers)")
    axes[1].legend(fontsize=6, ncol=2)
    ax = axes[2]
    for (scheme, variant), c in cells.items():
        color, ls, marker = STYLE[variant]
        sls = {"pre-ln": ls, "post-ln": "-.", "peri-ln": ":"}[scheme]
        finals = [max(curve.values()) if curve else math.nan for curve in c["logits"]]
        ax.plot(lrs, finals, color=color, ls=sls, marker=marker, ms=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_title("largest attention logit over the run")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(figures, "attn_logit_max.png"), dpi=80)
    plt.close(fig)

    # Table.
    with open(os.path.join(figures, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scheme", "variant", "lr", "status", "stable", "initial_train_nll",
                    "final_train_nll", "peak_train_nll", "final_valid_nll", "max_attn_logit",
                    "final_output_log_z"])
        for (scheme, variant), c in cells.items():
            for t, v, lg, z in zip(c["trials"], c["valid"], c["logits"], c["log_z"]):
                w.writerow([scheme, variant, t["lr"], t["status"], t["stable"], t["initial_loss"],
                            t["final_loss"], t["peak_loss"], f"{v:.4f}",
                            f"{max(lg.values()):.4g}" if lg else "", f"{z:.3f}"])
    head = " | ".join(f"{lr:.3g}" for lr in lrs)
    inits = [c["initial"] for c in cells.values()]
    print(f"Final validation nll per peak lr (L0, the initial training nll: {min(inits):.3f}–"
          f"{max(inits):.3f}); LR sensitivity (nats) on the "
          "validation nll (Wortsman), the training nll (Wortsman) and normlab frontier's; largest "
          f"attention logit over the run at lr {lrs[-2]:.3g} / {lrs[-1]:.3g}; mean output log Z at the "
          f"end at lr {lrs[-1]:.3g}.\n")
    print(f"| scheme | variant | {head} | sens. valid | sens. train | sens. normlab | "
          f"max logit {lrs[-2]:.3g} | max logit {lrs[-1]:.3g} | log Z {lrs[-1]:.3g} |")
    print("|---|---|" + "---:|" * (len(lrs) + 6))
    for (scheme, variant), c in cells.items():
        losses = " | ".join(f"{v:.3f}" for v in c["valid"])
        train = [t["final_loss"] if t["final_loss"] is not None else math.nan for t in c["trials"]]
        peaks = [f"{max(lg.values()):.3g}" if lg else "–" for lg in c["logits"][-2:]]
        normlab = f"{c['normlab']:.3f}" if c["normlab"] is not None else "–"
        print(f"| {scheme} | {LABEL[variant]} | {losses} | {sensitivity(c['valid'], c['initial']):.3f} | "
              f"{sensitivity(train, c['initial']):.3f} | {normlab} | {peaks[0]} | {peaks[1]} | {c['log_z'][-1]:.2f} |")


if __name__ == "__main__":
    main()
