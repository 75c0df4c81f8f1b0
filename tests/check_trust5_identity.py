#!/usr/bin/env python3
"""Trust 5 (issue 66): every command that reads a run's data or checkpoint checks them as training
does. On a run trained on normlab shards (`data tokenize`), with a validation split of its own:
  66.6  a validation shard rewritten in place (same size, one token changed; shards.json as it was)
        is refused by eval, eval --tasks, ablate, forward and export naming the file (its SHA-256
        against shards.json); re-tokenized (shards.json rewritten to match) it is refused against
        the checkpoint's data identity; --all-tokens never scores tokens the run trained on
  66.7  the checkpoint records the SHA-256 of the shards' tokenizer (hashlib's); another tokenizer
        of the same size and EOS in its place is refused by every command and by a resume; an
        older checkpoint without the record is taken with a note saying so; another run's
        checkpoint is still scored on this run's data
Each check fails on the code before the fix (the commands scored, ran and exported the other data).

usage: check_trust5_identity.py NORMLAB PLUGIN_DIR TESTS_DIR WORK_DIR
"""
import hashlib
import json
import os
import random
import shutil
import struct
import sys

normlab, plugins, tests_dir, work = sys.argv[1:5]
sys.path.insert(0, tests_dir)
from cli_checks import check, finish, one_error, run, said, write_tiny_llama_manifest  # noqa: E402

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
cache = os.path.join(work, "cache")


def nl(*args):
    return run(normlab, *args)


rng = random.Random(66)
SYLLABLES = "ba ke lo mi nu ra se ti vo wy an el or un is".split()
WORDS = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(200)})
lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))) for _ in range(2400)]
for name, part in (("train.txt", lines[:2000]), ("valid.txt", lines[2000:])):
    open(os.path.join(work, name), "w").write("\n".join(part) + "\n")
shards, valid, other = (os.path.join(work, d) for d in ("shards", "valid", "other"))
t = nl("data", "tokenize", os.path.join(work, "train.txt"), "--out", shards, "--vocab-size", "300",
       "--sample-lines", "2000", "--cache-dir", cache)
v = nl("data", "tokenize", os.path.join(work, "valid.txt"), "--out", valid, "--model",
       os.path.join(shards, "tokenizer.model"), "--cache-dir", cache)
# Another tokenizer of the same size and EOS, as a re-tokenize with other settings leaves one
# (here another sample of the lines).
o = nl("data", "tokenize", os.path.join(work, "train.txt"), "--out", other, "--vocab-size", "300",
       "--sample-lines", "1200", "--sample-seed", "9", "--cache-dir", cache)
check(t.returncode == 0 and v.returncode == 0 and o.returncode == 0,
      f"three tokenize runs ({said(t)} / {said(v)} / {said(o)})")
meta, other_meta = (json.load(open(os.path.join(d, "shards.json"))) for d in (shards, other))
tokenizer_bytes = open(os.path.join(shards, "tokenizer.model"), "rb").read()
other_bytes = open(os.path.join(other, "tokenizer.model"), "rb").read()
check(tokenizer_bytes != other_bytes and (meta["vocab_size"], meta["eos_id"]) ==
      (other_meta["vocab_size"], other_meta["eos_id"]),
      "the other tokenizer has the same vocabulary size and EOS, other pieces")


def manifest(name, data):
    return write_tiny_llama_manifest(
        os.path.join(work, name + ".toml"), work,
        f'max_updates = 4\n[eval]\ninterval = 4\nvalid_tokens = 512\n[run]\nout_dir = "{work}/{name}"\n'
        f'threads = 1\ncheckpoint_interval = 2\n',
        data=f'task = "lm"\nformat = "normlab"\nlm_block = 16\ncache_dir = "{cache}"\n{data}', max_tokens=128)


m = manifest("run", f'train = "{shards}/shard_*.bin"\nvalid = "{valid}/shard_*.bin"')
tr = nl("train", m, "--plugin-path", plugins)
check(tr.returncode == 0, f"a run on the shards with a valid split of its own ({said(tr)})")
rundir = os.path.join(work, "run")
last = os.path.join(rundir, "checkpoints", "last.safetensors")


