"""Checkpoints are data, never code (issue 27 items 1-3, 8), through the CLI.

usage: check_checkpoint_trust.py NORMLAB_EXE PLUGIN_DIR WORK_DIR

A TorchScript archive whose __setstate__ creates a file (checked to be armed: torch.jit.load runs
it) is put where normlab reads checkpoints -- best/last/step files listed in SHA256SUMS with their
true hash, --resume-from, Admin's scheme_setup file, an old-style last.pt -- and every command
(eval, translate, forward, export, train resume, checkpoint convert without --trust-code) must
exit 2 with one line naming the file, create nothing, and not hang (a looping __setstate__ too).
Also: SHA256SUMS is checked by eval/export/translate/forward/resume (damaged, unlisted, missing),
with --allow-unverified as the override; a checkpoint of another model is refused naming the
difference; the real `safetensors` library (PyPI, in the venv when present) reads a checkpoint.
Needs torch in the Python running it (Debian's python3-torch) to craft the archive.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from typing import Tuple

try:
    import torch
except ImportError:
    print(f"SKIP: {sys.executable} has no torch to craft a TorchScript archive (Debian: python3-torch)")
    sys.exit(77)

exe, plugin_dir, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
marker = os.path.join(work, "PWNED")
failures = []


def fail(msg):
    print("FAIL: " + msg)
    failures.append(msg)


def normlab(*args, stdin=None, timeout=120):
    p = subprocess.run([exe, "--plugin-path", plugin_dir, *args], input=stdin, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def manifest(name, ffn, scheme="admin"):
    path = os.path.join(work, name + ".toml")
    with open(path, "w") as f:
        f.write(f"""[model]
