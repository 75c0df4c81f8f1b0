#!/usr/bin/env python3
"""`normlab export` read back by plain PyTorch (python/normlab_torch.py).

For every built-in scheme (what `normlab plugins list` shows next to the binary), encoder-decoder,
decoder-only and decoder-only of the llama family (SwiGLU, rotary positions, no biases, grouped k/v
heads), every norm kind of `scheme.norm`, plus the scheme parameters that change the
forward pass: train a tiny model for
a few updates, export it with normlab's logits for a fixed input (--reference-logits), load it with
torch.load + normlab_torch in this Python, and compare the logits (max abs difference <= 1e-5 per
unit of the logits' magnitude, at least 1e-5).
Also: model.pt is a plain dict that torch.load opens (weights_only), the state_dict loads strictly,
a SentencePiece run exports its tokenizer, an export of format_version 1 still loads, a third-party
scheme, an unknown norm kind or model family is one clear error, and bad arguments are one error line.
`--format hf`: the models that are HF classes (Llama, with LN-Scaling's 1/√ℓ folded in; Qwen3;
OLMo 2; Gemma 2) load in transformers (where this Python has it) with normlab's logits to 1e-5,
and the others' model_type_note names each reason.
The PyTorch side alone: a third-party scheme loads once register_scheme names its class; the exported
tokenizers encode as normlab's (SentencePiece where this Python has the package, else one error that
says to install it); greedy generation is the step-by-step argmax of the model's own logits, beam 1
is greedy, beam hypotheses score their teacher-forced log p / (len + 1)^lenpen; `translate` gives
the lines of `normlab translate` for beams 1 to 5.

usage: check_export_torch.py NORMLAB REPO_ROOT WORK_DIR [FROM_DIR]    (prints SKIP without torch)
FROM_DIR: the WORK_DIR of an earlier check with the same NORMLAB (another Python): a case whose
manifest there is the same text takes its run and export from there instead of training again, and
normlab's outputs for that run (its --format hf export, translations, token ids) likewise.
Every case is trained first, then exported by one `normlab export RUN...` process per option set.
"""
import hashlib
import importlib.util
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
reuse = os.path.abspath(sys.argv[4]) if len(sys.argv) > 4 else None
sys.path.insert(0, os.path.join(repo, "python"))
import normlab_torch  # noqa: E402

# float32 agreement is relative: a norm-less model's logits reach ~10, and the two libraries'
# summation orders then differ by ~1e-5 (pre-ln with norm "none": 1.14e-5 at logits up to 10.3 on
# the 2.15 build). Models with norms keep |logits| ~ 1 and stay within 2e-6.
TOLERANCE = 1e-5
failures = []
diffs = {}  # case -> max |logits - normlab|
# The llama family's geometry here: 4 heads of width 4 (rotary positions need an even width), 2
# key/value heads (grouped-query attention).
LLAMA_MODEL = {"family": "llama", "heads": 4, "kv_heads": 2}


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


