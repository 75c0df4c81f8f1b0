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
import base64
import bz2
import gzip
import hashlib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import sentencepiece as spm

normlab, work = sys.argv[1:3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_checks import check, finish  # noqa: E402


def tokenize(inputs, out, *extra, cache=None):
    vocab = [] if "--vocab-size" in extra else ["--vocab-size", "400"]
    args = [normlab, "data", "tokenize", *inputs, "--out", os.path.join(work, out), *vocab,
            "--cache-dir", os.path.join(work, "cache-" + (cache or out)), *extra]
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

# 2. Compressed inputs are cut into pieces as plain ones are (issue 59.6): a .gz and a .zst of ~2.3 MiB
#    of text with --piece-mb 1 give three shards each (a first, a middle and a last piece), tokenized
#    in parallel, and the same token stream as one piece per file; 1 and 2 jobs give the same shards;
#    a rerun after a lost shard keeps the others and ends with the same shards.json; a truncated .gz
#    is one error line.


# 40,000 lines (~2.3 MiB) per file: more than 2 MiB, so still three pieces each (was 50,000, ~2.9 MiB).
big = [prose_line() for _ in range(80000)]
gz, zst = os.path.join(work, "big.txt.gz"), os.path.join(work, "big.txt.zst")
with gzip.open(gz, "wt") as f:
    f.write("\n".join(big[:40000]) + "\n")
plain_zst = os.path.join(work, "big2.txt")
open(plain_zst, "w").write("\n".join(big[40000:]) + "\n")
subprocess.run(["zstd", "-q", "-f", plain_zst, "-o", zst], check=True)
text_mb = (len("\n".join(big[:40000])) + 1) / 2**20
model = os.path.join(work, "both", "tokenizer.model")


def shard_bytes(out):
    meta = json.load(open(os.path.join(work, out, "shards.json")))
    return meta, [open(os.path.join(work, out, s["file"]), "rb").read() for s in meta["shards"]]


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
    check(len(m1["shards"]) == 2 and len(mp["shards"]) == want and text_mb > 2,
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


# The shards of fresh runs (into an empty --out) by their inputs' and --model's contents and options,
# so that section 5 compares a rerun with a fresh run made once rather than making it again.
fresh_runs = {}


def run_key(inputs, options):
    digest = lambda path: hashlib.sha256(open(path, "rb").read()).hexdigest()  # noqa: E731
    return (tuple(map(digest, inputs)),
            tuple(digest(o) if prev == "--model" else o for prev, o in zip([None] + list(options), options)))


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
    fresh_runs[run_key(inputs, ["--model", model, "--jobs", "2", *extra])] = shard_bytes(out)
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
    # keep's tokenizer cache: the same tokenizer (section 1: one seed, one model), not trained again.
    kw = tokenize([code_file, jsonl], "keep_whole", "--keep-newlines", "--documents", "paragraphs",
                  "--sample-lines", "3000", "--no-word-cache", cache="keep")
    check(kw.returncode == 0 and stream("keep_whole")[0]["shards"] == stream("keep")[0]["shards"],
          "--keep-newlines: the word cache writes the same shards as whole documents")
else:
    check(False, f"--keep-newlines ({keep.stderr.strip()[-300:]})")

# 4. Files of another format are named (issue 59.11: a Parquet file failed as "invalid UTF-8 at
#    byte 24"), plain or inside a .gz, by `data tokenize` and by a text run's data.train.

# A plain file's end is known: Parquet needs its footer there (a struct's stop byte, the footer's
# length, "PAR1"); only a stream (.gz) is told by binary bytes after "PAR1" (issue 66, D).
formats = {
    "data.parquet": (b"PAR1\x15\x04\x15\x80\x01" + bytes(range(256)) * 2 + b"\x15\x02\x00" +
                     (3).to_bytes(4, "little") + b"PAR1", "a Parquet file, not text"),
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

# 5. Issue 66.3: tokenizing into an --out again with another option kept the earlier run's shards
#    ("1 of 1 shards done by an earlier run, kept": --documents was not in the journal's key). Each
#    option that changes the tokens, changed between two runs into one --out, gives the shards of a
#    fresh run with the second options, byte for byte: --documents, --jsonl-field, --piece-mb, the
#    --model file's content (at one path: its vocabulary, so the dtype, and its EOS), the trained
#    tokenizer's --vocab-size / --sample-seed / --keep-newlines, and an input rewritten in place
#    with its size and time kept. An unchanged rerun keeps them all.


small = os.path.join(work, "small.txt")
small_text = "\n\n".join(code_paras[:300]) + "\n"
open(small, "w").write(small_text)
two_fields = os.path.join(work, "two_fields.jsonl")
with open(two_fields, "w") as f:
    for i in range(300):
        f.write(json.dumps({"text": prose_line(), "body": code_paras[i]}) + "\n")
same_path_model = os.path.join(work, "swapped.model")
shutil.copyfile(model, same_path_model)
# A LLaMA-like model (unk 0, bos 1, eos 2) of 66,014 pieces: uint32 shards.
wide = io.BytesIO()
spm.SentencePieceTrainer.train(
    sentence_iterator=iter(code_paras[:500] + records[:500]), model_writer=wide, vocab_size=70000,
    model_type="char", user_defined_symbols=[f"\u4e00{i}" for i in range(66000)],
    hard_vocab_limit=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)


def swap_model(data):
    def swap():
        open(same_path_model, "wb").write(data)
    return swap


def rewrite_small():
    # Another text of the same size, its modification time put back.
    st = os.stat(small)
    other = small_text.replace("return", "RETURN").replace("static", "STATIC")
    assert len(other) == len(small_text) and other != small_text
    open(small, "w").write(other)
    os.utime(small, ns=(st.st_atime_ns, st.st_mtime_ns))


# The fresh run a rerun is compared with is made once: "paragraphs, then files" first makes the fresh
# run of "lines, then paragraphs", section 3 the one of "--piece-mb 64, then 1", "an input rewritten"
# the one of "nothing changed" (fresh_runs: the same inputs' contents, the same options).
for what, inputs, first, second, between in (
        ("--documents paragraphs, then files", [small], ["--model", model, "--documents", "paragraphs"], ["--model", model, "--documents", "files"], None),
        ("--documents lines, then paragraphs", [small], ["--model", model], ["--model", model, "--documents", "paragraphs"], None),
        ("--jsonl-field text, then body", [two_fields], ["--model", model], ["--model", model, "--jsonl-field", "body"], None),
        ("--piece-mb 64, then 1", [para_file], ["--model", model, "--jobs", "2", "--documents", "paragraphs"],
         ["--model", model, "--jobs", "2", "--documents", "paragraphs", "--piece-mb", "1"], None),
        ("another --model at the same path", [small], ["--model", same_path_model], ["--model", same_path_model], swap_model(wide.getvalue())),
        ("--vocab-size 400, then 300", [small, prose], ["--vocab-size", "400"], ["--vocab-size", "300"], None),
        ("--sample-seed 0, then 1", [small, prose], ["--sample-lines", "300"], ["--sample-lines", "300", "--sample-seed", "1"], None),
        ("--keep-newlines off, then on", [small, prose], ["--documents", "paragraphs"], ["--documents", "paragraphs", "--keep-newlines"], None),
        ("an input rewritten in place, its size and time kept", [small], ["--model", model], ["--model", model], rewrite_small),
        ("nothing changed", [small], ["--model", model], ["--model", model], None)):
    out = "again_" + re.sub(r"[^a-z0-9]+", "_", what).strip("_")
    t1 = tokenize(inputs, out, *first)
    if t1.returncode == 0:
        fresh_runs.setdefault(run_key(inputs, first), shard_bytes(out))
    if between:
        between()
    t2 = tokenize(inputs, out, *second)
    key = run_key(inputs, second)
    fresh = None if key in fresh_runs else tokenize(inputs, out + "_fresh", *second)
    if t1.returncode or t2.returncode or (fresh and fresh.returncode):
        check(False, f"rerun with {what} ({(t1.stderr + t2.stderr + (fresh.stderr if fresh else '')).strip()[-400:]})")
        continue
    if fresh:
        fresh_runs[key] = shard_bytes(out + "_fresh")
    (m2, b2), (mf, bf) = shard_bytes(out), fresh_runs[key]
    kept = re.search(r"(\d+) of (\d+) shards done by an earlier run, kept", t2.stderr)
    same = b2 == bf and {k: v for k, v in m2.items() if k != "tokenizer"} == {k: v for k, v in mf.items() if k != "tokenizer"}
    if what == "nothing changed":
        check(same and kept is not None and kept.group(1) == kept.group(2),
              f"rerun with {what}: every shard kept ({kept.group(0) if kept else 'none kept'}), the fresh run's shards")
    else:
        check(same and kept is None, f"rerun with {what}: the fresh run's shards, byte for byte "
              f"({kept.group(0) if kept else 'none kept'}; {len(b2)} shards, {sum(map(len, b2))} bytes "
              f"vs {len(bf)}, {sum(map(len, bf))}; dtype {m2.get('dtype')} vs {mf.get('dtype')})")
wide_json = os.path.join(work, "again_another_model_at_the_same_path", "shards.json")
wide_meta = json.load(open(wide_json)) if os.path.exists(wide_json) else {}
check(wide_meta.get("dtype") == "uint32" and wide_meta.get("eos_id") == 2,
      f"the swapped model (66,014 pieces) made uint32 shards with eos 2, the first uint16 with eos 3 "
      f"({wide_meta.get('dtype')}, eos {wide_meta.get('eos_id')})")

# 6. Issue 66.11: --documents files with a tokenizer that keeps newlines dropped a file's leading
#    blank lines, its final newline and its CRs. A file is one document, its text exactly: the ids
#    are SentencePiece's of the whole file (python sentencepiece), with the word cache or without,
#    for a --keep-newlines model and the default one (which makes newlines spaces).
edge_files = {
    "leading_blank.txt": "\n\n  first line\n    indented\nlast\n",
    "crlf.txt": "def f():\r\n    return 1\r\n\r\nx = f()\r\n",
    "no_final_newline.txt": "a line\n\tand a tab",
    "trailing_blank.txt": "text\n\n\n",
    "newline_only.txt": "\n",
    "lone_cr.txt": "one\rtwo \r\n  \n",
}
edge_paths = []
for name, text in edge_files.items():
    edge_paths.append(os.path.join(work, name))
    open(edge_paths[-1], "w", newline="").write(text)
keep_model = os.path.join(work, "keep", "tokenizer.model")
for label, m in (("--keep-newlines model", keep_model), ("default model", model)):
    if not os.path.exists(m):
        check(False, f"--documents files, {label}: no model")
        continue
    sp_m = spm.SentencePieceProcessor(model_file=m)
    want = [sp_m.encode(t) for t in edge_files.values()]
    for extra in ([], ["--no-word-cache"]):
        out = "files_exact_" + re.sub(r"[^a-z]+", "_", label + " ".join(extra))
        t = tokenize(edge_paths, out, "--model", m, "--documents", "files", *extra)
        docs, ends = docs_of(out) if t.returncode == 0 else ([], False)
        bad = [name for name, d, w in zip(edge_files, docs, want) if d != w]
        check(t.returncode == 0 and ends and len(docs) == len(want) and not bad,
              f"--documents files, {label} {' '.join(extra)}: each file's ids are SentencePiece's of its "
              f"whole text ({len(docs)} documents; differ: {bad}; {t.stderr.strip()[-200:] if t.returncode else ''})")

# 7. Issue 66.9: the tokenizer's sample stopped at the first empty JSONL record (1 of 3,000 drawn
#    when it was the first, as wikitext's JSONL begins). The sample is --sample-lines of the
#    non-empty records, drawn over all of them.
wiki = os.path.join(work, "wiki.jsonl")
wiki_records = ["" if i % 3 == 0 else prose_line() for i in range(3000)]
with open(wiki, "w") as f:
    for r in wiki_records:
        f.write(json.dumps({"text": r}) + "\n")
non_empty = sum(1 for r in wiki_records if r)
tw = tokenize([wiki], "wiki", "--sample-lines", "1000")
drawn = re.search(r"training the tokenizer on (\d+) of (\d+) non-empty lines", tw.stderr)
check(tw.returncode == 0 and drawn is not None and drawn.groups() == ("1000", str(non_empty)),
      f"JSONL beginning with an empty record: 1000 of its {non_empty} non-empty records drawn "
      f"({drawn.group(0) if drawn else tw.stderr.strip()[-300:]})")

# 8. Issue 66.20: text beginning "PAR1", or with "ustar" at byte 257, is text (it was refused as
#    Parquet / tar), plain and in a .gz; real Parquet and tar files are
#    still named: a Parquet file of apache/parquet-testing (data/rle_boolean_encoding.parquet,
#    Apache-2.0), and tar archives of Python's tarfile (ustar, GNU, PAX) and of GNU tar.
REAL_PARQUET = base64.b64decode(
    "UEFSMRUGFTQVXFwViAEVDBWIARUGFRYVBAAAiAEH+39/HAEJ/vu/Px+LCAAAAAAAAADjZGBgEDx7M4dvtvF2SwBz8kmUDQAAABUC"
    "GSxIBXRhYmxlFQIAFQAlAhgQZGF0YXR5cGVfYm9vbGVhblUCABaIARkcGRwmABwVABkVBhkYEGRhdGF0eXBlX2Jvb2xlYW4VBBaI"
    "ARZiFooBJgg8GAEBGAEAFgwoAQEYAQAAAAAWigEWiAEAAG8AAABQQVIx")
par_text = "PAR1 begins this text about pairs.\n" + "\n".join(prose_line() for _ in range(40)) + "\nPAR1"
ustar_text = "w" * 257 + "ustar is a word here\n" + "\n".join(prose_line() for _ in range(40)) + "\n"
text_like = {"par1.txt": par_text.encode(), "par1.txt.gz": gzip.compress(par_text.encode()),
             "ustar.txt": ustar_text.encode(), "ustar.txt.gz": gzip.compress(ustar_text.encode())}
for name, data in text_like.items():
    open(os.path.join(work, name), "wb").write(data)
# One run for the four (one process, not four): a refused input is an error naming it; each input is
# a shard of its own.
t = tokenize([os.path.join(work, name) for name in text_like], "text_like", "--model", model)
text_shards = json.load(open(os.path.join(work, "text_like", "shards.json")))["shards"] if t.returncode == 0 else []
for i, name in enumerate(text_like):
    check(t.returncode == 0 and len(text_shards) == len(text_like) and text_shards[i]["tokens"] > 0,
          f"tokenize {name} (text): tokenized ({t.stderr.strip()[-200:]})")
tar_members = os.path.join(work, "members")
os.makedirs(tar_members, exist_ok=True)
open(os.path.join(tar_members, "a.txt"), "w").write("hello world\n" * 50)
real = {"real.parquet": REAL_PARQUET, "real.parquet.gz": gzip.compress(REAL_PARQUET)}
for fmt_name, fmt_id in (("ustar", tarfile.USTAR_FORMAT), ("gnu", tarfile.GNU_FORMAT), ("pax", tarfile.PAX_FORMAT)):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt_id) as tf:
        tf.add(os.path.join(tar_members, "a.txt"), arcname="a.txt")
    real[f"python_{fmt_name}.tar"] = buf.getvalue()
gnu_tar = subprocess.run(["tar", "-cf", "-", "-C", tar_members, "a.txt"], capture_output=True, check=True).stdout
real["gnu.tar"] = gnu_tar
real["gnu.tar.gz"] = gzip.compress(gnu_tar)
for name, data in real.items():
    path = os.path.join(work, name)
    open(path, "wb").write(data)
    needle = "a Parquet file, not text" if "parquet" in name else "a tar archive, not text"
    t = tokenize([path], "real_" + name.replace(".", "_"), "--model", model)
    errors = [line for line in t.stderr.splitlines() if line.startswith("normlab: error")]
    check(t.returncode == 2 and len(errors) == 1 and f"{name}: {needle}" in errors[0],
          f"tokenize {name}: one error line naming its format ({errors})")

finish("tokenize inputs")
