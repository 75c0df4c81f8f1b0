#!/usr/bin/env python3
"""normlab on a CUDA GPU: `normlab train` (the user path) against PyTorch eager on the same GPU.

For each shape, fp32 and bf16: `normlab train` on the built-in synthetic task with run.device =
"cuda" (median tokens/s of the logged intervals after the first, as bench/run_bench.py's user
path), then bench/eager_reference.py --device cuda (normlab's Post-LN model in eager PyTorch,
scaled_dot_product_attention, torch.optim.AdamW; median of its timed steps), and for bf16 the same
model under torch.compile (--no-compile skips it), and `normlab train` again with run.cuda_graph =
true (each update replayed from a CUDA graph; --no-cuda-graph skips it). Dropout 0.1 everywhere.
Prints one table row per shape and dtype with the ratios normlab / eager, normlab / compile and
normlab with graphs / eager. The research sweeps' shapes (issue 43.4): d64-18L, d64-50L, lm256-24L.

  python3 bench/gpu_bench.py --normlab build-torch2/bin/normlab [--shapes d64-18L,d64-50L,lm256-24L]

With --llama SHAPES (issue 43) it measures the LLaMA family instead: `normlab train` (family llama,
scheme pre-ln, synthetic-lm, dropout 0, AdamW, clip 1.0, bf16 or fp32) against HF transformers'
LlamaForCausalLM (bench/llama_peer.py) eager and under torch.compile, the same model, tokens per
update, optimizer and clipping, in the same run. One row per shape and dtype: ms per update,
tokens/s, MFU and peak allocated GiB of each side, and normlab against the compiled peer (fp32:
against eager, the issue's target). TF32 matmuls off on both sides (PyTorch's default), except in
tf32 rows: fp32 with TF32 matmuls on both sides (normlab's run.tf32, the peer's allow_tf32), against
eager.

  python3 bench/gpu_bench.py --llama llama-374M,llama-1.36B --dtypes bf16,fp32,tf32 --python VENV/bin/python
"""
import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run_bench  # noqa: E402  (TRAIN_MANIFEST and the user path are shared with the CPU benchmark)

SHAPES = {  # name: (arch, d, ffn, heads, enc, dec, batch, length)
    "d64-18L": ("encdec", 64, 128, 2, 18, 18, 32, 24),  # the CPU benchmark's shape: launch-bound on a GPU
    "base-6L": ("encdec", 512, 2048, 8, 6, 6, 128, 32),  # Transformer-base, 4,096 target tokens per update
    "lm1024-24L": ("lm", 1024, 4096, 16, 0, 24, 8, 512),  # GPT-2-medium-sized decoder, 4,096 tokens per update
}


