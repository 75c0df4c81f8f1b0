#!/usr/bin/env python3
"""What `normlab data tokenize` makes of its inputs (issue 59).

1. The tokenizer's training sample is drawn over all inputs, not from the first file: a corpus of a
   code file then a prose file gives prose its share of the sample, said on the console, and a
   tokenizer that encodes prose as well as one trained on prose alone (the first-lines sample gave
   prose 2.81 characters per token against 3.65 on code); the same seed gives the same tokenizer.

2. Compressed inputs are cut into pieces (and shards) as plain ones are, the same token stream.
3. Documents: paragraphs, files, JSONL records with newlines; --keep-newlines.
4. Files of formats normlab does not read (Parquet, ZIP, bzip2, misnamed gzip) are named as such.

usage: check_tokenize_inputs.py NORMLAB WORK_DIR
"""
import bz2
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import sentencepiece as spm

normlab, work = sys.argv[1:3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_checks import check, finish  # noqa: E402


def tokenize(inputs, out, *extra):
    args = [normlab, "data", "tokenize", *inputs, "--out", os.path.join(work, out), "--vocab-size",
            "400", "--cache-dir", os.path.join(work, "cache-" + out), *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


rng = random.Random(7)
SYLLABLES = "ba ke lo mi nu ra se ti vo wy an el or un is".split()
WORDS = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(300)})
IDENTS = "size_t uint32_t const struct static inline return void char buffer length offset".split()


def prose_line():
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() + "."


def code_line():
    return f"#define {rng.choice(IDENTS).upper()}_{rng.randint(0, 99)} ({rng.choice(IDENTS)}*)0x{rng.randint(0, 65535):04x}"


code = os.path.join(work, "code.h")
prose = os.path.join(work, "prose.txt")
with open(code, "w") as f:
    f.write("\n".join(code_line() for _ in range(3000)) + "\n")
with open(prose, "w") as f:
    f.write("\n".join(prose_line() for _ in range(3000)) + "\n\n\n")  # empty lines are not sampled
held_out = [prose_line() for _ in range(300)]

both = tokenize([code, prose], "both", "--sample-lines", "1000")
said = re.search(r"training the tokenizer on (\d+) of (\d+) non-empty lines, sampled uniformly over all "
                 r"inputs \(--sample-lines 1000, --sample-seed 0\): code\.h (\d+) of 3000, prose\.txt (\d+) of 3000",
                 both.stderr)
check(both.returncode == 0 and said is not None, f"the sample is said ({both.stderr.strip()[-400:]})")
if said:
    n, seen, from_code, from_prose = map(int, said.groups())
    # 1000 of 6000 lines, each file half of them: 500 ± 5 standard deviations (~13.6 each).
    check(n == 1000 and seen == 6000 and from_code + from_prose == 1000 and abs(from_prose - 500) < 70,
          f"each input its share: code {from_code}, prose {from_prose} of {n}")

prose_only = tokenize([prose], "prose", "--sample-lines", "1000")
code_only = tokenize([code], "code", "--sample-lines", "1000")
check(prose_only.returncode == 0 and code_only.returncode == 0, "one-input tokenizers")


def chars_per_token(out):
    sp = spm.SentencePieceProcessor(model_file=os.path.join(work, out, "tokenizer.model"))
    return sum(len(t) for t in held_out) / sum(len(sp.encode(t)) for t in held_out)


if both.returncode == 0 and prose_only.returncode == 0 and code_only.returncode == 0:
    b, p, c = chars_per_token("both"), chars_per_token("prose"), chars_per_token("code")
    # The sampled tokenizer, its vocabulary shared by prose and code, encodes held-out prose much
    # better than the code-only tokenizer that the first 1000 lines trained (3.75 vs 1.11 here).
    check(b > 0.6 * p and b > 2 * c,
          f"held-out prose: {b:.2f} characters per token (prose-only tokenizer {p:.2f}, code-only {c:.2f})")

again = tokenize([code, prose], "again", "--sample-lines", "1000")
same = (again.returncode == 0 and both.returncode == 0 and
        open(os.path.join(work, "again", "tokenizer.model"), "rb").read() ==
        open(os.path.join(work, "both", "tokenizer.model"), "rb").read())
