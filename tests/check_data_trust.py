#!/usr/bin/env python3
"""Trust 4 (issue 56): the data a run trains and validates on is the data it names. Each check is a
finding of the hostile review, on token shards as users write them (numpy), and fails on the code
before the fix:
  56.1  a validation or test split without one whole block is refused at the start (never nll 0)
  56.2  a Megatron glob over PREFIX.bin and PREFIX.idx opens the dataset once
  56.3  normlab valid/test shards are checked against shards.json's SHA-256
  56.4  a resume on other data (a shard replaced, shards reordered) is refused naming the file,
        unless --allow-data-change
  56.8/9/14  malformed .npy headers: one line, no crash, no huge allocation
  56.10 a nanoGPT shard truncated while a run reads it: a failed run naming it, not SIGBUS
  56.12 opening many normlab shards is not quadratic in their count
  56.15 a Megatron sequence of negative size says so
  56.18 a glob over two tokenize-style folders: each shard checked against its own shards.json
  56.22 a data.eos_id contradicting shards.json is refused

usage: check_data_trust.py NORMLAB PLUGIN_DIR WORK_DIR
"""
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_checks import check, finish, one_error, run, said  # noqa: E402

normlab, plugins, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def train(manifest, *args):
    return run(normlab, "train", manifest, "--plugin-path", plugins, *args)


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
lm_block = 32
{data}
[optim]
max_tokens = 128
max_updates = {updates}
[eval]
{eval}
[run]
out_dir = "{out}"
log_interval = 2
checkpoint_interval = 2
threads = 1
"""


def manifest(name, fmt, train_path, data="vocab_size = 1000", eval_="interval = 3\nvalid_tokens = 4096", updates=6):
    path = os.path.join(work, name + ".toml")
    with open(path, "w") as f:
        f.write(MANIFEST.format(fmt=fmt, train=train_path, data=data, eval=eval_, updates=updates,
                                out=os.path.join(work, "runs", name)))
    return path


def run_dir(name):
    return os.path.join(work, "runs", name)


def losses(name):
    """(update, loss) of the train records and (update, nll) of the valid ones: no timings."""
    with open(os.path.join(run_dir(name), "train.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    return [(r["update"], r["loss"]) for r in recs if r.get("kind") == "train"] + \
        [(r["update"], r["nll"]) for r in recs if r.get("kind") == "valid"]




rng = np.random.default_rng(56)
docs = [rng.integers(0, 999, size=int(n)).tolist() + [999] for n in rng.integers(20, 400, size=120)]
tokens = np.array([t for d in docs for t in d], dtype=np.int64)
d = os.path.join(work, "data")
os.makedirs(d)
tokens.astype(np.uint16).tofile(os.path.join(d, "train.bin"))
tokens[:3000].astype(np.uint16).tofile(os.path.join(d, "valid.bin"))
tokens[:20].astype(np.uint16).tofile(os.path.join(d, "short.bin"))


def normlab_folder(folder, parts, vocab=1000, eos=999):
    os.makedirs(folder, exist_ok=True)
    shards = []
    for i, part in enumerate(parts):
        name = f"shard_{i:05d}.bin"
        data = np.asarray(part).astype(np.uint16).tobytes()
        open(os.path.join(folder, name), "wb").write(data)
        shards.append({"file": name, "tokens": len(part), "sha256": hashlib.sha256(data).hexdigest(),
                       "max_token": int(np.max(part)) if len(part) else -1})
    json.dump({"format": "normlab.shards", "dtype": "uint16", "vocab_size": vocab, "eos_id": eos,
               "tokenizer": "", "shards": shards}, open(os.path.join(folder, "shards.json"), "w"))


# ---- 56.1: no score from no data --------------------------------------------------------------
train_bin = os.path.join(d, "train.bin")
r = train(manifest("valid_budget", "nanogpt", train_bin,
                   f'vocab_size = 1000\nvalid = "{os.path.join(d, "valid.bin")}"', "interval = 3\nvalid_tokens = 20"))
check(one_error(r, 2, "data.valid", "not one whole block", "33") and not os.path.exists(run_dir("valid_budget")),
      f"56.1 eval.valid_tokens below lm_block + 1: refused at the start, nothing created ({said(r)})")
r = train(manifest("valid_short", "nanogpt", train_bin, f'vocab_size = 1000\nvalid = "{os.path.join(d, "short.bin")}"'))
check(one_error(r, 2, "data.valid", "short.bin", "20 tokens"),
      f"56.1 a valid shard shorter than a block: refused naming it ({said(r)})")
r = train(manifest("test_short", "nanogpt", train_bin, f'vocab_size = 1000\ntest = "{os.path.join(d, "short.bin")}"'))
check(one_error(r, 2, "data.test", "short.bin"), f"56.1 a test shard shorter than a block: refused ({said(r)})")
tokens[:300].astype(np.uint16).tofile(os.path.join(d, "tiny_train.bin"))  # a tenth: 30 tokens
r = train(manifest("held_out_short", "nanogpt", os.path.join(d, "tiny_train.bin")))
check(one_error(r, 2, "data.valid", "held-out", "300 tokens"),
      f"56.1 the held-out tenth of a short stream: refused, not validated on 0 tokens ({said(r)})")

# ---- 56.2: Megatron PREFIX.bin + PREFIX.idx once -------------------------------------------------


def write_megatron(prefix, docs, sizes_override=None):
    with open(prefix + ".bin", "wb") as f:
        for doc in docs:
            f.write(np.array(doc, dtype=np.uint16).tobytes())
    sizes = np.array([len(doc) for doc in docs], dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64) * 2)
    if sizes_override:
        for i, v in sizes_override.items():
            sizes[i] = v
    doc_idx = np.arange(len(docs) + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(sizes), len(doc_idx)))
        f.write(sizes.tobytes() + pointers.tobytes() + doc_idx.tobytes())


mega = os.path.join(work, "megatron")
os.makedirs(mega)
write_megatron(os.path.join(mega, "corpus_text_document"), docs)
r_prefix = train(manifest("mega_prefix", "megatron", os.path.join(mega, "corpus_text_document")))
r_glob = train(manifest("mega_glob", "megatron", os.path.join(mega, "*")))
ok = r_prefix.returncode == 0 and r_glob.returncode == 0
check(ok and losses("mega_glob") == losses("mega_prefix") and len(losses("mega_glob")) >= 5,
      f"56.2 megatron 'DIR/*': one dataset, the records of its prefix bitwise ({said(r_glob)})")

# ---- 56.15: a negative Megatron size ------------------------------------------------------------
write_megatron(os.path.join(mega, "negative"), docs[:10], {2: -5})
r = train(manifest("mega_negative", "megatron", os.path.join(mega, "negative")))
check(one_error(r, 2, "sequence 2 has size -5"), f"56.15 a sequence of size -5 is named as such ({said(r)})")

# ---- 56.3 / 56.18 / 56.22: normlab shards --------------------------------------------------------
nl = os.path.join(work, "nl")
half = len(tokens) // 2
normlab_folder(os.path.join(nl, "train"), [tokens[:half], tokens[half:]])
normlab_folder(os.path.join(nl, "valid"), [tokens[:2000]])
valid_data = f'valid = "{os.path.join(nl, "valid", "shard_*.bin")}"'
r = train(manifest("nl_valid_ok", "normlab", os.path.join(nl, "train", "shard_*.bin"), valid_data))
check(r.returncode == 0, f"normlab shards with a normlab valid split train ({said(r)})")
with open(os.path.join(nl, "valid", "shard_00000.bin"), "r+b") as f:  # rewritten in place
    f.seek(100)
    f.write(np.array([5, 6, 7], dtype=np.uint16).tobytes())
r = train(manifest("nl_valid_replaced", "normlab", os.path.join(nl, "train", "shard_*.bin"), valid_data))
check(r.returncode == 1 and "SHA-256" in r.err and "valid" in r.err and "shard_00000.bin" in r.err,
      f"56.3 a normlab valid shard rewritten in place: the run fails naming it ({said(r)})")
normlab_folder(os.path.join(nl, "two", "a"), [tokens[:half]])
normlab_folder(os.path.join(nl, "two", "b"), [tokens[half:]])
r = train(manifest("nl_two_folders", "normlab", os.path.join(nl, "two", "*", "shard_*.bin"), ""))
check(r.returncode == 0 and "SHA-256" not in r.err,
      f"56.18 a glob over two intact folders: each shard against its own shards.json ({said(r)})")
r = train(manifest("nl_eos", "normlab", os.path.join(nl, "train", "shard_*.bin"), "eos_id = 5"))
check(one_error(r, 2, "data.eos_id = 5", "says 999"), f"56.22 data.eos_id against shards.json: refused ({said(r)})")

# ---- 56.12: many normlab shards open in time linear in their count ------------------------------
many = os.path.join(work, "many")
stream = np.tile(tokens, 4)
parts = np.array_split(stream, 3000)
normlab_folder(many, parts)
# The time to the first update, as the run prints it: the shards' SHA-256s are checked beside
# training (the run's wall time includes them), while opening them was what grew with their count.
def first_update_s(r):
    m = re.search(r"first update done ([0-9.]+) s", r.out)
    return float(m.group(1)) if m else float("inf")


r = train(manifest("many", "normlab", os.path.join(many, "shard_*.bin"), "", "interval = 0", updates=1))
many_s = first_update_s(r)
for i, part in enumerate(parts):
    part.astype(np.uint16).tofile(os.path.join(many, f"flat_{i:05d}.bin"))
r_flat = train(manifest("many_flat", "nanogpt", os.path.join(many, "flat_*.bin"), eval_="interval = 0", updates=1))
flat_s = first_update_s(r_flat)
print(f"     3,000 shards, first update after: normlab {many_s:.2f} s, nanoGPT {flat_s:.2f} s")
check(r.returncode == 0 and r_flat.returncode == 0 and many_s < 3 * flat_s + 2,
      f"56.12 3,000 normlab shards reach their first update within 3x (+2 s) of the same as nanoGPT files "
      f"({many_s:.1f} s vs {flat_s:.1f} s; {said(r)})")

# ---- 56.4: a resume on other data --------------------------------------------------------------
res = os.path.join(work, "resume")
os.makedirs(res)
shutil.copy(train_bin, os.path.join(res, "train.bin"))
m = manifest("resume_nanogpt", "nanogpt", os.path.join(res, "train.bin"), updates=4)
r = train(m)
check(r.returncode == 0, f"a nanoGPT run of 4 updates ({said(r)})")
replacement = tokens.copy()
replacement[::7] = (replacement[::7] + 1) % 999
replacement.astype(np.uint16).tofile(os.path.join(res, "train.bin"))  # the same size, other tokens
r = train(m, "--set", "optim.max_updates=6")
check(one_error(r, 2, "train.bin", "other content", "--allow-data-change"),
      f"56.4 a train shard replaced (same size): the resume is refused naming it ({said(r)})")
tokens[: len(tokens) - 64].astype(np.uint16).tofile(os.path.join(res, "train.bin"))
r = train(m, "--set", "optim.max_updates=6")
check(one_error(r, 2, "train.bin", "bytes"), f"56.4 a train shard replaced (another size): refused ({said(r)})")
r = train(m, "--set", "optim.max_updates=6", "--allow-data-change")
check(r.returncode == 0 and "resume: on other data" in r.out,
      f"56.4 --allow-data-change resumes, and says so ({said(r)})")
# normlab shards reordered, shards.json rewritten to match: their SHA-256s in another order.
ro = os.path.join(work, "reordered")
q = len(tokens) // 2  # two shards of one size: only their content tells them apart
first_half, second_half = tokens[:q], tokens[q:2 * q]
normlab_folder(ro, [first_half, second_half])
m = manifest("resume_reordered", "normlab", os.path.join(ro, "shard_*.bin"), "", updates=4)
r = train(m)
check(r.returncode == 0, f"a normlab run of 4 updates ({said(r)})")
normlab_folder(ro, [second_half, first_half])
r = train(m, "--set", "optim.max_updates=6")
check(one_error(r, 2, "shard_00000.bin", "other content"),
      f"56.4 normlab shards reordered: the resume is refused ({said(r)})")
normlab_folder(ro, [first_half, second_half])
r = train(m, "--set", "optim.max_updates=6")
check(r.returncode == 0, f"56.4 the same data again: the resume goes on ({said(r)})")

# ---- a branch in other batches, or validated on other examples (hostile review, session 18) ------
# --resume-from into a new out_dir: another optim.max_tokens skipped (or repeated) the rest of the
# epoch without a word, and a best valid nll of other validation blocks stood as the yardstick.
def valid_records(name):
    with open(os.path.join(run_dir(name), "train.jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("kind") == "valid"]


def branch(m, parent, name, *sets, allow=False):
    args = ["--resume-from", os.path.join(run_dir(parent), "checkpoints", "last.safetensors"),
            "--set", f'run.out_dir="{run_dir(name)}"']
    for kv in sets:
        args += ["--set", kv]
    return train(m, *args, *(["--allow-data-change"] if allow else []))


m = manifest("branch_parent", "nanogpt", train_bin, eval_="interval = 2\nvalid_tokens = 4096", updates=4)
r = train(m)
check(r.returncode == 0, f"a parent run of 4 updates ({said(r)})")
r = branch(m, "branch_parent", "branch_tokens", "optim.max_tokens=64", "optim.max_updates=6")
check(one_error(r, 2, "optim.max_tokens was 128, now 64", "the batches hold blocks 2 a batch", "epoch 1, batch 4",
                "--allow-data-change"),
      f"a branch with another optim.max_tokens is refused naming it ({said(r)})")
# Refused before the branch wrote a file (it left a "failed" run of the other max_tokens, so the
# fix the message gives, the checkpoint's values, was refused as another experiment).
r = branch(m, "branch_parent", "branch_refused", "optim.max_tokens=64", "optim.max_updates=6")
left = sorted(os.listdir(run_dir("branch_refused"))) if os.path.isdir(run_dir("branch_refused")) else []
check(r.returncode == 2 and "manifest.resolved.toml" not in left and "status.json" not in left,
      f"a refused branch writes no manifest or status ({left})")
r = branch(m, "branch_parent", "branch_refused", "optim.max_updates=6")
check(r.returncode == 0, f"... and the fix the message gives (the checkpoint's values) then runs there ({said(r)})")
r = branch(m, "branch_parent", "branch_tokens", "optim.max_tokens=64", "optim.max_updates=6", allow=True)
check(r.returncode == 0 and "resume: in other batches (--allow-data-change): optim.max_tokens was 128" in r.out,
      f"... and resumed with --allow-data-change, said ({said(r)})")
# Another max_tokens of the same blocks a batch (159 // 32 = 128 // 32 = 4) cuts the same batches.
r = branch(m, "branch_parent", "branch_same_blocks", "optim.max_tokens=159", "optim.max_updates=6")
check(r.returncode == 0 and "resume: in other batches" not in r.out,
      f"a branch with max_tokens 159 (4 blocks a batch, as 128): resumed ({said(r)})")


def with_metadata(src, dst_run, **changes):
    """A copy of checkpoint `src` as DST_RUN/checkpoints/last.safetensors with __metadata__ keys
    changed (None: removed), SHA256SUMS listing it, and the run's manifest beside it."""
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header["__metadata__"]
    for k, v in changes.items():
        meta.pop(k, None) if v is None else meta.__setitem__(k, v)
    text = json.dumps(header).encode()
    data = struct.pack("<Q", len(text)) + text + raw[8 + n:]
    ck = os.path.join(dst_run, "checkpoints")
    os.makedirs(ck, exist_ok=True)
    open(os.path.join(ck, "last.safetensors"), "wb").write(data)
    with open(os.path.join(ck, "SHA256SUMS"), "w") as f:
        f.write(f"{hashlib.sha256(data).hexdigest()}  last.safetensors\n")
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(src)), "manifest.resolved.toml"), dst_run)
    return os.path.join(ck, "last.safetensors")


