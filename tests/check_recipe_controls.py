#!/usr/bin/env python3
"""Issue 60.1: the shipped llama depth study compares each scheme with Pre-LN under that scheme's
own recipe, and the report pairs them. Every run of experiments/paper/llama-depth.toml (as `normlab sweep --dry-run` expands
it) has a Pre-LN run with the same optim.* overrides and the same seed, so each gap in its table
is the scheme's, not its recipe's.

usage: check_recipe_controls.py NORMLAB REPO WORK_DIR [PLUGIN_DIR]
"""
import os
import re
import shutil
import subprocess
import sys

normlab, repo, work = sys.argv[1:4]
shutil.rmtree(os.path.join(work, "runs"), ignore_errors=True)
os.makedirs(work, exist_ok=True)
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
# The report pairs each scheme with its control: tiny runs, LayerNorm-Scaling and Pre-LN at lr 3e-3,
# Pre-LN at lr 1e-2; only the first Pre-LN is LayerNorm-Scaling's control. Issue 66.19: nor is a
# Pre-LN of that recipe in bf16 (LayerNorm-Scaling trained in fp32), or on 2 data-parallel ranks
# (twice the update's batch); given before the control, each was taken for it.
plugins = sys.argv[4] if len(sys.argv) > 4 else None
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_checks  # noqa: E402

tiny = cli_checks.write_tiny_llama_manifest(os.path.join(work, "tiny.toml"), work,
                                            "lr = 3e-3\nmax_updates = 6\n[eval]\ninterval = 3\n[run]\nthreads = 1\n")
dirs = {}
for name, more in (("lns", ["--set", 'scheme.name="ln-scaling"']), ("control", []),
                   ("other", ["--set", "optim.lr=1e-2"]), ("control_bf16", ["--set", 'run.dtype="bf16"']),
                   ("control_2ranks", ["--nproc", "2"])):
    d = os.path.join(work, "runs", name)
    args = [normlab, "train", tiny, "--set", f'run.out_dir="{d}"'] + more
    if plugins:
        args += ["--plugin-path", plugins]
    p = subprocess.run(args, capture_output=True, text=True)
    ok = p.returncode == 0
    failures += not ok
    print(("ok   " if ok else "FAIL ") + f"tiny run {name} ({p.stderr.strip()[-200:]})")
    dirs[name] = d


def control_rows(names):
    """The rows of the report's control table for these runs, given in this order (a string when
    the report failed)."""
    out = os.path.join(work, "report")
    p = subprocess.run([normlab, "report", *(dirs[n] for n in names), "--out", out], capture_output=True, text=True)
    if p.returncode != 0:
        return "report failed: " + p.stderr.strip()[-300:]
    md = open(os.path.join(out, "report.md"), encoding="utf-8").read()
    section = md.split("## Each scheme against its control", 1)[1].split("\n## ", 1)[0] if \
        "## Each scheme against its control" in md else ""
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line
            and "| run |" not in line]


for names, why in ((["lns", "control", "other"], "not another"),
                   (["lns", "control_bf16", "control", "other"], "not its bf16 twin"),
                   (["lns", "control_2ranks", "control"], "not its 2-rank twin")):
    rows = control_rows(names)
    ok = len(rows) == 1 and rows[0].startswith("| ln-scaling 2L | pre-ln 2L (control) |")
    failures += not ok
    print(("ok   " if ok else "FAIL ") + f"report pairs LayerNorm-Scaling with Pre-LN under its recipe, {why} ({rows})")
rows = control_rows(["lns", "control_bf16", "control_2ranks"])
ok = rows == []
failures += not ok
print(("ok   " if ok else "FAIL ") + f"no control among a bf16 and a 2-rank Pre-LN ({rows})")
print("recipe controls: %s" % ("FAILED" if failures else "OK"))
sys.exit(1 if failures else 0)
