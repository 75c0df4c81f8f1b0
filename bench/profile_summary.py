#!/usr/bin/env python3
"""Where one profiled update's time went: a summary of the Chrome trace that
`NORMLAB_PROFILE_UPDATE=N normlab train …` writes (LibTorch's Kineto profiler), or any PyTorch
profiler trace (torch.profiler's export_chrome_trace).

    python3 bench/profile_summary.py runs/m/profile-update-20.json [--top 25]

On a GPU trace: the device's busy time against the update's span (a launch-bound step leaves the
GPU idle), the kernels by kind (GEMM, attention, normlab's own, elementwise, reduction, copies),
then the kernels taking the most time. On a CPU trace: the operators taking the most time
(inclusive: an operator's time contains the operators it calls). Only the standard library.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}

# Kernel kinds by name, first match wins (cuBLAS/CUTLASS GEMMs, SDPA's flash and efficient kernels,
# normlab's own kernels, ATen's elementwise and reduction kernels).
KINDS = [
    ("GEMM", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm\d+_.*_tn|splitK", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|efficient_attention", re.I)),
    ("normlab kernels", re.compile(r"normlab|rope_kernel|swiglu_\w*kernel")),
    ("optimizer", re.compile(r"adam|multi_tensor_apply", re.I)),
    ("norms", re.compile(r"layer_norm|rms_norm|RowwiseMoments|norm_kernel", re.I)),
    ("reductions", re.compile(r"reduce|sum_kernel|norm|softmax|logsumexp", re.I)),
    ("copies", re.compile(r"copy|cat|Memcpy|Memset|fill|index|gather|scatter", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise", re.I)),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def union_length(intervals):
    """Total length covered by [start, end) intervals (a device's busy time)."""
    total, end = 0.0, None
    start = None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    if end is not None:
        total += end - start
    return total


def load_events(path):
    try:
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"profile_summary: {path}: not a readable JSON trace ({e})")
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        sys.exit(f"profile_summary: {path}: no traceEvents list (a Chrome trace has one)")
    return [e for e in events
            if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e]


def table(rows, total, top, label, code=True):
    print(f"| {label} | calls | total ms | share |")
    print("|---|---|---|---|")
    for name, (calls, dur) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        share = 100.0 * dur / total if total > 0 else 0.0
        shown = f"`{short}`" if code else short
        print(f"| {shown} | {calls} | {dur / 1e3:.3f} | {share:.1f} % |")


def summarise(events, top):
    if not events:
        print("no complete events in the trace")
        return 1
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    if device:
        device_total = sum(e["dur"] for e in device)
        busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in device])
        print(f"span of the profiled update: {span / 1e3:.3f} ms; GPU busy {busy / 1e3:.3f} ms "
              f"({100.0 * busy / span:.1f} %), kernel time {device_total / 1e3:.3f} ms in "
              f"{len(device)} kernels and copies")
        kinds = defaultdict(lambda: [0, 0.0])
        names = defaultdict(lambda: [0, 0.0])
        for e in device:
            for key, rows in ((kind_of(e["name"]), kinds), (e["name"], names)):
                rows[key][0] += 1
                rows[key][1] += e["dur"]
        print()
        table(kinds, device_total, len(kinds), "kind", code=False)
        print()
        table(names, device_total, top, "kernel")
        return 0
    ops = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") == "cpu_op":
            ops[e["name"]][0] += 1
            ops[e["name"]][1] += e["dur"]
    print(f"span of the profiled update: {span / 1e3:.3f} ms (CPU trace: operators, inclusive)")
    print()
    table(ops, span, top, "operator")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="the JSON trace (profile-update-N.json in the run directory)")
    ap.add_argument("--top", type=int, default=25, help="rows of the per-name table")
    a = ap.parse_args()
    return summarise(load_events(a.trace), a.top)


if __name__ == "__main__":
    sys.exit(main())
