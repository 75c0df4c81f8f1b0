#!/usr/bin/env python3
"""Trust 4 (issue 56), the command-line findings: each a regression check that failed on the old
behaviour. `normlab data tokenize`: a 20 MB line refused at once in bounded memory (56.11), a
journal record of the wrong types named with its line (56.16), a shard damaged in place tokenized
again (56.17), each way a JSONL record is wrong said as such (56.21); a glob over two intact
tokenize folders trains (56.18); a resume with run.tf32 or optim.no_decay changed refused naming
that key (56.19); zero for a positive option said plainly, without DBL_MAX's 309 digits (56.20);
`normlab ablate SWEEP` follows no planted link (56.6).

usage: check_trust4_cli.py NORMLAB PLUGIN_DIR WORK_DIR
"""
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_checks  # noqa: E402
from cli_checks import check, one_error  # noqa: E402

normlab, plugins, work = sys.argv[1:4]
normlab = os.path.abspath(normlab)
plugins = os.path.abspath(plugins)
work = os.path.abspath(work)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
started = time.monotonic()


def run(*args, timeout=120):
    return cli_checks.run(normlab, *args, timeout=timeout)


def errors(p):
    return p.errors


def tail(p, n=300):
    return cli_checks.said(p, n)


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


# ---- Corpora: lines of random words, two sets from different seeds ----
texts = os.path.join(work, "texts")
os.makedirs(texts)
WORDS = [f"w{i}" for i in range(300)] + ["the", "of", "and", "normlab", "schéma", "naïve"]


