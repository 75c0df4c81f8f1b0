"""Writes a FAKE sweep directory and a fake LM run directory in the trainer's output format, for
developing and testing `normlab plot` / `normlab report` without training. The numbers are
synthetic shapes loosely following the papers' figures; they are test data, not results.

usage: make_fixture.py OUT_DIR   → OUT_DIR/sweep (a sweep over schemes x depths 4, 8,, one run diverged,
                                   one failed, one not started), OUT_DIR/lm_run (a decoder-only run, analysis.jsonl only),
                                   OUT_DIR/paper (a sweep of three runs named "b2t-fig3"), OUT_DIR/edge (a sweep
                                   with eval.test_beam = 0 where nothing diverged: a run with one validation and
                                   one probe update, a ReZero 6L-6L run with per-layer gates) and
                                   OUT_DIR/frontier (a frontier.json of two schemes whose bands overlap)
"""
import csv
import json
import math
import os
import random
import sys

DENSE, LAST, EVERY = 100, 1000, 100  # every update up to DENSE, then every EVERY up to LAST
D_MODEL = 64


def recorded_updates(last):
    ups = list(range(1, min(DENSE, last) + 1))
    ups += list(range(DENSE + EVERY, last + 1, EVERY))
    if ups[-1] != last:
        ups.append(last)
    return ups


def norms_of(stack):
    return ["self_attn_norm", "cross_attn_norm", "ffn_norm"] if stack == "decoder" else [
        "self_attn_norm", "ffn_norm"]


def sublayers_of(stack):
    return ["self_attn", "cross_attn", "ffn"] if stack == "decoder" else ["self_attn", "ffn"]


