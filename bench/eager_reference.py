#!/usr/bin/env python3
"""PyTorch-eager reference of normlab's Post-LN Transformer for `bench/run_bench.py`.

The same model as `normlab bench --scheme post-ln` builds (core/src/model, plugins/post_ln):
Post-LN layers y = LN(x + Drop(F(x))), no final LayerNorm, ReLU FFN, separate source/target
embeddings and output projection, embeddings x sqrt(d) + sinusoidal positions (sines then cosines,
from position 0), fairseq's init (q/k/v Xavier-uniform gain 1/sqrt 2, out/FFN gain 1, biases 0,
embeddings N(0, d^-1/2) with a zero pad row), residual dropout on every branch and on the
embeddings, dropout on the attention probabilities (--attention-dropout) and after the FFN's ReLU
(--activation-dropout), fairseq's label-smoothed cross entropy, gradient norm, torch.optim.AdamW with its
defaults for this device. The same random batch as normlab's (tokens in [1, V), the last quarter of
every other row padded). Written the way an eager user would: packed q/k/v projection as in
nn.MultiheadAttention, baddbmm with the additive mask (scaled_dot_product_attention on torch 2.x).

--model nn-transformer instead builds the model the way a user of torch.nn would: nn.Transformer
(Post-LN, ReLU, one dropout rate for residual, attention and activation dropout, so the three rates
must be equal) between the same embeddings and output projection, with its own init.

Speaks the same line protocol as `normlab bench --serve`: "steps N", "info", "quit".
"""
import argparse
import ctypes
import json
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


def frames_compiled():
    """Frames dynamo has (re)compiled so far: a step that raises it paid for compilation."""
    from torch._dynamo.utils import counters
    return counters["frames"]["total"]


def sinusoidal_positions(T, d):
    half = d // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000.0) / max(half - 1, 1)))
    pos = torch.arange(T, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(pos), torch.cos(pos)], 1)
    if d % 2 == 1:
        table = torch.cat([table, torch.zeros(T, 1)], 1)
    return table


class Attention(nn.Module):
    def __init__(self, d, heads, self_attention, dropout):
        super().__init__()
        self.d, self.h, self.self_attention, self.dropout = d, heads, self_attention, dropout
        if self_attention:
            self.qkv = nn.Linear(d, 3 * d)
        else:
            self.q = nn.Linear(d, d)
            self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)
        with torch.no_grad():
            packed = [self.qkv] if self_attention else [self.q, self.kv]
            for lin in packed:
                for i in range(lin.weight.shape[0] // d):  # one d x d block per projection
                    nn.init.xavier_uniform_(lin.weight[i * d:(i + 1) * d], gain=1 / math.sqrt(2))
                nn.init.zeros_(lin.bias)
            nn.init.xavier_uniform_(self.out.weight)
            nn.init.zeros_(self.out.bias)

    def forward(self, x, memory, mask):
        B, Tq, d = x.shape
        Tk, H, dh = memory.shape[1], self.h, self.d // self.h
        if self.self_attention:
            q, k, v = self.qkv(x).view(B, Tq, 3, H, dh).permute(2, 0, 3, 1, 4)
        else:
            q = self.q(x).view(B, Tq, H, dh).transpose(1, 2)
            k, v = self.kv(memory).view(B, Tk, 2, H, dh).permute(2, 0, 3, 1, 4)
        if HAS_SDPA:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                 dropout_p=self.dropout if self.training else 0.0)
        else:
            q = q.reshape(B * H, Tq, dh)
            k = k.reshape(B * H, Tk, dh)
            v = v.reshape(B * H, Tk, dh)
            scores = torch.baddbmm(mask.expand(B, H, Tq, Tk).reshape(B * H, Tq, Tk), q, k.transpose(1, 2),
                                   alpha=1 / math.sqrt(dh))
            probs = F.dropout(torch.softmax(scores, -1), self.dropout, self.training)
            ctx = torch.bmm(probs, v).view(B, H, Tq, dh)
        return self.out(ctx.transpose(1, 2).reshape(B, Tq, d))


