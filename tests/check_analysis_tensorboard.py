#!/usr/bin/env python3
"""Every analysis record of a real run (analysis.csv) must be in the run's TensorBoard events, read
with the real TensorBoard (PyPI `tensorboard`): tag metric/stack[/layer]/sublayer, step, value."""
import csv
import math
import os
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_analysis_tensorboard.py RUN_DIR")
    run = sys.argv[1]
    try:
        import numpy as np
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        sys.exit(f"FAIL: cannot import tensorboard ({e}) with {sys.executable}; run scripts/normlab.sh test")
    acc = EventAccumulator(os.path.join(run, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    events = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags}
    rows = 0
    with open(os.path.join(run, "analysis.csv"), newline="") as f:
        for r in csv.DictReader(f):
            tag = f"{r['metric']}/{r['stack']}"
            if int(r["layer"]) >= 0:
                tag += f"/{r['layer']}"
            if r["sublayer"]:
                tag += f"/{r['sublayer']}"
            if tag not in events:
                sys.exit(f"FAIL: {tag} (update {r['update']}) is not in the TensorBoard events")
            step = int(r["update"])
            if step not in events[tag]:
                sys.exit(f"FAIL: {tag} has no step {step} (steps: {sorted(events[tag])})")
            want = float(np.float32(float(r["value"])))
            got = events[tag][step]
            if not (got == want or (math.isnan(got) and math.isnan(want)) or
                    math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-30)):
                sys.exit(f"FAIL: {tag} step {step}: TensorBoard has {got}, analysis.csv {r['value']}")
            rows += 1
    for t in ("train/loss", "train/nll", "valid/nll"):
        if t not in tags:
            sys.exit(f"FAIL: training curve {t} missing (tags: {sorted(tags)[:10]}…)")
    if rows < 100:
        sys.exit(f"FAIL: only {rows} analysis rows")
    print(f"OK: {rows} analysis records and the training curves read back by TensorBoard "
          f"({len(tags)} tags)")


if __name__ == "__main__":
    main()
