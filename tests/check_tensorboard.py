#!/usr/bin/env python3
"""Reads the events that normlab's TensorBoardWriter wrote (ctest tensorboard_write) with the real
TensorBoard (PyPI `tensorboard`) and checks every scalar: tag, step and value (float32)."""
import math
import os
import sys

# Kept identical to kScalars in tests/test_tensorboard.cpp.
EXPECTED = [
    ("train/loss", 0, 10.5), ("train/loss", 1, 7.25), ("train/loss", 2, 3.1415926535),
    ("train/lr", 0, 1e-7), ("train/lr", 4000, 7e-4), ("eval/bleu", 8589934592, 35.125),
    ("eval/bleu", 8589934593, -0.0625), ("misc/ünïcode tag", 7, 123456.789),
]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_tensorboard.py EVENTS_DIR")
    events_dir = sys.argv[1]
    try:
        import numpy as np
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        sys.exit(f"FAIL: cannot import tensorboard ({e}) with {sys.executable}; install it with "
                 f"'{sys.executable} -m pip install tensorboard' or run scripts/normlab.sh test")
    files = [f for f in os.listdir(events_dir) if f.startswith("events.out.tfevents.")]
    if len(files) != 1:
        sys.exit(f"FAIL: expected one event file in {events_dir}, found {files}")
    acc = EventAccumulator(events_dir, size_guidance={"scalars": 0})
    acc.Reload()
    if getattr(acc, "file_version", 2.0) != 2.0:
        sys.exit(f"FAIL: file_version {acc.file_version}, expected 2 (brain.Event:2)")
    tags = acc.Tags()["scalars"]
    want_tags = sorted({t for t, _, _ in EXPECTED})
    if sorted(tags) != want_tags:
        sys.exit(f"FAIL: scalar tags {sorted(tags)}, expected {want_tags}")
    failures = 0
    for tag in want_tags:
        got = [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        want = [(s, v) for t, s, v in EXPECTED if t == tag]
        if len(got) != len(want):
            print(f"FAIL: {tag}: {len(got)} events, expected {len(want)}: {got}")
            failures += 1
            continue
        for (step, value, wall), (wstep, wvalue) in zip(got, want):
            f32 = float(np.float32(wvalue))
            ok = step == wstep and (value == f32 or math.isclose(value, f32, rel_tol=1e-6))
            ok = ok and wall > 1.6e9
            print(f"{'ok  ' if ok else 'FAIL'} {tag} step {step} value {value!r} (expected {wstep}, {f32!r})")
            failures += not ok
    if failures:
        sys.exit(f"FAIL: {failures} scalar(s) differ")
    print(f"tensorboard read {len(EXPECTED)} scalars from {files[0]}")


if __name__ == "__main__":
    main()