class Layer(nn.Module):
    def __init__(self, d, ffn, heads, dropout, cross):
        super().__init__()
        self.dropout, attention, self.activation_dropout = dropout
        self.self_attn = Attention(d, heads, True, attention)
        self.self_norm = nn.LayerNorm(d)
        self.cross_attn = Attention(d, heads, False, attention) if cross else None
        self.cross_norm = nn.LayerNorm(d) if cross else None
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.ffn_norm = nn.LayerNorm(d)
        with torch.no_grad():
            for lin in (self.fc1, self.fc2):
                nn.init.xavier_uniform_(lin.weight)
                nn.init.zeros_(lin.bias)

    def forward(self, x, self_mask, memory=None, memory_mask=None):
        drop = lambda y: F.dropout(y, self.dropout, self.training)
        x = self.self_norm(x + drop(self.self_attn(x, x, self_mask)))
        if self.cross_attn is not None:
            x = self.cross_norm(x + drop(self.cross_attn(x, memory, memory_mask)))
        h = F.dropout(F.relu(self.fc1(x)), self.activation_dropout, self.training)
        return self.ffn_norm(x + drop(self.fc2(h)))


class Stack(nn.Module):
    def __init__(self, vocab, d, ffn, heads, layers, dropout, cross):
        super().__init__()
        self.d, self.dropout = d, dropout[0]
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        with torch.no_grad():
            nn.init.normal_(self.embed.weight, 0.0, d ** -0.5)
            self.embed.weight[0].zero_()
        self.layers = nn.ModuleList(Layer(d, ffn, heads, dropout, cross) for _ in range(layers))

    def forward(self, tokens, self_mask, memory=None, memory_mask=None):
        x = self.embed(tokens) * math.sqrt(self.d) + sinusoidal_positions(tokens.shape[1], self.d).unsqueeze(0)
        x = F.dropout(x, self.dropout, self.training)
        for layer in self.layers:
            x = layer(x, self_mask, memory, memory_mask)
        return x


def padding_mask(tokens):
    m = torch.zeros(tokens.shape, dtype=torch.float).masked_fill_(tokens.eq(0), float("-inf"))
    return m.view(tokens.shape[0], 1, 1, tokens.shape[1])


def causal_mask(T):
    return torch.full((T, T), float("-inf")).triu(1).view(1, 1, T, T)


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.encdec = a.arch == "encdec"
        drop = (a.dropout, a.attention_dropout, a.activation_dropout)
        self.encoder = Stack(a.vocab, a.d_model, a.ffn_dim, a.heads, a.enc_layers, drop, False) if self.encdec else None
        self.decoder = Stack(a.vocab, a.d_model, a.ffn_dim, a.heads, a.dec_layers, drop, self.encdec)
        self.output = nn.Linear(a.d_model, a.vocab, bias=False)
        with torch.no_grad():
            nn.init.normal_(self.output.weight, 0.0, a.d_model ** -0.5)

    def forward(self, src, tgt_in):
        self_mask = causal_mask(tgt_in.shape[1]) + padding_mask(tgt_in)
        if not self.encdec:
            return self.output(self.decoder(tgt_in, self_mask))
        src_mask = padding_mask(src)
        memory = self.encoder(src, src_mask)
        return self.output(self.decoder(tgt_in, self_mask, memory, src_mask))