def manifest(name, scheme, arch, params, sharing, run_keys=None, family="transformer", model_keys=None):
    model = {"arch": arch, "d_model": 16, "ffn_dim": 24, "heads": 2, "enc_layers": 2, "dec_layers": 3,
             "dropout": 0.1, "share_embeddings": sharing}
    if family == "llama":
        model.update(LLAMA_MODEL)
    model.update(model_keys or {})
    lines = ['[model]'] + ['%s = %s' % (k, json.dumps(v)) for k, v in model.items()]
    lines += ['[scheme]', 'name = "%s"' % scheme]
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
    lines += ['%s = %s' % (k, json.dumps(v)) for k, v in (run_keys or {}).items()]
    path = os.path.join(work, name + ".toml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def read_safetensors_checked(path):
    """The tensors of a safetensors file, with the `safetensors` package where this Python has it
    (else normlab_torch's reader), after checking the layout against the format's spec: 8-byte
    little-endian header length, JSON header, every tensor's bytes in [begin, end) back to back,
    no gap, no overlap, the byte buffer fully indexed."""
    blob = open(path, "rb").read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    position = 0
    for begin, end in spans:
        if begin != position or end < begin:
            raise AssertionError("%s: data_offsets %s do not follow %d" % (path, (begin, end), position))
        position = end
    if 8 + n + position != len(blob):
        raise AssertionError("%s: %d data bytes indexed, the file has %d" % (path, position, len(blob) - 8 - n))
    for k, v in header.items():
        if k != "__metadata__":
            elements = 1
            for dim in v["shape"]:
                elements *= dim
            if v["dtype"] != "F32" or elements * 4 != v["data_offsets"][1] - v["data_offsets"][0]:
                raise AssertionError("%s: %s is %s %s in %d bytes" % (path, k, v["dtype"], v["shape"],
                                                                     v["data_offsets"][1] - v["data_offsets"][0]))
    try:
        from safetensors.torch import load_file
    except ImportError:
        return normlab_torch.read_safetensors(path)
    return load_file(path)


def compare(name, export_dir):
    weights = json.load(open(os.path.join(export_dir, "config.json")))["weights"]
    if weights.endswith(".safetensors"):
        state = read_safetensors_checked(os.path.join(export_dir, weights))
    else:
        state = torch.load(os.path.join(export_dir, weights), map_location="cpu", weights_only=True)
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
    allowed = TOLERANCE * max(1.0, scale)
    if not diff <= allowed:
        raise AssertionError("max |logits - normlab| = %.3g > %.3g (1e-5 x max(1, logits up to %.3g))"
                             % (diff, allowed, scale))
    return diff


def refused(name, source, edit, needle):
    """An export normlab_torch cannot rebuild (config.json changed by `edit`, e.g. a third-party
    scheme's name) is one clear ValueError that names `needle`."""
    try:
        if not source:
            raise AssertionError("no export of the case it starts from")
        out = os.path.join(work, "export", name)
        shutil.copytree(source, out)
        path = os.path.join(out, "config.json")
        cfg = json.load(open(path))
        edit(cfg)
        with open(path, "w") as f:
            json.dump(cfg, f)
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


def as_format_1(cfg):
    """config.json as normlab wrote it before the norm specs (format_version 1) and the model
    families (no "family": a transformer)."""
    cfg["format_version"] = 1
    del cfg["norms"], cfg["norm_spec"]
    for key in ("family", "kv_heads", "rope_theta", "qk_norm_before_rope"):
        cfg.pop(key, None)


REUSED = set()  # the runs copied from FROM_DIR: normlab's outputs for them are FROM_DIR's too


def reused(name, manifest_path, out, data_files=()):
    """Copies the run and export of case `name` from FROM_DIR when its manifest (and data files)
    there are this text."""
    if not reuse:
        return False
    theirs = os.path.join(reuse, name + ".toml")
    runs, export = os.path.join(reuse, "runs", name), os.path.join(reuse, "export", name)
    if not (os.path.isfile(theirs) and os.path.isdir(runs) and os.path.isdir(export)):
        return False
    for mine in (manifest_path,) + tuple(data_files):
        other = os.path.join(reuse, os.path.relpath(mine, work))
        if not os.path.isfile(other) or open(other, "rb").read() != open(mine, "rb").read():
            return False
    shutil.copytree(runs, os.path.join(work, "runs", name))
    shutil.copytree(export, out)
    REUSED.add(name)
    return True


def export_runs(names, to, options):
    """`normlab export` of several runs in one process (LibTorch and the plugins start once, ~2 s of
    CPU a process): each into TO/NAME. Where that process fails, each run it left unexported gets
    a process of its own, so the error is its case's. Returns {name: the error} of the failed ones."""
    errors = {}
    if len(names) > 1:
        try:
            run(["export"] + ["runs/" + n for n in names] + ["--to", to] + options)
        except RuntimeError:
            pass
    for n in names:
        if not os.path.isfile(os.path.join(to, n, "config.json")):
            try:
                run(["export", "runs/" + n, "--to", os.path.join(to, n)] + options)
            except RuntimeError as e:
                errors[n] = e
    return errors


PLANNED = []  # the cases in order: trained, exported (one process per checkpoint), then compared
built = {}  # case -> its export folder, where it passed


def case(name, scheme, arch, params=None, sharing="none", checkpoint="last", run_keys=None,
         family="transformer", model_keys=None):
    PLANNED.append(dict(name=name, scheme=scheme, arch=arch, params=params or {}, sharing=sharing,
                        checkpoint=checkpoint, run_keys=run_keys, family=family, model_keys=model_keys))
    return name


def build_cases():
    """Trains (or takes from FROM_DIR) every planned case, exports them, and compares each."""
    errors, copied, todo = {}, set(), []
    for c in PLANNED:
        try:
            m = manifest(c["name"], c["scheme"], c["arch"], c["params"], c["sharing"], c["run_keys"],
                         c["family"], c["model_keys"])
            if reused(c["name"], m, os.path.join(work, "export", c["name"])):
                copied.add(c["name"])
            else:
                run(["train", m])
                todo.append(c)
        except Exception as e:  # noqa: BLE001 - report every case, then fail
            errors[c["name"]] = e
    for checkpoint in sorted({c["checkpoint"] for c in todo}):
        errors.update(export_runs([c["name"] for c in todo if c["checkpoint"] == checkpoint],
                                  os.path.join(work, "export"), ["--checkpoint", checkpoint, "--reference-logits"]))
    for c in PLANNED:
        name, out = c["name"], os.path.join(work, "export", c["name"])
        try:
            if name in errors:
                raise errors[name]
            cfg = json.load(open(os.path.join(out, "config.json")))
            if cfg.get("family", "transformer") != c["family"]:
                raise AssertionError("config.json family %r, the manifest's %r" % (cfg.get("family"), c["family"]))
            diffs[name] = diff = compare(name, out)
            print("ok   %-28s max |diff| %.2e%s" % (name, diff, " (run and export from FROM_DIR)" if name in copied else ""))
            built[name] = out
        except Exception as e:  # noqa: BLE001 - report every case, then fail
            failures.append(name)
            print("FAIL %-28s %s" % (name, e))
    del PLANNED[:]


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
print("torch %s (%s)" % (torch.__version__, sys.executable))
# Every built-in scheme has a PyTorch version, encoder-decoder, LM and llama-family LM.
exported = {}
for scheme in builtin_schemes():
    if scheme not in normlab_torch.SCHEMES:
        failures.append(scheme)
        print("FAIL %s: built-in scheme without a PyTorch version in normlab_torch.SCHEMES" % scheme)
        continue
    for arch in ("encdec", "lm"):
        exported[scheme, arch] = case("%s-%s" % (scheme, arch), scheme, arch)
    exported[scheme, "llama"] = case("%s-llama" % scheme, scheme, "lm", family="llama")

# Every norm kind of `scheme.norm` (and its eps), in the layers, inside branches and at the end.
for kind in ("rmsnorm", "scalenorm", "dyt", "l2"):
    case("pre-ln-%s" % kind, "pre-ln", "encdec", {"norm": kind})
# Without norms the first losses exceed the divergence threshold (3 ln V): not a divergence here.
UNNORMALIZED = {"divergence_loss": 1e9}
case("pre-ln-none", "pre-ln", "encdec", {"norm": "none"}, run_keys=UNNORMALIZED)
case("pre-ln-none-lm", "pre-ln", "lm", {"norm": "none"}, run_keys=UNNORMALIZED)
case("hybridnorm-none-lm", "hybridnorm", "lm", {"norm": "none"}, run_keys=UNNORMALIZED)
case("post-ln-scalenorm-lm", "post-ln", "lm", {"norm": "scalenorm", "norm_eps": 1e-3})
case("hybridnorm-rmsnorm", "hybridnorm", "encdec", {"norm": "rmsnorm", "norm_eps": 1e-6})
case("magneto-dyt-lm", "magneto", "lm", {"norm": "dyt"})
case("ln-scaling-rmsnorm", "ln-scaling", "encdec", {"norm": "rmsnorm"})
case("residual-l2", "residual", "encdec", {"norm": "l2"})
case("hyper-connections-dynamic-rms", "hyper-connections-dynamic", "lm", {"norm": "rmsnorm", "n": 3})
case("mhc-scalenorm", "mhc", "encdec", {"norm": "scalenorm", "n": 2, "t_max": 5})
# Issue 67.1's interventions: q/k norms before RoPE (per head, over the whole projection) and the
# attention and final soft-caps, on both bodies.
case("post-ln-qk-layer-softcaps", "post-ln", "encdec",
     model_keys={"qk_norm": "layer", "attn_logit_softcap": 2.0, "final_logit_softcap": 3.0})
case("pre-ln-qk-rms-all-llama", "pre-ln", "lm", family="llama",
     model_keys={"qk_norm": "rms", "qk_norm_scope": "all", "attn_logit_softcap": 1.5,
                 "final_logit_softcap": 0.5})
# Issue 67.3: the combinations that are HF classes (`--format hf` below): per-head RMS q/k norms on
# Pre-LN (Qwen3), whole-projection ones on OLMo 2's reordered norm, soft-caps on Peri-LN with a tied
# output (Gemma 2).
case("pre-ln-qk-rms-head-llama", "pre-ln", "lm", family="llama", model_keys={"qk_norm": "rms"})
case("reordered-norm-qk-rms-all-llama", "reordered-norm", "lm", family="llama",
     model_keys={"qk_norm": "rms", "qk_norm_scope": "all"})
case("peri-ln-softcaps-tied-llama", "peri-ln", "lm", sharing="decoder", family="llama",
     model_keys={"attn_logit_softcap": 1.5, "final_logit_softcap": 3.0})

# Parameters that change the forward pass, and the embedding-sharing layouts.
for sched in ("linear", "exp", "sigmoid"):
    case("branchnorm-%s" % sched, "branchnorm", "encdec", {"schedule": sched, "T": 8, "k": 3.0})
case("branchnorm-floor-lm", "branchnorm", "lm", {"T": 100, "alpha_min": 0.3})
case("admin-ologn", "admin", "encdec", {"omega_init": "O(logn)"})
case("admin-o1-lm", "admin", "lm", {"omega_init": "O(1)"})
case("deepnorm-torchscale", "deepnorm", "encdec", {"torchscale_compat": True})
case("rezero-init", "rezero", "encdec", {"init": 0.5})
case("hybridnorm-star", "hybridnorm", "lm", {"first_layer_prenorm": True})
case("magneto-ca-subln", "magneto", "encdec", {"cross_attn_subln": True, "torchscale_init": True})
case("peri-ln-embedding-norm", "peri-ln", "encdec", {"embedding_norm": True})
case("mix-ln-half-lm", "mix-ln", "lm", {"alpha": 0.5})
case("mix-ln-all-post", "mix-ln", "encdec", {"alpha": 1.0})
case("dyt-alpha0s", "dyt", "encdec", {"alpha0_attn": 0.8, "alpha0_ffn": 0.2, "alpha0_final": 0.3})
case("residual-eps", "residual", "lm", {"final_ln_eps": 1e-3})
case("ngpt-biases", "ngpt", "encdec", {"biases": True})
case("hyper-connections-n2-dynamic", "hyper-connections", "encdec", {"n": 2, "dynamic": True})
case("hyper-connections-dynamic-off", "hyper-connections-dynamic", "encdec", {"n": 3, "dynamic": False})
case("mhc-n3-lm", "mhc", "lm", {"n": 3, "t_max": 7})
case("pre-ln-share-all", "pre-ln", "encdec", sharing="all")
case("b2t-share-decoder", "b2t", "encdec", sharing="decoder")
case("post-ln-share-decoder-lm", "post-ln", "lm", sharing="decoder")
case("deepnorm-step", "deepnorm", "encdec", checkpoint="step_2")

# The llama family: one k/v head per query head with a tied output; nGPT's logit scale s_z on a
# tied output; HybridNorm's q/k norms with rotary positions (config.json "qk_norm_before_rope" says
# their order; normlab_torch follows it); a norm kind other than the family's default RMSNorm.
case("pre-ln-mha-tied-llama", "pre-ln", "lm", sharing="decoder", family="llama", model_keys={"kv_heads": 4})
case("ngpt-tied-llama", "ngpt", "lm", sharing="decoder", family="llama")
case("hybridnorm-star-llama", "hybridnorm", "lm", {"first_layer_prenorm": True}, family="llama")
case("peri-ln-layernorm-llama", "peri-ln", "lm", {"norm": "layernorm", "embedding_norm": True}, family="llama")
build_cases()
exported = {key: built.get(name) for key, name in exported.items()}
last, star = built.get("deepnorm-step"), built.get("hybridnorm-star-llama")
if star:
    print("     hybridnorm llama: qk_norm_before_rope = %s"
          % json.load(open(os.path.join(star, "config.json")))["qk_norm_before_rope"])

# A third-party scheme, and exports this normlab_torch cannot read, are one clear error.
refused("third-party-refused", exported.get(("pre-ln", "encdec")),
        lambda cfg: cfg["scheme"].update(name="my-scheme"), "normlab_torch.register_scheme('my-scheme'")


class MyScheme(normlab_torch.Scheme):
    """A third party's PyTorch version of its scheme (here Pre-LN's equations under another name)."""

    def final_norm(self, stack):
        return True

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = x + branch(s, layer.norm(s + "_norm", x))
        return x


# The hook that message names: registered, the third-party export loads and gives normlab's logits.
try:
    normlab_torch.register_scheme("my-scheme", MyScheme)
    for bad, error in ((lambda: normlab_torch.register_scheme("my-other", dict), TypeError),
                       (lambda: normlab_torch.register_scheme("pre-ln", MyScheme), ValueError)):
        try:
            bad()
            raise AssertionError("register_scheme accepted a bad registration")
        except error:
            pass
    diff = compare("my-scheme", os.path.join(work, "export", "third-party-refused"))
    print("ok   %-28s max |diff| %.2e" % ("third-party-registered", diff))
except Exception as e:  # noqa: BLE001
    failures.append("third-party-registered")
    print("FAIL %-28s %s" % ("third-party-registered", e))
refused("unknown-norm-kind-refused", exported.get(("pre-ln", "encdec")),
        lambda cfg: cfg["norms"]["encoder.layers.0.ffn_norm"].update(kind="groupnorm"), "'groupnorm'")
refused("format-1-sdk2-refused", exported.get(("hybridnorm", "encdec")), as_format_1, "'hybridnorm'")
refused("unknown-family-refused", exported.get(("pre-ln", "llama")),
        lambda cfg: cfg.update(family="mamba"), "'mamba'")
refused("logit-scale-kind-refused", exported.get(("ngpt", "llama")),
        lambda cfg: cfg["norms"]["decoder.logit_scale"].update(kind="rmsnorm"), "'rmsnorm'")
# An export of format_version 1 (LayerNorms only, no norm specs) still loads for the schemes it covered.
for scheme in ("admin", "sandwich-ln"):
    source = exported.get((scheme, "encdec"))
    if source:
        try:
            out = os.path.join(work, "export", scheme + "-format-1")
            shutil.copytree(source, out)
            cfg = json.load(open(os.path.join(out, "config.json")))
            as_format_1(cfg)
            json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
            print("ok   %-28s max |diff| %.2e" % (scheme + "-format-1", compare(scheme, out)))
        except Exception as e:  # noqa: BLE001
            failures.append(scheme + "-format-1")
            print("FAIL %-28s %s" % (scheme + "-format-1", e))

# The exported config names the checkpoint's update; step_2 is not the last one. It names the file
# relative to the run, and the run by its folder's name (issue 66.22): no config.json of a folder
# one may publish holds a path of this machine (this test's folders, or FROM_DIR's beside them).
if last:
    cfg = json.load(open(os.path.join(last, "config.json")))
    want = {"file": "checkpoints/step_2.safetensors", "run": "deepnorm-step", "updates": 2}
    if cfg["checkpoint"] != want or cfg["scheme"]["name"] != "deepnorm":
        failures.append("config.json")
        print("FAIL config.json: checkpoint %s (expected %s) scheme %s" % (cfg["checkpoint"], want, cfg["scheme"]["name"]))
    configs = [os.path.join(work, "export", d, "config.json") for d in sorted(os.listdir(os.path.join(work, "export")))]
    leaks = [f for f in configs if os.path.isfile(f) and os.path.dirname(work) in open(f).read()]
    if leaks:
        failures.append("config.json paths")
        print("FAIL config.json of %s names a path under %s" % (leaks, os.path.dirname(work)))
    else:
        print("ok   config.json: checkpoint %s, no path of this machine" % cfg["checkpoint"])

# `--format hf`: a HuggingFace-style folder, config.json + model.safetensors holding the tensors of
# model.pt (bit for bit, or where export folded a constant in, as config.json "hf_weights" says);
# normlab_torch loads it too. A llama-family LM whose layer and interventions an HF class has is
# that class (issues 46.13, 67.3, 68.2a), with HF's names; any other is model_type normlab with a
# note naming every reason.
HF_CLASSES = {  # case -> model_type
    "pre-ln-llama": "llama",
    "ln-scaling-llama": "llama",  # each layer's 1/√ℓ folded into its RMSNorm gains
    "mix-ln-llama": "llama",  # ⌊0.25 · 3⌋ = 0 Post-LN layers: Pre-LN
    "pre-ln-qk-rms-head-llama": "qwen3",
    "reordered-norm-qk-rms-all-llama": "olmo2",
    "peri-ln-llama": "gemma2",  # gains stored as γ − 1, the embedding / √d
    "sandwich-ln-llama": "gemma2",
    "peri-ln-softcaps-tied-llama": "gemma2",  # tied: lm_head the embedding, untied in Gemma 2
}
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
                    "gemma2": "Gemma2ForCausalLM"}