parent_ck = os.path.join(run_dir("branch_parent"), "checkpoints", "last.safetensors")
for key, value in (("batching", "garbage"), ("batching", '{"max_tokens": -5, "seed": 1, "plan": "blocks 4 a batch", '
                                                          '"batches_per_epoch": 183}'),
                   ("validation", '{"examples": 1, "sha256": "xyz", "bleu_sentences": 0}')):
    forged = with_metadata(parent_ck, os.path.join(work, "forged_" + key), **{key: value})
    r = train(m, "--resume-from", forged, "--set", f'run.out_dir="{run_dir("forged_branch")}"',
              "--set", "optim.max_updates=6", "--allow-data-change")
    check(one_error(r, 2, f"__metadata__.{key} is malformed"),
          f"a checkpoint's {key} record {value[:30]!r}: refused by name, even with --allow-data-change ({said(r)})")
# A checkpoint of an older normlab (no records): a branch says what it cannot check.
old = with_metadata(parent_ck, os.path.join(work, "older"), batching=None, validation=None)
r = train(m, "--resume-from", old, "--set", f'run.out_dir="{run_dir("older_branch")}"', "--set", "optim.max_updates=6")
check(r.returncode == 0 and "records no batching or validation (an older normlab)" in r.out,
      f"a branch from a checkpoint without the records: said ({said(r)})")