def eager(shape, a, dtype, compiled=False):
    arch, d, ffn, heads, enc, dec, batch, length = SHAPES[shape]
    if a.smoke:  # as run_bench's smoke user path
        enc, dec, batch, length = min(enc, 1), 1, 4, 8
    cmd = [a.python, os.path.join(HERE, "eager_reference.py"), "--device", a.device, "--arch", arch,
           "--d-model", str(d), "--ffn-dim", str(ffn), "--heads", str(heads), "--enc-layers", str(max(enc, 1)),
           "--dec-layers", str(dec), "--batch", str(batch), "--length", str(length), "--vocab", str(a.vocab),
           "--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1",
           "--dtype", dtype, "--warmup", "1" if a.smoke else ("3" if compiled else "5"), "--steps", str(a.eager_steps)]
    p = subprocess.run(cmd + (["--compile"] if compiled else []), capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"eager_reference{' --compile' if compiled else ''} on {shape}: exit {p.returncode}\n{p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    ms = statistics.median(r["ms"])
    return ms, r["info"]["target_tokens"] / ms * 1e3, r["info"]["peak_cuda_mib"]


LLAMA_SHAPES = {  # name: (d, layers, heads, ffn, vocab, batch, seq): issue 43's table
    "llama-374M": (1024, 24, 16, 2816, 32000, 8, 1024),
    "llama-1.36B": (2048, 24, 16, 5632, 32000, 4, 2048),
}
LLAMA_SMOKE = (64, 2, 4, 172, 512, 2, 32)  # --smoke: checks that both sides run

LLAMA_MANIFEST = """[model]
arch = "lm"
family = "llama"
d_model = {d}
heads = {heads}
dec_layers = {layers}
ffn_dim = {ffn}
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
task = "synthetic-lm"
lm_block = {seq}
synthetic_vocab = {symbols}
synthetic_train = {examples}
synthetic_valid = 2
[optim]
lr = 3e-4
warmup_updates = 10
weight_decay = 0.0
label_smoothing = 0.0
clip_norm = 1.0
max_tokens = {max_tokens}
max_updates = {updates}
[eval]
interval = 0
test_beam = 0
[run]
out_dir = "{out}"
device = "{device}"
dtype = "{dtype}"
tf32 = {tf32}
cuda_graph = {cuda_graph}
threads = 4
log_interval = {log_interval}
checkpoint_interval = {updates}
"""


def llama_normlab(shape, dims, a, dtype, work, cuda_graph=False):
    """`normlab train` at the shape: the median ms/update of the logged intervals after the first and
    the peak allocated GiB it reports at the end (-1 on the CPU)."""
    d, layers, heads, ffn, vocab, batch, seq = dims
    updates, log_interval = (6, 2) if a.smoke else (a.train_updates, 10)
    out = os.path.join(work, f"{shape}-{dtype}{'-graph' if cuda_graph else ''}")
    manifest = out + ".toml"
    with open(manifest, "w") as f:
        f.write(LLAMA_MANIFEST.format(d=d, heads=heads, layers=layers, ffn=ffn, seq=seq, symbols=vocab - 4,
                                      examples=batch * (updates + 2), max_tokens=batch * seq, updates=updates,
                                      out=out, device=a.device, dtype="fp32" if dtype == "tf32" else dtype,
                                      tf32=str(dtype == "tf32").lower(), log_interval=log_interval,
                                      cuda_graph=str(cuda_graph).lower()))
    env = dict(os.environ)
    if a.profile_update and not cuda_graph:  # one update's trace, summarised into --profile-dir
        env["NORMLAB_PROFILE_UPDATE"] = str(a.profile_update)
    p = subprocess.run([a.normlab, "train", manifest], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"normlab train {manifest}: exit {p.returncode}\n{p.stderr[-2000:]}")
    if a.profile_update and not cuda_graph:
        summarise_profile(os.path.join(out, f"profile-update-{a.profile_update}.json"), a.profile_dir,
                          f"profile-{shape}-{dtype}")
    rows = [json.loads(line) for line in open(os.path.join(out, "train.jsonl"))]
    rows = [r for r in rows if r.get("kind") == "train"][1:]
    if not rows:
        sys.exit(f"normlab train {manifest}: no logged interval after the first")
    console = p.stdout + p.stderr
    peak = re.search(r"GPU memory: peak allocated ([0-9.]+) GiB", console)
    params = int(re.search(r", (\d+) parameters,", console).group(1))
    # setup, final phase, checkpoints; the setup's parts; the GPU path's fallbacks (issue 43)
    for line in re.findall(r"^(?:time|setup|gpu path|cuda graph): .*$", console, re.M):
        print(f"<!-- {shape} {dtype} normlab {line} -->", flush=True)
    return statistics.median(r["ms_per_update"] for r in rows), float(peak.group(1)) if peak else -1.0, params


def summarise_profile(trace, into, stem):
    """bench/profile_summary.py's tables of a normlab trace, to INTO/STEM.md (and the trace, gzipped)."""
    if not os.path.exists(trace):
        print(f"<!-- no profile: {trace} was not written -->", flush=True)
        return
    os.makedirs(into, exist_ok=True)
    p = subprocess.run([sys.executable, os.path.join(HERE, "profile_summary.py"), trace], capture_output=True,
                       text=True)
    with open(os.path.join(into, stem + ".md"), "w") as f:
        f.write(p.stdout + p.stderr)
    with open(trace, "rb") as src, gzip.open(os.path.join(into, stem + ".json.gz"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    print(f"<!-- {stem}: {p.stdout.splitlines()[0] if p.stdout else p.stderr.strip()} -->", flush=True)


def llama_peer(dims, a, dtype, compiled):
    d, layers, heads, ffn, vocab, batch, seq = dims
    cmd = [a.python, os.path.join(HERE, "llama_peer.py"), "--d", str(d), "--layers", str(layers), "--heads",
           str(heads), "--ffn", str(ffn), "--vocab", str(vocab), "--batch", str(batch), "--seq", str(seq),
           "--dtype", dtype, "--device", a.device, "--steps", str(2 if a.smoke else a.eager_steps),
           "--warmup", str(1 if a.smoke else (3 if compiled else 5))] + (["--compile"] if compiled else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"llama_peer ({'compile' if compiled else 'eager'}): exit {p.returncode}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def llama_main(a):
    from llama_peer import flops_per_token  # the peer's FLOP count, for both sides

    print(f"LLaMA family (issue 43): normlab train vs HF LlamaForCausalLM; TF32 off except in tf32 rows (both sides); MFU of {a.peak_tflops:g} TFLOP/s")
    print("| shape | dtype | normlab ms | HF eager ms | HF compile ms | normlab vs peer | MFU normlab / compile "
          "| peak GiB normlab / eager / compile |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="normlab_gpu_bench_llama_") as work:
        for shape in a.llama.split(","):
            dims = LLAMA_SMOKE if a.smoke else LLAMA_SHAPES[shape]
            d, layers, heads, ffn, vocab, batch, seq = dims
            tokens = batch * seq
            per_token = flops_per_token(d, layers, heads, heads, ffn, vocab, seq)
            for dtype in a.dtypes.split(","):
                ms, peak, params = llama_normlab(shape, dims, a, dtype, work)
                if a.llama_cuda_graph:  # the same run replayed from a CUDA graph: a line of its own
                    gms, gpeak, _ = llama_normlab(shape, dims, a, dtype, work, cuda_graph=True)
                    print(f"<!-- {shape} {dtype} normlab with run.cuda_graph: {gms:.1f} ms/update "
                          f"(without: {ms:.1f}), peak {gpeak:.1f} GiB -->", flush=True)
                eager_r = llama_peer(dims, a, dtype, False)
                if eager_r["params"] != params:
                    sys.exit(f"{shape}: normlab has {params} parameters, the peer {eager_r['params']}: not the same model")
                comp = llama_peer(dims, a, dtype, True) if dtype == "bf16" and not a.no_compile else None
                ref = comp or eager_r  # bf16: against compile; fp32: against eager
                mfu = per_token * tokens / ms / 1e9 / a.peak_tflops
                print(f"| {shape} | {dtype} | {ms:.1f} | {eager_r['median_ms']:.1f} | "
                      f"{comp['median_ms'] if comp else float('nan'):.1f} | "
                      f"{ref['median_ms'] / ms:.2f}× of {'compile' if comp else 'eager'} | "
                      f"{100 * mfu:.1f} % / {100 * comp['mfu'] if comp else float('nan'):.1f} % | "
                      f"{peak:.1f} / {eager_r['peak_gib']:.1f} / {comp['peak_gib'] if comp else float('nan'):.1f} |",
                      flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--normlab", default=os.path.join(run_bench.ROOT, "build-torch2", "bin", "normlab"))
    p.add_argument("--python", default=sys.executable, help="interpreter of the eager side (the torch normlab links)")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--train-updates", type=int, default=60)
    p.add_argument("--eager-steps", type=int, default=20)
    p.add_argument("--device", default="cuda", help="cuda (cpu only to check this script)")
    p.add_argument("--smoke", action="store_true", help="1 layer, batch 4x8, 6 updates: checks that it all runs")
    p.add_argument("--llama", default="", help=f"LLaMA shapes instead ({','.join(LLAMA_SHAPES)})")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer (bf16 rows)")
    p.add_argument("--no-cuda-graph", action="store_true", help="skip the run.cuda_graph = true runs")
    p.add_argument("--llama-cuda-graph", action="store_true",
                   help="LLaMA rows: also time normlab train with run.cuda_graph = true (a line per row)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100/H200: 989)")
    p.add_argument("--profile-update", type=int, default=0,
                   help="LLaMA rows: profile this update of each normlab run (NORMLAB_PROFILE_UPDATE)")
    p.add_argument("--profile-dir", default="profiles", help="where the profiles' summaries and traces go")
    a = p.parse_args()
    if a.llama:
        return llama_main(a)
    torch_line = subprocess.run([a.python, "-c", "import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"],
                                capture_output=True, text=True).stdout.strip()
    print(f"GPU benchmark: {torch_line}; dropout 0.1 (residual, attention, activation)")
    print(f"{'shape':<12} {'dtype':<5} {'train ms/upd':>12} {'train tok/s':>12} {'eager ms':>9} "
          f"{'eager tok/s':>12} {'eager MiB':>9} {'train/eager':>11} {'compile ms':>10} {'train/compile':>13} "
          f"{'graph ms/upd':>12} {'graph/eager':>11}")
    run_bench.SHAPES.update(SHAPES)
    with tempfile.TemporaryDirectory(prefix="normlab_gpu_bench_") as work:
        for shape in a.shapes.split(","):
            for dtype in a.dtypes.split(","):
                ns = types.SimpleNamespace(smoke=a.smoke, train_updates=a.train_updates, vocab=a.vocab, dropout=0.1,
                                           attention_dropout=0.1, activation_dropout=0.1, threads=4,
                                           dtype=dtype, normlab=a.normlab, device=a.device)
                os.makedirs(os.path.join(work, dtype), exist_ok=True)
                ms, tokens = run_bench.user_path(shape, os.environ.copy(), ns, os.path.join(work, dtype))
                gms = float("nan")
                if not a.no_cuda_graph:  # the same run with each update replayed from a CUDA graph
                    ns.run_extra = "cuda_graph = true"
                    gms, _ = run_bench.user_path(shape, os.environ.copy(), ns, os.path.join(work, dtype), run=1)
                ems, etoks, emib = eager(shape, a, dtype)
                # bf16 also against the same model under torch.compile (issue 43.6)
                cms = eager(shape, a, dtype, compiled=True)[0] if dtype == "bf16" and not a.no_compile else float("nan")
                print(f"{shape:<12} {dtype:<5} {ms:>12.1f} {tokens / ms * 1e3:>12,.0f} {ems:>9.1f} "
                      f"{etoks:>12,.0f} {emib:>9,.0f} {etoks and (tokens / ms * 1e3) / etoks:>10.2f}× "
                      f"{cms:>10.1f} {cms / ms:>12.2f}× {gms:>12.1f} {ems / gms:>10.2f}×", flush=True)


if __name__ == "__main__":
    main()