NOT_HF = {  # case -> what model_type_note names (each reason that applies)
    "pre-ln-encdec": ["only a language model of the llama family"],
    "mhc-lm": ["only a language model of the llama family"],
    "ngpt-llama": ["scheme ngpt changes the layer", "norm kind l2, scale"],
    "pre-ln-qk-rms-all-llama": ['model.qk_norm_scope = "all"', "model.attn_logit_softcap",
                                "model.final_logit_softcap"],
    "reordered-norm-llama": ['model.qk_norm = "none": OLMo 2 normalizes q and k'],
    "peri-ln-layernorm-llama": ["norm kind layernorm", "scheme.embedding_norm"],
}
hf_exports = {}
HF_DIR = os.path.join(work, "export-hf")  # NAME's --format hf export in HF_DIR/NAME
hf_errors, hf_todo = {}, []
for name in list(HF_CLASSES) + list(NOT_HF):
    theirs = os.path.join(reuse or "", "export-hf", name)
    if name in REUSED and os.path.isfile(os.path.join(theirs, "config.json")):
        shutil.copytree(theirs, os.path.join(HF_DIR, name))  # the same normlab, run and options
    elif os.path.isdir(os.path.join(work, "export", name)):
        hf_todo.append(name)
hf_errors.update(export_runs(hf_todo, HF_DIR, ["--format", "hf", "--reference-logits"]))
for name, want in list(HF_CLASSES.items()) + [(n, "normlab") for n in NOT_HF]:
    try:
        if not os.path.isdir(os.path.join(work, "export", name)):
            raise AssertionError("no torch export to compare with")
        if name in hf_errors:
            raise hf_errors[name]
        out = os.path.join(HF_DIR, name)
        cfg = json.load(open(os.path.join(out, "config.json")))
        if cfg["weights"] != "model.safetensors" or cfg.get("model_type") != want or \
                os.path.exists(os.path.join(out, "model.pt")):
            raise AssertionError("config.json weights %r model_type %r (expected %r: %s), files %s"
                                 % (cfg["weights"], cfg.get("model_type"), want, cfg.get("model_type_note"),
                                    sorted(os.listdir(out))))
        note = cfg.get("model_type_note", "")
        if want == "normlab" and not (note.startswith("not HF Llama, Qwen3, OLMo 2 or Gemma 2: ") and
                                      all(n in note for n in NOT_HF[name])):
            raise AssertionError("model_type_note %r does not name each of %s" % (note, NOT_HF[name]))
        if want != "normlab" and cfg.get("architectures") != [HF_ARCHITECTURES[want]]:
            raise AssertionError("architectures %r" % cfg.get("architectures"))
        hf_state = read_safetensors_checked(os.path.join(out, "model.safetensors"))
        if "hf_weights" in cfg:
            hf_state = normlab_torch.from_hf_weights(hf_state, cfg)
        pt_state = torch.load(os.path.join(work, "export", name, "model.pt"), map_location="cpu", weights_only=True)
        folded = [k for k, v in cfg.get("hf_weights", {}).items() if not isinstance(v, str)]
        if sorted(hf_state) != sorted(pt_state):
            raise AssertionError("model.safetensors holds %s, model.pt %s" % (sorted(hf_state), sorted(pt_state)))
        worst = max((hf_state[k] - pt_state[k]).abs().max().item() for k in pt_state)
        if worst > (1e-6 if folded else 0.0):
            raise AssertionError("model.safetensors and model.pt differ by %.2e" % worst)
        # The gains trained away from their initial ones: a fold that dropped them would show.
        gains = [v for k, v in pt_state.items() if k.endswith("norm.weight")]
        if want != "normlab" and all(torch.equal(g, torch.ones_like(g)) for g in gains):
            raise AssertionError("the norm gains are all ones: nothing to check a fold with")
        diffs[name + "-hf"] = diff = compare(name, out)
        hf_exports[name] = out
        print("ok   %-28s model_type %s, %d tensors as model.pt's (%d folded), max |diff| %.2e"
              % (name + "-hf", want, len(hf_state), len(folded), diff))
    except Exception as e:  # noqa: BLE001
        failures.append(name + "-hf")
        print("FAIL %-28s %s" % (name + "-hf", e))