def header(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


data_identity = json.loads(header(last)[0]["__metadata__"]["data"])
check(data_identity.get("tokenizer", {}).get("sha256") == hashlib.sha256(tokenizer_bytes).hexdigest(),
      f"66.7 the checkpoint records the tokenizer's SHA-256 ({data_identity.get('tokenizer')})")

task = os.path.join(work, "task.jsonl")
with open(task, "w") as f:
    for i in range(4):
        f.write(json.dumps({"context": lines[10 + i], "choices": [lines[20 + i], lines[30 + i]], "gold": 0}) + "\n")
text_in = os.path.join(work, "text.txt")
open(text_in, "w").write(lines[0] + "\n")
exports = iter(range(100))


def commands(names=("eval", "eval --tasks", "ablate", "forward", "export")):
    """The commands that read the run (all, or `names`): name -> its result."""
    p = ["--plugin-path", plugins]
    argv = {
        "eval": lambda: ("eval", rundir, "--split", "valid", *p),
        "eval --tasks": lambda: ("eval", rundir, "--tasks", task, *p),
        "ablate": lambda: ("ablate", rundir, *p),
        "forward": lambda: ("forward", rundir, "--input", text_in, *p),
        "export": lambda: ("export", rundir, "--to", os.path.join(work, f"export{next(exports)}"), "--format",
                           "hf", *p),
    }
    return {name: nl(*argv[name]()) for name in names}


for name, r in commands().items():
    check(r.returncode == 0 and "note:" not in r.err, f"{name} on the run's own data ({said(r)})")

# ---- 66.6: a validation shard rewritten in place, shards.json as it was ----------------------------
valid_shard = os.path.join(valid, json.load(open(os.path.join(valid, "shards.json")))["shards"][0]["file"])
original = open(valid_shard, "rb").read()
changed = bytearray(original)
changed[40:42] = (1 + struct.unpack("<H", original[40:42])[0] % 200).to_bytes(2, "little")  # one token
open(valid_shard, "wb").write(bytes(changed))
for name, r in commands().items():
    check(one_error(r, 2, valid_shard, "SHA-256", "shards.json"),
          f"66.6 {name}: a valid shard rewritten in place (same size) is refused naming it ({said(r)})")

# Re-tokenized: shards.json holds the new file's SHA-256 (only the checkpoint knows the old one).
valid_json = os.path.join(valid, "shards.json")
valid_meta_text = open(valid_json).read()
vm = json.loads(valid_meta_text)
vm["shards"][0]["sha256"] = hashlib.sha256(bytes(changed)).hexdigest()
json.dump(vm, open(valid_json, "w"))
for name, r in commands(("eval", "export")).items():  # the check above: two commands say it
    check(one_error(r, 2, valid_shard, "other content", "not the data it trained on"),
          f"66.6 {name}: a re-tokenized valid shard is refused against the checkpoint ({said(r)})")
open(valid_shard, "wb").write(original)
open(valid_json, "w").write(valid_meta_text)
r = nl("eval", rundir, "--split", "valid", "--plugin-path", plugins)
check(r.returncode == 0, f"66.6 the shard restored: eval scores again ({said(r)})")

# ---- 66.7: another tokenizer of the same size and EOS in place of the run's --------------------
for folder in (shards, valid):
    open(os.path.join(folder, "tokenizer.model"), "wb").write(other_bytes)
# Beside a shards.json that records another tokenizer's SHA-256 it is refused by the folder itself
# (a failed re-tokenize left one so, issue 66 A); a re-tokenize records the new one, as here, and
# then only the checkpoint's record tells.
other_sha = hashlib.sha256(other_bytes).hexdigest()
r = nl("eval", rundir, "--split", "valid", "--plugin-path", plugins)
check(one_error(r, 2, "shards.json: tokenizer_sha256 " + hashlib.sha256(tokenizer_bytes).hexdigest(), other_sha),
      f"a tokenizer other than the one shards.json records is refused naming both ({said(r)})")
json_texts = {}
for folder in (shards, valid):
    json_file = os.path.join(folder, "shards.json")
    json_texts[json_file] = open(json_file).read()
    folder_meta = json.loads(json_texts[json_file])
    folder_meta["tokenizer_sha256"] = other_sha
    json.dump(folder_meta, open(json_file, "w"))
for name, r in commands().items():
    check(one_error(r, 2, "tokenizer", "is not the run's", hashlib.sha256(tokenizer_bytes).hexdigest()[:12]),
          f"66.7 {name}: another tokenizer of the same size and EOS is refused ({said(r)})")
r = nl("train", m, "--plugin-path", plugins, "--set", "optim.max_updates=6")
check(one_error(r, 2, "tokenizer", "is not the run's", "--allow-data-change"),
      f"66.7 a resume with another tokenizer is refused ({said(r)})")

# An older checkpoint (no tokenizer in its data identity): taken, with a note saying so.
meta_json, body = header(last)
ident = json.loads(meta_json["__metadata__"]["data"])
del ident["tokenizer"]
meta_json["__metadata__"]["data"] = json.dumps(ident)
text = json.dumps(meta_json).encode()
text += b" " * (-len(text) % 8)
old = os.path.join(rundir, "checkpoints", "old.safetensors")
open(old, "wb").write(struct.pack("<Q", len(text)) + text + body)
r = nl("eval", rundir, "--split", "valid", "--checkpoint", old, "--allow-unverified", "--plugin-path", plugins)
check(r.returncode == 0 and "records no tokenizer" in r.err and "taken as the run's unchecked" in r.err,
      f"66.7 an older checkpoint without the record loads, and says so ({said(r)})")
for folder in (shards, valid):
    open(os.path.join(folder, "tokenizer.model"), "wb").write(tokenizer_bytes)
for json_file, text in json_texts.items():
    open(json_file, "w").write(text)
r = nl("train", m, "--plugin-path", plugins, "--set", "optim.max_updates=6")
check(r.returncode == 0, f"66.7 the run's tokenizer back: the resume goes on ({said(r)})")

# ---- the held-out end of the train stream, and another run's checkpoint --------------------------
m2 = manifest("tail", f'train = "{shards}/shard_*.bin"')
tr2 = nl("train", m2, "--plugin-path", plugins)
check(tr2.returncode == 0, f"a run validating on the held-out end of its train stream ({said(tr2)})")
r = nl("eval", os.path.join(work, "tail"), "--split", "valid", "--plugin-path", plugins)
check(r.returncode == 0, f"eval of its held-out end ({said(r)})")
r = nl("eval", os.path.join(work, "tail"), "--split", "valid", "--all-tokens", "--plugin-path", plugins)
check(one_error(r, 2, "--all-tokens", "trained on"),
      f"66.6 eval --all-tokens would score tokens the run trained on: refused ({said(r)})")
r = nl("eval", rundir, "--split", "valid", "--checkpoint",
       os.path.join(work, "tail", "checkpoints", "last.safetensors"), "--plugin-path", plugins)
check(r.returncode == 0, f"another run's checkpoint (other data, the same tokenizer) is scored here ({said(r)})")
finish("trust5 identity")
