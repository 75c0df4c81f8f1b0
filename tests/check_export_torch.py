#!/usr/bin/env python3
"""`normlab export` read back by plain PyTorch (python/normlab_torch.py).

For every built-in scheme (what `normlab plugins list` shows next to the binary), encoder-decoder
and decoder-only, plus the scheme parameters that change the forward pass: train a tiny model for
a few updates, export it with normlab's logits for a fixed input (--reference-logits), load it with
torch.load + normlab_torch in this Python, and compare the logits (max abs difference <= 1e-5).
Also: model.pt is a plain dict that torch.load opens (weights_only), the state_dict loads strictly,
a SentencePiece run exports its tokenizer, and bad arguments are one error line.

usage: check_export_torch.py NORMLAB REPO_ROOT WORK_DIR    (prints SKIP without torch)
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
except ImportError:
    print("SKIP: %s has no torch (the venv of scripts/normlab.sh, or Debian python3-torch)" % sys.executable)
    sys.exit(0)

normlab, repo, work = (os.path.abspath(a) for a in sys.argv[1:4])
sys.path.insert(0, os.path.join(repo, "python"))
import normlab_torch  # noqa: E402

TOLERANCE = 1e-5
failures = []


def run(args, expect=0):
    p = subprocess.run([normlab] + args, cwd=work, capture_output=True, text=True)
    if p.returncode != expect:
        raise RuntimeError("normlab %s: exit %d (expected %d)\n%s%s"
                           % (" ".join(args), p.returncode, expect, p.stdout[-2000:], p.stderr[-2000:]))
    return p


def builtin_schemes():
    out = run(["plugins", "list"]).stdout.splitlines()[1:]
    names = [line.split()[0] for line in out if line.strip()]
    if len(names) < 10:
        raise RuntimeError("plugins list shows only %s" % names)
    return names


def manifest(name, scheme, arch, params, sharing):
    lines = ['[model]', 'arch = "%s"' % arch, 'd_model = 16', 'ffn_dim = 24', 'heads = 2',
             'enc_layers = 2', 'dec_layers = 3', 'dropout = 0.1', 'share_embeddings = "%s"' % sharing,
             '[scheme]', 'name = "%s"' % scheme]
    lines += ['%s = %s' % (k, json.dumps(v)) for k, v in params.items()]
    if arch == "lm":
        lines += ['[data]', 'task = "synthetic-lm"', 'synthetic_vocab = 20', 'synthetic_train = 200',
                  'synthetic_valid = 20', 'lm_block = 12']
    else:
        lines += ['[data]', 'task = "reverse"', 'synthetic_vocab = 20', 'synthetic_train = 200',
                  'synthetic_valid = 20', 'synthetic_min_len = 3', 'synthetic_max_len = 8']
    lines += ['[optim]', 'lr = 3e-3', 'warmup_updates = 1', 'max_updates = 3', 'max_tokens = 256',
              '[eval]', 'bleu = false', 'interval = 0',
              '[run]', 'out_dir = "runs/%s"' % name, 'threads = 1', 'checkpoint_interval = 2']
    path = os.path.join(work, name + ".toml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def compare(name, export_dir):
    state = torch.load(os.path.join(export_dir, "model.pt"), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise AssertionError("model.pt is not a dict of tensors: %r" % type(state))
    model = normlab_torch.load(export_dir)  # strict load_state_dict: names and shapes must agree
    ref = torch.load(os.path.join(export_dir, "reference.pt"), map_location="cpu", weights_only=True)
    with torch.no_grad():
        if "src" in ref:
            logits = model(ref["src"], ref["tgt_in"])
        else:
            logits = model.forward_lm(ref["tokens"])
    if logits.shape != ref["logits"].shape:
        raise AssertionError("logits shape %s, normlab %s" % (tuple(logits.shape), tuple(ref["logits"].shape)))
    diff = (logits - ref["logits"]).abs().max().item()
    scale = ref["logits"].abs().max().item()
    if not diff <= TOLERANCE:
        raise AssertionError("max |logits - normlab| = %.3g > %g (logits up to %.3g)" % (diff, TOLERANCE, scale))
    return diff


def refused(name, scheme, params, needle):
    """A run normlab_torch cannot rebuild still exports, and loading it is one clear error."""
    try:
        m = manifest(name, scheme, "encdec", params, "none")
        run(["train", m])
        out = os.path.join(work, "export", name)
        run(["export", "runs/" + name, "--to", out])
        try:
            normlab_torch.load(out)
        except ValueError as e:
            if needle not in str(e):
                raise AssertionError("load refused it, but the message does not name %r: %s" % (needle, e))
            print("ok   %-28s load refused: %s" % (name, e))
            return
        raise AssertionError("normlab_torch.load accepted a model it cannot rebuild")
    except Exception as e:  # noqa: BLE001
        failures.append(name)
        print("FAIL %-28s %s" % (name, e))


def case(name, scheme, arch, params=None, sharing="none", checkpoint="last"):
    try:
        m = manifest(name, scheme, arch, params or {}, sharing)
        run(["train", m])
        out = os.path.join(work, "export", name)
        run(["export", "runs/" + name, "--to", out, "--checkpoint", checkpoint, "--reference-logits"])
        diff = compare(name, out)
        print("ok   %-28s max |diff| %.2e" % (name, diff))
        return out
    except Exception as e:  # noqa: BLE001 - report every case, then fail
        failures.append(name)
        print("FAIL %-28s %s" % (name, e))
        return None


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
print("torch %s (%s)" % (torch.__version__, sys.executable))
# The SDK 1 schemes have a PyTorch version; the SDK 2 schemes (2022-2025) not yet: exporting them
# works, and loading them in normlab_torch is one error naming the scheme.
SDK1_SCHEMES = {"admin", "b2t", "branchnorm", "deepnorm", "ds-init", "post-ln", "post-ln-init", "pre-ln",
                "rezero", "sandwich-ln"}
for scheme in builtin_schemes():
    if scheme not in normlab_torch.SCHEMES:
        if scheme in SDK1_SCHEMES:
            failures.append(scheme)
            print("FAIL %s: built-in scheme without a PyTorch version in normlab_torch.SCHEMES" % scheme)
        else:
            refused("%s-refused" % scheme, scheme, {}, "'%s'" % scheme)
        continue
    for arch in ("encdec", "lm"):
        case("%s-%s" % (scheme, arch), scheme, arch)
refused("pre-ln-rmsnorm-refused", "pre-ln", {"norm": "rmsnorm"}, "rmsnorm")

# Parameters that change the forward pass, and the embedding-sharing layouts.
for sched in ("linear", "exp", "sigmoid"):
    case("branchnorm-%s" % sched, "branchnorm", "encdec", {"schedule": sched, "T": 8, "k": 3.0})
case("branchnorm-floor-lm", "branchnorm", "lm", {"T": 100, "alpha_min": 0.3})
case("admin-ologn", "admin", "encdec", {"omega_init": "O(logn)"})
case("admin-o1-lm", "admin", "lm", {"omega_init": "O(1)"})
case("deepnorm-torchscale", "deepnorm", "encdec", {"torchscale_compat": True})
case("rezero-init", "rezero", "encdec", {"init": 0.5})
case("pre-ln-share-all", "pre-ln", "encdec", sharing="all")
case("b2t-share-decoder", "b2t", "encdec", sharing="decoder")
case("post-ln-share-decoder-lm", "post-ln", "lm", sharing="decoder")
last = case("deepnorm-step", "deepnorm", "encdec", checkpoint="step_2")

# The exported config names the checkpoint's update; step_2 is not the last one.
if last:
    cfg = json.load(open(os.path.join(last, "config.json")))
    if cfg["checkpoint"]["updates"] != 2 or cfg["scheme"]["name"] != "deepnorm":
        failures.append("config.json")
        print("FAIL config.json: checkpoint %s scheme %s" % (cfg["checkpoint"], cfg["scheme"]["name"]))

# A SentencePiece run: the tokenizer model goes with the weights.
text = os.path.join(work, "text.txt")
with open(text, "w") as f:
    words = "the man runs over a red ball near house with small dog".split()
    f.write("\n".join(" ".join(words[(i * 7 + k) % len(words)] for k in range(3 + i % 6)) for i in range(200)) + "\n")
with open(os.path.join(work, "spm.toml"), "w") as f:
    f.write('[model]\narch = "lm"\nd_model = 16\nffn_dim = 32\nheads = 2\ndec_layers = 1\n'
            '[data]\ntask = "lm"\ntrain = "text.txt"\nlm_block = 16\ncache_dir = "cache"\n'
            '[data.tokenizer]\nmodel_type = "char"\nvocab_size = 30\n'
            '[optim]\nmax_updates = 2\nmax_tokens = 256\n[eval]\nbleu = false\n[run]\nout_dir = "runs/spm"\nthreads = 1\n')
try:
    run(["train", "spm.toml"])
    out = os.path.join(work, "export", "spm")
    run(["export", "runs/spm", "--to", out, "--reference-logits"])
    cfg = json.load(open(os.path.join(out, "config.json")))
    model_file = os.path.join(out, cfg["tokenizer"].get("model", ""))
    if cfg["tokenizer"]["type"] != "sentencepiece" or not os.path.isfile(model_file):
        raise AssertionError("tokenizer not exported: %s" % cfg["tokenizer"])
    compare("spm", out)
    print("ok   spm tokenizer exported as %s" % os.path.basename(model_file))
except Exception as e:  # noqa: BLE001
    failures.append("spm")
    print("FAIL spm: %s" % e)

# Bad arguments: one error line, exit 2, nothing written.
for args, needle in ((["export", "runs/none", "--to", "x"], "not a run directory"),
                     (["export", "runs/post-ln-encdec", "--to", "x", "--checkpoint", "step_99"], "does not exist"),
                     (["export", "runs/post-ln-encdec", "--to", "x", "--checkpoint", "first"], "expected best, last or step_N")):
    try:
        p = run(args, expect=2)
        lines = p.stderr.strip().splitlines()
        if len(lines) != 1 or needle not in lines[0] or os.path.exists(os.path.join(work, "x")):
            raise AssertionError("stderr %r" % p.stderr)
        print("ok   error: %s" % lines[0])
    except Exception as e:  # noqa: BLE001
        failures.append("error " + needle)
        print("FAIL error case %s: %s" % (needle, e))

if failures:
    print("export check FAILED: %s" % ", ".join(failures))
    sys.exit(1)
print("export check OK")