check(same, "the same seed, trained afresh (another cache): the same tokenizer.model, byte for byte")
other = tokenize([code, prose], "seed1", "--sample-lines", "1000", "--sample-seed", "1")
moved = re.search(r"--sample-seed 1\): code\.h (\d+) of 3000", other.stderr)
check(other.returncode == 0 and moved is not None and said is not None and moved.group(1) != said.group(3),
      f"--sample-seed 1 draws another sample ({moved.group(0) if moved else other.stderr[-300:]})")

# 2. Compressed inputs are cut into pieces as plain ones are (issue 59.6): a .gz and a .zst of ~2.5 MB
#    of text with --piece-mb 1 give three shards each, tokenized in parallel, and the same token
#    stream as one piece per file; 1 and 2 jobs give the same shards; a rerun after a lost shard
#    keeps the others and ends with the same shards.json; a truncated .gz is one error line.


big = [prose_line() for _ in range(100000)]
gz, zst = os.path.join(work, "big.txt.gz"), os.path.join(work, "big.txt.zst")
with gzip.open(gz, "wt") as f:
    f.write("\n".join(big[:50000]) + "\n")
plain_zst = os.path.join(work, "big2.txt")
open(plain_zst, "w").write("\n".join(big[50000:]) + "\n")
subprocess.run(["zstd", "-q", "-f", plain_zst, "-o", zst], check=True)
text_mb = (len("\n".join(big[:50000])) + 1) / 2**20
model = os.path.join(work, "both", "tokenizer.model")


def stream(out):
    meta = json.load(open(os.path.join(work, out, "shards.json")))
    return meta, np.concatenate([np.fromfile(os.path.join(work, out, s["file"]), np.uint16) for s in meta["shards"]])


one = tokenize([gz, zst], "whole", "--model", model)
pieces1 = tokenize([gz, zst], "pieces1", "--model", model, "--piece-mb", "1", "--jobs", "1")
pieces2 = tokenize([gz, zst], "pieces2", "--model", model, "--piece-mb", "1", "--jobs", "2")
check(one.returncode == 0 and pieces1.returncode == 0 and pieces2.returncode == 0,
      f"tokenize .gz + .zst, whole and in 1 MiB pieces ({pieces2.stderr.strip()[-300:]})")
if one.returncode == 0 and pieces1.returncode == 0 and pieces2.returncode == 0:
    m1, s1 = stream("whole")
    mp, sp_ = stream("pieces1")
    mp2, _ = stream("pieces2")
    want = 2 * int(np.ceil(text_mb))
    check(len(m1["shards"]) == 2 and len(mp["shards"]) == want,
          f"{text_mb:.1f} MiB of text per file: {len(mp['shards'])} shards in 1 MiB pieces (want {want}), 2 whole")
    check(np.array_equal(s1, sp_), f"the same {len(s1)} tokens in the same order as one piece per file")
    check(mp["shards"] == mp2["shards"], "--jobs 1 and --jobs 2: the same shards, SHA-256 for SHA-256")
    os.remove(os.path.join(work, "pieces2", mp2["shards"][-2]["file"]))
    again = tokenize([gz, zst], "pieces2", "--model", model, "--piece-mb", "1", "--jobs", "2")
    kept = f"{len(mp2['shards']) - 1} of {len(mp2['shards'])} shards done by an earlier run, kept"
    check(again.returncode == 0 and kept in again.stderr and stream("pieces2")[0]["shards"] == mp2["shards"],
          f"a lost piece of the .zst: the others kept, the same shards.json ({again.stderr.strip()[-200:]})")
cut = os.path.join(work, "cut.txt.gz")
open(cut, "wb").write(open(gz, "rb").read()[:-5000])
bad = tokenize([cut], "cut", "--model", model, "--piece-mb", "1")
errors = [line for line in bad.stderr.splitlines() if line.startswith("normlab: error")]
check(bad.returncode == 2 and len(errors) == 1 and "cut.txt.gz: truncated or corrupt" in errors[0],
      f"a truncated .gz: one error line ({errors})")