# Translation: a branch that decodes BLEU on another subset (eval.bleu_max_sentences) compares its
# BLEU with the parent's best on 2 sentences no more: the best BLEU starts afresh (hostile review).
rev = os.path.join(work, "rev.toml")
with open(rev, "w") as f:
    f.write(f"""[model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 1
dec_layers = 1
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
task = "reverse"
synthetic_vocab = 12
synthetic_min_len = 3
synthetic_max_len = 6
synthetic_train = 500
synthetic_valid = 40
[optim]
lr = 3e-3
warmup_updates = 5
max_tokens = 256
max_updates = 20
[eval]
interval = 10
bleu = true
bleu_max_sentences = 2
[run]
out_dir = "{run_dir('rev_parent')}"
checkpoint_interval = 10
checkpoint_save_best = "bleu"
threads = 1
""")
r = train(rev)
check(r.returncode == 0, f"a translation parent with BLEU on 2 sentences ({said(r)})")
r = train(rev, "--resume-from", os.path.join(run_dir("rev_parent"), "checkpoints", "last.safetensors"),
          "--set", f'run.out_dir="{run_dir("rev_branch")}"', "--set", "eval.bleu_max_sentences=0",
          "--set", "optim.max_updates=30")
recs = valid_records("rev_branch") if r.returncode == 0 else []
check(r.returncode == 0 and "resume: BLEU on the first 40 validation sentences, the checkpoint's on 2" in r.out
      and recs and recs[0].get("best_bleu", recs[0].get("best")) is not None
      and os.path.isfile(os.path.join(run_dir("rev_branch"), "checkpoints", "best.safetensors")),
      f"a branch decoding BLEU on all 40 sentences (the parent 2): the best BLEU starts afresh, said, "
      f"best.safetensors written; {recs[:1]} ({said(r)})")

