#!/usr/bin/env python3
"""LM data at scale (issue 44), measured on the path users run:
1. `normlab train` from nanoGPT token shards of 10 M, 100 M and 1 B tokens (sparse files: generated,
   not stored): the time to the first update (the console's "first update done … s") and the peak
   RSS (this child's own, os.wait4), 3 updates of a small LLaMA model;
2. `normlab data tokenize` throughput on English text (../shared/data's Multi30k captions and
   tinyshakespeare, copied up to --text-mb), then on each of Multi30k en, de and tinyshakespeare
   once; SentencePiece BPE 2,000 trained on a sample, --jobs 1 and --jobs N, the word cache
   against SentencePiece on whole lines (--no-word-cache) in the same run, same tokens checked.
Prints a table for docs/data.md.

usage: lm_data_scale.py [--normlab build/bin/normlab] [--work DIR] [--text-mb 40] [--jobs N]
"""
import argparse
import os
import random
import re
import shutil
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("--normlab", default="build/bin/normlab")
ap.add_argument("--work", default="/tmp/normlab-lm-data-scale")
ap.add_argument("--text-mb", type=float, default=40)
ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
args = ap.parse_args()
shutil.rmtree(args.work, ignore_errors=True)
os.makedirs(args.work)

MANIFEST = """[model]
arch = "lm"
family = "llama"
d_model = 64
ffn_dim = 172
heads = 4
dec_layers = 2
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
task = "lm"
format = "nanogpt"
train = "{train}"
vocab_size = 50304
lm_block = 256
[optim]
max_tokens = 2048
max_updates = 3
[eval]
interval = 0
valid_tokens = 65536
[run]
out_dir = "{out}"
log_interval = 1
threads = 1
"""


def run(cmd):
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    out, err = p.stdout.read(), p.stderr.read()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {code}\n{err[-2000:]}")
    return out, err, usage.ru_maxrss / 1024.0, time.monotonic() - t0


print("| tokens | first update after start | peak RSS | whole run (3 updates + 64 K validation) |")
print("|---|---|---|---|")
for n in (10_000_000, 100_000_000, 1_000_000_000):
    shard = os.path.join(args.work, f"tokens_{n}.bin")
    with open(shard, "wb") as f:
        f.truncate(2 * n)
    m = os.path.join(args.work, f"m{n}.toml")
    open(m, "w").write(MANIFEST.format(train=shard, out=os.path.join(args.work, f"run{n}")))
    out, _, rss, wall = run([args.normlab, "train", m])
    first = re.search(r"first update done ([0-9.]+) s", out).group(1)
    print(f"| {n:,} | {first} s | {rss:.0f} MiB | {wall:.1f} s |", flush=True)
    os.remove(shard)

# Real English (../shared/data: Multi30k's English captions and tinyshakespeare) copied up to
# --text-mb; without them, Zipf-distributed made-up words.
shared = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
real = [os.path.join(shared, "multi30k", "train.en"), os.path.join(shared, "tinyshakespeare", "input.txt")]
text_dir = os.path.join(args.work, "text")
os.makedirs(text_dir)
files, size, k = [], 0, 0
if all(os.path.exists(p) for p in real):
    source = "Multi30k train.en + tinyshakespeare, copied"
    data = "".join(open(p, encoding="utf-8").read() for p in real)
else:
    source = "made-up Zipf words"
    rnd = random.Random(1)
    vocab = ["".join(rnd.choice("etaoinshrdlcumwfgypbvkjxqz") for _ in range(rnd.randint(1, 9)))
             for _ in range(20000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    data = "\n".join(" ".join(rnd.choices(vocab, weights, k=rnd.randint(5, 40))) for _ in range(40000)) + "\n"
while size < args.text_mb * 1e6:
    path = os.path.join(text_dir, f"part{k:02d}.txt")
    open(path, "w", encoding="utf-8").write(data)
    files.append(path)
    size += len(data.encode("utf-8"))
    k += 1


def tokenize(files, out_dir, jobs, model, extra=()):
    cmd = [args.normlab, "data", "tokenize", *files, "--out", out_dir, "--jobs", str(jobs),
           "--cache-dir", os.path.join(args.work, "cache"), *extra]
    cmd += ["--model", model] if model else ["--vocab-size", "2000", "--sample-lines", "100000"]
    _, err, _, _ = run(cmd)
    m = re.search(r"tokenize: (\d+) tokens in \d+ shards .* in ([0-9.]+) s, ([0-9.]+) M tokens/s", err)
    found = re.search(r"word cache: ([0-9.]+) % of", err)
    shard = b"".join(open(os.path.join(out_dir, f), "rb").read()
                     for f in sorted(os.listdir(out_dir)) if f.startswith("shard_"))
    if not model:
        shutil.copy(os.path.join(out_dir, "tokenizer.model"), os.path.join(args.work, "tokenizer.model"))
    shutil.rmtree(out_dir)
    return int(m.group(1)), float(m.group(2)), float(m.group(3)), found.group(1) if found else "-", shard


# The reference (--no-word-cache: SentencePiece on whole lines) runs beside the word cache, on the
# same files; both must write the same tokens.
print()
print(f"`normlab data tokenize` (BPE 2,000 trained on a sample of English and German), the word "
      f"cache against SentencePiece on whole lines (--no-word-cache) in the same run:")
print()
print("| text | jobs | tokens | whole lines | word cache | per job | words found in the cache |")
print("|---|---|---|---|---|---|---|")
german = os.path.join(shared, "multi30k", "train.de")
have_german = os.path.exists(german) and source.startswith("Multi30k")
tokenize(files[:1] + ([german] if have_german else []), os.path.join(args.work, "train"), 1, None)
model = os.path.join(args.work, "tokenizer.model")
corpora = [(f"{size / 1e6:.0f} MB ({source}, {len(files)} files)", files)]
if have_german:
    corpora.append(("2.9 MB, once: Multi30k train.en + tinyshakespeare", real))
    corpora.append(("2.1 MB, once: Multi30k train.de (German)", [german]))
for name, corpus in corpora:
    for jobs in sorted({1, args.jobs}):
        out_dir = os.path.join(args.work, "shards")
        tokens, _, ref, _, ref_tokens = tokenize(corpus, out_dir, jobs, model, ["--no-word-cache"])
        tokens2, _, rate, found, cached_tokens = tokenize(corpus, out_dir, jobs, model)
        if tokens2 != tokens or cached_tokens != ref_tokens:
            raise SystemExit(f"{name}: the word cache wrote other tokens than whole lines")
        print(f"| {name} | {jobs} | {tokens:,} | {ref:.2f} M/s | {rate:.2f} M/s ({rate / ref:.1f}x) | "
              f"{rate / jobs:.2f} M/s | {found} % |", flush=True)
