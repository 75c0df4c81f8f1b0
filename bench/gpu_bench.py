#!/usr/bin/env python3
"""normlab on a CUDA GPU: `normlab train` (the user path) against PyTorch eager on the same GPU.

For each shape, fp32 and bf16: `normlab train` on the built-in synthetic task with run.device =
"cuda" (median tokens/s of the logged intervals after the first, as bench/run_bench.py's user
path), then bench/eager_reference.py --device cuda (normlab's Post-LN model in eager PyTorch,
scaled_dot_product_attention, torch.optim.AdamW; median of its timed steps). Dropout 0.1
everywhere. Prints one table row per shape and dtype with the ratio normlab / eager.

  python3 bench/gpu_bench.py --normlab build-torch2/bin/normlab [--shapes base-6L,lm1024-24L]
"""
import argparse
import json
import os
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


def eager(shape, a, dtype):
    arch, d, ffn, heads, enc, dec, batch, length = SHAPES[shape]
    if a.smoke:  # as run_bench's smoke user path
        enc, dec, batch, length = min(enc, 1), 1, 4, 8
    cmd = [a.python, os.path.join(HERE, "eager_reference.py"), "--device", a.device, "--arch", arch,
           "--d-model", str(d), "--ffn-dim", str(ffn), "--heads", str(heads), "--enc-layers", str(max(enc, 1)),
           "--dec-layers", str(dec), "--batch", str(batch), "--length", str(length), "--vocab", str(a.vocab),
           "--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1",
           "--dtype", dtype, "--warmup", "1" if a.smoke else "5", "--steps", str(a.eager_steps)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"eager_reference on {shape}: exit {p.returncode}\n{p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    ms = statistics.median(r["ms"])
    return ms, r["info"]["target_tokens"] / ms * 1e3, r["info"]["peak_cuda_mib"]


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
    a = p.parse_args()
    torch_line = subprocess.run([a.python, "-c", "import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"],
                                capture_output=True, text=True).stdout.strip()
    print(f"GPU benchmark: {torch_line}; dropout 0.1 (residual, attention, activation)")
    print(f"{'shape':<12} {'dtype':<5} {'train ms/upd':>12} {'train tok/s':>12} {'eager ms':>9} "
          f"{'eager tok/s':>12} {'eager MiB':>9} {'train/eager':>11}")
    run_bench.SHAPES.update(SHAPES)
    with tempfile.TemporaryDirectory(prefix="normlab_gpu_bench_") as work:
        for shape in a.shapes.split(","):
            for dtype in a.dtypes.split(","):
                ns = types.SimpleNamespace(smoke=a.smoke, train_updates=a.train_updates, vocab=a.vocab, dropout=0.1,
                                           attention_dropout=0.1, activation_dropout=0.1, threads=4,
                                           dtype=dtype, normlab=a.normlab, device=a.device)
                os.makedirs(os.path.join(work, dtype), exist_ok=True)
                ms, tokens = run_bench.user_path(shape, os.environ.copy(), ns, os.path.join(work, dtype))
                ems, etoks, emib = eager(shape, a, dtype)
                print(f"{shape:<12} {dtype:<5} {ms:>12.1f} {tokens / ms * 1e3:>12,.0f} {ems:>9.1f} "
                      f"{etoks:>12,.0f} {emib:>9,.0f} {etoks and (tokens / ms * 1e3) / etoks:>10.2f}×", flush=True)


if __name__ == "__main__":
    main()