# A damaged checkpoint of another run: the message names a good step beside it (it looked in the
# branch's own, empty folder and said none was left).
dmg = os.path.join(work, "runs", "dmg_parent")
shutil.copytree(run_dir("branch_parent"), dmg)
step2 = os.path.join(dmg, "checkpoints", "step_2.safetensors")
with open(step2, "r+b") as f:
    f.seek(os.path.getsize(step2) - 5)
    b = f.read(1)
    f.seek(os.path.getsize(step2) - 5)
    f.write(bytes([b[0] ^ 0x10]))
r = train(m, "--resume-from", step2, "--set", f'run.out_dir="{run_dir("dmg_branch")}"', "--set", "optim.max_updates=6")
check(one_error(r, 2, "resume from the newest good one beside it with --resume-from",
                os.path.join(dmg, "checkpoints", "step_4.safetensors")),
      f"a branch from a damaged step: the good step beside it named ({said(r)})")
# One batch per update on 2 ranks: the refusal does not offer --allow-world-size-change, which
# cannot share it (it did, and the flag then failed).
r = train(m, "--resume-from", os.path.join(run_dir("branch_parent"), "checkpoints", "last.safetensors"),
          "--set", f'run.out_dir="{run_dir("ranks_branch")}"', "--set", "optim.max_updates=6", "--nproc", "2")