# A Llama export of normlab before "hf_weights" (weight_names "hf-llama" alone) still loads.
try:
    if not hf_exports.get("pre-ln-llama"):
        raise AssertionError("no pre-ln-llama --format hf export")
    out = os.path.join(work, "export", "pre-ln-llama-hf-legacy")
    shutil.copytree(hf_exports["pre-ln-llama"], out)
    cfg = json.load(open(os.path.join(out, "config.json")))
    del cfg["hf_weights"]
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    print("ok   %-28s max |diff| %.2e" % ("pre-ln-llama-hf-legacy", compare("pre-ln-llama", out)))
except Exception as e:  # noqa: BLE001
    failures.append("pre-ln-llama-hf-legacy")
    print("FAIL %-28s %s" % ("pre-ln-llama-hf-legacy", e))

# An export folder a user kept other files in is not replaced (hostile review: export deleted a
# notes file and a results folder kept in an export): one error naming them, the files kept.
try:
    if not hf_exports.get("pre-ln-llama"):
        raise AssertionError("no pre-ln-llama --format hf export")
    out = os.path.join(work, "export", "pre-ln-llama-hf-kept")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(hf_exports["pre-ln-llama"], out)
    os.makedirs(os.path.join(out, "results"))
    open(os.path.join(out, "notes.txt"), "w").write("mine\n")
    p = run(["export", "runs/pre-ln-llama", "--to", out, "--format", "hf"], expect=2)
    if "notes.txt, results" not in p.stderr or not os.path.isfile(os.path.join(out, "notes.txt")) \
            or not os.path.isdir(os.path.join(out, "results")):
        raise AssertionError("stderr %r, files %s" % (p.stderr, sorted(os.listdir(out))))
    shutil.rmtree(os.path.join(out, "results"))
    os.remove(os.path.join(out, "notes.txt"))
    run(["export", "runs/pre-ln-llama", "--to", out, "--format", "torch"])  # only its own files
    files = set(os.listdir(out))
    if "model.pt" not in files or "model.safetensors" in files or "notes.txt" in files:
        raise AssertionError("files %s" % sorted(files))
    print("ok   %-28s %s" % ("export-keeps-user-files", p.stderr.strip()))
