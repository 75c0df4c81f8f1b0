#!/usr/bin/env python3
"""`normlab data tokenize` on the real text of this machine (issue 59.5, 59.8), one call:
- prose (../shared/data's Multi30k English captions and tinyshakespeare, the machine's
  /usr/share/doc text files) and code (C headers of /usr/include, Python of /usr/lib/python3*),
  up to --mb MB each, as plain text (a document per line) and as JSONL (a record per source file,
  newlines inside), on 1 and --jobs jobs (pieces of 4 MiB, so that both jobs have work): tokens/s
  and peak RSS (the child's own, os.wait4);
- the JSONL/plain ratios of both, time and memory (the target: within 1.3x of plain text's), and
  JSONL with every record encoded whole by SentencePiece (--no-word-cache), as records with
  newlines were before (issue 59.5: 2.3-2.8x slower, 2.0 GB against 0.3-0.46 GB).
- newlines kept (issue 59.2): the same text as documents with their newlines (plain
  `--documents paragraphs`, and JSONL) through the default tokenizer and a `--keep-newlines` one,
  each through the word cache and encoded whole (--no-word-cache), 1 job: the target is the
  default tokenizer's speed.
A BPE tokenizer of --vocab tokens is trained once on a sample of both and used for every run (and a
`--keep-newlines` one for that section). Run it on a quiet machine (nothing else running): it
prints Markdown tables for docs/data.md.

usage: tokenize_inputs.py [--normlab build/bin/normlab] [--work DIR] [--mb 40] [--jobs N] [--vocab 8000]
                          [--section all|jsonl|newlines]
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("--normlab", default="build/bin/normlab")
ap.add_argument("--work", default="/tmp/normlab-tokenize-inputs")
ap.add_argument("--mb", type=float, default=40)
ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
ap.add_argument("--vocab", type=int, default=8000)
ap.add_argument("--section", choices=["all", "jsonl", "newlines"], default="all")
args = ap.parse_args()
shutil.rmtree(args.work, ignore_errors=True)
os.makedirs(args.work)
here = os.path.dirname(os.path.abspath(__file__))
shared = os.path.join(here, "..", "..", "shared", "data")


def gather(patterns, limit):
    """(name, text) of the files the patterns match, in sorted order, up to `limit` bytes."""
    out, size = [], 0
    for pattern in patterns:
        for path in sorted(glob.glob(pattern, recursive=True)):
            try:
                text = open(path, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            if not text.strip():
                continue
            out.append((path, text))
            size += len(text.encode())
            if size >= limit:
                return out
    return out


limit = int(args.mb * 1e6)
corpora = {
    "prose": gather([os.path.join(shared, "multi30k", "train.en"), os.path.join(shared, "tinyshakespeare", "input.txt"),
                     "/usr/share/doc/**/*.txt", "/usr/share/doc/**/README*", "/usr/share/common-licenses/*"], limit),
    "code": gather(["/usr/include/**/*.h", "/usr/lib/python3*/**/*.py"], limit),
}


def write(kind, docs):
    plain = os.path.join(args.work, f"{kind}.txt")
    jsonl = os.path.join(args.work, f"{kind}.jsonl")
    with open(plain, "w") as p, open(jsonl, "w") as j:
        for _, text in docs:
            p.write(text if text.endswith("\n") else text + "\n")
            j.write(json.dumps({"text": text}) + "\n")
    return plain, jsonl


# The machine holds little prose: copied until it is at least half of --mb (said in the table).
copies = 1
while sum(len(t) for _, t in corpora["prose"]) * copies < limit / 2:
    copies += 1
corpora["prose"] = corpora["prose"] * copies
files = {kind: write(kind, docs) for kind, docs in corpora.items()}


def tokenize(inputs, jobs, extra=()):
    out = os.path.join(args.work, "shards")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.normlab, "data", "tokenize", *inputs, "--out", out, "--jobs", str(jobs),
           "--cache-dir", os.path.join(args.work, "cache"), *extra]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{err[-2000:]}")
    m = re.search(r"tokenize: (\d+) tokens in \d+ shards .* in ([0-9.]+) s", err)
    whole = re.search(r"(\d+) lines encoded whole", err)
    # Seconds: the whole command's (its own figure has one decimal), loading the model included.
    return int(m.group(1)), time.monotonic() - t0, usage.ru_maxrss / 1024.0, whole.group(1) if whole else "-"


def train_tokenizer(name, extra=()):
    """A tokenizer trained on a sample of both corpora's plain text, kept as `name`."""
    tokenize([files["prose"][0], files["code"][0]], 1,
             ["--vocab-size", str(args.vocab), "--sample-lines", "200000", *extra])
    path = os.path.join(args.work, name)
    shutil.copy(os.path.join(args.work, "shards", "tokenizer.model"), path)
    return path


def fastest(inputs, jobs, extra, runs=3):
    """The fastest of `runs` runs: a shared machine's noise only ever slows a run down."""
    return min((tokenize(inputs, jobs, extra) for _ in range(runs)), key=lambda r: r[1])