check(r.returncode == 2 and "--allow-world-size-change cannot help" in r.err
      and "pass --allow-world-size-change to resume" not in r.err,
      f"1 batch per update on 2 ranks: refused without advice that cannot work ({said(r)})")
# A branch of another model is refused before it writes a file too (it left a "failed" run of the
# other model, so the corrected command was refused as another experiment).
r = branch(m, "branch_parent", "branch_model", "model.d_model=32", "optim.max_updates=6")
left = sorted(os.listdir(run_dir("branch_model"))) if os.path.isdir(run_dir("branch_model")) else []
check(r.returncode == 2 and "another model" in r.err and "manifest.resolved.toml" not in left,
      f"a branch of another model: refused, no manifest written ({left}; {said(r)})")
r = branch(m, "branch_parent", "branch_model", "optim.max_updates=6")
check(r.returncode == 0, f"... and the corrected command runs there ({said(r)})")
# Examples in memory edited under the same batches (synthetic noise here; a text corpus edited on
# disk, a tokenizer retrained with other ids): the position would read other examples. Refused.
r = train(rev, "--resume-from", os.path.join(run_dir("rev_parent"), "checkpoints", "last.safetensors"),
          "--set", f'run.out_dir="{run_dir("rev_noise")}"', "--set", "data.synthetic_noise=0.2",
          "--set", "optim.max_updates=30")