except Exception as e:  # noqa: BLE001
    failures.append("export-keeps-user-files")
    print("FAIL %-28s %s" % ("export-keeps-user-files", e))

# ... and transformers itself loads each HF-class export (AutoModelForCausalLM, as lm-eval-harness
# does): its logits are normlab's (the export's reference.pt) to 1e-5. The venv has transformers
# (scripts/normlab.sh); another Python without it says so and checks nothing here.
try:
    import transformers  # noqa: F401
except ImportError:
    transformers = None
if transformers is None:
    print("note: no transformers in %s: the HF classes' from_pretrained not checked" % sys.executable)
else:
    for name, want in HF_CLASSES.items():
        label = "%s-hf-transformers" % name
        try:
            out = hf_exports.get(name)
            if not out:
                raise AssertionError("no --format hf export")
            hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
            if type(hf).__name__ != HF_ARCHITECTURES[want]:
                raise AssertionError("AutoModelForCausalLM gave %s" % type(hf).__name__)
            ref = torch.load(os.path.join(out, "reference.pt"), map_location="cpu", weights_only=True)
            tokens, want_logits = ref["tokens"], ref["logits"]
            with torch.no_grad():
                got = hf(input_ids=tokens).logits
            # Row 2 ends in padding: causal, so its first 6 positions do not see it.
            diff = max((got[:2] - want_logits[:2]).abs().max().item(),
                       (got[2, :6] - want_logits[2, :6]).abs().max().item())
            if not diff <= 1e-5:
                raise AssertionError("%s logits differ from normlab's by %.2e" % (type(hf).__name__, diff))
            print("ok   %-28s transformers %s %s, max |diff| %.2e"
                  % (label, transformers.__version__, type(hf).__name__, diff))
        except Exception as e:  # noqa: BLE001
            failures.append(label)
            print("FAIL %-28s %s" % (label, e))

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
spm_export = None
try:
    out = os.path.join(work, "export", "spm")
    if reused("spm", os.path.join(work, "spm.toml"), out, data_files=(text,)):
        if os.path.isdir(os.path.join(reuse, "cache")):  # its tokenizer, as the run trained it
            shutil.copytree(os.path.join(reuse, "cache"), os.path.join(work, "cache"))
    else:
        run(["train", "spm.toml"])
        run(["export", "runs/spm", "--to", out, "--reference-logits"])
    cfg = json.load(open(os.path.join(out, "config.json")))
    model_file = os.path.join(out, cfg["tokenizer"].get("model", ""))
    if cfg["tokenizer"]["type"] != "sentencepiece" or not os.path.isfile(model_file):
        raise AssertionError("tokenizer not exported: %s" % cfg["tokenizer"])
    compare("spm", out)
    spm_export = out
    print("ok   spm tokenizer exported as %s" % os.path.basename(model_file))
