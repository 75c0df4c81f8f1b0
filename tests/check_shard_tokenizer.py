#!/usr/bin/env python3
"""A model trained on normlab token shards meets text again (issue 59.3): shards.json records the
SentencePiece model, and the run, `forward`, `eval --tasks` and the export use it.

- `forward` on text encodes each line into exactly the ids `data tokenize` wrote for it (the
  shard's ids, line for line), and `forward --ids` with those ids gives the same log-probabilities;
  a bad id is one error line naming file:line.
- `eval --tasks` scores a text task (it refused: "token shards have no tokenizer here").
- The HF export holds the shards' tokenizer.model, eos_token_id = shards.json's eos_id, and a
  tokenizer_config.json naming transformers' own SentencePieceBackend, and no Python (issue 66.15):
  `AutoTokenizer.from_pretrained(DIR)` without remote code encodes as normlab does, id for id with
  `data tokenize` on adversarial documents (spaces at the ends and doubled, tabs, newlines, NFKC
  forms, unknown characters, text spelling special tokens, the empty string), for this default model
  and for a `--keep-newlines` one (spaces and newlines kept, byte fallback) beside the same config.

usage: check_shard_tokenizer.py NORMLAB PLUGIN_DIR TESTS_DIR WORK_DIR   (the venv's python)
"""
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import sentencepiece as spm

normlab, plugins, tests_dir, work = sys.argv[1:5]
sys.path.insert(0, tests_dir)
from cli_checks import check, finish, one_error, run, said, write_tiny_llama_manifest  # noqa: E402

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

rng = random.Random(3)
SYLLABLES = "ba ke lo mi nu ra se ti vo wy an el or un is".split()
WORDS = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(200)})
lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))) for _ in range(3000)]
corpus = os.path.join(work, "corpus.txt")
open(corpus, "w").write("\n".join(lines) + "\n")
shards = os.path.join(work, "shards")
t = run(normlab, "data", "tokenize", corpus, "--out", shards, "--vocab-size", "300",
        "--sample-lines", "2000", "--cache-dir", os.path.join(work, "cache"))
check(t.returncode == 0, f"tokenize ({t.err.strip()[-200:]})")
meta = json.load(open(os.path.join(shards, "shards.json")))
sp = spm.SentencePieceProcessor(model_file=os.path.join(shards, "tokenizer.model"))
ids = np.frombuffer(open(os.path.join(shards, meta["shards"][0]["file"]), "rb").read(), np.uint16)
first_line = ids[:list(ids).index(meta["eos_id"])].tolist()
check(first_line == sp.encode(lines[0]), "the shard's first line is SentencePiece's ids of it")

manifest = write_tiny_llama_manifest(
    os.path.join(work, "run.toml"), work,
    f'max_updates = 8\n[eval]\ninterval = 8\nvalid_tokens = 2048\n[run]\nout_dir = "{work}/run"\nthreads = 1\n',
    data=f'task = "lm"\nformat = "normlab"\ntrain = "{shards}/shard_*.bin"\nlm_block = 16', max_tokens=128)
tr = run(normlab, "train", manifest, "--plugin-path", plugins)
check(tr.returncode == 0 and "its tokenizer from shards.json" in tr.out + tr.err,
      f"trained on the shards, the data line names their tokenizer ({(tr.out + tr.err).strip()[-300:]})")
rundir = os.path.join(work, "run")

text_in = os.path.join(work, "text.txt")
open(text_in, "w").write(lines[0] + "\n" + lines[1] + "\n")
f_text = run(normlab, "forward", rundir, "--input", text_in, "--plugin-path", plugins)
check(f_text.returncode == 0, f"forward on text ({f_text.err.strip()[-300:]})")
ids_in = os.path.join(work, "ids.txt")
open(ids_in, "w").write("\n".join(" ".join(map(str, sp.encode(s))) for s in lines[:2]) + "\n")
f_ids = run(normlab, "forward", rundir, "--ids", "--input", ids_in, "--plugin-path", plugins)
check(f_ids.returncode == 0, f"forward --ids ({f_ids.err.strip()[-300:]})")
if f_text.returncode == 0 and f_ids.returncode == 0:
    a, b = json.loads(f_text.out)["sentences"], json.loads(f_ids.out)["sentences"]
    check([[p["input"]["id"] for p in s["positions"]] for s in a] == [sp.encode(s) for s in lines[:2]],
          "forward's ids of the text are the shards' (SentencePiece's)")
    check([[p.get("next", {}).get("logprob") for p in s["positions"]] for s in a] ==
          [[p.get("next", {}).get("logprob") for p in s["positions"]] for s in b] and b[0]["ids"] == sp.encode(lines[0]),
          "forward --ids: the same log-probabilities, bit for bit")
bad = os.path.join(work, "bad_ids.txt")
open(bad, "w").write("5 6\n7 300 8\n")
fb = run(normlab, "forward", rundir, "--ids", "--input", bad, "--plugin-path", plugins)
check(one_error(fb, 2, f"{bad}:2: '300' is not a token id (--ids: whole numbers 0 … 299"),
      f"a bad id: one error line naming file:line ({said(fb)})")

task = os.path.join(work, "task.jsonl")
with open(task, "w") as f:
    for i in range(6):
        f.write(json.dumps({"context": lines[10 + i], "choices": [lines[20 + i], lines[30 + i]], "gold": 0}) + "\n")
ev = run(normlab, "eval", rundir, "--tasks", task, "--plugin-path", plugins)
check(ev.returncode == 0 and "task" in ev.out, f"eval --tasks on text ({(ev.out + ev.err).strip()[-300:]})")