check(one_error(r, 2, "the training examples are not the checkpoint's",
                "[data] 'synthetic_noise = 0.0' in the checkpoint's run, 'synthetic_noise = 0.2' in this one",
                "--allow-data-change"),
      f"a branch on other training examples (synthetic_noise): refused ({said(r)})")

# Examples in memory (the built-in synthetic LM, blocks of 16): max_tokens 70 cuts the same batches
# as 64 (4 blocks each), so the branch goes on; 96 (6 blocks) is refused.
slm = os.path.join(work, "slm.toml")
with open(slm, "w") as f:
    f.write(f"""[model]
arch = "lm"
d_model = 16
ffn_dim = 32
heads = 2
dec_layers = 1
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
task = "synthetic-lm"
lm_block = 16
[optim]
max_tokens = 64
max_updates = 4
[eval]
interval = 0
[run]
out_dir = "{run_dir('slm')}"
checkpoint_interval = 2
threads = 1
""")
r = train(slm)
check(r.returncode == 0, f"a synthetic-LM parent ({said(r)})")
for max_tokens, ok in ((70, True), (96, False)):
    r = branch(slm, "slm", f"slm_{max_tokens}", f"optim.max_tokens={max_tokens}", "optim.max_updates=6")
    check((r.returncode == 0) if ok else one_error(r, 2, "optim.max_tokens was 64, now 96", "the batches hold"),
          f"a synthetic-LM branch with max_tokens {max_tokens}: {'the same batches, resumed' if ok else 'refused'} "
          f"({said(r)})")

# A branch with no update left prints no train nll (it printed "train nll 0.0000"; status.json null).
r = branch(m, "branch_parent", "branch_none", "optim.max_updates=4")
st = json.load(open(os.path.join(run_dir("branch_none"), "status.json"))) if r.returncode == 0 else {}
check(r.returncode == 0 and "no train nll (no update in this process)" in r.out and "train nll 0.0000" not in r.out
      and st.get("train_nll", "absent") is None,
      f"a branch with no update left: no train nll made up, status.json train_nll {st.get('train_nll', 'absent')} ({said(r)})")
# A position past the new epoch (1 block a batch, then ~260): the error names the batches, not the
# index; allowed, it starts the next epoch.
m1 = manifest("branch_small", "nanogpt", train_bin, eval_="interval = 2\nvalid_tokens = 4096", updates=4)
r = train(m1, "--set", "optim.max_tokens=32")
check(r.returncode == 0, f"a parent run of 1 block a batch ({said(r)})")
r = branch(m1, "branch_small", "branch_big", "optim.max_tokens=8000", "optim.max_updates=5")
check(one_error(r, 2, "optim.max_tokens was 32, now 8000", "an epoch was", "blocks 250 a batch"),
      f"a branch whose position is past its epoch: refused naming the batches ({said(r)})")
r = branch(m1, "branch_small", "branch_big", "optim.max_tokens=8000", "optim.max_updates=5", allow=True)
check(r.returncode == 0 and "is past this run's epoch" in r.out and "from epoch 2" in r.out,
      f"... allowed: from the next epoch, said ({said(r)})")
# Other validation blocks (eval.valid_tokens), both ways: the branch's first validation is its best.
# The model barely moves at this lr, so without the fix one of the two directions compares against
# the parent's lower nll of other blocks and is not "best".
valid_bin = os.path.join(d, "valid.bin")
for parent_tokens, branch_tokens in ((2048, 1024), (1024, 2048)):
    pname, bname = f"valid_parent_{parent_tokens}", f"valid_branch_{branch_tokens}"
    mv = manifest(pname, "nanogpt", train_bin, f'vocab_size = 1000\nvalid = "{valid_bin}"',
                  eval_=f"interval = 2\nvalid_tokens = {parent_tokens}", updates=4)
    r = train(mv, "--set", "optim.lr=1e-9")
    check(r.returncode == 0, f"a parent validated on {parent_tokens} tokens ({said(r)})")
    r = branch(mv, pname, bname, "optim.lr=1e-9", f"eval.valid_tokens={branch_tokens}", "optim.max_updates=6")
    recs = valid_records(bname) if r.returncode == 0 else []
    check(r.returncode == 0 and "resume: validation on other examples than the checkpoint's" in r.out
          and recs and recs[0].get("best") is True
          and os.path.isfile(os.path.join(run_dir(bname), "checkpoints", "best.safetensors")),
          f"a branch validated on {branch_tokens} tokens (the parent {parent_tokens}): best and patience "
          f"start afresh, said; its first validation {recs[:1]} ({said(r)})")