def write_corpus(path, n_lines, seed):
    rnd = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n_lines):
            f.write(" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 25))) + "\n")
    return path


a1 = write_corpus(os.path.join(texts, "a1.txt"), 600, 1)
a2 = write_corpus(os.path.join(texts, "a2.txt"), 600, 2)
b1 = write_corpus(os.path.join(texts, "b1.txt"), 700, 3)
cache = os.path.join(work, "cache")
parent = os.path.join(work, "tokens")  # dirA and dirB: the glob of 56.18
dir_a, dir_b = os.path.join(parent, "dirA"), os.path.join(parent, "dirB")


def tokenize(out, *inputs_and_options):
    return run("data", "tokenize", *inputs_and_options, "--out", out, "--cache-dir", cache)


# The base tokenizer: trained on corpus A (small vocabulary, few sample lines), then given as
# --model to every other tokenize (no training there).
t = tokenize(dir_a, a1, a2, "--vocab-size", "300", "--sample-lines", "1000", "--jobs", "2")
check(t.returncode == 0, f"tokenize corpus A into dirA, a tokenizer trained ({tail(t)})")
model = os.path.join(dir_a, "tokenizer.model")
if not os.path.exists(model):
    print("no tokenizer.model: the remaining checks need it")
    print("trust4 cli checks FAILED")
    sys.exit(1)

# ---- 56.18: a glob over two intact tokenize folders (both with a shard_00000.bin) trains ----
t = tokenize(dir_b, b1, "--model", model, "--jobs", "1")
check(t.returncode == 0, f"56.18: tokenize corpus B into dirB with dirA's --model ({tail(t)})")

MANIFEST = """[model]
arch = "lm"
family = "llama"
d_model = 16
ffn_dim = 32
heads = 2
dec_layers = 2
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
task = "lm"
format = "normlab"
train = "{train}"
lm_block = 32
[optim]
max_tokens = 128
max_updates = 6
[eval]
interval = 3
valid_tokens = 1024
[run]
out_dir = "{out}"
log_interval = 2
threads = 1
"""
sweep = os.path.join(work, "sweep")  # 56.6: this run is the sweep's r1
run_dir = os.path.join(sweep, "r1")
manifest = os.path.join(work, "glob.toml")
with open(manifest, "w") as f:
    f.write(MANIFEST.format(train=os.path.join(parent, "dir*", "shard_*.bin"), out=run_dir))


def train(*sets):
    args = ["train", manifest, "--plugin-path", plugins]
    for s in sets:
        args += ["--set", s]
    return run(*args, timeout=300)


p = train()
check(p.returncode == 0 and "SHA-256" not in p.err and "SHA-256" not in p.out,
      f"56.18: a glob over dirA and dirB (each its own shards.json) trains, no SHA-256 complaint "
      f"({tail(p)})")
trained = p.returncode == 0 and os.path.exists(os.path.join(run_dir, "checkpoints", "last.safetensors"))
check(trained, "56.18: the run wrote checkpoints/last.safetensors")
if not trained:  # the checks below need a run: one folder's shards alone
    shutil.rmtree(run_dir, ignore_errors=True)
    with open(manifest, "w") as f:
        f.write(MANIFEST.format(train=os.path.join(parent, "dirA", "shard_*.bin"), out=run_dir))
    p = train()
    trained = p.returncode == 0
    check(trained, f"a run on dirA alone, for the checks below ({tail(p)})")

# ---- 56.19: a resume with run.tf32 / optim.no_decay changed names that key ----
if trained:
    p = train()
    check(p.returncode == 0 and "nothing to do" in p.out,
          f"56.19: the same manifest again: already completed, nothing to do ({tail(p)})")
    p = train("run.tf32=true")
    e = errors(p)
    named = e and re.search(r"\(\[run\] '(tf32 = true' is new|tf32 = false' became 'tf32 = true')\)", e[0])
    check(one_error(p, 2, "belongs to another experiment", "tf32") and bool(named),
          f"56.19: --set run.tf32=true refused naming [run] tf32 ({tail(p)})")
    resolved = open(os.path.join(run_dir, "manifest.resolved.toml")).read()
    now = re.search(r"^no_decay = ['\"]([^'\"]*)['\"]", resolved, re.M)
    new = "vectors" if not now or now.group(1) != "vectors" else "vectors+scheme"
    p = train(f"optim.no_decay={new}")
    e = errors(p)
    named = e and re.search(r"\(\[optim\] '(no_decay = ['\"]" + re.escape(new) + r"['\"]' is new|"
                            r"no_decay = ['\"][^'\"]*['\"]' became 'no_decay = ['\"]" + re.escape(new) +
                            r"['\"]')\)", e[0])
    check(one_error(p, 2, "belongs to another experiment", "no_decay") and bool(named),
          f"56.19: --set optim.no_decay={new} refused naming [optim] no_decay ({tail(p)})")


# ---- 56.6: `normlab ablate SWEEP` follows no link ----
def write_sweep_json(folder):
    os.makedirs(folder, exist_ok=True)
    json.dump({"manifest": manifest, "name": os.path.basename(folder), "created": "2026-01-01T00:00:00Z",
               "sets": [], "runs": [{"index": 0, "id": "r1", "dir": "r1", "overrides": [], "values": {}}]},
              open(os.path.join(folder, "sweep.json"), "w"), indent=2)


def listing(folder):
    """Every file under folder: (relative path, size, mtime_ns), links not followed."""
    out = []
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            out.append((os.path.relpath(os.path.join(root, name), folder), st.st_size, st.st_mtime_ns))
    return sorted(out)


if trained:
    write_sweep_json(sweep)
    # Case A: RUN/eval/ablate.log planted as a link to a user's file: unlinked, not truncated through.
    user_file = os.path.join(work, "user_file.txt")
    USER_TEXT = "the user's own notes, not normlab's\n" * 20
    open(user_file, "w").write(USER_TEXT)
    os.makedirs(os.path.join(run_dir, "eval"), exist_ok=True)
    planted = os.path.join(run_dir, "eval", "ablate.log")
    os.symlink(user_file, planted)
    p = run("ablate", sweep, "--plugin-path", plugins, timeout=300)
    check(open(user_file).read() == USER_TEXT,
          f"56.6 A: a planted RUN/eval/ablate.log link: the user's file it points to is unchanged ({tail(p)})")
    check(not os.path.islink(planted) and os.path.isfile(planted) and "1 of 1 runs ablated" in p.out,
          f"56.6 A: the run ablated, its ablate.log a new file of its own (exit {p.returncode}; "
          f"{p.out.strip()[-300:]} {p.err.strip()[-300:]})")

    # Case B: a sweep whose run folder is a link to a run outside it: refused, nothing written there.
    sweep_b = os.path.join(work, "sweep_link")
    write_sweep_json(sweep_b)
    os.symlink(run_dir, os.path.join(sweep_b, "r1"))
    before = listing(run_dir)
    p = run("ablate", sweep_b, "--plugin-path", plugins, timeout=300)
    check(p.returncode != 0 and len(errors(p)) == 1 and "is a symbolic link" in errors(p)[0],
          f"56.6 B: a run folder that is a link: one line 'is a symbolic link' ({tail(p)})")
    check(listing(run_dir) == before and not os.path.exists(os.path.join(sweep_b, "ablation")),
          "56.6 B: the run outside the sweep (and the sweep) unchanged")

    # Case C: a run folder of its own whose eval/ is a link to a folder elsewhere: refused, nothing there.
    sweep_c = os.path.join(work, "sweep_eval_link")
    write_sweep_json(sweep_c)
    shutil.copytree(run_dir, os.path.join(sweep_c, "r1"), symlinks=True)
    shutil.rmtree(os.path.join(sweep_c, "r1", "eval"))
    elsewhere = os.path.join(work, "elsewhere")
    os.makedirs(elsewhere)
    os.symlink(elsewhere, os.path.join(sweep_c, "r1", "eval"))
    p = run("ablate", sweep_c, "--plugin-path", plugins, timeout=300)
    check(p.returncode != 0 and len(errors(p)) == 1 and "is a symbolic link" in errors(p)[0] and
          os.listdir(elsewhere) == [],
          f"56.6 C: RUN/eval a link: one line 'is a symbolic link', nothing written where it points ({tail(p)})")

# ---- 56.17: a shard damaged in place (same size) is tokenized again on a rerun ----
out17 = os.path.join(work, "damaged")
t = tokenize(out17, a1, a2, "--model", model, "--jobs", "1")
check(t.returncode == 0, f"56.17: tokenize two inputs ({tail(t)})")
shard0 = os.path.join(out17, "shard_00000.bin")
if t.returncode == 0:
    original = open(shard0, "rb").read()
    with open(shard0, "r+b") as f:
        f.seek(len(original) // 2)
        f.write(bytes([original[len(original) // 2] ^ 0x5A]))
    check(os.path.getsize(shard0) == len(original) and open(shard0, "rb").read() != original,
          "56.17: shard_00000.bin damaged in place, its size kept")
    t = tokenize(out17, a1, a2, "--model", model, "--jobs", "1")
    listed = json.load(open(os.path.join(out17, "shards.json")))["shards"][0]
    check(t.returncode == 0 and open(shard0, "rb").read() == original and
          sha256(shard0) == listed["sha256"] and listed["file"] == "shard_00000.bin",
          f"56.17: the rerun tokenized it again: byte-identical, SHA-256 as shards.json's ({tail(t)})")
    check("1 of 2 shards done by an earlier run, kept" in t.err,
          f"56.17: the intact shard kept, the damaged one not ({t.err.strip()[-200:]})")

# ---- 56.16: a journal record of the wrong types: one line naming progress.jsonl and the line ----
journal = os.path.join(out17, "progress.jsonl")
if os.path.exists(journal):
    good = open(journal).read()
    n = len(good.splitlines())
    cases = [
        ('{"key": 5, "tokens": "x", "sha256": 3}', "'key': expected a string"),
        ('{"key": "k", "tokens": "x", "sha256": "' + "0" * 64 + '"}', "'tokens': expected a whole number"),
        ('{"key": "k", "tokens": 4, "sha256": 3}', "'sha256': expected 64 hex digits"),
        ("[1, 2]", "expected a JSON object"),
    ]
    for record, phrase in cases:
        open(journal, "w").write(good + record + "\n")
        t = tokenize(out17, a1, a2, "--model", model, "--jobs", "1")
        check(one_error(t, 2, f"progress.jsonl:{n + 1}: ", phrase),
              f"56.16: journal line {n + 1} {record[:40]}: one line 'progress.jsonl:{n + 1}: … {phrase}' ({tail(t)})")
    open(journal, "w").write(good)

# ---- 56.21: each way a JSONL record is wrong, said as such ----
jsonl_cases = {
    "utf8": (b'{"text": "caf\xe9 au lait"}', "invalid UTF-8"),
    "notjson": (b'{"text": oops}', "not JSON"),
    "array": (b'["text", "a list"]', "not an object"),
    "nofield": (b'{"body": "no text here"}', "has no field 'text'"),
    "number": (b'{"text": 5}', "is a JSON number, expected a string"),
}
for name, (record, phrase) in jsonl_cases.items():
    path = os.path.join(texts, f"bad_{name}.jsonl")
    open(path, "wb").write(b'{"text": "a good first record"}\n' + record + b"\n")
    t = tokenize(os.path.join(work, f"jsonl_{name}"), path, "--model", model, "--jobs", "1")
    check(one_error(t, 2, f"{path}:2: ", phrase), f"56.21: a JSONL record ({name}): one line '{path}:2: … {phrase}' "
          f"({tail(t)})")
# Through the sample a tokenizer is trained on, too (no --model).
t = tokenize(os.path.join(work, "jsonl_sample"), os.path.join(texts, "bad_number.jsonl"), "--vocab-size", "20",
             "--sample-lines", "10")
check(one_error(t, 2, "bad_number.jsonl:2: ", "is a JSON number, expected a string"),
      f"56.21: the same record read for the tokenizer's sample: the same line ({tail(t)})")

# ---- 56.11: a line over --max-line-bytes refused at once, in bounded memory ----
huge = os.path.join(texts, "one_line.txt.gz")
with gzip.open(huge, "wb", compresslevel=6) as f:
    f.write(b"a b " * (5 << 20))  # 20 MiB, no newline
print(f"     {huge}: {os.path.getsize(huge)} bytes compressed, 20 MiB in one line")
LINE_RE = re.escape(huge) + r":1: a line of (more than )?\d+ bytes, over --max-line-bytes 8388608"
for what, extra in (("the tokenizer's sample", ["--vocab-size", "300", "--sample-lines", "1000"]),
                    ("tokenized with --model", ["--model", model, "--jobs", "1"])):
    t = tokenize(os.path.join(work, "huge_" + extra[0].strip("-")), huge, *extra)
    e = errors(t)
    check(one_error(t, 2, "--max-line-bytes") and bool(re.search(LINE_RE, e[0])),
          f"56.11: a 20 MiB line ({what}): exit 2, one line 'FILE:1: a line of … over --max-line-bytes "
          f"8388608' ({tail(t)})")
    check(t.peak_rss_mb < 600, f"56.11: … peak RSS {t.peak_rss_mb:.0f} MiB, under 600 (was 1.6–2.6 GiB)")
# A small limit, a whole line: its exact length and line number.
short = os.path.join(texts, "short.txt")
open(short, "w").write("one two three\nfour five\n" + "x" * 60 + "\nsix\n")
t = tokenize(os.path.join(work, "short_limit"), short, "--model", model, "--max-line-bytes", "50")
check(one_error(t, 2, f"{short}:3: a line of 60 bytes, over --max-line-bytes 50"),
      f"56.11: --max-line-bytes 50, a 60-byte line 3: named exactly ({tail(t)})")
t = tokenize(os.path.join(work, "big_limit"), a1, "--model", model, "--max-line-bytes", "100000000")
check(t.returncode == 0, f"56.11: --max-line-bytes 100000000 accepted ({tail(t)})")

# ---- 56.20: zero for a positive option, said plainly (no DBL_MAX digits) ----
dummy_run = os.path.join(work, "no_such_run")
dummy_manifest = os.path.join(work, "no_such_sweep.toml")
tok = ["data", "tokenize", a1, "--out", os.path.join(work, "never")]
cli_cases = [
    (tok + ["--jobs", "0"], "not in range 1 to 1024"),
    (tok + ["--sample-lines", "0"], "expected a whole number of 1 or more, got '0'"),
    (tok + ["--max-line-bytes", "0"], "expected a whole number of 1 or more, got '0'"),
    (["sweep", dummy_manifest, "--jobs", "0"], "expected a whole number of 1 or more, got '0'"),
    (["sweep", dummy_manifest, "--threads-per-run", "0"], "expected a whole number of 1 or more, got '0'"),
    (["sweep", dummy_manifest, "--status", "--watch", "0"], "expected a number above 0, got '0'"),
    (["sweep", dummy_manifest, "--max-parallel=-1"], "expected a number of 0 or more, got '-1'"),
    (["forward", dummy_run, "--input", a1, "--top-k", "0"], "expected a whole number of 1 or more, got '0'"),
    (["eval", dummy_run, "--beam", "0"], "expected a whole number of 1 or more, got '0'"),
    (["eval", dummy_run, "--batch-tokens", "0"], "expected a whole number of 1 or more, got '0'"),
    # Issue 68.7: eval --threads N, LibTorch's threads: a whole number of 1 or more.
    (["eval", dummy_run, "--threads", "0"], "--threads: expected a whole number of 1 or more, got '0'"),
    (["eval", dummy_run, "--threads", "two"], "--threads: expected a whole number of 1 or more, got 'two'"),
    (["eval", dummy_run, "--threads=-1"], "--threads: expected a whole number of 1 or more, got '-1'"),
    # Unbounded, --threads 100000 made ~22,000 threads and stalled the machine (hostile review).
    (["eval", dummy_run, "--threads", "100000"], "--threads: Value 100000 not in range 1 to 1024"),
    (["ablate", dummy_run, "--jobs", "0"], "expected a whole number of 1 or more, got '0'"),
    (["ablate", dummy_run, "--batch-tokens", "0"], "expected a whole number of 1 or more, got '0'"),
    (["bench", "--heads", "0"], "expected a whole number of 1 or more, got '0'"),
    (["smoke", "--d-model", "0"], "expected a whole number of 1 or more, got '0'"),
]
for args, phrase in cli_cases:
    p = run(*args)
    check(p.returncode == 2 and "1797" not in p.err and phrase in p.err,
          f"56.20: {' '.join(args[:2]) if args[0] == 'data' else args[0]} {' '.join(args[-2:])}: exit 2, "
          f"'{phrase}', no DBL_MAX ({tail(p, 200)})")
check(not os.path.exists(os.path.join(work, "never")), "56.20: nothing made by a refused tokenize")

print(f"     {time.monotonic() - started:.1f} s in all")
cli_checks.finish("trust4 cli checks")
