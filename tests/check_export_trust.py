#!/usr/bin/env python3
"""An export folder is data, never code (issue 56.7): python/normlab_torch.py's load(DIR) and
load_state_dict(FILE) on crafted weights.

usage: check_export_trust.py REPO_ROOT WORK_DIR    (prints SKIP without torch)

Crafted, each checked to be armed (its usual loader creates a marker file): (a) a pickle that
torch.load(weights_only=True) rejects with a TypeError (a Tensor BUILD) and the full unpickler then
runs (builtins.open); (b) a TorchScript archive whose __setstate__ writes a file (torch 1.13's
torch.load hands it to torch.jit.load, weights_only or not); (c) torch.save's zip whose pickle calls
builtins.open. Each as model.pt of an otherwise valid export, as model.safetensors, and named by
config.json "weights" outside the folder: load and load_state_dict must raise one ValueError naming
the file and saying what was expected, create no marker, and call neither torch.load,
torch.jit.load nor pickle. Genuine exports (model.pt in torch.save's zip, model.safetensors) still
load, with the same tensors, also with those loaders disabled.
"""
import json
import os
import pickle
import shutil
import struct
import sys
from typing import Tuple

try:
    import torch
except ImportError:
    print("SKIP: %s has no torch to craft a TorchScript archive (Debian: python3-torch)" % sys.executable)
    sys.exit(0)

repo, work = (os.path.abspath(a) for a in sys.argv[1:3])
sys.path.insert(0, os.path.join(repo, "python"))
import normlab_torch  # noqa: E402

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
marker = os.path.join(work, "PWNED")
failures = []


def fail(msg):
    print("FAIL: " + msg)
    failures.append(msg)


def armed(label, run):
    """The crafted file does run its code under its usual loader: else this test proves nothing."""
    try:
        run()
    except Exception:
        pass
    if not os.path.exists(marker):
        print("FAIL: %s did not create its marker under its own loader: the test proves nothing" % label)
        sys.exit(1)
    os.remove(marker)


# A genuine export: a tiny pre-ln LM (format_version 1: every norm a LayerNorm), synthetic words.
config = {"format": "normlab-export", "format_version": 1, "weights": "model.pt", "arch": "lm",
          "d_model": 8, "ffn_dim": 16, "heads": 2, "enc_layers": 0, "dec_layers": 1, "tgt_vocab": 14,
          "src_vocab": 14, "share_embeddings": "all", "scheme": {"name": "pre-ln"},
          "special_ids": {"pad": 0, "unk": 1, "bos": 2, "eos": 3},
          "tokenizer": {"type": "synthetic", "symbols": 10}}
state = {k: v.clone() for k, v in normlab_torch.NormlabTransformer(config).state_dict().items()}


def export_dir(name, weights_name, weights_src=None, cfg_weights=None):
    d = os.path.join(work, name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(config, weights=cfg_weights or weights_name), f)
    if weights_src:
        shutil.copyfile(weights_src, os.path.join(d, weights_name))
    return d


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for k, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class Forbidden(Exception):
    pass