except Exception as e:  # noqa: BLE001
    failures.append("spm")
    print("FAIL spm: %s" % e)


def check(name, body):
    """One named check of the PyTorch side alone: ok with what body() returns, or FAIL."""
    try:
        print("ok   %-28s %s" % (name, body()))
    except Exception as e:  # noqa: BLE001
        failures.append(name)
        print("FAIL %-28s %s" % (name, e))


def normlab_output(run_name, args, stdin_text=None, files=()):
    """`normlab ARGS` (run in WORK_DIR, `stdin_text` on stdin) as (exit code, stdout, stderr), kept
    in WORK_DIR/outputs. Where run_name's run came from FROM_DIR, FROM_DIR's output for the same
    arguments, stdin and input `files` is that of the same normlab on the same run: taken, not
    computed again."""
    key = json.dumps([args, stdin_text] + [open(os.path.join(work, f)).read() for f in files])
    file = "outputs/%s.json" % hashlib.sha256(key.encode()).hexdigest()[:32]
    theirs = os.path.join(reuse or "", file)
    if run_name in REUSED and os.path.isfile(theirs) and json.load(open(theirs))["key"] == key:
        result = json.load(open(theirs))
    else:
        p = subprocess.run([normlab] + args, cwd=work, input=stdin_text, capture_output=True, text=True)
        result = {"key": key, "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
    os.makedirs(os.path.join(work, "outputs"), exist_ok=True)
    json.dump(result, open(os.path.join(work, file), "w"))
    return result["rc"], result["stdout"], result["stderr"]


def normlab_ids(run_name, lines):
    """The token ids normlab's own tokenizer gives each line (`normlab forward`): an LM's text, or an
    encoder-decoder's source (with its eos)."""
    path = os.path.join(work, "forward_input.txt")
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    args = ["forward", "runs/" + run_name, "--input", "forward_input.txt", "--checkpoint", "last"]
    rc, stdout, stderr = normlab_output(run_name, args, files=["forward_input.txt"])
    if rc != 0:
        raise RuntimeError("normlab %s: exit %d\n%s" % (" ".join(args), rc, stderr[-2000:]))
    out = json.loads(stdout)
    key = "source_tokens" if out["arch"] == "encdec" else "positions"
    return [[t["id"] if "id" in t else t["input"]["id"] for t in s[key]] for s in out["sentences"]]


def have_sentencepiece():
    return importlib.util.find_spec("sentencepiece") is not None


def check_tokenizers():
    """load_tokenizers reads what export wrote and encodes as normlab does: the synthetic words
    (odd ones become unk) and, where this Python has the sentencepiece package, the SentencePiece
    model (else one ImportError that says to install it)."""
    lines = ["w3 w0 w19 w05 w20 x w1", "  w7  w7 w2 "]
    tok = normlab_torch.load_tokenizers(exported["pre-ln", "encdec"])
    mine = [tok.encode_source(line) for line in lines]
    if mine != normlab_ids("pre-ln-encdec", lines):
        raise AssertionError("synthetic ids %s, normlab %s" % (mine, normlab_ids("pre-ln-encdec", lines)))
    if tok.decode(mine[0]) != "w3 w0 w19 w1":
        raise AssertionError("decode %r" % tok.decode(mine[0]))
    lines = ["the man runs over a red ball", "near house with small dog"]
    # Debian's python3 (externally managed: no pip there) gets it from python3-sentencepiece, which
    # scripts/normlab.sh installs (issue 46.8): a LLaMA export's tokenizer must load there too.
    if sys.executable.startswith("/usr/bin/python3") and not have_sentencepiece():
        raise AssertionError("Debian's python3 has no sentencepiece: apt-get install python3-sentencepiece "
                             "(in scripts/normlab.sh's RUN_PACKAGES)")
    if not have_sentencepiece():
        try:
            normlab_torch.load_tokenizers(spm_export)
        except ImportError as e:
            if "pip install sentencepiece" not in str(e):
                raise AssertionError("the ImportError does not say how to install it: %s" % e)
            return "synthetic as normlab; no sentencepiece here, refused: %s" % e
        raise AssertionError("load_tokenizers read a SentencePiece model without the sentencepiece package")
    tok = normlab_torch.load_tokenizers(spm_export)
    mine = [tok.encode(line) for line in lines]
    if mine != normlab_ids("spm", lines) or [tok.decode(ids) for ids in mine] != lines:
        raise AssertionError("sentencepiece ids %s (normlab %s), decoded %s"
                             % (mine, normlab_ids("spm", lines), [tok.decode(ids) for ids in mine]))
    return "synthetic and sentencepiece ids as normlab's, decoded back"


def masked_argmax(logits, step, min_len=1):
    """The most likely next token as the decoders choose it: never pad or bos, eos not before min_len."""
    logits = logits.clone()
    logits[0] = logits[2] = float("-inf")
    if step < min_len:
        logits[3] = float("-inf")
    return int(logits.argmax())


def teacher_forced(model, ids, tokens, eos):
    """Σ log p(tokens [+ eos]) under the model, one forward pass (normlab's sequence_log_probs)."""
    target = tokens + ([3] if eos else [])
    with torch.no_grad():
        if model.encoder is not None:
            logits = model(torch.tensor([ids + ([] if ids[-1] == 3 else [3])]), torch.tensor([[2] + target[:-1]]))[0]
        else:
            logits = model.forward_lm(torch.tensor([ids + target[:-1]]))[0, len(ids) - 1:]
    lp = torch.log_softmax(logits.float(), -1).double()
    return float(sum(lp[i, t] for i, t in enumerate(target)))


def check_lm_generate(export):
    """An LM's greedy continuation is the argmax of forward_lm's own logits step by step; beam 1 is
    greedy; a beam's hypotheses are sorted by score = log p / (len + 1)^lenpen, with log p their
    teacher-forced probability."""
    model = normlab_torch.load(export)
    results = []
    for prompt in ([5, 9, 4], [3], [7, 7, 11, 6, 4, 12]):
        limit = 9
        greedy = normlab_torch.greedy_search(model, prompt, max_len_b=limit)
        ref, log_prob = [], 0.0
        with torch.no_grad():
            for step in range(limit + 1):
                logits = model.forward_lm(torch.tensor([prompt + ref]))[0, -1]
                token = 3 if step == limit else masked_argmax(logits, step)
                log_prob += float(torch.log_softmax(logits.float(), -1)[token])
                if token == 3:
                    break
                ref.append(token)
        if greedy.tokens != ref or abs(greedy.log_prob - log_prob) > 1e-9:
            raise AssertionError("prompt %s: greedy %s, argmax of forward_lm %s (%.9g)"
                                 % (prompt, greedy, ref, log_prob))
        one = normlab_torch.beam_search(model, prompt, beam=1, max_len_b=limit)
        if [h.tokens for h in one] != [greedy.tokens] or abs(one[0].log_prob - greedy.log_prob) > 1e-12:
            raise AssertionError("prompt %s: beam 1 %s, greedy %s" % (prompt, one, greedy))
        hyps = normlab_torch.beam_search(model, prompt, beam=4, lenpen=0.7, max_len_b=limit)
        check_hypotheses(model, prompt, hyps, 4, 0.7, limit)
        results.append(len(greedy.tokens))
    return "greedy = argmax of forward_lm (%s tokens), beam 1 = greedy, beam 4 consistent" % results


def check_hypotheses(model, ids, hyps, beam, lenpen, limit):
    if not 1 <= len(hyps) <= beam or [h.score for h in hyps] != sorted((h.score for h in hyps), reverse=True):
        raise AssertionError("%d hypotheses, scores %s" % (len(hyps), [h.score for h in hyps]))
    for h in hyps:
        if len(h.tokens) > limit or any(t in (0, 2, 3) for t in h.tokens):
            raise AssertionError("hypothesis %s (limit %d)" % (h, limit))
        if abs(h.score - h.log_prob / (len(h.tokens) + 1) ** lenpen) > 1e-12:
            raise AssertionError("score of %s is not log_prob / (len + 1)^%g" % (h, lenpen))
        forced = teacher_forced(model, ids, h.tokens, eos=True)
        if abs(forced - h.log_prob) > 1e-4:
            raise AssertionError("%s: teacher-forced log p %.6g" % (h, forced))


def check_translate(name, sources):
    """The Python translation equals `normlab translate` for beam 1 (greedy) and beams of 2 to 5 with
    length penalties; where a beam's text differs, normlab's output must tie with Python's best to
    1e-5 in score (the logits agree to ~1e-6, not bit for bit)."""
    export = exported[name, "encdec"]
    model, tok = normlab_torch.load(export), normlab_torch.load_tokenizers(export)
    path = os.path.join(work, "translate_input.txt")
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in sources))
    ties = 0
    for beam, lenpen in ((1, 1.0), (2, 1.0), (4, 0.6), (5, 1.0), (3, 2.0)):
        args = ["translate", "runs/%s-encdec" % name, "--checkpoint", "last", "--beam", str(beam), "--lenpen",
                str(lenpen), "--max-len-a", "1.2", "--max-len-b", "4"]
        rc, stdout, stderr = normlab_output("%s-encdec" % name, args, open(path).read())
        if rc != 0:
            raise AssertionError("normlab %s: exit %d\n%s" % (" ".join(args), rc, stderr[-2000:]))
        theirs = stdout.splitlines()
        options = dict(beam=beam, lenpen=lenpen, max_len_a=1.2, max_len_b=4)
        mine = [normlab_torch.translate(model, tok, line, **options) for line in sources]
        for line, a, b in zip(sources, mine, theirs):
            if a == b:
                continue
            ids = tok.encode_source(line)
            best = normlab_torch.generate(model, ids, **options)
            other = tok.encode(b)
            score = teacher_forced(model, ids, other, eos=True) / (len(other) + 1) ** lenpen
            if beam == 1 or abs(score - best.score) > 1e-5:
                raise AssertionError("beam %d lenpen %g, %r: normlab_torch %r (score %.9g), normlab %r (%.9g)"
                                     % (beam, lenpen, line, a, best.score, b, score))
            ties += 1
        if len(theirs) != len(sources):
            raise AssertionError("normlab translated %d of %d lines" % (len(theirs), len(sources)))
        for line in sources[:3]:
            ids = tok.encode_source(line)
            if beam == 1:
                one = normlab_torch.beam_search(model, ids, beam=1, **{k: v for k, v in options.items() if k != "beam"})
                greedy = normlab_torch.greedy_search(model, ids, lenpen, 1.2, 4)
                if one[0].tokens != greedy.tokens:
                    raise AssertionError("%r: beam 1 %s, greedy %s" % (line, one[0], greedy))
            else:
                check_hypotheses(model, ids, normlab_torch.beam_search(model, ids, **options), beam, lenpen,
                                 int(1.2 * len(ids) + 4))
    # Without length options both take the run's eval.max_len_a/b (config.json "decoding").
    rc, stdout, stderr = normlab_output("%s-encdec" % name, ["translate", "runs/%s-encdec" % name, "--checkpoint",
                                                              "last", "--beam", "1"], open(path).read())
    mine = [normlab_torch.translate(model, tok, line) for line in sources]
    if rc != 0 or stdout.splitlines() != mine or "decoding" not in model.cfg:
        raise AssertionError("run's length limit %s: normlab %r, normlab_torch %r"
                             % (model.cfg.get("decoding"), stdout.splitlines(), mine))
    return "%d sentences as normlab translate, beams 1-5 (%d ties)" % (len(sources), ties)


