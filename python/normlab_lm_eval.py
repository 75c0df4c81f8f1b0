"""lm-evaluation-harness's model `normlab`: any normlab language-model run or export, every scheme.

    python python/normlab_lm_eval.py --model normlab --model_args path=runs/my-lm \\
        --tasks hellaswag,arc_easy --device cpu --batch_size 16
    python python/normlab_lm_eval.py --model normlab --model_args path=export/,max_length=2048 ...

The arguments are `lm_eval`'s (lm-evaluation-harness 0.4); this file registers the model `normlab`
in the harness's model registry, then runs the harness's own command line (`lm_eval.__main__`'s
cli_evaluate). The harness finds models only among the modules it imported (0.4.13 has no entry
point for models; `--include_path` adds tasks only), hence this wrapper; `python -m normlab_lm_eval`
does the same with python/ (or PREFIX/share/normlab/python) on PYTHONPATH. From Python:

    import lm_eval, normlab_lm_eval          # the import registers "normlab"
    lm_eval.simple_evaluate(model="normlab", model_args="path=runs/my-lm", tasks=["hellaswag"])

--model_args (comma-separated key=value):
    path        a run directory (runs/NAME: its checkpoint is exported with `normlab export` into a
                temporary folder) or what `normlab export` wrote (--format torch or hf, any scheme)
    checkpoint  with a run: best | last | step_N (`normlab export --checkpoint`; default best, else last)
    device      cpu | cuda | cuda:N (default: the harness's --device; a GPU asked by the harness's
                default on a machine without one falls back to the CPU, as its HF model does)
    batch_size  rows per forward pass (default: the harness's --batch_size; "auto": 16)
    max_length  the model's window (default: config.json's max_position_embeddings, or for a run
                max(data.lm_block, 2048): `normlab eval --tasks`'s and the HF export's max_length)
    normlab     the normlab binary for a run (default: $NORMLAB, `normlab` on PATH, the build's or the
                install's bin/normlab beside this file)
    plugin_path passed to `normlab export --plugin-path` (an out-of-tree scheme)

The model is python/normlab_torch.py's (the PyTorch mirror of every scheme), fp32, eval mode; the
tokenizer the run's own (its SentencePiece model; the synthetic tasks' words). A request is scored
as lm-evaluation-harness scores it for a Hugging Face causal LM and as `normlab eval --tasks` does
(docs/downstream.md "How an item is scored"): the context's trailing whitespace moved to the
continuation, the pair encoded together and split after the context's tokens (TemplateLM's
_encode_pair), EOS before an empty context, no BOS, (context + continuation)[-(max_length + 1):][:-1]
as input, the continuation's log-softmax (fp32) summed, greedy when every token is the argmax. Each
distinct token sequence is scored once per call, so that identical requests (duplicated choices)
get bitwise equal log-likelihoods. loglikelihood_rolling is the harness's rolling windows
(EOS-prefixed, disjoint); generate_until is greedy (until strings, max_gen_toks, EOS), rerunning
the whole prefix each step (no key/value cache): correct, slow for long generations; sampling
(do_sample) is refused.

Needs `torch`, `lm_eval` (0.4) and, for a SentencePiece run, `sentencepiece`; not transformers.
"""
import atexit
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import normlab_torch  # noqa: E402

import lm_eval.models  # noqa: E402,F401  (the harness's own models: see register below)
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

__all__ = ["NormlabLM", "main"]

log = logging.getLogger("normlab_lm_eval")
DEFAULT_BATCH = 16
DEFAULT_MAX_GEN_TOKS = 256
HARNESS_MIN_LENGTH = 2048  # normlab: max(data.lm_block, 2048), the HF export's max_position_embeddings


class NormlabError(ValueError):
    """A model argument or folder normlab_lm_eval cannot use: the message names it and what was expected."""


def _truthy(v):
    return str(v).lower() in ("1", "true", "yes")


def _normlab_binary(given):
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [given, os.environ.get("NORMLAB"), shutil.which("normlab"),
                  os.path.join(here, "..", "build", "bin", "normlab"),       # the source tree's python/
                  os.path.join(here, "..", "..", "..", "bin", "normlab")]    # PREFIX/share/normlab/python
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    if given:
        raise NormlabError("normlab_lm_eval: model_args normlab=%s: no executable there" % given)
    raise NormlabError("normlab_lm_eval: exporting a run needs the normlab binary: pass model_args normlab=PATH, "
                       "set $NORMLAB or put normlab on PATH (or give path= an export folder)")