# 3. Documents (issue 59.2): --documents paragraphs / files make one document (one EOS) of lines up
#    to a blank line / of a whole file, encoded as SentencePiece encodes its whole text; pieces never
#    cut a paragraph; with --keep-newlines the trained tokenizer keeps newlines and indentation
#    (decoding a document gives its text back), and JSONL records keep theirs; a default tokenizer
#    makes newlines spaces, and its word cache takes documents with newlines and double spaces
#    (issue 59.5: such JSONL records were all "encoded whole").
sp_default = spm.SentencePieceProcessor(model_file=model)
paragraphs = ["\n".join(prose_line() for _ in range(rng.randint(1, 5))) for _ in range(6000)]
para_file = os.path.join(work, "paragraphs.txt")
open(para_file, "w").write("\n\n".join(paragraphs) + "\n")
files = [os.path.join(work, f"file{i}.txt") for i in range(3)]
for i, f in enumerate(files):
    open(f, "w").write("\n".join(paragraphs[i * 10:(i + 1) * 10]) + "\n")


def docs_of(out):
    meta, ids = stream(out)
    docs, start = [], 0
    for k in np.flatnonzero(ids == meta["eos_id"]):
        docs.append(ids[start:k].tolist())
        start = k + 1
    return docs, start == len(ids)


for what, inputs, extra, texts in (
        ("paragraphs", [para_file], ["--documents", "paragraphs"], paragraphs),
        ("paragraphs in 1 MiB pieces", [para_file], ["--documents", "paragraphs", "--piece-mb", "1"], paragraphs),
        ("files", files, ["--documents", "files"], ["\n".join(paragraphs[i * 10:(i + 1) * 10]) for i in range(3)])):
    out = "docs_" + what.replace(" ", "_")
    t = tokenize(inputs, out, "--model", model, "--jobs", "2", *extra)
    if t.returncode != 0:
        check(False, f"--documents {what} ({t.stderr.strip()[-300:]})")
        continue
    docs, ends = docs_of(out)
    check(ends and len(docs) == len(texts) and all(d == sp_default.encode(x) for d, x in zip(docs, texts)),
          f"--documents {what}: {len(docs)} documents (want {len(texts)}), each SentencePiece's ids of its whole text")
    t2 = tokenize(inputs, out + "_whole", "--model", model, "--no-word-cache", *extra)
    check(t2.returncode == 0 and stream(out + "_whole")[0]["shards"] == stream(out)[0]["shards"],
          f"--documents {what}: --no-word-cache (documents encoded whole) writes the same shards")
pieces_meta = stream("docs_paragraphs_in_1_MiB_pieces")[0] if os.path.exists(os.path.join(work, "docs_paragraphs_in_1_MiB_pieces")) else {"shards": []}
check(len(pieces_meta["shards"]) >= 2, f"the paragraphs file in {len(pieces_meta['shards'])} pieces, none cut inside a paragraph")

# JSONL records with newlines, tabs and double spaces: the default tokenizer's word cache takes them.
records = [paragraphs[i].replace(" ", "  ", 1) + "\n\t" + prose_line() for i in range(2000)]
jsonl = os.path.join(work, "records.jsonl")
with open(jsonl, "w") as f:
    for r in records:
        f.write(json.dumps({"text": r}) + "\n")
tj = tokenize([jsonl], "records", "--model", model)
whole_lines = re.search(r"(\d+) lines encoded whole", tj.stderr)
docs, _ = docs_of("records") if tj.returncode == 0 else ([], False)
check(whole_lines is not None and whole_lines.group(1) == "0" and
      docs == [sp_default.encode(r) for r in records],
      f"JSONL records with newlines and double spaces: none encoded whole, SentencePiece's ids ({whole_lines.group(0) if whole_lines else tj.stderr[-200:]})")