model = train_tokenizer("tokenizer.model")


def jsonl_section():
    """Plain text against JSONL, both through the word cache (issue 59.5)."""
    print(f"`normlab data tokenize`, BPE {args.vocab:,} trained on a sample of both, {os.cpu_count()} cores, "
          f"`--model` given (tokenizing only):")
    print()
    print("| text | form | jobs | MB | tokens | tokens/s | peak RSS | lines encoded whole |")
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for kind in ("prose", "code"):
        plain, jsonl = files[kind]
        mb = os.path.getsize(plain) / 1e6
        for form, path in (("plain, a document per line", plain), ("JSONL, a record per file", jsonl)):
            for jobs in sorted({1, args.jobs}):
                tokens, secs, rss, whole = fastest([path], jobs, ["--model", model, "--piece-mb", "4"])
                rows[(kind, form[:5], jobs)] = (secs, rss)
                print(f"| {kind} ({len(corpora[kind]) // (copies if kind == 'prose' else 1)} files"
                      f"{f', {copies} copies' if kind == 'prose' and copies > 1 else ''}) | {form} | {jobs} | {mb:.0f} | {tokens:,} | "
                      f"{tokens / secs / 1e6:.2f} M | {rss:.0f} MiB | {whole} |", flush=True)
        # Every record encoded whole by SentencePiece (--no-word-cache): how JSONL documents with
        # newlines were tokenized before the word cache split at collapsing whitespace (issue 59.5).
        tokens, secs, rss, whole = tokenize([jsonl], 1, ["--model", model, "--piece-mb", "4", "--no-word-cache"])
        rows[(kind, "whole", 1)] = (secs, rss)
        print(f"| {kind} | JSONL, every record whole (--no-word-cache) | 1 | {mb:.0f} | {tokens:,} | "
              f"{tokens / secs / 1e6:.2f} M | {rss:.0f} MiB | all |", flush=True)
    print()
    print("The same text each time (a JSONL record holds a file's lines), so seconds compare:")
    for kind in ("prose", "code"):
        (ps, pm), (ws, wm) = rows[(kind, "plain", 1)], rows[(kind, "whole", 1)]
        print(f"- {kind}, 1 job: JSONL records encoded whole took {ws / ps:.2f}x plain text's time, {wm / pm:.2f}x its peak RSS")
        for jobs in sorted({1, args.jobs}):
            (ps, pm), (js, jm) = rows[(kind, "plain", jobs)], rows[(kind, "JSONL", jobs)]
            print(f"- {kind}, {jobs} job(s): JSONL took {js / ps:.2f}x plain text's time, {jm / pm:.2f}x its peak RSS")


def newlines_section():
    """Documents with their newlines: the default tokenizer (newlines are spaces to it) against a
    --keep-newlines one, through the word cache and whole (issue 59.2)."""
    kept = train_tokenizer("tokenizer-keep-newlines.model", ["--keep-newlines"])
    print(f"Documents with their newlines, BPE {args.vocab:,} each, 1 job, `--model` given, "
          f"`--piece-mb 4`; the fastest of 3 runs:")
    print()
    print("| text | form | tokenizer | encoding | MB | tokens | tokens/s | seconds | peak RSS | documents whole |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = {}
    for kind in ("prose", "code"):
        plain, jsonl = files[kind]
        mb = os.path.getsize(plain) / 1e6
        for form, inputs, extra in (("plain, --documents paragraphs", [plain], ["--documents", "paragraphs"]),
                                    ("JSONL, a record per file", [jsonl], [])):
            for name, tok in (("default", model), ("--keep-newlines", kept)):
                for encoding, more in (("word cache", []), ("whole (--no-word-cache)", ["--no-word-cache"])):
                    tokens, secs, rss, whole = fastest(inputs, 1, ["--model", tok, "--piece-mb", "4", *extra, *more],
                                                       runs=3 if not more else 1)
                    rows[(kind, form[:5], name, encoding[:5])] = secs
                    print(f"| {kind} | {form} | {name} | {encoding} | {mb:.0f} | {tokens:,} | "
                          f"{tokens / secs / 1e6:.2f} M | {secs:.1f} | {rss:.0f} MiB | {whole if not more else 'all'} |",
                          flush=True)
    print()
    for kind in ("prose", "code"):
        for form in ("plain", "JSONL"):
            d, k, w = (rows[(kind, form, n, e)] for n, e in
                       (("default", "word "), ("--keep-newlines", "word "), ("--keep-newlines", "whole")))
            print(f"- {kind}, {form}: --keep-newlines took {k / d:.2f}x the default tokenizer's time "
                  f"(encoded whole: {w / d:.2f}x)")


if args.section in ("all", "jsonl"):
    jsonl_section()
if args.section in ("all", "newlines"):
    if args.section == "all":
        print()
    newlines_section()