def _run_lm_block(run_dir):
    """data.lm_block of the run's manifest.resolved.toml (None when it does not say)."""
    path = os.path.join(run_dir, "manifest.resolved.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            block = tomllib.load(f).get("data", {}).get("lm_block")
    except ImportError:  # Python < 3.11: the key's line
        block = None
        section = ""
        with open(path, encoding="utf-8") as f:
            for line in f:
                s = line.split("#", 1)[0].strip()
                if s.startswith("["):
                    section = s.strip("[] ")
                elif section == "data" and s.replace(" ", "").startswith("lm_block="):
                    block = int(s.split("=", 1)[1])
    return int(block) if isinstance(block, int) else None


def _export_run(run_dir, checkpoint, binary, plugin_path):
    """The run's checkpoint exported (`normlab export --format torch`) into a temporary folder,
    removed when the process ends."""
    tmp = tempfile.mkdtemp(prefix="normlab_lm_eval.")
    atexit.register(shutil.rmtree, tmp, True)
    out = os.path.join(tmp, "export")
    cmd = [binary, "export", run_dir, "--to", out, "--format", "torch"]
    if checkpoint:
        cmd += ["--checkpoint", str(checkpoint)]
    if plugin_path:
        cmd += ["--plugin-path", str(plugin_path)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        said = (p.stderr.strip() or p.stdout.strip())[-600:] or "it printed nothing (is normlab= the normlab binary?)"
        raise NormlabError("normlab_lm_eval: %s failed (exit %d): %s" % (" ".join(cmd), p.returncode, said))
    return out


def _whole_number(key, value):
    try:
        return int(str(value))
    except ValueError:
        raise NormlabError("normlab_lm_eval: model_args %s=%s: expected an integer >= 1" % (key, value)) from None


class NormlabLM(TemplateLM):
    """A normlab language model (run or export) for lm-evaluation-harness: see the module's text."""

    backend = "causal"

    def __init__(self, path=None, checkpoint=None, device=None, batch_size=None, max_length=None, normlab=None,
                 plugin_path=None, max_batch_size=None, _device_from_harness=False, **unknown):
        super().__init__()
        if unknown:
            raise NormlabError("normlab_lm_eval: unknown model_args %s (known: path, checkpoint, device, batch_size, "
                               "max_length, normlab, plugin_path)" % ", ".join(sorted(unknown)))
        if not path:
            raise NormlabError("normlab_lm_eval: model_args path= is needed: a run directory or a normlab export")
        path = str(path)
        lm_block = None
        if os.path.isfile(os.path.join(path, "manifest.resolved.toml")):
            lm_block = _run_lm_block(path)
            export = _export_run(path, checkpoint, _normlab_binary(normlab), plugin_path)
            self.source = {"run": os.path.abspath(path), "checkpoint": checkpoint or "best, else last"}
        elif os.path.isfile(os.path.join(path, "config.json")):
            if checkpoint:
                raise NormlabError("normlab_lm_eval: model_args checkpoint=%s: %s is an export (one checkpoint); "
                                   "checkpoint= picks one of a run directory's" % (checkpoint, path))
            export = path
            self.source = {"export": os.path.abspath(path)}
        else:
            raise NormlabError("normlab_lm_eval: model_args path=%s: expected a run directory (with "
                               "manifest.resolved.toml) or a normlab export (with config.json)" % path)
        with open(os.path.join(export, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        if cfg.get("format") != "normlab-export":
            raise NormlabError("normlab_lm_eval: %s/config.json: format is %r, expected \"normlab-export\" (what "
                               "`normlab export` writes)" % (export, cfg.get("format")))
        if cfg.get("arch") != "lm":
            raise NormlabError("normlab_lm_eval: %s/config.json: arch is %r; the harness scores a language model "
                               "(arch \"lm\")" % (export, cfg.get("arch")))
        tokenizers = normlab_torch.load_tokenizers(export)
        if tokenizers.tgt is None:
            raise NormlabError("normlab_lm_eval: %s/config.json: tokenizer type \"ids\" (token shards whose tokenizer "
                               "normlab does not run); the harness passes text: score pre-tokenized items with "
                               "`normlab eval --tasks` (context_ids/choice_ids)" % export)
        self.tok = tokenizers.tgt
        self.cfg = cfg

        device = str(device) if device else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            if not _device_from_harness:
                raise NormlabError("normlab_lm_eval: model_args device=%s: no CUDA device here" % device)
            log.info("normlab_lm_eval: --device %s: no CUDA device here, using the CPU", device)
            device = "cpu"
        try:
            self._device = torch.device(device)
            torch.empty(0, device=self._device)
        except (RuntimeError, ValueError) as e:
            raise NormlabError("normlab_lm_eval: model_args device=%s: expected cpu, cuda or cuda:N (%s)"
                               % (device, str(e).splitlines()[0]))
        self.model = normlab_torch.load(export, map_location=self._device).to(self._device).eval()

        if batch_size in (None, "") or str(batch_size).startswith("auto"):
            self.batch_size = DEFAULT_BATCH
        else:
            self.batch_size = _whole_number("batch_size", batch_size)
            if self.batch_size < 1:
                raise NormlabError("normlab_lm_eval: batch_size=%s: expected an integer >= 1" % batch_size)
        if max_length not in (None, ""):
            self._max_length = _whole_number("max_length", max_length)
        elif cfg.get("max_position_embeddings"):
            self._max_length = int(cfg["max_position_embeddings"])
        elif lm_block is not None:
            self._max_length = max(lm_block, HARNESS_MIN_LENGTH)
        else:
            self._max_length = HARNESS_MIN_LENGTH
            log.warning("normlab_lm_eval: %s/config.json records no max_position_embeddings (an export other than "
                        "HF Llama's): max_length %d, normlab eval's max(data.lm_block, 2048) for blocks up to 2048; "
                        "pass max_length=N (or path= the run) for a longer block", export, HARNESS_MIN_LENGTH)
        if self._max_length < 1:
            raise NormlabError("normlab_lm_eval: max_length=%s: expected an integer >= 1" % max_length)
        self.pad_id = cfg["special_ids"].get("pad")
        self.eos_id = cfg["special_ids"]["eos"]

    @classmethod
    def create_from_arg_obj(cls, arg_dict, additional_config=None):
        # model_args win over the harness's --device/--batch_size (which it always passes: default cuda:0, 1).
        args = dict(arg_dict)
        for k, v in (additional_config or {}).items():
            if v is not None and k not in args:
                args[k] = v
                if k == "device":
                    args["_device_from_harness"] = True
        return cls(**args)

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        from lm_eval.utils import simple_parse_args_string
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # --- what the harness asks of a model ------------------------------------------------------
    @property
    def eot_token_id(self):
        return self.eos_id

    @property
    def prefix_token_id(self):  # before an empty context: EOS (no BOS), as normlab eval --tasks
        return self.eos_id

    @property
    def max_length(self):
        return self._max_length

    @property
    def max_gen_toks(self):
        return DEFAULT_MAX_GEN_TOKS

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self):
        return "normlab:" + json.dumps(self.cfg.get("tokenizer"), sort_keys=True)

    def get_model_info(self):
        return {"normlab": dict(self.source, scheme=self.cfg.get("scheme"), family=self.cfg.get("family"),
                                max_length=self._max_length)}

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return list(self.tok.encode(string))

    def tok_decode(self, tokens, **kwargs):
        return self.tok.decode(tokens)

    # --- scoring -------------------------------------------------------------------------------
    def _hidden(self, tokens):
        """The final hidden states [B, T, d] (normlab_torch's forward_lm before the output projection)."""
        mask = normlab_torch.causal_mask(tokens.size(1), tokens.device) + \
            normlab_torch.key_padding_mask(tokens, self.pad_id)
        return self.model.decoder(tokens, mask)

    def _score_windows(self, seqs):
        """{(input, continuation): (Σ log p, greedy)} for distinct token tuples; input is what the model
        reads (already cut to max_length), continuation its last len(continuation) targets."""
        out = {}
        order = sorted(seqs, key=lambda s: (-len(s[0]), s))
        # Longest first, at most batch_size rows, and a row less than half the batch's width starts
        # the next batch: padding at most doubles the work (one 2,048-token context among short ones
        # would otherwise pad them all to 2,048).
        batches = []
        for s in order:
            if batches and len(batches[-1]) < self.batch_size and 2 * len(s[0]) >= len(batches[-1][0][0]):
                batches[-1].append(s)
            else:
                batches.append([s])
        pad = self.pad_id if self.pad_id is not None else self.eos_id  # right padding: never attended
        with torch.no_grad():
            for chunk in batches:
                width = len(chunk[0][0])
                tokens = torch.full((len(chunk), width), pad, dtype=torch.long, device=self._device)
                for r, (inp, _) in enumerate(chunk):
                    tokens[r, :len(inp)] = torch.tensor(inp, dtype=torch.long)
                hidden = self._hidden(tokens)
                for r, (inp, cont) in enumerate(chunk):
                    h = hidden[r, len(inp) - len(cont):len(inp)]
                    logp = F.log_softmax(self.model.output_logits(h).float(), dim=-1)
                    target = torch.tensor(cont, dtype=torch.long, device=self._device)
                    ll = logp.gather(1, target.unsqueeze(1)).sum()
                    out[(inp, cont)] = (float(ll), bool((logp.argmax(-1) == target).all()))
        return out

    def _window(self, context_enc, continuation_enc):
        if not continuation_enc:
            raise NormlabError("normlab_lm_eval: a continuation that encodes to no token (the harness asserts "
                               "len(continuation_enc) > 0)")
        if len(continuation_enc) > self._max_length:
            raise NormlabError("normlab_lm_eval: a continuation of %d tokens, more than max_length %d"
                               % (len(continuation_enc), self._max_length))
        inp = (list(context_enc) + list(continuation_enc))[-(self._max_length + 1):][:-1]
        return tuple(inp), tuple(continuation_enc)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        windows = [self._window(ctx, cont) for _, ctx, cont in requests]
        scores = self._score_windows(set(windows))
        res = []
        for (request_str, _, _), w in zip(requests, windows):
            res.append(scores[w])
            if request_str is not None:
                self.cache_hook.add_partial("loglikelihood", request_str, scores[w])
        return res

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        per_request, windows = [], []
        for (string,) in [req.args for req in requests]:
            ws = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self._max_length, context_len=1)]
            per_request.append(len(ws))
            windows.extend((None, ctx, cont) for ctx, cont in ws)
        scores = self._loglikelihood_tokens(windows)
        out, k = [], 0
        for req, n in zip(requests, per_request):
            total = sum(ll for ll, _ in scores[k:k + n])
            k += n
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return out

    def generate_until(self, requests, disable_tqdm=False):
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            kwargs = dict(gen_kwargs or {})
            if _truthy(kwargs.pop("do_sample", False)):
                raise NotImplementedError("normlab_lm_eval: generate_until is greedy only; do_sample=True (sampling) "
                                          "is not implemented")
            until = kwargs.pop("until", None)
            until = [until] if isinstance(until, str) else list(until or [])
            max_gen = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            ids = self.tok_encode(context) or [self.prefix_token_id]
            ids = ids[-max(self._max_length - max_gen, 1):]
            new = []
            text = ""
            with torch.no_grad():
                for _ in range(max_gen):
                    window = (ids + new)[-self._max_length:]
                    tokens = torch.tensor([window], dtype=torch.long, device=self._device)
                    logits = self.model.output_logits(self._hidden(tokens)[:, -1])
                    nxt = int(logits.float().argmax(-1))
                    if nxt == self.eos_id:
                        break
                    new.append(nxt)
                    text = self.tok_decode(new)
                    if any(u and u in text for u in until):
                        break
            for u in until:
                if u:
                    text = text.split(u)[0]
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out


def main(argv=None):
    """lm_eval's command line with the model `normlab` registered (argv: lm_eval's arguments)."""
    from lm_eval.__main__ import cli_evaluate
    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    cli_evaluate()


if __name__ == "__main__":
    # Registered once, by the module's own name (a second class under "normlab" would be refused).
    import normlab_lm_eval
    normlab_lm_eval.main()
else:
    # The harness's models are imported above: its get_model imports them only while its registry is
    # empty, so registering first would hide `hf` and the others.
    register_model("normlab")(NormlabLM)
