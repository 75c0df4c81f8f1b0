"""`normlab frontier` end to end on a tiny LM of the built-in task (a few updates per trial, one
core): the frontier lies between a stable and an unstable trial, a rerun launches no trial
(resume), the figures are drawn, frontier.json reads back through the Python side and agrees
with frontier.csv, and bad input is one error line with exit code 2.

usage: check_frontier.py NORMLAB WORK_DIR ANALYSIS_PYTHON_DIR
"""
import csv
import json
import os
import shutil
import subprocess
import sys
import time

normlab, work, pydir = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, pydir)
import normlab_frontier  # noqa: E402  (standard library only for reading)

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
manifest = os.path.join(work, "tiny-lm.toml")
with open(manifest, "w") as f:
    f.write("""
[model]
arch = "lm"
d_model = 16
ffn_dim = 32
heads = 2
dec_layers = 2
dropout = 0.0
[scheme]
name = "post-ln"
[data]
task = "synthetic-lm"
synthetic_vocab = 16
lm_block = 16
synthetic_train = 400
synthetic_valid = 8
[optim]
warmup_updates = 2
lr_schedule = "constant"
label_smoothing = 0.0
max_tokens = 128
[eval]
interval = 0
test_beam = 0
[run]
threads = 1
checkpoint_interval = 100000
checkpoint_keep_last = 0
checkpoint_save_best = "none"
""")
out = os.path.join(work, "frontier")
# 0.01 trains the tiny model; 10 (Adam) wrecks it: the top of the grid diverges.
cmd = [normlab, "frontier", manifest, "--schemes", "post-ln", "--depths", "2", "--lr", "1e-2:10",
       "--seeds", "1,2", "--updates", "12", "--bisect", "1", "--out", out]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, expect_rc=0):
    t = time.time()
    p = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    print(f"$ {' '.join(args[1:3])} … ({time.time() - t:.1f} s, exit {p.returncode})")
    if p.returncode != expect_rc:
        print(p.stdout[-3000:], p.stderr[-3000:])
        sys.exit(f"FAIL: exit code {p.returncode}, expected {expect_rc}")
    return p


p = run(cmd)
print(p.stdout[-1500:])
data = normlab_frontier.load_frontier(out)
check(len(data["cells"]) == 1, "one cell (post-ln, depth 2)")
cell = data["cells"][0]
check(cell["verdict"] == "frontier", f"verdict frontier, got {cell['verdict']}")
lo, hi = cell["max_stable_lr"], cell["min_unstable_lr"]
check(lo is not None and hi is not None and lo < hi, f"max stable {lo} < min unstable {hi}")
trials = cell["trials"]
check(len(trials) == 2 * (7 + 1), f"7 grid lrs + 1 bisection midpoint, 2 seeds: {len(trials)} trials")
at = lambda lr: [t for t in trials if abs(t["lr"] - lr) <= 1e-12 * lr]  # noqa: E731
check(len(at(lo)) == 2 and all(t["stable"] for t in at(lo)), f"every seed stable at max_stable_lr {lo}")
check(len(at(hi)) == 2 and any(not t["stable"] for t in at(hi)), f"a seed unstable at min_unstable_lr {hi}")
check(not any(t["stable"] for t in at(10.0)), "lr 10 unstable for every seed (the top of the range diverges)")
for t in trials:
    d = os.path.join(out, t["id"])
    st = json.load(open(os.path.join(d, "status.json")))
    check(st["status"] == t["status"] and st["status"] in ("completed", "diverged"), f"{t['id']}: status.json agrees")
    check(os.path.exists(os.path.join(d, "manifest.resolved.toml")), f"{t['id']}: a normal run directory")
    if t["stable"]:
        check(t["final_loss"] < t["initial_loss"], f"{t['id']}: stable means the loss fell")
    # peak_loss: the highest logged train nll after update 1, a diverged trial's too (was null).
    after1 = [r["nll"] for r in map(json.loads, open(os.path.join(d, "train.jsonl")))
              if r.get("kind") == "train" and r.get("update", 0) > 1 and isinstance(r.get("nll"), (int, float))]
    check(t["peak_loss"] == (max(after1) if after1 else None),
          f"{t['id']} ({t['status']}): peak_loss {t['peak_loss']} is the highest train nll after update 1")