class TorchTransformerModel(nn.Module):
    """The same shape with torch.nn.Transformer (as a user would write it): Post-LN layers, a final
    LayerNorm per stack (nn.Transformer adds one), its own init; dropout at one rate everywhere."""

    def __init__(self, a):
        super().__init__()
        if not a.dropout == a.attention_dropout == a.activation_dropout:
            sys.exit("eager_reference: --model nn-transformer applies one dropout rate everywhere "
                     "(--dropout, --attention-dropout and --activation-dropout must be equal)")
        self.encdec, self.d, self.p = a.arch == "encdec", a.d_model, a.dropout
        self.src_embed = nn.Embedding(a.vocab, a.d_model, padding_idx=0) if self.encdec else None
        self.tgt_embed = nn.Embedding(a.vocab, a.d_model, padding_idx=0)
        layer = dict(d_model=a.d_model, nhead=a.heads, dim_feedforward=a.ffn_dim, dropout=a.dropout,
                     batch_first=True)
        if self.encdec:
            self.body = nn.Transformer(num_encoder_layers=a.enc_layers, num_decoder_layers=a.dec_layers, **layer)
        else:  # decoder-only: a causal encoder stack
            self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer), a.dec_layers,
                                              norm=nn.LayerNorm(a.d_model))
        self.output = nn.Linear(a.d_model, a.vocab, bias=False)

    def embed(self, embedding, tokens):
        x = embedding(tokens) * math.sqrt(self.d) + sinusoidal_positions(tokens.shape[1], self.d).unsqueeze(0)
        return F.dropout(x, self.p, self.training)

    def forward(self, src, tgt_in):
        T = tgt_in.shape[1]
        causal = torch.full((T, T), float("-inf")).triu(1)
        tgt = self.embed(self.tgt_embed, tgt_in)
        if not self.encdec:
            return self.output(self.body(tgt, mask=causal, src_key_padding_mask=tgt_in.eq(0)))
        out = self.body(self.embed(self.src_embed, src), tgt, tgt_mask=causal, src_key_padding_mask=src.eq(0),
                        tgt_key_padding_mask=tgt_in.eq(0), memory_key_padding_mask=src.eq(0))
        return self.output(out)


def label_smoothed_loss(logits, target, eps):
    V = logits.shape[-1]
    lprobs = F.log_softmax(logits.reshape(-1, V), -1)
    tgt = target.reshape(-1, 1)
    keep = tgt.ne(0).float().squeeze(1)
    nll = (-lprobs.gather(-1, tgt).squeeze(1) * keep).sum()
    smooth = (-lprobs.sum(-1) * keep).sum()
    eps_i = eps / (V - 1)
    return (1.0 - eps - eps_i) * nll + eps_i * smooth