class NoCodeLoaders:
    """torch.load, torch.jit.load and pickle disabled: reading an export must need none of them."""
    names = [(torch, "load"), (torch.jit, "load"), (pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")]

    def __enter__(self):
        self.saved = [getattr(m, n) for m, n in self.names]
        for m, n in self.names:
            setattr(m, n, self.refuse(n))

    def __exit__(self, *exc):
        for (m, n), f in zip(self.names, self.saved):
            setattr(m, n, f)

    @staticmethod
    def refuse(name):
        def f(*a, **k):
            raise Forbidden("normlab_torch called %s" % name)
        return f


# Genuine exports load, with the same tensors, without torch.load or pickle.
genuine_pt = os.path.join(work, "genuine.pt")
torch.save(state, genuine_pt)
genuine_st = os.path.join(work, "genuine.safetensors")
write_safetensors(genuine_st, state)
for name, weights, src in (("ok_pt", "model.pt", genuine_pt), ("ok_st", "model.safetensors", genuine_st)):
    d = export_dir(name, weights, src)
    try:
        with NoCodeLoaders():
            got = normlab_torch.load(d).state_dict()
            normlab_torch.load_tokenizers(d)
        if set(got) != set(state) or any(not torch.equal(got[k], state[k]) for k in state):
            fail("%s: load(DIR) gave other tensors than the export's" % name)
    except Exception as e:
        fail("%s: a genuine export did not load: %s: %s" % (name, type(e).__name__, e))


# (a) A pickle whose Tensor BUILD (a 3-tuple state) makes torch's weights_only unpickler raise a
# TypeError (Tensor.set_(False, None, None)) while the full unpickler accepts it and goes on to
# builtins.open(marker, "w").
payload = (b"\x80\x02ctorch\nTensor\n)R" + b"\x89NN\x87b0" +
           b"cbuiltins\nopen\nX" + struct.pack("<I", len(marker)) + marker.encode() + b"X\x01\x00\x00\x00w\x86R.")
evil_pickle = os.path.join(work, "evil_pickle.pt")
with open(evil_pickle, "wb") as f:
    f.write(payload)
armed("the pickle", lambda: pickle.loads(payload))


# (b) A TorchScript archive whose __setstate__ creates the marker (as check_checkpoint_trust.py).
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


evil_script = os.path.join(work, "evil_script.pt")
torch.jit.script(Writes(marker)).save(evil_script)
armed("the TorchScript archive", lambda: torch.jit.load(evil_script))


# (c) torch.save's zip (what genuine model.pt looks like) whose pickle calls builtins.open.
class Opens:
    def __reduce__(self):
        return (open, (marker, "w"))


evil_zip = os.path.join(work, "evil_zip.pt")
torch.save({"decoder.embed_tokens.weight": Opens()}, evil_zip)
armed("the torch.save zip", lambda: torch.load(evil_zip, weights_only=False))


def expect_refused(label, call, path):
    for guarded in (False, True):  # as it is; then with torch.load/jit.load/pickle disabled
        try:
            if guarded:
                with NoCodeLoaders():
                    call()
            else:
                call()
            fail("%s: loaded without an error" % label)
        except Forbidden as e:
            fail("%s: %s on the file" % (label, e))
        except ValueError as e:
            msg = str(e)
            if path not in msg or "expected" not in msg or "\n" in msg:
                fail("%s: the error should be one line naming %s and what was expected: %s" % (label, path, msg))
        except Exception as e:
            fail("%s: %s instead of a ValueError naming the file: %s" % (label, type(e).__name__, e))
        if os.path.exists(marker):
            fail("%s: the file's code ran (created %s)" % (label, marker))
            os.remove(marker)


for kind, src in (("pickle", evil_pickle), ("torchscript", evil_script), ("zip", evil_zip)):
    for weights in ("model.pt", "model.safetensors", "pytorch_model.bin"):
        d = export_dir("%s_%s" % (kind, weights.replace(".", "_")), weights, src)
        path = os.path.join(d, weights)
        expect_refused("load(DIR) with a crafted %s as %s" % (kind, weights), lambda: normlab_torch.load(d), path)
        expect_refused("load_state_dict(%s) of a crafted %s" % (weights, kind),
                       lambda: normlab_torch.load_state_dict(path), path)
    # config.json naming a file outside the export folder
    d = export_dir("%s_outside" % kind, "model.pt", cfg_weights=src)
    expect_refused("load(DIR) whose config.json names %s" % src, lambda: normlab_torch.load(d), src)

# The tokenizer is a file of the folder too: config.json may not point elsewhere.
d = export_dir("tok_outside", "model.pt", genuine_pt)
with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(dict(config, tokenizer={"type": "sentencepiece", "model": evil_script}), f)
expect_refused("load_tokenizers(DIR) whose config.json names %s" % evil_script,
               lambda: normlab_torch.load_tokenizers(d), evil_script)

if failures:
    print("%d failure(s)" % len(failures))
    sys.exit(1)
print("export trust OK")
