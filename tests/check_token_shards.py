#!/usr/bin/env python3
"""Token shards as the tools users have write them (issue 44): one token stream written with numpy
as nanoGPT's prepare.py (flat uint16), numpy.save (.npy, uint16 and uint32), Megatron-LM's
MMapIndexedDatasetBuilder (.bin + .idx) and normlab's own layout (flat + shards.json) trains to the
same losses, bitwise; damaged or mismatched files are one error line. Then the scale properties: a
1-billion-token corpus (a sparse file: generated, not stored) starts as fast and peaks at the same
memory as a 10-million-token one.

usage: check_token_shards.py NORMLAB PLUGIN_DIR WORK_DIR
"""
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

normlab, plugins, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    failures += not cond


def train(manifest, *sets, timeout=300):
    args = [normlab, "train", manifest, "--plugin-path", plugins]
    for s in sets:
        args += ["--set", s]
    start = time.monotonic()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # os.wait4: this child's own peak RSS (getrusage of all children would keep the largest).
    _, status, usage = os.wait4(p.pid, 0)
    out, err = p.stdout.read(), p.stderr.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    p.peak_rss_mb = usage.ru_maxrss / 1024.0
    p.wall_s = time.monotonic() - start
    p.out, p.err = out, err
    return p


def records(run, kind):
    with open(os.path.join(run, "train.jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("kind") == kind]


MANIFEST = """[model]
arch = "lm"
family = "llama"
d_model = 16
ffn_dim = 32
heads = 2
dec_layers = 1
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
task = "lm"
format = "{fmt}"
train = "{train}"
{extra}
lm_block = 32
[optim]
max_tokens = 128
max_updates = 6
[eval]
interval = 3
valid_tokens = 4096
[run]
out_dir = "{out}"
log_interval = 2
threads = 1
"""


def manifest(name, fmt, train_path, extra="vocab_size = 1000"):
    path = os.path.join(work, name + ".toml")
    with open(path, "w") as f:
        f.write(MANIFEST.format(fmt=fmt, train=train_path, extra=extra, out=os.path.join(work, "runs", name)))
    return path


# One token stream: documents of random lengths, each ending with EOS (999), ids 0 … 999 (0 is a
# token, as GPT-2's "!" is).
rng = np.random.default_rng(44)
docs = [rng.integers(0, 999, size=int(n)).tolist() + [999] for n in rng.integers(20, 400, size=200)]
tokens = np.array([t for d in docs for t in d], dtype=np.int64)
print(f"{len(tokens)} tokens in {len(docs)} documents")

d = os.path.join(work, "formats")
os.makedirs(d)
# nanoGPT (data/openwebtext/prepare.py): np.memmap(filename, dtype=np.uint16, mode='w+') filled
# with the concatenated ids, i.e. the raw little-endian uint16 bytes.
arr = np.memmap(os.path.join(d, "nanogpt.bin"), dtype=np.uint16, mode="w+", shape=(len(tokens),))
arr[:] = tokens
arr.flush()
del arr
# NumPy: np.save of the array, uint16 and uint32.
np.save(os.path.join(d, "tokens_u2.npy"), tokens.astype(np.uint16))
np.save(os.path.join(d, "tokens_u4.npy"), tokens.astype(np.uint32))


# Megatron-LM (megatron/core/datasets/indexed_dataset.py, IndexedDatasetBuilder): each document's
# ids appended to PREFIX.bin in the best-fitting dtype (uint16 below 65500 ids: DType code 8),
# PREFIX.idx = b"MMIDIDX\x00\x00", <Q version 1, <B dtype code, <Q sequence count, <Q document
# count, int32 sequence lengths, int64 byte pointers, int64 document indices (0, then after each
# document).
def write_megatron(prefix, docs, dtype=np.uint16, code=8, break_pointers=False):
    with open(prefix + ".bin", "wb") as f:
        for doc in docs:
            f.write(np.array(doc, dtype=dtype).tobytes(order="C"))
    sizes = np.array([len(doc) for doc in docs], dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64) * np.dtype(dtype).itemsize)
    if break_pointers:
        pointers[3] += 2
    doc_idx = np.arange(len(docs) + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(doc_idx.tobytes(order="C"))


write_megatron(os.path.join(d, "corpus_text_document"), docs)
write_megatron(os.path.join(d, "corpus_i32_text_document"), docs, np.int32, 4)
# normlab: flat uint16 shards (split in two) and shards.json with their SHA-256.
half = len(tokens) // 2
shards = []
for i, part in enumerate((tokens[:half], tokens[half:])):
    name = f"train_{i:03d}.bin"
    data = part.astype(np.uint16).tobytes()
    open(os.path.join(d, name), "wb").write(data)
    shards.append({"file": name, "tokens": len(part), "sha256": hashlib.sha256(data).hexdigest(),
                   "max_token": int(part.max())})
json.dump({"format": "normlab.shards", "dtype": "uint16", "vocab_size": 1000, "eos_id": 999,
           "tokenizer": "", "shards": shards}, open(os.path.join(d, "shards.json"), "w"))

runs = {
    "nanogpt": manifest("nanogpt", "nanogpt", os.path.join(d, "nanogpt.bin")),
    "npy_u2": manifest("npy_u2", "npy", os.path.join(d, "tokens_u2.npy")),
    "npy_u4": manifest("npy_u4", "npy", os.path.join(d, "tokens_u4.npy")),
    "megatron": manifest("megatron", "megatron", os.path.join(d, "corpus_text_document")),
    "megatron_i32": manifest("megatron_i32", "megatron", os.path.join(d, "corpus_i32_text_document.bin")),
    "normlab": manifest("normlab", "normlab", os.path.join(d, "train_*.bin"), ""),
}
losses = {}
for name, m in runs.items():
    p = train(m)
    check(p.returncode == 0, f"{name}: trains (exit {p.returncode}{': ' + p.err.strip()[-300:] if p.returncode else ''})")
    if p.returncode == 0:
        losses[name] = [(r["update"], r["loss"]) for r in records(os.path.join(work, "runs", name), "train")]
        losses[name] += [(r["update"], r["nll"]) for r in records(os.path.join(work, "runs", name), "valid")]
first = losses.get("nanogpt")
check(first is not None and len(first) >= 5, "nanogpt: train and valid records")
for name, got in losses.items():
    check(got == first, f"{name}: the same records as nanogpt's, bitwise")


# Export of a run on shards: no padding id, the tokenizer named as the shards' ids.
exp = os.path.join(work, "export_nanogpt")
pe = subprocess.run([normlab, "export", os.path.join(work, "runs", "nanogpt"), "--to", exp, "--plugin-path", plugins],
                    capture_output=True, text=True)
cfg = json.load(open(os.path.join(exp, "config.json"))) if pe.returncode == 0 else {}
check(pe.returncode == 0 and cfg.get("special_ids", {}).get("pad", 0) is None and
      cfg.get("tokenizer", {}).get("type") == "ids",
      f"export of a shard run: pad null, tokenizer ids ({pe.returncode}: {pe.stderr.strip()[-200:]})")


def refused(name, fmt, path, needle, extra="vocab_size = 1000", code=2):
    p = train(manifest(name, fmt, path, extra))
    errors = [l for l in p.err.splitlines() if l.startswith("normlab: error")]
    check(p.returncode == code and len(errors) == 1 and needle in errors[0],
          f"{name}: exit {code}, one line with '{needle}' (exit {p.returncode}: {p.err.strip()[-300:]})")


open(os.path.join(d, "odd.bin"), "wb").write(b"\x01\x00\x02")
refused("odd", "nanogpt", os.path.join(d, "odd.bin"), "not a whole number of 2-byte tokens")
refused("small_vocab", "nanogpt", os.path.join(d, "nanogpt.bin"), "is not below data.vocab_size = 500",
        "vocab_size = 500")
refused("no_vocab", "nanogpt", os.path.join(d, "nanogpt.bin"), "data.vocab_size: required", "")
np.save(os.path.join(d, "big_endian.npy"), tokens.astype(">u2"))
refused("big_endian", "npy", os.path.join(d, "big_endian.npy"), "dtype '>u2'")
np.save(os.path.join(d, "two_d.npy"), tokens[:1000].reshape(10, 100).astype(np.uint16))
refused("two_d", "npy", os.path.join(d, "two_d.npy"), "expected one dimension")
write_megatron(os.path.join(d, "gappy"), docs, break_pointers=True)
refused("gappy", "megatron", os.path.join(d, "gappy"), "sequence 3 is not where the previous one ends")
refused("no_match", "nanogpt", os.path.join(d, "nothing_*.bin"), "matches no file")
refused("vocab_disagrees", "normlab", os.path.join(d, "train_*.bin"), "says 1000", "vocab_size = 900")
# A normlab shard replaced after shards.json was written: the run does not complete.
bad = os.path.join(work, "badhash")
shutil.copytree(d, bad)
with open(os.path.join(bad, "train_001.bin"), "r+b") as f:
    f.seek(10)
    f.write(b"\x07\x00")
p = train(manifest("badhash", "normlab", os.path.join(bad, "train_*.bin"), ""))
check(p.returncode == 1 and "SHA-256" in p.err and "train_001.bin" in p.err,
      f"a replaced normlab shard: the run fails naming it ({p.returncode}: {p.err.strip()[-200:]})")

# `normlab data tokenize`: plain, .gz, .zst and JSONL inputs -> normlab shards; the same shards on 1
# and 2 jobs; a killed run resumes, keeping its finished shards, to the same shards.json; they train.
import gzip  # noqa: E402
import random  # noqa: E402

texts = os.path.join(work, "texts")
os.makedirs(texts)
words = [f"w{i}" for i in range(400)] + ["the", "of", "and", "normlab", "schéma", "naïve"]
rnd = random.Random(5)


def lines(n):
    return ["".join(" ".join(rnd.choice(words) for _ in range(rnd.randint(3, 30)))) for _ in range(n)]


inputs = []
for i in range(6):
    path = os.path.join(texts, f"part{i}.txt")
    open(path, "w", encoding="utf-8").write("\n".join(lines(6000)) + "\n")
    inputs.append(path)
gz = os.path.join(texts, "more.txt.gz")
with gzip.open(gz, "wt", encoding="utf-8") as f:
    f.write("\n".join(lines(2000)) + "\n")
zst_src = os.path.join(texts, "zst.txt")
open(zst_src, "w", encoding="utf-8").write("\n".join(lines(2000)) + "\n")
subprocess.run(["zstd", "-q", "-f", zst_src, "-o", zst_src + ".zst"], check=True)
jsonl = os.path.join(texts, "docs.jsonl")
with open(jsonl, "w", encoding="utf-8") as f:
    for t in lines(1000):
        f.write(json.dumps({"id": 1, "text": t}) + "\n")
inputs += [gz, zst_src + ".zst", jsonl]


def tokenize(out, *extra, wait=True):
    args = [normlab, "data", "tokenize", *inputs, "--out", out, "--vocab-size", "300",
            "--sample-lines", "3000", "--cache-dir", os.path.join(work, "cache"), *extra]
    if not wait:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(args, capture_output=True, text=True)


t1 = tokenize(os.path.join(work, "shards1"), "--jobs", "1")
check(t1.returncode == 0, f"tokenize, 1 job ({t1.stderr.strip()[-300:]})")
t2 = tokenize(os.path.join(work, "shards2"), "--jobs", "2")
check(t2.returncode == 0, f"tokenize, 2 jobs ({t2.stderr.strip()[-300:]})")
set1 = json.load(open(os.path.join(work, "shards1", "shards.json")))
set2 = json.load(open(os.path.join(work, "shards2", "shards.json")))
check(set1["shards"] == set2["shards"] and len(set1["shards"]) == len(inputs),
      f"1 and 2 jobs: the same {len(set1['shards'])} shards, SHA-256 for SHA-256")
check(set1["vocab_size"] == 300 and set1["eos_id"] == 3 and set1["dtype"] == "uint16",
      "shards.json: vocab 300, eos 3 (normlab's), uint16")
for sh in set1["shards"]:
    data = open(os.path.join(work, "shards1", sh["file"]), "rb").read()
    ids = np.frombuffer(data, dtype=np.uint16)
    check(hashlib.sha256(data).hexdigest() == sh["sha256"] and len(ids) == sh["tokens"] and
          int(ids.max()) == sh["max_token"] and (ids == 3).sum() > 0, f"{sh['file']}: as listed, EOS inside")
# The word cache (issue 44.3) writes SentencePiece's tokens: --no-word-cache (whole lines) gives the
# same shards; a unigram model is not encoded word by word, and says so.
found = re.search(r"tokenize: word cache: ([0-9.]+) % of (\d+) words found", t1.stderr)
check(found and float(found.group(1)) > 90 and int(found.group(2)) > 100000,
      f"the word cache line: most words found ({found.group(0) if found else t1.stderr[-300:]})")
tw = tokenize(os.path.join(work, "shards_whole"), "--no-word-cache")
check(tw.returncode == 0 and "every line encoded whole (--no-word-cache)" in tw.stderr and
      json.load(open(os.path.join(work, "shards_whole", "shards.json")))["shards"] == set1["shards"],
      f"--no-word-cache: the same shards, SHA-256 for SHA-256 ({tw.stderr.strip()[-200:]})")
tu = tokenize(os.path.join(work, "shards_unigram"), "--model-type", "unigram")
check(tu.returncode == 0 and "every line encoded whole (this model: unigram model; no word cache)" in tu.stderr,
      f"a unigram model: lines encoded whole, and why ({tu.stderr.strip()[-200:]})")
# Each line is one document ending with EOS: the .gz input's shard has 2000 of them.
gz_ids = np.frombuffer(open(os.path.join(work, "shards1", set1["shards"][6]["file"]), "rb").read(), np.uint16)
check(int((gz_ids == 3).sum()) == 2000, f"the .gz input: 2000 lines, 2000 EOS ({int((gz_ids == 3).sum())})")
# Killed after its first shards, then again: the earlier shards kept, the same result.
resumed_dir = os.path.join(work, "shards_resumed")
p = tokenize(resumed_dir, "--jobs", "1", wait=False)
progress = os.path.join(resumed_dir, "progress.jsonl")
deadline = time.monotonic() + 120
while time.monotonic() < deadline and p.poll() is None:
    if os.path.exists(progress) and len(open(progress).read().splitlines()) >= 2:
        break
    time.sleep(0.02)
p.kill()
p.wait()
kept = len(open(progress).read().splitlines()) if os.path.exists(progress) else 0
t3 = tokenize(resumed_dir, "--jobs", "2")
check(t3.returncode == 0 and 1 <= kept < len(inputs) and "done by an earlier run, kept" in t3.stderr,
      f"killed with {kept} shard(s) done, resumed ({t3.stderr.strip()[-200:]})")
set3 = json.load(open(os.path.join(resumed_dir, "shards.json")))
check(set3["shards"] == set1["shards"], "the resumed run's shards.json equals the uninterrupted run's")
# Bad input: a JSONL record without the field, a file of another kind than its name says.
bad_jsonl = os.path.join(texts, "bad.jsonl")
open(bad_jsonl, "w").write('{"text": "ok"}\n{"body": "no text"}\n')
pb = subprocess.run([normlab, "data", "tokenize", bad_jsonl, "--out", os.path.join(work, "bad_out"), "--model",
                     os.path.join(work, "shards1", "tokenizer.model")], capture_output=True, text=True)
check(pb.returncode == 2 and "bad.jsonl:2: the record has no field 'text'" in pb.stderr,
      f"a JSONL record without text: one line naming file and line ({pb.stderr.strip()})")
pu = subprocess.run([normlab, "data", "tokenize", inputs[0], "--out", texts], capture_output=True, text=True)
check(pu.returncode == 2 and "is neither empty nor a folder normlab made" in pu.stderr,
      f"--out a folder of the user's: refused ({pu.stderr.strip()[-200:]})")
pt = train(manifest("tokenized", "normlab", os.path.join(work, "shards1", "shard_*.bin"), ""))
check(pt.returncode == 0, f"the tokenized shards train ({pt.err.strip()[-300:]})")

# A text file above data.text_max_mb: refused with how to make shards, before anything is read.
big_text = os.path.join(texts, "big.txt")
with open(big_text, "w") as f:
    for path in inputs[:6]:
        f.write(open(path).read())
text_manifest = os.path.join(work, "text.toml")
open(text_manifest, "w").write(MANIFEST.format(fmt="text", train=big_text, extra="text_max_mb = 1",
                                               out=os.path.join(work, "runs", "text")))
pt = train(text_manifest)
check(pt.returncode == 2 and "above data.text_max_mb = 1" in pt.err and "normlab data tokenize" in pt.err,
      f"a text corpus above data.text_max_mb: one line saying how to make shards ({pt.err.strip()[-200:]})")

# Scale: 10 M and 1 B tokens (sparse nanoGPT files of zeros, all valid ids).
for n in (10_000_000, 1_000_000_000):
    path = os.path.join(work, f"zeros_{n}.bin")
    with open(path, "wb") as f:
        f.truncate(2 * n)
stats = {}
for n in (10_000_000, 1_000_000_000):
    m = manifest(f"scale_{n}", "nanogpt", os.path.join(work, f"zeros_{n}.bin"))
    p = train(m, "optim.max_updates=3", "eval.interval=0")
    first_update = None
    for line in p.out.splitlines():
        if line.startswith("first update done "):
            first_update = float(line.split()[3])
    check(p.returncode == 0 and first_update is not None,
          f"{n} tokens: trains ({p.returncode}: {p.err.strip()[-200:]})")
    stats[n] = (p.peak_rss_mb, first_update, p.wall_s)
    print(f"     {n:>13,} tokens: peak RSS {p.peak_rss_mb:.0f} MiB, first update after {first_update} s, "
          f"wall {p.wall_s:.1f} s")
small, big = stats[10_000_000], stats[1_000_000_000]
check(abs(big[0] - small[0]) < 50, f"peak RSS 1 B vs 10 M tokens within 50 MB ({big[0]:.0f} vs {small[0]:.0f} MiB)")
check(big[1] is not None and big[1] <= 2.0, f"1 B tokens: the first update within 2 s of the start ({big[1]} s)")

print("token shards: %s" % ("FAILED" if failures else "OK"))
sys.exit(1 if failures else 0)