# The PyTorch side alone: tokenizers, generation, decoding as `normlab translate`.
SOURCES = ["w1 w2 w3", "w5 w4 w3 w2 w1 w0", "w7 w7 w8", "w11 w3 w9 w2 w6 w6 w1", "w19 w0", "w4",
           "w12 w13 w1 w8 w16 w15 w12 w9", "w2 w2 w2 w2 w2"]
if exported.get(("pre-ln", "encdec")) and spm_export:
    check("tokenizers", check_tokenizers)
else:
    failures.append("tokenizers")
    print("FAIL tokenizers: no pre-ln encoder-decoder or SentencePiece export")
for key in (("pre-ln", "lm"), ("ngpt", "llama"), ("hybridnorm", "llama")):
    if exported.get(key):
        check("generate-%s-%s" % key, lambda: check_lm_generate(exported[key]))
if spm_export:
    check("generate-spm", lambda: check_lm_generate(spm_export))
for name in ("pre-ln", "ngpt", "post-ln"):
    if exported.get((name, "encdec")):
        check("translate-%s" % name, lambda: check_translate(name, SOURCES))
if spm_export:
    def complete_spm():
        """complete() is the beam continuation of eos + the prompt's ids, decoded."""
        model, tok = normlab_torch.load(spm_export), normlab_torch.load_tokenizers(spm_export)
        text = normlab_torch.complete(model, tok, "the man", max_new_tokens=8, beam=3)
        hyp = normlab_torch.generate(model, [3] + tok.encode("the man"), beam=3, max_len_b=8)
        if text != tok.decode(hyp.tokens):
            raise AssertionError("complete returned %r, the continuation %s decodes to %r"
                                 % (text, hyp.tokens, tok.decode(hyp.tokens)))
        return "complete(\"the man\") -> %r (ids %s)" % (text, hyp.tokens)
    check("complete-spm", complete_spm if have_sentencepiece() else lambda: "skipped: no sentencepiece package here")

