#!/usr/bin/env python3
"""Data-parallel efficiency of `normlab train` on this machine (docs/data-parallel.md).

For each shape, trains the same synthetic copy task three ways, alternating them for --rounds
rounds, and prints the median global target tokens/s of each (train.jsonl's logged intervals,
the first one skipped as warm-up):
  1 rank x 1 thread, 2 ranks x 1 thread (`--nproc 2`, Gloo on loopback), 1 rank x 2 threads.
The ratio "2 ranks / 1 rank x 1 thread" is the second rank's gain; against "1 rank x 2 threads" it
says whether two processes use two cores better than one process's thread pool.

  bench/data_parallel_scaling.py [--normlab build/bin/normlab] [--shapes 18L-d64,6L-d512] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (d_model, ffn_dim, heads, layers per stack, updates per measurement)
SHAPES = {
    "18L-d64": (64, 128, 2, 18, 60),
    "6L-d512": (512, 2048, 8, 6, 16),
}

MANIFEST = """[model]
d_model = {d}
ffn_dim = {ffn}
heads = {heads}
enc_layers = {layers}
dec_layers = {layers}
dropout = 0.1

[scheme]
name = "pre-ln"

[data]
task = "copy"
synthetic_vocab = 1000
synthetic_min_len = 20
synthetic_max_len = 23
synthetic_train = 20000
synthetic_valid = 16

[optim]
lr = 5e-4
warmup_updates = 10
max_tokens = 800
max_updates = {updates}

[eval]
interval = 0
bleu = false
test_beam = 0

[run]
log_interval = {log}
checkpoint_interval = 100000
checkpoint_save_best = "none"
"""


def run(normlab, manifest, out_dir, ranks, threads):
    cmd = [normlab, "train", manifest, "--set", f"run.out_dir={out_dir}", "--set", f"run.threads={threads}"]
    if ranks > 1:
        cmd += ["--nproc", str(ranks)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    rates = []
    with open(os.path.join(out_dir, "train.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "train":
                rates.append(r["tokens_per_s"])
    return rates[1:] or rates  # the first interval holds the warm-up


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--normlab", default=os.path.join(ROOT, "build", "bin", "normlab"))
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    configs = [("1 rank x 1 thread", 1, 1), ("2 ranks x 1 thread", 2, 1), ("1 rank x 2 threads", 1, 2)]
    with open("/proc/cpuinfo") as f:
        model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    print(f"cpu: {model}, {os.cpu_count()} cores; normlab train, global target tokens/s (median of logged intervals)")
    for shape in a.shapes.split(","):
        d, ffn, heads, layers, updates = SHAPES[shape]
        with tempfile.TemporaryDirectory() as tmp:
            manifest = os.path.join(tmp, "m.toml")
            with open(manifest, "w") as f:
                f.write(MANIFEST.format(d=d, ffn=ffn, heads=heads, layers=layers, updates=updates,
                                        log=max(2, updates // 8)))
            rates = {name: [] for name, _, _ in configs}
            for r in range(a.rounds):
                for name, ranks, threads in configs:
                    out = os.path.join(tmp, f"{r}-{ranks}-{threads}")
                    rates[name] += run(a.normlab, manifest, out, ranks, threads)
        med = {name: statistics.median(v) for name, v in rates.items()}
        base = med["1 rank x 1 thread"]
        print(f"{shape} ({layers}L-{layers}L d{d} ffn{ffn} h{heads}, 800-token batches, dropout 0.1):")
        for name, _, _ in configs:
            print(f"  {name:20s} {med[name]:10.0f} tok/s  {med[name] / base:5.2f}x")
        print(f"  second rank's gain: {med['2 ranks x 1 thread'] / base:.2f}x; 2 ranks vs 2 threads: "
              f"{med['2 ranks x 1 thread'] / med['1 rank x 2 threads']:.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