def write_run(run_dir, scheme, enc, dec, seed, status, last, arch="encdec", bleu=True, state=None,
              full_cosine=True, analysis_format="csv", test_beam=None, probe_updates=None, d_model=D_MODEL):
    rng = random.Random(f"{scheme}-{enc}-{dec}-{seed}")
    os.makedirs(run_dir, exist_ok=True)
    stacks = ["decoder"] if arch == "lm" else ["encoder", "decoder"]
    layers = {"encoder": enc, "decoder": dec}
    depth = dec if arch == "lm" else enc + dec
    post = scheme in ("post-ln",)
    pre = scheme in ("pre-ln",)
    params = {"branchnorm": 'schedule = "linear"\nT = 400\nk = 5.0\nalpha_min = 0.0\n',
              "deepnorm": "torchscale_compat = false\n"}.get(scheme, "")
    with open(os.path.join(run_dir, "manifest.resolved.toml"), "w") as f:
        f.write(f'[model]\narch = "{arch}"\nd_model = {d_model}\nffn_dim = 256\nheads = 4\n'
                f"enc_layers = {enc if arch != 'lm' else 6}\ndec_layers = {dec}\ndropout = 0.1\n\n"
                f'[scheme]\nname = "{scheme}"\n{params}\n'
                f'[data]\ntask = "{"synthetic-lm" if arch == "lm" else "reverse"}"\n\n'
                f"[optim]\nlr = 0.0005\nwarmup_updates = 100\nmax_updates = {LAST}\n\n"
                + ("" if test_beam is None else f"[eval]\ntest_beam = {test_beam}\n\n") +
                f'[run]\nseed = {seed}\nout_dir = "{run_dir}"\n')
    with open(os.path.join(run_dir, "env.json"), "w") as f:
        json.dump({"scheme": {"name": scheme}, "parameters": 123456 * depth, "threads": 2,
                   "torch": "1.13.1"}, f)
    note = {"diverged": f"diverged at update {last}: non-finite gradient in decoder.layers.3.ffn",
            "failed": "std::bad_alloc while building the model"}.get(status, "")
    with open(os.path.join(run_dir, "status.json"), "w") as f:
        json.dump({"status": status, "updates": last, "note": note}, f)
    if status == "failed":
        return  # nothing else written

    # train.jsonl: a log line every 10 updates, validation every 200 and at the end.
    final = {"post-ln": 2.2, "pre-ln": 1.4, "deepnorm": 1.0, "branchnorm": 0.9}.get(scheme, 1.2)
    final += 0.01 * depth * (1 if post else -1)
    with open(os.path.join(run_dir, "train.jsonl"), "w") as f:
        best = math.inf
        for u in range(10, last + 1, 10):
            nll = final + (3.2 - final) * math.exp(-u / 150) + rng.gauss(0, 0.03)
            if status == "diverged":
                nll = 3.2 - 0.4 * u / last + (20 * (u / last) ** 8)
            f.write(json.dumps({"kind": "train", "update": u, "loss": nll + 0.2, "nll": nll,
                                "ppl": math.exp(nll), "gnorm": abs(rng.gauss(1.0, 0.2)) *
                                (5 if post and u < 60 else 1), "lr": 5e-4 * min(1, u / 100),
                                "tokens_per_s": rng.uniform(9000, 11000) / depth * 12,
                                "elapsed_s": u * 0.05 * depth}) + "\n")
            if u % 200 == 0 or u == last:
                if status == "diverged":
                    continue
                vnll = nll + 0.15
                rec = {"kind": "valid", "update": u, "loss": vnll + 0.2, "nll": vnll,
                       "ppl": math.exp(vnll)}
                if bleu:
                    rec["bleu"] = max(0.0, 40 - 12 * vnll)
                rec["best"] = vnll < best
                best = min(best, vnll)
                f.write(json.dumps(rec) + "\n")
        if status == "diverged":
            f.write(json.dumps({"kind": "diverged", "update": last, "loss": None,
                                "module": "decoder.layers.3.ffn"}) + "\n")
        if test_beam and status == "completed":  # the end-of-training test score, as the trainer writes it
            tnll = final + 0.2
            rec = {"kind": "test", "update": last, "nll": tnll, "ppl": math.exp(tnll), "sentences": 100}
            if bleu:
                rec.update(beam=test_beam, bleu=max(0.0, 42 - 12 * tnll), chrf=50.0)
            f.write(json.dumps(rec) + "\n")
        if status == "running":
            f.write('{"kind": "train", "update": 99')  # partly written line of a live run

    rows = []

    def add(u, metric, stack, layer, sub, value):
        rows.append((u, metric, stack, layer, sub, value))

    cos_updates = {1, 100, last}
    for u in probe_updates or recorded_updates(last):
        early = math.exp(-u / 30)
        # ||ΔF||: Post-LN jumps early then stalls; the others grow smoothly (DeepNet Fig. 3a).
        if post:
            dF = 0.05 * depth * (1 - math.exp(-u / 3)) + 0.2 * math.log1p(u)
        else:
            dF = 0.6 * math.log1p(u) * (1 + 0.01 * depth) * (0.5 if scheme == "deepnorm" else 1)
        dF = 0.0 if u == 0 else dF
        add(u, "update_norm", "model", -1, "logits", dF * (1 + rng.gauss(0, 0.02)))
        add(u, "param_update", "model", -1, "total", 1e-3 * (1 + 4 * early) * (3 if post else 1))
        add(u, "grad_norm", "model", -1, "total", (2 if post else 1) * (1 + 3 * early))
        add(u, "grad_norm", "model", -1, "embeddings", 0.3 * (1 + early))
        add(u, "grad_norm", "model", -1, "output", 0.8 * (1 + early))
        if pre:
            add(u, "grad_norm", "model", -1, "final_norm", 0.1)
        for stack in stacks:
            L = layers[stack]
            for i in range(L):
                h = (i + 1) / L  # 1 at the top layer
                if post:  # vanishing toward the bottom (B2T Fig. 3b)
                    g = 0.5 * (0.2 ** ((1 - h) * L / 6)) * (1 + 2 * early)
                elif pre:  # larger at the bottom
                    g = 0.3 * (1.5 - h) * (1 + early)
                else:
                    g = 0.3 * (1 + 0.2 * (1 - h)) * (1 + early)
                g *= 1 + rng.gauss(0, 0.05)
                add(u, "grad_norm", stack, i, "all", g)
                for s in sublayers_of(stack):
                    add(u, "grad_norm", stack, i, s, g * rng.uniform(0.3, 0.7))
                for n in norms_of(stack):
                    add(u, "grad_norm", stack, i, n, g * 0.05)
                add(u, "act_grad_norm", stack, i, "output", g * 2)
                for k, n in enumerate(norms_of(stack)):  # shrinks through each LN (B2T Fig. 4)
                    add(u, "act_grad_norm", stack, i, n + ".out", g * 2 * (1 + 0.3 * k))
                    add(u, "act_grad_norm", stack, i, n + ".in",
                        g * 2 * (1 + 0.3 * k) * (0.3 if not pre else 0.9))
                add(u, "update_norm", stack, i, "output", dF * h * rng.uniform(0.8, 1.2))
                add(u, "param_update", stack, i, "all", 1e-3 * (1 + early))
                z = 0.55 + 0.3 * h * (1 - math.exp(-u / 200)) + (0.05 if scheme == "branchnorm" else 0)
                add(u, "ffn_zero_fraction", stack, i, "ffn", min(z, 0.99))
                add(u, "ffn_nonzero_fraction", stack, i, "ffn", 1 - min(z, 0.99))
                for n in norms_of(stack):
                    base = math.sqrt(D_MODEL)
                    if post:
                        x = base * (1 + 3 * (1 - math.exp(-u / 10))) * (1 + 0.05 * i)
                    elif scheme in ("deepnorm", "branchnorm"):
                        x = base * 1.3
                    else:
                        x = base * (1 + 0.3 * i)
                    add(u, "ln_input_norm", stack, i, n, x * rng.uniform(0.95, 1.05))
                if u in cos_updates:
                    for j in range(L):
                        if not full_cosine and j < i:
                            continue
                        decay = 0.15 if not pre else 0.03
                        c = 1.0 if i == j else math.exp(-decay * abs(i - j)) * (0.9 if post else 1.0)
                        add(u, "layer_cosine", stack, i, f"layer:{j}", c)
        if state == "alpha_t":
            add(u, "scheme_state", "model", -1, "alpha_t", min(1.0, u / 400))
        elif state == "gates":  # ReZero: a gate per sublayer and layer, larger in the decoder
            for stack in stacks:
                for i in range(layers[stack]):
                    for s in sublayers_of(stack):
                        add(u, "scheme_state", stack, i, s + "_gate",
                            (0.3 if stack == "decoder" else 0.1) * (1 + 0.1 * i) * (1 - math.exp(-u / 200)))
        elif state == "omega":
            for stack in stacks:
                for i in range(layers[stack]):
                    add(u, "scheme_state", stack, i, "omega_init.mean",
                        math.sqrt(1 + 2 * i) * (1 + 0.001 * u / 100))

    fields = ["update", "metric", "stack", "layer", "sublayer", "value"]
    if analysis_format == "csv":
        with open(os.path.join(run_dir, "analysis.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(fields)
            for r in rows:
                w.writerow([r[0], r[1], r[2], r[3], r[4], f"{r[5]:.6g}"])
    else:  # the same rows as JSON lines (the reader's fallback when there is no CSV)
        with open(os.path.join(run_dir, "analysis.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(dict(zip(fields, r))) + "\n")


def main(out):
    sweep = os.path.join(out, "sweep")
    os.makedirs(sweep, exist_ok=True)
    manifest = os.path.join(sweep, "sweep.toml")
    with open(manifest, "w") as f:
        f.write('# FAKE fixture sweep (tests/plots/make_fixture.py)\nname = "fixture-depth"\n'
                'base = "quickstart.toml"\n\n[grid]\nscheme = ["post-ln", "pre-ln", "deepnorm", '
                '"branchnorm", "admin"]\n"model.enc_layers" = [4, 8]\n')
    plan = [  # scheme, layers, status, last update, scheme state (completed runs: a test score, beam 5)
        ("post-ln", 4, "completed", LAST, None),
        ("post-ln", 8, "diverged", 137, None),
        ("pre-ln", 4, "completed", LAST, None),
        ("deepnorm", 4, "completed", LAST, None),
        ("deepnorm", 8, "completed", LAST, None),
        ("branchnorm", 8, "running", 600, "alpha_t"),
        ("admin", 4, "failed", 0, None),
        ("admin", 8, None, 0, None),  # not started: no directory
    ]
    runs = []
    for index, (scheme, L, status, last, state) in enumerate(plan):
        rid = f"{scheme}_L{L}-{L}"
        runs.append({"index": index, "id": rid, "dir": rid,
                     "values": {"scheme": scheme, "model.enc_layers": str(L),
                                "model.dec_layers": str(L)}})
        if status is None:
            continue
        write_run(os.path.join(sweep, rid), scheme, L, L, 1, status, last, state=state,
                  full_cosine=index % 2 == 0, test_beam=5)
    with open(os.path.join(sweep, "sweep.json"), "w") as f:
        json.dump({"manifest": manifest, "name": "fixture-depth", "runs": runs}, f, indent=1)
    write_run(os.path.join(out, "lm_run"), "admin", 0, 4, 3, "completed", 300, arch="lm",
              bleu=False, state="omega", analysis_format="jsonl")
    # A sweep named after a paper figure: the report's paper view.
    paper = os.path.join(out, "paper")
    runs = []
    for index, scheme in enumerate(("post-ln", "pre-ln", "b2t")):
        write_run(os.path.join(paper, scheme), scheme, 8, 8, 1, "completed", 120, bleu=False)
        runs.append({"index": index, "id": scheme, "dir": scheme, "values": {"scheme": scheme}})
    with open(os.path.join(paper, "sweep.json"), "w") as f:
        json.dump({"manifest": os.path.join(paper, "b2t-fig3.toml"), "name": "b2t-fig3",
                   "runs": runs}, f, indent=1)
    # Translation runs without a test score (eval.test_beam = 0) where nothing diverged: one with a
    # single validation (update 60) and probes at one update, and a ReZero 6L-6L run whose gates make
    # 12 encoder+decoder lines in the self_attn and ffn panels of scheme_state.
    edge = os.path.join(out, "edge")
    runs = []
    for index, (rid, scheme, L, last, kw) in enumerate((
            ("pre-ln_L2-2", "pre-ln", 2, 60, {"probe_updates": [60]}),
            ("rezero_L6-6", "rezero", 6, LAST, {"state": "gates"}))):
        write_run(os.path.join(edge, rid), scheme, L, L, 1, "completed", last, test_beam=0, **kw)
        runs.append({"index": index, "id": rid, "dir": rid, "values": {"scheme": scheme}})
    with open(os.path.join(edge, "sweep.json"), "w") as f:
        json.dump({"manifest": os.path.join(edge, "edge.toml"), "name": "fixture-edge", "runs": runs}, f, indent=1)
    # Two seeds per scheme and depth (the depth sweep of docs/sweeps.md): the figures against depth
    # average the seeds, never join them into one zig-zag line (hostile review, session 18).
    seeds = os.path.join(out, "seeds")
    runs = []
    for scheme in ("post-ln", "deepnorm"):
        for L in (2, 4):
            for seed in (1, 2):
                rid = f"{scheme}_L{L}-{L}_seed{seed}"
                write_run(os.path.join(seeds, rid), scheme, L, L, seed, "completed", 400, bleu=False)
                # Post-LN from a scheme table with a label: sweep.json's "scheme" is the label.
                named = {"scheme": "PostLN-paper", "scheme.name": scheme} if scheme == "post-ln" else {"scheme": scheme}
                runs.append({"index": len(runs), "id": rid, "dir": rid,
                             "values": dict(named, **{"model.enc_layers": L, "model.dec_layers": L,
                                                      "run.seed": seed})})
    for L in (2, 4):  # a wider DeepNorm from a `key = "model"` table axis: a line of its own
        rid = f"deepnorm_wide_L{L}-{L}"
        write_run(os.path.join(seeds, rid), "deepnorm", L, L, 1, "completed", 400, bleu=False, d_model=128)
        runs.append({"index": len(runs), "id": rid, "dir": rid,
                     "values": {"scheme": "deepnorm", "model": {"enc_layers": L, "dec_layers": L, "d_model": 128}}})
    with open(os.path.join(seeds, "sweep.json"), "w") as f:
        json.dump({"manifest": os.path.join(seeds, "seeds.toml"), "name": "fixture-seeds", "runs": runs}, f, indent=1)
    # Encoder-decoders of 1-1, 2-2 and 3-1 layers: the figures against depth put all at N+M.
    mixed = os.path.join(out, "mixed")
    runs = []
    for enc, dec in ((1, 1), (2, 2), (3, 1)):
        rid = f"deepnorm_L{enc}-{dec}"
        write_run(os.path.join(mixed, rid), "deepnorm", enc, dec, 1, "completed", 400, bleu=False)
        runs.append({"index": len(runs), "id": rid, "dir": rid,
                     "values": {"scheme": "deepnorm", "model.enc_layers": enc, "model.dec_layers": dec}})
    with open(os.path.join(mixed, "sweep.json"), "w") as f:
        json.dump({"manifest": os.path.join(mixed, "mixed.toml"), "name": "fixture-mixed", "runs": runs}, f, indent=1)
    # A frontier directory (`normlab frontier`'s frontier.json) whose two schemes' bands overlap.
    cells = []
    for scheme, bands in (("post-ln", ((2, 0.01, 0.1), (6, 0.003, 0.03), (18, 0.001, 0.01))),
                          ("pre-ln", ((2, 0.02, 0.2), (6, 0.01, 0.1), (18, 0.003, 0.03)))):
        for depth, lo, hi in bands:
            cells.append({"scheme": scheme, "depth": depth, "verdict": "frontier", "max_stable_lr": lo,
                          "min_unstable_lr": hi, "lr_sensitivity": 0.5, "best_loss": 2.0, "trials": []})
    os.makedirs(os.path.join(out, "frontier"), exist_ok=True)
    with open(os.path.join(out, "frontier", "frontier.json"), "w") as f:
        json.dump({"arch": "lm", "lr_min": 0.001, "lr_max": 0.3, "updates": 50, "seeds": [1, 2],
                   "grid": [0.001, 0.003, 0.01, 0.03, 0.1, 0.3], "definition": "FAKE fixture frontier",
                   "cells": cells}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