check(cell["lr_sensitivity"] is not None and cell["lr_sensitivity"] > 0, "LR sensitivity > 0 (the grid has bad lrs)")
with open(os.path.join(out, "frontier.csv")) as f:
    rows = list(csv.DictReader(f))
check(len(rows) == 1 and rows[0]["verdict"] == "frontier" and float(rows[0]["max_stable_lr"]) == float(f"{lo:.6g}")
      and int(rows[0]["trials"]) == len(trials) and rows[0]["seeds"] == "2", f"frontier.csv agrees: {rows}")
check("post-ln" in p.stdout and "frontier" in p.stdout, "the table is printed")

# Resume: a rerun reuses every finished trial and starts none.
logs = {t["id"]: open(os.path.join(out, t["id"], "worker.log")).read() for t in trials}
p2 = run(cmd)
check("[sweep] start" not in p2.stdout, "a rerun starts no trial")
check(all(open(os.path.join(out, i, "worker.log")).read() == text for i, text in logs.items()),
      "a rerun leaves every trial's worker.log as it was")
check(normlab_frontier.load_frontier(out)["cells"][0]["max_stable_lr"] == lo, "the rerun finds the same frontier")
p3 = run(cmd + ["--dry-run"])
check("nothing to run" in p3.stdout, "--dry-run on a finished frontier says nothing is left to run")

# One more seed: only that seed's trials run; the others are reused.
p4 = run(cmd[:cmd.index("--seeds") + 1] + ["1,2,3"] + cmd[cmd.index("--seeds") + 2:] + ["--dry-run"])
listed = [line for line in p4.stdout.splitlines() if line.startswith("  ")]
check(listed and all(line.strip().endswith("_seed3") for line in listed), f"--seeds 1,2,3 plans only seed 3: {listed}")

# Figures: `normlab plot` and `normlab report` on the frontier directory.
figs = os.path.join(work, "figs")
run([normlab, "plot", out, "--out", figs, "--format", "png"])
for name in ("frontier.png", "lr_sensitivity.png"):
    check(os.path.getsize(os.path.join(figs, name)) > 5000, f"plot wrote {name}")
run([normlab, "report", out])
html = open(os.path.join(out, "report", "report.html")).read()
check("Stability frontier" in html and html.count("data:image/png;base64,") == 2, "the report shows both figures")

# Bad input: one error line, exit code 2.
base = [normlab, "frontier", manifest, "--out", os.path.join(work, "bad")]
for args, expect in [
        (["--schemes", "post_ln", "--depths", "2"], "unknown scheme 'post_ln'"),
        (["--schemes", "post-ln", "--depths", "0"], "--depths: expected layer counts of at least 1, got 0"),
        (["--schemes", "post-ln", "--depths", "2", "--lr", "0.3:0.001"], "expected MIN < MAX"),
        (["--schemes", "post-ln", "--depths", "2", "--lr", "1e-3"], "expected MIN:MAX"),
        (["--schemes", "post-ln", "--depths", "2", "--updates", "2"], "warmup_updates = 2 but --updates 2"),
        (["--schemes", "post-ln", "--depths", "2", "--set", "optim.lr=0.1"], "the frontier sets optim.lr")]:
    p = run(base + args, expect_rc=2)
    lines = p.stderr.strip().splitlines()
    check(len(lines) == 1 and lines[0].startswith("normlab: error:") and expect in lines[0],
          f"{args}: one error line with '{expect}', got {p.stderr!r}")
check(not os.path.exists(os.path.join(work, "bad")), "bad input creates nothing")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("frontier end to end: OK")