# Bad arguments: one error line, exit 2, nothing written.
for args, needle in ((["export", "runs/none", "--to", "x"], "not a run directory"),
                     (["export", "runs/post-ln-encdec", "--to", "x", "--checkpoint", "step_99"], "does not exist"),
                     (["export", "runs/post-ln-encdec", "--to", "x", "--checkpoint", "first"], "expected best, last or step_N"),
                     (["export", "runs/post-ln-encdec", "--to", "x", "--format", "onnx"], "expected torch or hf"),
                     (["export", "runs/post-ln-encdec", "runs/pre-ln-encdec", "runs/post-ln-encdec/", "--to", "x"],
                      "two runs named 'post-ln-encdec'"),
                     # a typo in the last of several runs: checked before the first is exported
                     (["export", "runs/post-ln-encdec", "runs/none", "--to", "x"], "runs/none: not a run directory")):
    try:
        p = run(args, expect=2)
        lines = p.stderr.strip().splitlines()
        if len(lines) != 1 or needle not in lines[0] or os.path.exists(os.path.join(work, "x")):
            raise AssertionError("stderr %r" % p.stderr)
        print("ok   error: %s" % lines[0])
    except Exception as e:  # noqa: BLE001
        failures.append("error " + needle)
        print("FAIL error case %s: %s" % (needle, e))

llama = {k: v for k, v in diffs.items() if "llama" in k}
if llama:
    worst = max(llama, key=llama.get)
    print("%d llama-family cases, max |diff| %.2e (%s)" % (len(llama), llama[worst], worst))
if failures:
    print("export check FAILED: %s" % ", ".join(failures))
    sys.exit(1)
print("export check OK")