def batch(a, length):
    t = torch.randint(1, a.vocab, (a.batch, length))
    t[0::2, length * 3 // 4:] = 0
    return t


def blas_info():
    for line in open("/proc/self/maps"):
        # torch's OpenBLAS only: numpy's bundled scipy_openblas (venv) has prefixed symbols.
        if "libopenblas" in line:
            path = line.split()[-1]
            lib = ctypes.CDLL(path)
            if not hasattr(lib, "openblas_get_corename"):
                continue
            lib.openblas_get_corename.restype = ctypes.c_char_p
            parallel = {0: "sequential", 1: "pthreads", 2: "openmp"}.get(lib.openblas_get_parallel(), "?")
            return path, lib.openblas_get_corename().decode(), parallel, lib.openblas_get_num_threads()
    cfg = torch.__config__.show()
    return "", "mkl" if "MKL" in cfg else "?", "", 0


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--arch", default="encdec", choices=["encdec", "lm"])
    for k, v in [("enc-layers", 6), ("dec-layers", 6), ("d-model", 64), ("ffn-dim", 128), ("heads", 2),
                 ("batch", 32), ("length", 24), ("vocab", 8000), ("threads", 0), ("warmup", 2), ("steps", 5)]:
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--dropout", type=float, default=0.1, help="residual dropout")
    p.add_argument("--attention-dropout", type=float, default=0.0)
    p.add_argument("--activation-dropout", type=float, default=0.0)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: the forward under CPU autocast, the loss in fp32 (as normlab's run.dtype)")
    p.add_argument("--model", default="reference", choices=["reference", "nn-transformer"],
                   help="reference: normlab's Post-LN written out in eager PyTorch; nn-transformer: torch.nn.Transformer")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (torch 2.x: every tensor made on it)")
    p.add_argument("--serve", action="store_true")
    p.add_argument("--compile", action="store_true",
                   help="the model under torch.compile (torch 2.x; the loss and optimizer stay eager)")
    p.add_argument("--compile-mode", choices=COMPILE_MODES,
                   help="torch.compile(mode=...) (implies --compile; default: default)")
    a = p.parse_args()
    if a.compile_mode:
        a.compile = True
    elif a.compile:
        a.compile_mode = "default"
    import os
    torch.set_num_threads(a.threads or os.cpu_count())
    torch.manual_seed(1)
    cuda = a.device.startswith("cuda")
    if a.device != "cpu":
        torch.set_default_device(a.device)
    model = Model(a) if a.model == "reference" else TorchTransformerModel(a)
    model.train()
    forward = torch.compile(model, mode=a.compile_mode) if a.compile else model
    src, tgt = batch(a, a.length), batch(a, a.length + 1)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    ntok = float(tgt_out.ne(0).sum())
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=5e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)
    last = {}

    def step():
        c0 = time.process_time()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = forward(src, tgt_in)
        loss = label_smoothed_loss(logits.float(), tgt_out, a.label_smoothing)
        (loss / ntok).backward()
        gnorm = torch.norm(torch.stack([torch.norm(q.grad) for q in params if q.grad is not None]))
        last["gnorm"] = gnorm.item()
        last["loss"] = loss.item() / ntok
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        last["cpu_ms"] = (time.process_time() - c0) * 1e3
        return (time.perf_counter() - t0) * 1e3

    def run_steps(n):
        ms, cpu = [], []
        for _ in range(n):
            ms.append(step())
            cpu.append(last["cpu_ms"])
        return {"ms": ms, "cpu_ms": cpu, "loss": last["loss"], "gnorm": last["gnorm"]}

    def info():
        path, core, parallel, bthreads = blas_info()
        impl = ("eager" if a.model == "reference" else "nn.Transformer") + \
            (f" + torch.compile ({a.compile_mode})" if a.compile else "")
        return {"impl": impl, "torch": torch.__version__, "dtype": a.dtype, "threads": torch.get_num_threads(),
                "blas_library": path, "blas_core": core, "blas_parallel": parallel, "blas_threads": bthreads,
                "coretype_env": os.environ.get("OPENBLAS_CORETYPE", ""),
                "parameters": sum(q.numel() for q in params), "target_tokens": ntok,
                "dropout": {"residual": a.dropout, "attention": a.attention_dropout,
                            "activation": a.activation_dropout},
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0,
                **({"compile_mode": a.compile_mode, "compile_s": compiled["s"], "compile_steps": compiled["steps"],
                    "warmup_steps": compiled["warmup"], "frames_compiled": compiled["frames"],
                    "recompiles_timed": frames_compiled() - compiled["frames"]} if a.compile else {})}

    # Warm-up: at least --warmup steps; under torch.compile also until two steps in a row compiled
    # nothing (a guard that fails on the second call recompiles), so timed steps exclude compilation.
    # The wall time of the steps that compiled is reported apart (info: compile_s).
    compiled = {"s": 0.0, "steps": 0, "warmup": 0, "frames": 0}
    quiet = 0
    try:
        while compiled["warmup"] < a.warmup or (a.compile and quiet < 2 and compiled["warmup"] < a.warmup + 20):
            before = frames_compiled() if a.compile else 0
            ms = step()
            compiled["warmup"] += 1
            if a.compile and frames_compiled() != before:
                compiled["s"] += ms / 1e3
                compiled["steps"] += 1
                quiet = 0
            else:
                quiet += 1
        if a.compile:
            compiled["frames"] = frames_compiled()
    except Exception as e:  # a mode that fails to compile: one line for run_bench's table, not a traceback
        if not a.serve:
            raise
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        print(json.dumps({"ready": False, "error": reason[:300]}), flush=True)
        import traceback
        traceback.print_exc()
        sys.exit(1)
    if not a.serve:
        r = run_steps(a.steps)
        r["info"] = info()
        print(json.dumps(r), flush=True)
        return
    print(json.dumps({"ready": True, **({"compile_s": compiled["s"]} if a.compile else {})}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "steps":
            print(json.dumps(run_steps(int(words[1]) if len(words) > 1 else 1)), flush=True)
        elif words[0] == "info":
            print(json.dumps(info()), flush=True)
        elif words[0] == "quit":
            break


if __name__ == "__main__":
    main()
