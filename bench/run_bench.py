#!/usr/bin/env python3
"""normlab vs PyTorch eager: training-step speed of identical models, measured in one run.

For each shape it starts `normlab bench --serve` and `bench/eager_reference.py --serve` (both warm
up, then wait), and asks them in turn for a few steps at a time, alternating which goes first, so
both see the same machine load. Reports medians (ms/step, target tokens/s), the ratio
normlab / eager, achieved GFLOP/s and their share of a GEMM peak measured in the same run
(torch.mm 2048x2048 fp32), peak RSS, threads, BLAS kernels and CPU flags.

Environments (--env): "default" is this environment without OPENBLAS_CORETYPE (what a new user
has; normlab may choose its kernels and malloc thresholds itself); "tuned" sets OPENBLAS_CORETYPE to
the core type with the fastest GEMM measured here and normlab's malloc thresholds, for both sides.

  python3 bench/run_bench.py                       # every shape, both environments
  python3 bench/run_bench.py --shapes d64-6L --env default --rounds 3
  python3 bench/run_bench.py --shapes "" --env default --depth-fit 6,12,25,50,100,200
--depth-fit also times normlab alone on 64-128-2 L-L models at those depths and prints the
least-squares line of step time and peak RSS against L, with each depth's residual and R².

Dropout: residual, attention-probability and activation dropout, 0.1 each by default, on every side.
Eager sides: bench/eager_reference.py (normlab's model written out in eager PyTorch) and, where the
three rates are equal, the same script's --model nn-transformer (torch.nn.Transformer, as a user
would write it). The user path: after each shape's bench rounds, `normlab train` trains the same
shape (a manifest of the built-in task with fixed-length examples, so every update is the bench's
B × T batch) and the table gives its ms/update (median of the logged intervals after the first)
against `normlab bench` and both eager sides (--no-user-path skips it).
The torch.compile peer (--compile-modes, torch 2.x): eager_reference.py's model under
torch.compile(mode=...) for each mode, in the same alternating rounds; a third table gives its ms/step,
normlab bench and normlab train against it, and the compile time (warm-up steps that compiled, a cold
inductor cache) apart from ms/step. A mode that fails or passes --compile-timeout shows "failed: ...".
The eager side must use the same ATen/BLAS as the normlab binary: Debian's python3-torch for a
build against Debian's LibTorch (/usr/bin/python3), the venv's python for a build against the wheel.
"""
import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SHAPES = {  # name: (arch, d, ffn, heads, enc, dec, batch, length)
    "d64-6L": ("encdec", 64, 128, 2, 6, 6, 32, 24),
    "d64-18L": ("encdec", 64, 128, 2, 18, 18, 32, 24),
    "d64-50L": ("encdec", 64, 128, 2, 50, 50, 32, 24),
    "d512-6L": ("encdec", 512, 2048, 8, 6, 6, 32, 24),
    "lm256-24L": ("lm", 256, 1024, 4, 0, 24, 16, 128),
}
DEFAULT_COMPILE_MODES = ["default", "max-autotune-no-cudagraphs"]
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
CORETYPES = ["Haswell", "Zen", "SkylakeX", "Cooperlake"]
# The instructions each OpenBLAS core type's kernels execute (/proc/cpuinfo flag names): forcing a
# core type the CPU lacks dies with SIGILL, so only the supported ones are measured.
CORETYPE_NEEDS = {
    "Haswell": {"avx2", "fma"},
    "Zen": {"avx2", "fma"},
    "SkylakeX": {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"},
    "Cooperlake": {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_bf16"},
}


def supported_coretypes(flags):
    """(core types this CPU can run, {skipped: missing flags})."""
    have = set(flags)
    ok = [ct for ct in CORETYPES if CORETYPE_NEEDS[ct] <= have]
    skipped = {ct: sorted(CORETYPE_NEEDS[ct] - have) for ct in CORETYPES if ct not in ok}
    return ok, skipped

GEMM_SNIPPET = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
for _ in range(3): torch.mm(a, b)
ts = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); torch.mm(a, b); ts.append(time.perf_counter() - t)
core = ""
for line in open("/proc/self/maps"):
    # torch's own OpenBLAS; numpy's bundled scipy_openblas (in a venv) has prefixed symbols: skip it.
    if "libopenblas" in line:
        import ctypes
        lib = ctypes.CDLL(line.split()[-1])
        if hasattr(lib, "openblas_get_corename"):
            lib.openblas_get_corename.restype = ctypes.c_char_p
            core = lib.openblas_get_corename().decode(); break
print(json.dumps({"gflops": 2 * 2048 ** 3 / sorted(ts)[len(ts) // 2] / 1e9, "core": core, "torch": torch.__version__}))
"""


SHOWN_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_bf16",
               "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_summary():
    """(model name, logical cores, every /proc/cpuinfo flag, sorted)."""
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    return model, os.cpu_count(), sorted(flags)


def shown(flags):
    """The flags that decide which kernels run, for the printed header."""
    return " ".join(f for f in SHOWN_FLAGS if f in flags)


def gemm(python, env, threads, reps):
    out = subprocess.run([python, "-c", GEMM_SNIPPET, str(threads), str(reps)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


class Worker:
    """A --serve process. timeout (seconds): the most any answer, warm-up included, may take; past it
    the process and its children (torch.compile's compile workers) are killed and WorkerFailed raised.
    stderr: a file for its stderr (its last line is the reason given when it dies)."""

    def __init__(self, argv, env, timeout=None, stderr=None):
        self.timeout, self.stderr = timeout, stderr
        # its own process group, so that a timeout also ends the children it started
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1, stderr=open(stderr, "w") if stderr else None,
                                     start_new_session=timeout is not None)
        self.ready = self.read()  # {"ready": true}: model built, warm-up done
        if not self.ready.get("ready", True):
            self.kill()
            raise WorkerFailed(self.ready.get("error") or "not ready")

    def read(self):
        if self.timeout is not None and not select.select([self.proc.stdout], [], [], self.timeout)[0]:
            self.kill()
            raise WorkerFailed(f"no answer within {self.timeout:.0f} s (--compile-timeout)")
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise WorkerFailed(f"{os.path.basename(self.proc.args[1] if len(self.proc.args) > 1 else self.proc.args[0])} "
                               f"exited ({rc})" + (f": {self.last_error()}" if self.last_error() else ""))
        return json.loads(line)

    def last_error(self):
        """The last line of its stderr that names an error (a traceback's last line), if captured."""
        if not self.stderr or not os.path.exists(self.stderr):
            return ""
        lines = [ln.strip() for ln in open(self.stderr, errors="replace") if ln.strip()]
        named = [ln for ln in lines if "Error" in ln or "Exception" in ln]
        return (named or lines or [""])[-1][:300]

    def kill(self):
        if self.proc.poll() is None:
            if self.timeout is not None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        self.proc.wait()

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self):
        info = self.ask("info")
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()
        return info


class WorkerFailed(RuntimeError):
    pass


def shape_args(shape, a):
    arch, d, ffn, heads, enc, dec, batch, length = SHAPES[shape]
    if a.smoke:
        enc, dec, batch, length = min(enc, 1), 1, 4, 8
    args = ["--arch", arch, "--d-model", str(d), "--ffn-dim", str(ffn), "--heads", str(heads),
            "--dec-layers", str(dec), "--batch", str(batch), "--length", str(length), "--vocab", str(a.vocab),
            "--threads", str(a.threads), "--warmup", str(a.warmup), "--dtype", a.dtype, "--serve",
            "--dropout", str(a.dropout), "--attention-dropout", str(a.attention_dropout),
            "--activation-dropout", str(a.activation_dropout)]
    if arch == "encdec":
        args += ["--enc-layers", str(enc)]
    return args


def one_dropout_rate(a):
    return a.dropout == a.attention_dropout == a.activation_dropout


def compile_worker(shape, mode, args, env, a, work):
    """eager_reference.py with the model under torch.compile(mode=mode), warmed up (compiled) with a
    cold inductor cache of its own, so compile_s is what a first run pays."""
    tag = f"{shape}-{mode}-{len(os.listdir(work))}"
    env = dict(env, TORCHINDUCTOR_CACHE_DIR=os.path.join(work, "inductor-" + tag))
    return Worker([a.python, os.path.join(HERE, "eager_reference.py"), "--compile-mode", mode] + args, env,
                  timeout=a.compile_timeout, stderr=os.path.join(work, f"compile-{tag}.stderr"))


def measure(shape, env, a, work):
    """Steps of every side in alternating rounds. Returns (ms per side, CPU ms per side, info per side,
    {compile mode: why it failed}); a compile mode that fails or times out drops out, the others go on."""
    args = shape_args(shape, a)
    workers = [("normlab", Worker([a.normlab, "bench"] + args, env)),
               ("eager", Worker([a.python, os.path.join(HERE, "eager_reference.py")] + args, env))]
    if one_dropout_rate(a) and a.dtype == "fp32":
        workers.append(("nn.Transformer", Worker([a.python, os.path.join(HERE, "eager_reference.py"),
                                                  "--model", "nn-transformer"] + args, env)))
    failed = {}
    for mode in a.compile_modes:
        try:
            workers.append(("compile " + mode, compile_worker(shape, mode, args, env, a, work)))
        except WorkerFailed as e:
            failed[mode] = str(e)
    times = {name: [] for name, _ in workers}
    cpu = {name: [] for name, _ in workers}
    for r in range(a.rounds):
        order = workers[r % len(workers):] + workers[:r % len(workers)]  # each side first in turn
        for name, w in order:
            if name.startswith("compile ") and name[8:] in failed:
                continue
            try:
                r_ = w.ask(f"steps {a.steps_per_round}")
            except WorkerFailed as e:
                if not name.startswith("compile "):
                    raise
                failed[name[8:]] = str(e)
                w.kill()
                continue
            times[name] += r_["ms"]
            cpu[name] += r_["cpu_ms"]
    infos = {name: w.close() for name, w in workers if not (name.startswith("compile ") and name[8:] in failed)}
    return times, cpu, infos, failed


def compile_cells(row, mode, nm, tr):
    """The compile peer's cells of a row: ms/step, its ratio to normlab bench (nm) and to normlab train
    (tr, or None), compile seconds (steps that compiled), recompilations in timed steps."""
    c = row["compile"][mode]
    if "failed" in c:
        return [f"failed: {c['failed']}"] + ["–"] * 4
    cm = c["ms"]
    return [f"{cm:.1f}", f"**{cm / nm:.2f}×**", f"**{cm / tr:.2f}×**" if tr else "–",
            f"{c['compile_s']:.1f} ({c['compile_steps']} of {c['warmup_steps']} warm-up steps)",
            str(c["recompiles_timed"])]


TRAIN_MANIFEST = """[model]
arch = "{arch}"
d_model = {d}
ffn_dim = {ffn}
heads = {heads}
{layers}
dropout = {dropout}
attention_dropout = {attention_dropout}
activation_dropout = {activation_dropout}
[scheme]
name = "post-ln"
[data]
{data}
synthetic_vocab = {vocab}
synthetic_train = {examples}
synthetic_valid = 8
[optim]
lr = 5e-4
warmup_updates = 10
label_smoothing = 0.1
max_tokens = {max_tokens}
max_updates = {updates}
clip_norm = 0.0
[eval]
interval = 0
bleu = false
test_beam = 0
[run]
out_dir = "{out}"
threads = {threads}
device = "{device}"
dtype = "{dtype}"
log_interval = {log_interval}
checkpoint_interval = {updates}
{run_extra}
"""


def user_path(shape, env, a, work, run=0):
    """`normlab train` on the shape: every example `length` target tokens (the copy task's, or LM
    blocks), max_tokens = batch · length, so each update is one B × T batch. Returns the median
    ms/update and target tokens per update of the logged intervals after the first (warm-up)."""
    arch, d, ffn, heads, enc, dec, batch, length = SHAPES[shape]
    updates, log_interval = (6, 2) if a.smoke else (a.train_updates, 10)
    if a.smoke:
        enc, dec, batch, length = min(enc, 1), 1, 4, 8
    if arch == "encdec":  # a sentence of L symbols is L + 1 tokens with eos
        data = f'task = "copy"\nsynthetic_min_len = {length - 1}\nsynthetic_max_len = {length - 1}'
        layers = f"enc_layers = {enc}\ndec_layers = {dec}"
    else:
        data = f'task = "synthetic-lm"\nlm_block = {length}'
        layers = f"dec_layers = {dec}"
    out = os.path.join(work, f"{shape}-{run}")  # a fresh run each time, not a resume
    manifest = out + ".toml"
    with open(manifest, "w") as f:
        f.write(TRAIN_MANIFEST.format(arch=arch, d=d, ffn=ffn, heads=heads, layers=layers, dropout=a.dropout,
                                      attention_dropout=a.attention_dropout, activation_dropout=a.activation_dropout,
                                      data=data, vocab=a.vocab - 4, examples=batch * (updates + 2) * 2,
                                      max_tokens=batch * length, updates=updates, out=out, threads=a.threads,
                                      dtype=a.dtype, log_interval=log_interval,
                                      device=getattr(a, "device", "cpu"), run_extra=getattr(a, "run_extra", "")))
    p = subprocess.run([a.normlab, "train", manifest], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"normlab train {manifest}: exit {p.returncode}\n{p.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(os.path.join(out, "train.jsonl"))]
    rows = [r for r in rows if r.get("kind") == "train"][1:]
    if not rows:
        sys.exit(f"normlab train {manifest}: no logged interval after the first in {out}/train.jsonl")
    ms = statistics.median(r["ms_per_update"] for r in rows)
    return ms, statistics.median(r["tokens_per_s"] * r["ms_per_update"] / 1e3 for r in rows)


def user_path_rounds(shape, env, a, work):
    """`normlab train` runs of the shape, each followed at once by `normlab bench` steps of the same
    shape: the host's speed drifts by 20 % and more for minutes at a time, so train and bench are
    compared in pairs taken in the same minute (their ratio's median), beside the medians."""
    bench = Worker([a.normlab, "bench"] + shape_args(shape, a), env)
    runs, paired = [], []
    for r in range(a.train_rounds):
        runs.append(user_path(shape, env, a, work, r))
        paired.append(statistics.median(bench.ask(f"steps {1 if a.smoke else 5}")["ms"]))
    bench.close()
    train = [ms for ms, _ in runs]
    return {"train_ms": statistics.median(train), "train_ms_runs": train, "train_tokens_per_update": runs[0][1],
            "paired_bench_ms": paired, "paired_ratio": statistics.median(b / t for b, t in zip(paired, train))}


def linear_fit(xs, ys):
    """(intercept, slope, R²) of the least-squares line through (xs, ys)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    icept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - icept - slope * x) ** 2 for x, y in zip(xs, ys))
    return icept, slope, 1 - ss_res / ss_tot if ss_tot > 0 else 1.0


def depth_fit(a, env):
    """normlab's step time and peak RSS against depth (64-128-2 L-L, batch 32 x 24): is it linear?"""
    depths = [int(x) for x in a.depth_fit.split(",")]
    batch, length = (4, 8) if a.smoke else (32, 24)
    rows = []
    for L in depths:
        args = ["--arch", "encdec", "--d-model", "64", "--ffn-dim", "128", "--heads", "2", "--enc-layers", str(L),
                "--dec-layers", str(L), "--batch", str(batch), "--length", str(length), "--vocab", str(a.vocab),
                "--threads", str(a.threads), "--warmup", str(a.warmup), "--dtype", a.dtype,
                "--steps", str(max(1, a.rounds))]
        p = subprocess.run([a.normlab, "bench"] + args, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"normlab bench at {L}L-{L}L: exit {p.returncode}\n{p.stderr[-2000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append((L, statistics.median(r["ms"]), r["info"]["peak_rss_mib"]))
    print(f"\n## step time and peak memory against depth (normlab, 64-128-2 L-L, batch {batch} x {length}, "
          f"{a.threads} threads, median of {max(1, a.rounds)} steps)")
    fits = {}
    for i, what in ((1, "ms/step"), (2, "peak RSS MiB")):
        fits[what] = linear_fit([float(r[0]) for r in rows], [r[i] for r in rows])
    print("| layers per stack | ms/step | line | residual | peak RSS MiB | line | residual |")
    print("|---|---|---|---|---|---|---|")
    for L, ms, rss in rows:
        cells = []
        for what, y in (("ms/step", ms), ("peak RSS MiB", rss)):
            c, m, _ = fits[what]
            line = c + m * L
            cells.append(f"{y:.1f} | {line:.1f} | {100 * (y - line) / line:+.1f} %")
        print(f"| {L} | " + " | ".join(cells) + " |")
    for what, (c, m, r2) in fits.items():
        print(f"{what} = {c:.1f} + {m:.2f} · L   (R² = {r2:.4f})")
    return rows, fits


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--normlab", default=os.path.join(ROOT, "build", "bin", "normlab"))
    p.add_argument("--python", default=sys.executable, help="interpreter of the eager side (its torch)")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--env", default="both", choices=["default", "tuned", "both"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="alternations; each side runs steps-per-round per round")
    p.add_argument("--steps-per-round", type=int, default=1)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: both sides autocast the forward to bf16 (a separate table, never the fp32 targets)")
    p.add_argument("--dropout", type=float, default=0.1, help="residual dropout (model.dropout)")
    p.add_argument("--attention-dropout", type=float, default=0.1, help="model.attention_dropout")
    p.add_argument("--activation-dropout", type=float, default=0.1, help="model.activation_dropout")
    p.add_argument("--cap-isa", choices=["avx2"],
                   help="both sides with AVX2 kernels only (ATen, oneDNN, OpenBLAS core type Zen, and "
                        "normlab's own elementwise loops: NORMLAB_CPU_ISA=avx2) on a CPU that has AVX-512: "
                        "a stand-in for an AVX2-only CPU")
    p.add_argument("--no-user-path", action="store_true", help="skip `normlab train` on each shape")
    p.add_argument("--train-updates", type=int, default=60, help="updates of each `normlab train` run")
    p.add_argument("--train-rounds", type=int, default=3, help="`normlab train` runs per shape (their median)")
    p.add_argument("--compile-modes", default=None,
                   help="comma-separated torch.compile modes timed as peers in the same rounds (default, "
                        "reduce-overhead, max-autotune, max-autotune-no-cudagraphs); \"\" = none. Default: "
                        f"{','.join(DEFAULT_COMPILE_MODES)} when --python's torch is 2.x (not with --smoke)")
    p.add_argument("--compile-timeout", type=float, default=1800.0,
                   help="seconds a compile peer may take for its warm-up (compilation) or any answer; past it "
                        "the mode is shown as failed")
    p.add_argument("--json", help="also write every measurement here")
    p.add_argument("--smoke", action="store_true", help="1 layer, batch 4x8, 1 step: checks that it all runs")
    p.add_argument("--depth-fit", default="", help="comma-separated depths (e.g. 6,12,25,50,100,200): normlab's "
                   "step time and peak RSS against depth, with the least-squares line")
    a = p.parse_args()
    if a.train_rounds < 1:
        p.error(f"--train-rounds {a.train_rounds}: expected at least 1 (`normlab train` runs per shape)")
    if a.compile_modes is not None:
        a.compile_modes = [m for m in a.compile_modes.split(",") if m]
        bad = [m for m in a.compile_modes if m not in COMPILE_MODES]
        if bad:
            p.error(f"--compile-modes: unknown mode {bad[0]!r}; expected a comma-separated list of "
                    + ", ".join(COMPILE_MODES))
    if a.compile_timeout <= 0:
        p.error(f"--compile-timeout {a.compile_timeout}: expected seconds > 0")
    if a.smoke:
        a.warmup, a.rounds, a.steps_per_round, a.shapes, a.env = 0, 1, 1, "d64-6L", "default"
        a.train_rounds = 1

    base_env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "NORMLAB_OPENBLAS_CORETYPE_CHOSEN")}
    model, ncpu, flags = cpu_summary()
    print(f"CPU: {model}, {ncpu} logical cores; flags: {shown(flags)}")
    if a.cap_isa:
        base_env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", DNNL_MAX_CPU_ISA="AVX2",
                        MKL_ENABLE_INSTRUCTIONS="AVX2", NORMLAB_CPU_ISA="avx2")
        flags = [f for f in flags if not f.startswith(("avx512", "amx"))]
        print("AVX2 kernels only (--cap-isa avx2): ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, "
              "MKL_ENABLE_INSTRUCTIONS=AVX2 (the wheel's MKL), "
              "OpenBLAS core types without AVX-512 (default: Zen), normlab's own loops' AVX2 build "
              f"(NORMLAB_CPU_ISA=avx2); flags as seen: {shown(flags)}")

    # GEMM peak per core type (torch.mm 2048², fp32), in this run.
    reps = 1 if a.smoke else 7
    peaks = {"default": gemm(a.python, base_env, a.threads, reps)}
    if peaks["default"]["core"] and not a.smoke:
        usable, skipped = supported_coretypes(flags)
        for ct, missing in skipped.items():
            lacks = "--cap-isa hides" if a.cap_isa else "this CPU lacks"
            print(f"OPENBLAS_CORETYPE={ct} skipped: {lacks} {' '.join(missing)}")
        for ct in usable:
            peaks[ct] = gemm(a.python, dict(base_env, OPENBLAS_CORETYPE=ct), a.threads, reps)
    if a.cap_isa and peaks["default"]["core"] and "Zen" not in peaks:  # --smoke: the capped heading's own peak
        peaks["Zen"] = gemm(a.python, dict(base_env, OPENBLAS_CORETYPE="Zen"), a.threads, reps)
    print(f"GEMM peak (torch.mm 2048², fp32, {a.threads} threads, eager's torch): " +
          ", ".join(f"{k} ({v['core'] or 'non-OpenBLAS'}) {v['gflops']:.0f} GFLOP/s" for k, v in peaks.items()))
    best = max((k for k in peaks if k != "default"), key=lambda k: peaks[k]["gflops"], default=None)
    eager_torch = peaks["default"].get("torch", "")
    if a.compile_modes is None:  # torch.compile exists from torch 2.0; a smoke run stays quick
        a.compile_modes = [] if a.smoke or int(eager_torch.split(".")[0] or 0) < 2 else list(DEFAULT_COMPILE_MODES)
    elif a.compile_modes and int(eager_torch.split(".")[0] or 0) < 2:
        sys.exit(f"--compile-modes: {a.python}'s torch is {eager_torch}; torch.compile needs torch 2.x "
                 "(the venv's python, with --normlab of the wheel's build)")
    if a.compile_modes:
        print(f"torch.compile peers (eager's torch {eager_torch}): {', '.join(a.compile_modes)}; "
              f"compile timeout {a.compile_timeout:.0f} s")

    envs = []
    if a.env in ("default", "both"):
        envs.append(("default", base_env, peaks["default"]["gflops"]))
        if a.cap_isa:  # OpenBLAS's own pick on an AVX2-only AMD CPU
            envs[-1] = ("default, AVX2 kernels (OPENBLAS_CORETYPE=Zen)", dict(base_env, OPENBLAS_CORETYPE="Zen"),
                        peaks.get("Zen", peaks["default"])["gflops"])
    if a.env in ("tuned", "both") and best:
        # normlab's malloc thresholds (normlab/runtime_env.h) for the eager side too
        tuned = dict(base_env, OPENBLAS_CORETYPE=best,
                     GLIBC_TUNABLES="glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824")
        envs.append((f"tuned (OPENBLAS_CORETYPE={best}, malloc thresholds for both)", tuned, peaks[best]["gflops"]))

    results = []
    work = tempfile.mkdtemp(prefix="normlab_bench_")
    drops = f"dropout {a.dropout} / attention {a.attention_dropout} / activation {a.activation_dropout}"
    for env_name, env, peak in envs if a.shapes else []:
        print(f"\n## environment: {env_name}; GEMM peak {peak:.0f} GFLOP/s; {drops}"
              + ("; bf16 forwards (autocast) on both sides, not the fp32 targets" if a.dtype == "bf16" else ""))
        print("| shape | normlab ms/step | eager ms/step | normlab tok/s | eager tok/s | ratio | normlab GFLOP/s (% peak) "
              "| eager GFLOP/s (% peak) | peak RSS MiB normlab / eager | CPU-time ratio | nn.Transformer ms/step | ratio |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        infos = None
        for shape in a.shapes.split(","):
            times, cpu, si, compile_failed = measure(shape, env, a, work)
            ni, ei = si["normlab"], si["eager"]
            cpu_ratio = statistics.median(cpu["eager"]) / statistics.median(cpu["normlab"])
            infos = list(si.values())
            nm, em = statistics.median(times["normlab"]), statistics.median(times["eager"])
            tm = statistics.median(times["nn.Transformer"]) if "nn.Transformer" in times else None
            tok = ni["target_tokens"]
            gf_n, gf_e = ni["flops_per_step"] / nm / 1e6, ni["flops_per_step"] / em / 1e6
            row = {"env": env_name, "shape": shape, "times_ms": times, "cpu_ms": cpu, "normlab": ni, "eager": ei,
                   "ratio": em / nm, "gemm_peak_gflops": peak, "dtype": a.dtype,
                   "dropout": [a.dropout, a.attention_dropout, a.activation_dropout]}
            if tm:
                row["nn_transformer_ratio"] = tm / nm
            if a.compile_modes:
                row["compile"] = {}
                for mode in a.compile_modes:
                    ci = si.get("compile " + mode)
                    row["compile"][mode] = {"failed": compile_failed[mode]} if mode in compile_failed else {
                        "ms": statistics.median(times["compile " + mode]), "ratio": statistics.median(
                            times["compile " + mode]) / nm, **{k: ci[k] for k in (
                                "compile_s", "compile_steps", "warmup_steps", "recompiles_timed")}}
            if not a.no_user_path:
                row.update(user_path_rounds(shape, env, a, work))
            results.append(row)
            print(f"| {shape} | {nm:.1f} | {em:.1f} | {tok / nm * 1e3:,.0f} | {tok / em * 1e3:,.0f} | **{em / nm:.2f}×** "
                  f"| {gf_n:.1f} ({100 * gf_n / peak:.0f} %) | {gf_e:.1f} ({100 * gf_e / peak:.0f} %) "
                  f"| {ni['peak_rss_mib']:.0f} / {ei['peak_rss_mib']:.0f} | {cpu_ratio:.2f}× "
                  + (f"| {tm:.1f} | **{tm / nm:.2f}×** |" if tm else "| – | – |"), flush=True)
        for side in infos:
            print(f"{side['impl']}: torch {side['torch']}, {side['threads']} threads; BLAS {side['blas_core']} kernels "
                  f"({side['blas_parallel']}, {side['blas_threads']} threads) from {side['blas_library'] or '?'}"
                  + (f"; layer GEMMs by {side['layer_gemm']}" if side.get("layer_gemm") else "")
                  + (f" (bf16: {side['bf16_gemm']})" if a.dtype == "bf16" and side.get("bf16_gemm") else "")
                  + (f", attention blocks by {side['small_gemm']}" if side.get("small_gemm") else "")
                  + (f"; elementwise kernels' build {side['cpu_kernels']}" if side.get("cpu_kernels") else "")
                  + (f"; OPENBLAS_CORETYPE={side['coretype_env']} set by {side.get('coretype_chosen_by') or 'the environment'}"
                     if side["coretype_env"] else ""))
        if not a.no_user_path:
            print(f"\n### the user path: `normlab train` on the same shapes ({env_name}; {drops}; "
                  f"median ms/update of the logged intervals after the first, {6 if a.smoke else a.train_updates} "
                  f"updates; the median of {a.train_rounds} runs, their range beside it)")
            print("| shape | target tokens/update (bench B×T) | train ms/update | runs | bench ms/step | train / bench "
                  "| train / bench, paired | eager ms/step | train vs eager | nn.Transformer ms/step "
                  "| train vs nn.Transformer |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for row in (r for r in results if r["env"] == env_name):
                t = row["times_ms"]
                nm, em = statistics.median(t["normlab"]), statistics.median(t["eager"])
                tm = statistics.median(t["nn.Transformer"]) if "nn.Transformer" in t else None
                tr = row["train_ms"]
                bt = row["normlab"]["tokens_per_step"]
                rng = f"{min(row['train_ms_runs']):.1f}–{max(row['train_ms_runs']):.1f}"
                print(f"| {row['shape']} | {row['train_tokens_per_update']:.0f} ({bt:.0f}) | {tr:.1f} | {rng} | {nm:.1f} | {nm / tr:.2f} | {row['paired_ratio']:.2f} | {em:.1f} | **{em / tr:.2f}×** | "
                      + (f"{tm:.1f} | **{tm / tr:.2f}×** |" if tm else "– | – |"))
        if a.compile_modes:
            print(f"\n### the torch.compile peer ({env_name}): eager_reference.py's model under torch.compile(mode=...), "
                  "the loss and AdamW eager, in the same alternating rounds; compile s = wall time of the warm-up "
                  "steps that compiled (cold inductor cache), left out of ms/step")
            print("| shape | mode | normlab bench ms/step | normlab train ms/update | compile ms/step | bench vs compile "
                  "| train vs compile | compile s (steps) | recompiles in timed steps |")
            print("|---|---|---|---|---|---|---|---|---|")
            for row in (r for r in results if r["env"] == env_name):
                nm = statistics.median(row["times_ms"]["normlab"])
                tr = row.get("train_ms")
                for mode in a.compile_modes:
                    print(f"| {row['shape']} | {mode} | {nm:.1f} | " + (f"{tr:.1f}" if tr else "–") + " | "
                          + " | ".join(compile_cells(row, mode, nm, tr)) + " |")
            print(f"compile peers' stderr (a failed mode's traceback): {work}/compile-<shape>-<mode>-*.stderr")
    print(f"\n{a.dtype} forwards; medians of {a.rounds * a.steps_per_round} steps per side after {a.warmup} warm-up steps; ratio = "
          "eager ms / normlab ms; tok/s counts target tokens (non-pad); GFLOP/s from the GEMM FLOPs of a step "
          "(3x forward); CPU-time ratio = the same from process CPU time (steadier on a busy machine); "
          "train / bench = normlab bench's ms/step over normlab train's ms/update (1.00: the user path is as fast); "
          "paired: each train run against bench steps taken right after it, the median of those ratios")
    fit = depth_fit(a, envs[0][1]) if a.depth_fit else None
    if a.smoke:  # the line bench_vs_eager_smoke looks for: a ratio measured, and the fit when asked
        print(f"smoke: {results[0]['shape']} ratio {results[0]['ratio']:.2f}×"
              + (f"; depth fit ms/step slope {fit[1]['ms/step'][1]:.2f} per layer" if fit else "")
              + (f"; user path train ms/update {results[0]['train_ms']:.1f}" if "train_ms" in results[0] else "")
              + "".join(f"; compile {m} " + (f"{c['ratio']:.2f}× (compile {c['compile_s']:.1f} s)" if "ratio" in c
                                             else f"failed: {c['failed']}")
                        for m, c in results[0].get("compile", {}).items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": model, "flags": flags, "gemm": peaks, "results": results, "depth_fit": fit}, f, indent=1)


if __name__ == "__main__":
    main()
