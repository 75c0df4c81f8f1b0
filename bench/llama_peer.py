#!/usr/bin/env python3
"""The peer of issue 43: what a researcher writes instead of normlab for a LLaMA study, in about fifty
lines. HF transformers' LlamaForCausalLM (SDPA attention, untied output projection, RMSNorm ε 1e-6),
fp32 weights, bf16 autocast (or fp32), the loss as cross-entropy of the fp32 logits over every
position, AdamW (fused on CUDA), gradient clipping at 1.0; eager, or the model under torch.compile.
TF32 matmuls stay off (PyTorch's default, as in normlab) unless --dtype tf32: fp32 with TF32
matmuls (normlab's run.tf32 = true). Random tokens, seeded.

Prints one JSON line: the ms of each timed step, their median, tokens/s, the parameter count, TFLOP/s
and MFU (6·N + 12·L·d·T FLOPs per token, N without the input embedding, as bench/gpu_bench.py counts
normlab) and the peak allocated memory of the whole run (torch.cuda.max_memory_allocated, as normlab
reports its own; -1 on the CPU).

  python3 bench/llama_peer.py --d 1024 --layers 24 --heads 16 --ffn 2816 --vocab 32000 --batch 8 --seq 1024 [--compile]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def flops_per_token(d, layers, heads, kv_heads, ffn, vocab, seq):
    """6·N + 12·L·d·T: N the parameters a token passes through (every layer and the output
    projection, not the input embedding), 12·L·d·T the attention scores and their weighted sum."""
    kv = d * kv_heads // heads
    per_layer = d * d * 2 + 2 * d * kv + 3 * d * ffn + 2 * d
    n = layers * per_layer + d + vocab * d
    return 6 * n + 12 * layers * d * seq


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=0, help="0: as many as heads")
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dtype", choices=["bf16", "fp32", "tf32"], default="bf16",
                   help="tf32: fp32 weights and activations, matmuls on tensor cores with TF32 inputs")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM: 989)")
    a = p.parse_args()
    kv_heads = a.kv_heads or a.heads
    torch.manual_seed(1)
    torch.backends.cuda.matmul.allow_tf32 = a.dtype == "tf32"
    dev = torch.device(a.device)
    cfg = LlamaConfig(hidden_size=a.d, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=kv_heads, vocab_size=a.vocab,
                      max_position_embeddings=a.seq, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      attention_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).to(dev)
    params = sum(t.numel() for t in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0, fused=dev.type == "cuda")
    forward = torch.compile(model) if a.compile else model
    gen = torch.Generator().manual_seed(2)

    def step():
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen).to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = forward(input_ids=tokens[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    sync()
    ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(ms)
    tokens = a.batch * a.seq
    tflops = flops_per_token(a.d, a.layers, a.heads, kv_heads, a.ffn, a.vocab, a.seq) * tokens / med / 1e9
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else -1.0
    print(json.dumps({"ms": ms, "median_ms": med, "tokens_per_s": tokens / med * 1e3, "params": params,
                      "tflops": tflops, "mfu": tflops / a.peak_tflops, "peak_gib": peak,
                      "torch": torch.__version__, "compile": a.compile, "dtype": a.dtype}))


if __name__ == "__main__":
    main()
