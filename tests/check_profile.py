#!/usr/bin/env python3
"""NORMLAB_PROFILE_UPDATE and bench/profile_summary.py (issue 43: where a GPU update's time goes).

1. bench/profile_summary.py on a handmade GPU trace: busy time (overlapping kernels counted once),
   kernel time, the kinds and their shares, each against a hand computation.
2. `normlab train` with NORMLAB_PROFILE_UPDATE=2 on a small llama LM: on LibTorch 2.x the run
   directory gets profile-update-2.json, a Chrome trace whose CPU operators include the model's
   matrix products, and the summary tables them; on 1.13 the run says it was not profiled. The
   losses are those of the run without the profiler.
3. A bad value is one error line naming the variable.

usage: check_profile.py NORMLAB PLUGIN_DIR WORK_DIR SOURCE_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys

normlab, plugins, work, source = sys.argv[1:5]
summary_script = os.path.join(source, "bench", "profile_summary.py")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    failures += not cond


def summarise(trace):
    return subprocess.run([sys.executable, summary_script, trace], capture_output=True, text=True,
                          timeout=60)


# 1. A handmade GPU trace (µs): a GEMM [0, 10), an elementwise kernel [5, 15) overlapping it, a
# memcpy [30, 35), the CPU operator around them [-2, 40). Busy: [0, 15) + [30, 35) = 20 of a span of
# 42; kernel time 25; GEMM 10/25 = 40 %.
handmade = os.path.join(work, "handmade.json")
events = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": -2, "dur": 42},
    {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 0, "dur": 10},
    {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>",
     "ts": 5, "dur": 10},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 30, "dur": 5},
    {"ph": "i", "cat": "instant", "name": "not a complete event", "ts": 50},
]
with open(handmade, "w") as f:
    json.dump({"traceEvents": events}, f)
r = summarise(handmade)
print(r.stdout + r.stderr)
check(r.returncode == 0, "profile_summary reads a GPU trace")
check("span of the profiled update: 0.042 ms; GPU busy 0.020 ms (47.6 %), kernel time 0.025 ms "
      "in 3 kernels and copies" in r.stdout, "busy time counts overlapping kernels once")
check("| GEMM | 1 | 0.010 | 40.0 % |" in r.stdout, "a cuBLAS kernel is a GEMM, 40 % of the time")
check("| elementwise | 1 | 0.010 | 40.0 % |" in r.stdout, "ATen's elementwise kernel")
check("| copies | 1 | 0.005 | 20.0 % |" in r.stdout, "a memcpy is a copy")
bad = os.path.join(work, "bad.json")
with open(bad, "w") as f:
    f.write("{not json")
r = summarise(bad)
check(r.returncode != 0 and "bad.json: not a readable JSON trace" in r.stderr,
      "a damaged trace is one error line naming the file")

# 2. A profiled run against the same run without the profiler.
manifest = os.path.join(work, "m.toml")
with open(manifest, "w") as f:
    f.write("""[model]
arch = "lm"
family = "llama"
d_model = 32
heads = 4
dec_layers = 2
ffn_dim = 64
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
task = "synthetic-lm"
synthetic_vocab = 32
synthetic_train = 200
synthetic_valid = 10
[optim]
max_updates = 3
max_tokens = 256
[run]
log_interval = 1
checkpoint_save_best = "none"
""")


def train(out_dir, profile):
    env = dict(os.environ)
    env.pop("NORMLAB_PROFILE_UPDATE", None)
    if profile is not None:
        env["NORMLAB_PROFILE_UPDATE"] = profile
    return subprocess.run([normlab, "train", manifest, "--plugin-path", plugins, "--set",
                           f'run.out_dir="{out_dir}"'], capture_output=True, text=True, env=env,
                          timeout=300)


def nlls(text):
    return re.findall(r"nll ([0-9.]+)", text)


plain = train(os.path.join(work, "plain"), None)
profiled = train(os.path.join(work, "profiled"), "2")
print(profiled.stdout[-3000:] + profiled.stderr[-2000:])
check(plain.returncode == 0 and profiled.returncode == 0, "both runs complete")
check(nlls(plain.stdout) and nlls(plain.stdout) == nlls(profiled.stdout),
      "the profiled run logs the losses of the run without the profiler")
trace = os.path.join(work, "profiled", "profile-update-2.json")
if "was not profiled" in profiled.stdout:  # LibTorch 1.13
    check("needs LibTorch 2.x's profiler (Kineto)" in profiled.stdout and not os.path.exists(trace),
          "LibTorch 1.13: the run says update 2 was not profiled")
else:
    check(f"profile: update 2 (" in profiled.stdout and trace in profiled.stdout,
          "the run names the trace it wrote")
    with open(trace) as f:
        written = json.load(f)["traceEvents"]
    ops = {e.get("name") for e in written if e.get("cat") == "cpu_op"}
    check(bool(ops & {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul"}),
          "the trace holds the model's matrix products")
    check(any(n.startswith("autograd::engine::evaluate_function") for n in ops),
          "the trace holds the backward pass")
    r = summarise(trace)
    print(r.stdout[:1500])
    check(r.returncode == 0 and "| `aten::" in r.stdout, "profile_summary tables the operators")
    check(not os.path.exists(os.path.join(work, "profiled", "profile-update-1.json")) and
          not os.path.exists(os.path.join(work, "profiled", "profile-update-3.json")),
          "only the requested update is profiled")

# An update the run does not make is said, not silently skipped.
r = train(os.path.join(work, "beyond"), "9")
check(r.returncode == 0 and "profile: NORMLAB_PROFILE_UPDATE=9, but this run makes updates 1 to 3"
      in r.stdout and not os.path.exists(os.path.join(work, "beyond", "profile-update-9.json")),
      "an update beyond max_updates: the run says so and trains")

# 3. A bad value.
r = train(os.path.join(work, "bad"), "two")
check(r.returncode != 0 and "NORMLAB_PROFILE_UPDATE: expected the number of the update to profile"
      in r.stderr + r.stdout and "'two'" in r.stderr + r.stdout,
      "NORMLAB_PROFILE_UPDATE=two is one error naming the variable and the value")

print("profile checks OK" if failures == 0 else f"{failures} profile checks FAILED")
sys.exit(1 if failures else 0)
