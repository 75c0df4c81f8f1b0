#!/usr/bin/env python3
"""Issue 60.1: the shipped llama depth study compares each scheme with Pre-LN under that scheme's
own recipe. Every run of experiments/paper/llama-depth.toml (as `normlab sweep --dry-run` expands
it) has a Pre-LN run with the same optim.* overrides and the same seed, so each gap in its table
is the scheme's, not its recipe's.

usage: check_recipe_controls.py NORMLAB REPO WORK_DIR
"""
import os
import re
import subprocess
import sys

normlab, repo, work = sys.argv[1:4]
manifest = os.path.join(repo, "experiments", "paper", "llama-depth.toml")
p = subprocess.run([normlab, "sweep", manifest, "--dry-run", "--set", f'run.out_dir="{work}"'],
                   capture_output=True, text=True)
if p.returncode != 0:
    print("FAIL sweep --dry-run: " + p.stderr.strip()[-300:])
    sys.exit(1)
runs = []
for line in p.stdout.splitlines():
    m = re.match(r"\s*\d+\s+(\S+)\s+\S+\s+scheme=\{name = \"([^\"]+)\"[^}]*\}(.*)", line)
    if m:
        optim = tuple(sorted(re.findall(r"optim\.\w+=\S+", m.group(3))))
        seed = re.search(r"run\.seed=(\d+)", m.group(3)).group(1)
        runs.append((m.group(1), m.group(2), optim, seed))
failures = 0
controls = {(optim, seed) for _, scheme, optim, seed in runs if scheme == "pre-ln"}
for rid, scheme, optim, seed in runs:
    ok = (optim, seed) in controls
    failures += not ok
    print(("ok   " if ok else "FAIL ") + f"{rid} ({scheme}): a Pre-LN run with its recipe {' '.join(optim) or '(baseline)'}, "
          f"seed {seed}")
ok = len(runs) >= 12 and len({s for _, s, _, _ in runs}) >= 6
failures += not ok
print(("ok   " if ok else "FAIL ") + f"{len(runs)} runs, {len({s for _, s, _, _ in runs})} schemes parsed")
print("recipe controls: %s" % ("FAILED" if failures else "OK"))
sys.exit(1 if failures else 0)