d_model = 16
ffn_dim = {ffn}
heads = 2
enc_layers = 1
dec_layers = 1
dropout = 0.0
[scheme]
name = "{scheme}"
[data]
task = "reverse"
synthetic_vocab = 10
synthetic_min_len = 3
synthetic_max_len = 6
synthetic_train = 300
synthetic_valid = 20
cache_dir = "{work}/cache"
[optim]
max_tokens = 128
max_updates = 20
[eval]
interval = 10
bleu = false
test_beam = 0
[run]
out_dir = "{work}/{name}"
checkpoint_interval = 10
threads = 1
""")
    return path


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def list_in_sums(path):
    """As an attacker who ships the whole run folder would: SHA256SUMS vouches for the file."""
    sums = os.path.join(os.path.dirname(path), "SHA256SUMS")
    lines = []
    if os.path.exists(sums):
        lines = [l for l in open(sums).read().splitlines() if not l.endswith("  " + os.path.basename(path))]
    lines.append(f"{sha256(path)}  {os.path.basename(path)}")
    with open(sums, "w") as f:
        f.write("\n".join(lines) + "\n")


def expect_refused(label, code, err, must_contain):
    # eval & co. print the data summary on stderr before loading; the error is the last line, alone.
    lines = [l for l in err.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("normlab: error: ")]
    if code != 2:
        fail(f"{label}: exit {code}, expected 2; stderr: {err[-600:]}")
    if len(errors) != 1 or lines[-1] != errors[0] or any(s in err for s in ("Traceback", "terminate", "frame #")):
        fail(f"{label}: expected one 'normlab: error:' line at the end, no trace: {err[-600:]}")
    for s in must_contain:
        if s not in err:
            fail(f"{label}: stderr lacks {s!r}: {err[-600:]}")
    if os.path.exists(marker):
        fail(f"{label}: the archive's code ran (created {marker})")
        os.remove(marker)


# Two small runs: Admin (so scheme_setup exists), and one with another FFN width.
m = manifest("run", 32)
code, out, err = normlab("train", m)
if code != 0:
    print(f"FAIL: training the fixture run: exit {code}\n{out}\n{err}")
    sys.exit(1)
run = os.path.join(work, "run")
ckpts = os.path.join(run, "checkpoints")
for f in ("last.safetensors", "best.safetensors", "step_20.safetensors"):
    if not os.path.exists(os.path.join(ckpts, f)):
        fail(f"training wrote no checkpoints/{f}")
if not os.path.exists(os.path.join(run, "scheme_setup.safetensors")):
    fail("Admin's run wrote no scheme_setup.safetensors")
m_other = manifest("other", 64)
if normlab("train", m_other)[0] != 0:
    fail("training the second fixture run")


# The crafted archives: __setstate__ runs while torch's archive loader reads the file.
class Writes(torch.nn.Module):
    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.n = 0

    @torch.jit.export
    def __getstate__(self):
        return (self.path, self.n, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, int, bool]):
        t = torch.from_file(state[0], shared=True, size=8)
        t.fill_(7.0)
        self.n = int(t.sum().item())  # used, so TorchScript cannot drop the write
        self.path = state[0]
        self.training = state[2]


class Loops(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n = 1

    @torch.jit.export
    def __getstate__(self):
        return (self.n, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[int, bool]):
        i = state[0]
        while i > 0:
            i += 1
        self.n = i
        self.training = state[1]


evil = os.path.join(work, "evil.pt")
torch.jit.script(Writes(marker)).save(evil)
looping = os.path.join(work, "loops.pt")
torch.jit.script(Loops()).save(looping)
torch.jit.load(evil)  # armed: torch's own loader runs the code
if not os.path.exists(marker):
    print("FAIL: the crafted archive did not create its file under torch.jit.load: the test proves nothing")
    sys.exit(1)
os.remove(marker)


def fresh_copy(name):
    dst = os.path.join(work, name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(run, dst)
    return dst


def plant(run_dir, rel, archive=evil):
    path = os.path.join(run_dir, rel)
    shutil.copyfile(archive, path)
    list_in_sums(path)
    return path


src_file = os.path.join(work, "src.txt")
with open(src_file, "w") as f:
    f.write("3 4 5\t5 4\n")

# 1. Every command that reads a checkpoint.
r = fresh_copy("evil_best")
p = plant(r, "checkpoints/best.safetensors")
for label, args, stdin in [("eval", ["eval", r], None), ("translate", ["translate", r], "3 4 5\n"),
                           ("forward", ["forward", r, "--input", src_file], None),
                           ("export", ["export", r, "--to", os.path.join(work, "exp_evil")], None),
                           ("eval --checkpoint FILE", ["eval", r, "--checkpoint", p], None)]:
    code, out, err = normlab(*args, stdin=stdin, timeout=60)
    expect_refused(label, code, err, [p, "TorchScript", "checkpoint convert"])

r = fresh_copy("evil_loop")
p = plant(r, "checkpoints/best.safetensors", looping)
try:
    code, out, err = normlab("eval", r, timeout=60)
    expect_refused("eval (looping __setstate__)", code, err, [p])
except subprocess.TimeoutExpired:
    fail("eval of a looping archive hung")

r = fresh_copy("evil_last")
p = plant(r, "checkpoints/last.safetensors")
code, out, err = normlab("train", m, "--set", f'run.out_dir="{r}"', "--set", "optim.max_updates=30")
expect_refused("train (plain resume)", code, err, [p, "TorchScript"])
st = json.load(open(os.path.join(r, "status.json")))
if st.get("status") != "failed":
    fail(f"train (plain resume): status.json says {st.get('status')!r}, expected failed")

r = fresh_copy("evil_resume_from")
elsewhere = os.path.join(work, "elsewhere")
os.makedirs(elsewhere, exist_ok=True)
p = plant(elsewhere, "ckpt.safetensors")
code, out, err = normlab("train", m, "--set", f'run.out_dir="{r}"', "--set", "optim.max_updates=30",
                         "--resume-from", p)
expect_refused("train --resume-from", code, err, [p, "TorchScript"])

r = fresh_copy("evil_setup")
p = plant(r, "scheme_setup.safetensors")
code, out, err = normlab("train", m, "--set", f'run.out_dir="{r}"', "--set", "optim.max_updates=30")
expect_refused("train (Admin's scheme_setup)", code, err, [p, "TorchScript"])

# An old run: its checkpoints are *.pt archives only.
r = fresh_copy("old_run")
for f in os.listdir(os.path.join(r, "checkpoints")):
    os.remove(os.path.join(r, "checkpoints", f))
p = plant(r, "checkpoints/last.pt")
code, out, err = normlab("train", m, "--set", f'run.out_dir="{r}"', "--set", "optim.max_updates=30")
expect_refused("train (old run)", code, err, ["old TorchScript format", "normlab checkpoint convert"])
code, out, err = normlab("eval", r)
expect_refused("eval (old run)", code, err, ["old TorchScript format", "normlab checkpoint convert"])
code, out, err = normlab("export", r, "--to", os.path.join(work, "exp_old"))
expect_refused("export (old run)", code, err, ["old TorchScript format"])
code, out, err = normlab("checkpoint", "convert", r)
expect_refused("checkpoint convert without --trust-code", code, err, ["--trust-code"])

# 2. SHA256SUMS wherever a checkpoint is used.
r = fresh_copy("damaged")
best = os.path.join(r, "checkpoints", "best.safetensors")
with open(best, "r+b") as f:  # a byte of tensor data: the file still parses
    f.seek(os.path.getsize(best) - 5)
    b = f.read(1)
    f.seek(os.path.getsize(best) - 5)
    f.write(bytes([b[0] ^ 0x10]))
for label, args in [("eval", ["eval", r]), ("export", ["export", r, "--to", os.path.join(work, "exp_dmg")]),
                    ("forward", ["forward", r, "--input", src_file])]:
    code, out, err = normlab(*args)
    expect_refused(f"{label} of a damaged best", code, err, [best, "not the one recorded", "--allow-unverified"])
code, out, err = normlab("eval", r, "--allow-unverified")
if code != 0:
    fail(f"eval --allow-unverified of a damaged best: exit {code}: {err[-400:]}")
# Several runs, the damaged one between two good ones: it stops neither; the exit code is its own.
good_a, good_b = fresh_copy("good_a"), fresh_copy("good_b")
multi = os.path.join(work, "exp_multi")
code, out, err = normlab("export", good_a, r, good_b, "--to", multi)
exported = [n for n in ("good_a", "damaged", "good_b") if os.path.isfile(os.path.join(multi, n, "config.json"))]
if code != 2 or exported != ["good_a", "good_b"] or "not the one recorded" not in err \
        or f"exported 2 of 3 runs; not exported (the errors above): {r}" not in err:
    fail(f"export of good, damaged, good: exit {code} (expected 2), exported {exported}: {err[-400:]}")

r = fresh_copy("no_sums")
os.remove(os.path.join(r, "checkpoints", "SHA256SUMS"))
code, out, err = normlab("eval", r)
expect_refused("eval without SHA256SUMS", code, err, ["SHA256SUMS", "--allow-unverified"])
code, out, err = normlab("train", m, "--set", f'run.out_dir="{r}"', "--set", "optim.max_updates=30")
expect_refused("resume without SHA256SUMS", code, err, ["SHA256SUMS", "--allow-unverified"])
code, out, err = normlab("train", m, "--set", f'run.out_dir="{r}"', "--set", "optim.max_updates=30",
                         "--allow-unverified")
if code != 0 or "resuming" not in out:
    fail(f"resume --allow-unverified without SHA256SUMS: exit {code}: {out[-300:]} {err[-300:]}")

r = fresh_copy("unlisted")
extra = os.path.join(r, "checkpoints", "extra.safetensors")
shutil.copyfile(os.path.join(r, "checkpoints", "last.safetensors"), extra)
code, out, err = normlab("eval", r, "--checkpoint", extra)
expect_refused("eval of an unlisted checkpoint", code, err, [extra, "does not list it"])

# 3. Another model's checkpoint (listed, readable): refused, the difference named.
r = fresh_copy("other_model")
p = os.path.join(r, "checkpoints", "best.safetensors")
shutil.copyfile(os.path.join(work, "other", "checkpoints", "last.safetensors"), p)
list_in_sums(p)
for label, args in [("eval", ["eval", r]), ("export", ["export", r, "--to", os.path.join(work, "exp_other")])]:
    code, out, err = normlab(*args)
    expect_refused(f"{label} of another model's checkpoint", code, err, [p, "ffn_dim 64 in the checkpoint, 32"])

# The real safetensors library reads a checkpoint (the venv has it; Debian has no package).
reader = None
for py in (sys.executable, os.path.expanduser("~/.cache/normlab/venv/bin/python")):
    if os.path.exists(py) and subprocess.run([py, "-c", "import safetensors.numpy"], capture_output=True).returncode == 0:
        reader = py
        break
if reader:
    script = ("import json, sys; from safetensors import safe_open\n"
              "f = safe_open(sys.argv[1], 'numpy'); meta = f.metadata()\n"
              "print(json.dumps({'format': meta['format'], 'updates': json.loads(meta['training_state'])['updates'],"
              " 'n': len(list(f.keys())), 'rng': f.get_tensor('rng/cpu').dtype.name}))")
    got = subprocess.run([reader, "-c", script, os.path.join(ckpts, "last.safetensors")], capture_output=True,
                         text=True)
    if got.returncode != 0:
        fail(f"safetensors could not read last.safetensors: {got.stderr[-400:]}")
    else:
        info = json.loads(got.stdout)
        if info["format"] != "normlab.checkpoint" or info["updates"] != 20 or info["rng"] != "uint8" or info["n"] < 10:
            fail(f"safetensors read back {info}")
        print(f"safetensors ({reader}) reads last.safetensors: {info}")
else:
    print("note: no Python with the safetensors module; the read-back by the real library was not run")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("checkpoint trust OK")