export = os.path.join(work, "export")
ex = run(normlab, "export", rundir, "--to", export, "--format", "hf", "--plugin-path", plugins)
check(ex.returncode == 0, f"export --format hf ({ex.err.strip()[-300:]})")
if ex.returncode == 0:
    config = json.load(open(os.path.join(export, "config.json")))
    check(config["eos_token_id"] == meta["eos_id"] and config["pad_token_id"] is None and
          config["special_ids"]["eos"] == meta["eos_id"],
          f"config.json: eos_token_id {config['eos_token_id']} = shards.json's {meta['eos_id']}, no pad")
    check(open(os.path.join(export, "tokenizer.model"), "rb").read() ==
          open(os.path.join(shards, "tokenizer.model"), "rb").read() and
          config["tokenizer"]["type"] == "sentencepiece",
          "the export's tokenizer.model is the shards' one, byte for byte")
    os.environ["HF_HOME"] = os.path.join(work, "hf_home")  # where remote code would be copied
    import transformers
    tok_config = json.load(open(os.path.join(export, "tokenizer_config.json")))
    code = [f for f in os.listdir(export) if f.endswith(".py")]
    check(not code and "auto_map" not in tok_config and "auto_map" not in config,
          f"the export holds no Python and names none (files {sorted(os.listdir(export))})")
    tok = transformers.AutoTokenizer.from_pretrained(export, trust_remote_code=False)
    check(type(tok).__module__.startswith("transformers.") and tok.eos_token_id == meta["eos_id"] and
          tok.bos_token_id is None and all(tok.encode(s) == sp.encode(s) for s in lines[:50]),
          f"AutoTokenizer without remote code loads transformers' {type(tok).__name__}: the shards' ids, "
          f"eos {tok.eos_token_id}, no bos")

    # Adversarial documents: normlab's ids from `data tokenize --model` (its tokenizer, documents as
    # JSONL records, newlines and tabs kept) against AutoTokenizer's, document by document.
    ADVERSARIAL = ["ba ke lo", " ba ke", "ba ke ", "  ba   ke  ", "ba\tke\t\tlo", "ba\nke", "ba\n\n ke\n",
                   "\u00a0ba\u3000ke\u2003lo", "ＡＢＣ ｶﾀｶﾅ ﬁ ㎏ ① Ⅻ", "Ünïcödé café e\u0301 ñ",
                   "東京 😀 😀😀 \U0010fffd", "</s> <unk> <s> <pad> ba</s>ke<s>", "▁ba ▁▁ke ▁", "a\r\nb\rc",
                   "\u2028x\u0085y\u200bz\ufeff", "<0x41> <0x0A> [UNK]", "mi" * 200, " ", "\t\n", "\n\n"]

    def normlab_ids(model, name):
        """normlab's ids of each ADVERSARIAL document under `model` (EOS after each)."""
        docs = os.path.join(work, name + ".jsonl")
        with open(docs, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps({"text": t}) + "\n" for t in ADVERSARIAL))
        out = os.path.join(work, name + "_shards")
        t = run(normlab, "data", "tokenize", docs, "--out", out, "--model", model, "--cache-dir",
                os.path.join(work, "cache"))
        check(t.returncode == 0, f"data tokenize the adversarial documents with {name}'s model ({said(t)})")
        m = json.load(open(os.path.join(out, "shards.json")))
        ids = np.concatenate([np.frombuffer(open(os.path.join(out, s["file"]), "rb").read(), m["dtype"])
                              for s in m["shards"]]).tolist()
        eos, got, cur = m["eos_id"], [], []
        for i in ids:
            if i == eos:
                got.append(cur)
                cur = []
            else:
                cur.append(i)
        return got

    def same_ids(hf_dir, model, name):
        tok = transformers.AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=False)
        spm_model = spm.SentencePieceProcessor(model_file=model)
        theirs = normlab_ids(model, name)
        kept = [t for t in ADVERSARIAL if spm_model.encode(t)]  # a document of no tokens: EOS alone, or none
        if len(theirs) == len(ADVERSARIAL):
            kept = ADVERSARIAL
        bad = [(t, tok.encode(t), n) for t, n in zip(kept, theirs) if tok.encode(t) != n]
        check(len(theirs) == len(kept) and not bad and tok.encode("") == spm_model.encode("") == [],
              f"{name}: AutoTokenizer's ids are normlab's on {len(kept)} adversarial documents and the empty "
              f"string ({len(theirs)} documents from data tokenize; differing: {bad[:3]})")
        return tok

    same_ids(export, os.path.join(export, "tokenizer.model"), "default")
    # A --keep-newlines model (spaces and newlines kept, "\n" a piece, byte fallback) in the same
    # folder layout: the export's config files beside it.
    nl = os.path.join(work, "shards_nl")
    t = run(normlab, "data", "tokenize", corpus, "--out", nl, "--vocab-size", "400", "--keep-newlines",
            "--sample-lines", "2000", "--cache-dir", os.path.join(work, "cache"))
    check(t.returncode == 0, f"tokenize --keep-newlines ({said(t)})")
    hf_nl = os.path.join(work, "export_nl")
    os.makedirs(hf_nl, exist_ok=True)
    for f in ("config.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(export, f), hf_nl)
    shutil.copy(os.path.join(nl, "tokenizer.model"), hf_nl)
    tok_nl = same_ids(hf_nl, os.path.join(hf_nl, "tokenizer.model"), "keep-newlines")
    pieces = tok_nl.convert_ids_to_tokens(tok_nl.encode("ba\n  ke 😀"))
    check("\n" in pieces and any(p.startswith("<0x") for p in pieces),
          f"keep-newlines: a newline piece and byte pieces among {pieces}")
finish("shard tokenizer")