# --keep-newlines: code with indentation, paragraphs as documents, decoded back exactly.
code_paras = ["\n".join(("    " * rng.randint(0, 2)) + code_line() for _ in range(rng.randint(2, 4))) for _ in range(1500)]
code_file = os.path.join(work, "code_paragraphs.txt")
open(code_file, "w").write("\n\n".join(code_paras) + "\n")
keep = tokenize([code_file, jsonl], "keep", "--keep-newlines", "--documents", "paragraphs", "--sample-lines", "3000")
if keep.returncode == 0:
    sp_keep = spm.SentencePieceProcessor(model_file=os.path.join(work, "keep", "tokenizer.model"))
    docs, _ = docs_of("keep")
    want = code_paras + records
    check(len(docs) == len(want) and all(sp_keep.decode(d) == x for d, x in zip(docs, want)),
          f"--keep-newlines: {len(docs)} documents decode to their text, newlines and indentation kept")
    # Indented lines go through the word cache as segments (issue 59.2: they were encoded whole).
    kept_whole = re.search(r"(\d+) lines encoded whole", keep.stderr)
    check(kept_whole is not None and kept_whole.group(1) == "0",
          f"--keep-newlines: indented documents through the word cache, none encoded whole "
          f"({kept_whole.group(0) if kept_whole else keep.stderr[-200:]})")
    check(sp_keep.encode("a\n  b") != sp_keep.encode("a b") and sp_default.encode("a\n  b") == sp_default.encode("a b"),
          "--keep-newlines tokenizes 'a\\n  b' apart from 'a b'; the default tokenizer does not")
    kw = tokenize([code_file, jsonl], "keep_whole", "--keep-newlines", "--documents", "paragraphs",
                  "--sample-lines", "3000", "--no-word-cache")
    check(kw.returncode == 0 and stream("keep_whole")[0]["shards"] == stream("keep")[0]["shards"],
          "--keep-newlines: the word cache writes the same shards as whole documents")
else:
    check(False, f"--keep-newlines ({keep.stderr.strip()[-300:]})")

# 4. Files of another format are named (issue 59.11: a Parquet file failed as "invalid UTF-8 at
#    byte 24"), plain or inside a .gz, by `data tokenize` and by a text run's data.train.

formats = {
    "data.parquet": (b"PAR1\x15\x04\x15\x80\x01" + bytes(range(256)) * 2, "a Parquet file, not text"),
    "data.txt.bz2": (bz2.compress(b"hello world\n" * 100), "bzip2 data"),
    "corpus.txt": (gzip.compress(b"hello world\n" * 100), "gzip data in a file not named .gz"),
    "inner.parquet.gz": (gzip.compress(b"PAR1" + bytes(300)), "a Parquet file, not text"),
}
zbuf = os.path.join(work, "data.zip")
with zipfile.ZipFile(zbuf, "w") as z:
    z.writestr("a.txt", "hello world\n")
formats["data.zip"] = (open(zbuf, "rb").read(), "a ZIP archive, not text")
for name, (data, needle) in formats.items():
    path = os.path.join(work, name)
    open(path, "wb").write(data)
    t = tokenize([path], "fmt_" + name.replace(".", "_"), "--model", model)
    errors = [line for line in t.stderr.splitlines() if line.startswith("normlab: error")]
    check(t.returncode == 2 and len(errors) == 1 and f"{name}: {needle}" in errors[0],
          f"tokenize {name}: one error line naming its format ({errors})")
run_manifest = os.path.join(work, "parquet_run.toml")
open(run_manifest, "w").write(f"""[model]
arch = "lm"
d_model = 16
heads = 2
dec_layers = 1
[data]
task = "lm"
train = "{os.path.join(work, 'data.parquet')}"
cache_dir = "{work}/cache"
[run]
out_dir = "{work}/parquet_run"
""")
tr = subprocess.run([normlab, "train", run_manifest], capture_output=True, text=True, timeout=120)
errors = [line for line in tr.stderr.splitlines() if line.startswith("normlab: error")]
check(tr.returncode == 2 and len(errors) == 1 and "data.parquet': a Parquet file, not text" in errors[0],
      f"a text run's data.train = a Parquet file: one error line naming its format ({errors or tr.stderr[-300:]})")

finish("tokenize inputs")
