#!/usr/bin/env python3
"""`normlab train` on a quiet and on a busy machine, in one call (issue 59.13).

The quickstart (experiments/quickstart.toml, --updates updates) is timed with four settings:
normlab's default (it chooses the OpenMP wait policy from the load at its start), libgomp's default
(spinning idle threads: NORMLAB_OMP_AUTO=0), OMP_WAIT_POLICY=PASSIVE, and run.threads = 1; first on
the machine as it is (run it quiet: nothing else running), then with --busy processes spinning
beside it. Each setting runs --repeats times quiet (the settings taking turns; the fastest counts)
and once busy; a run past
--timeout seconds is stopped and counted as that. Prints a table for docs/speed.md and the two
targets: quiet, the default within 3 % of the fastest setting; busy, within 1.5x of the best.

usage: busy_machine.py [--normlab build/bin/normlab] [--updates 150] [--busy 4] [--repeats 5]
"""
import argparse
import multiprocessing
import os
import re
import shutil
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("--normlab", default="build/bin/normlab")
ap.add_argument("--manifest", default="experiments/quickstart.toml")
ap.add_argument("--work", default="/tmp/normlab-busy-machine")
ap.add_argument("--updates", type=int, default=150)
ap.add_argument("--busy", type=int, default=4)
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--timeout", type=float, default=180)
args = ap.parse_args()
shutil.rmtree(args.work, ignore_errors=True)
os.makedirs(args.work)

SETTINGS = [  # name, environment, extra --set
    ("normlab's default", {}, []),
    ("libgomp's default (spin)", {"NORMLAB_OMP_AUTO": "0"}, []),
    ("OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}, []),
    ("run.threads = 1", {"NORMLAB_OMP_AUTO": "0"}, ["run.threads=1"]),
]


def train(name, env_extra, sets, k):
    out = os.path.join(args.work, f"run{k}")
    shutil.rmtree(out, ignore_errors=True)
    env = {key: v for key, v in os.environ.items() if key not in ("OMP_WAIT_POLICY", "NORMLAB_OMP_AUTO")}
    env.update(env_extra)
    cmd = [args.normlab, "train", args.manifest, "--set", f"optim.max_updates={args.updates}",
           "--set", f"run.out_dir=\"{out}\"", "--set", "run.checkpoint_interval=1000000"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return args.timeout, "stopped", True
    if p.returncode != 0:
        raise SystemExit(f"{name}: exit {p.returncode}\n{p.stderr[-2000:]}")
    choice = re.search(r"OpenMP wait policy: ([^:]+)", p.stdout + p.stderr)
    return time.monotonic() - t0, choice.group(1).strip() if choice else "-", False


def spin():
    while True:
        pass


def measure(case, repeats):
    """The fastest of `repeats` runs per setting, the settings taking turns (round by round), so
    that a slow spell of a shared machine falls on all of them alike."""
    runs = [[] for _ in SETTINGS]
    for _ in range(repeats):
        for i, (name, env, sets) in enumerate(SETTINGS):
            runs[i].append(train(name, env, sets, i))
    rows = []
    for (name, _, _), r in zip(SETTINGS, runs):
        secs, choice, stopped = min(r, key=lambda x: x[0])
        rows.append((name, secs, choice, stopped))
        print(f"  {case}: {name}: {'>' if stopped else ''}{secs:.2f} s of {', '.join(f'{x[0]:.2f}' for x in r)} ({choice})",
              flush=True)
    return rows


print(f"`normlab train {args.manifest}`, {args.updates} updates, {os.cpu_count()} cores, "
      f"load at the start {os.getloadavg()[0]:.2f}", flush=True)
quiet = measure("quiet", args.repeats)
spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
for s in spinners:
    s.start()
time.sleep(3)
try:
    busy = measure(f"{args.busy} busy processes", 1)
finally:
    for s in spinners:
        s.terminate()

print()
print(f"| setting | quiet (fastest of {args.repeats}) | beside {args.busy} busy processes |")
print("|---|---|---|")
for (name, qs, qc, qstop), (_, bs, bc, bstop) in zip(quiet, busy):
    q = f"{'>' if qstop else ''}{qs:.2f} s" + (f" (chose {qc})" if name == "normlab's default" else "")
    b = f"{'>' if bstop else ''}{bs:.1f} s" + (f" (chose {bc})" if name == "normlab's default" else "")
    print(f"| {name} | {q} | {b} |")
qbest = min(r[1] for r in quiet)
bbest = min(r[1] for r in busy)
print()
print(f"quiet: normlab's default {quiet[0][1]:.1f} s = {quiet[0][1] / qbest:.3f}x the fastest setting (target: within 1.03x)")
print(f"busy: normlab's default {busy[0][1]:.1f} s = {busy[0][1] / bbest:.2f}x the best setting (target: within 1.5x)")