# ---- 56.8 / 56.9 / 56.14: malformed .npy headers ------------------------------------------------
npyd = os.path.join(work, "npy")
os.makedirs(npyd)
body = tokens.astype("<u2").tobytes()


def npy(name, header, major=1, length=None):
    header_bytes = header.encode("latin1")
    size = struct.pack("<H" if major == 1 else "<I", len(header_bytes) if length is None else length)
    path = os.path.join(npyd, name)
    open(path, "wb").write(b"\x93NUMPY" + bytes([major, 0]) + size + header_bytes + body)
    return path


n = len(tokens)
cases = [
    ("spaces.npy", "{'descr': '<u2', 'fortran_order': False, 'shape':" + " " * 30000 + "(%d,), }\n" % n, 2, None,
     0, None),  # 30 kB of whitespace inside the dict: parsed (std::regex's recursion overflowed the stack)
    ("long_shape.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (" + "1, " * 20000 + "%d,), }\n" % n, 2,
     None, 2, "more than 32 dimensions"),
    ("huge_len.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }\n" % n, 2, 0xFFFFFFFF, 2,
     "header length 4294967295"),
    ("bad_width.npy", "{'descr': '<u99999999999999999999', 'fortran_order': False, 'shape': (%d,), }\n" % n, 1,
     None, 2, "'descr'"),
    ("bad_shape.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", 1, None, 2,
     "'shape'"),
    ("no_tuple.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': , }\n", 1, None, 2, "'shape'"),
    ("neg_shape.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (-5,), }\n", 1, None, 2, "'shape'"),
]
for name, header, major, length, code, needle in cases:
    r = train(manifest("npy_" + name[:-4], "npy", npy(name, header, major, length)))
    ok = r.returncode == code and r.returncode not in (-signal.SIGSEGV, 139) and r.peak_rss_mb < 1500
    if needle:
        ok = ok and one_error(r, code, name, needle) and "stoi" not in r.err and "stoll" not in r.err
    check(ok, f"56.8/9/14 {name}: exit {code}{', one line with ' + repr(needle) if needle else ''}, "
              f"peak {r.peak_rss_mb:.0f} MiB ({said(r)})")
open(os.path.join(npyd, "cut.npy"), "wb").write(b"\x93NUMPY\x01")
r = train(manifest("npy_cut", "npy", os.path.join(npyd, "cut.npy")))
check(one_error(r, 2, "cut.npy", "cut") and "no \\x93NUMPY magic" not in r.err,
      f"56.14 a .npy cut inside its header is not said to lack its magic ({said(r)})")

# ---- 56.10: a nanoGPT shard truncated while the run reads it ------------------------------------
live = os.path.join(work, "live.bin")
np.tile(tokens, 40).astype(np.uint16).tofile(live)
m = manifest("truncated", "nanogpt", live, updates=100000, eval_="interval = 0")
p = subprocess.Popen([normlab, "train", m, "--plugin-path", plugins], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
log = os.path.join(run_dir("truncated"), "train.jsonl")
deadline = time.monotonic() + 120
while time.monotonic() < deadline and p.poll() is None and not (os.path.exists(log) and os.path.getsize(log) > 0):
    time.sleep(0.05)
with open(live, "r+b") as f:  # as nanoGPT's prepare.py does: the file emptied in place, rewritten
    f.truncate(0)
try:
    out, err = p.communicate(timeout=120)
except subprocess.TimeoutExpired:
    p.kill()
    out, err = p.communicate()
status = json.load(open(os.path.join(run_dir("truncated"), "status.json")))
check(p.returncode == 1 and "live.bin" in err and "shrank" in err and status.get("status") == "failed",
      f"56.10 a shard truncated under the run: failed run naming it, status.json {status.get('status')} "
      f"(exit {p.returncode}: {err.strip()[-300:]})")

finish("data trust")
