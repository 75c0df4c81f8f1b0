#!/usr/bin/env python3
"""bench/run_bench.py measures a GEMM peak per OPENBLAS_CORETYPE: only for core types the CPU can
execute (a forced SkylakeX on an AVX2-only CPU dies with SIGILL, as it did on an AMD Zen 3)."""
import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location(
    "run_bench", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "run_bench.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

zen3 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi1 bmi2 sha_ni vaes".split()
ok, skipped = bench.supported_coretypes(zen3)
assert ok == ["Haswell", "Zen"], ok
assert skipped["SkylakeX"] == ["avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl"], skipped
assert "avx512_bf16" in skipped["Cooperlake"], skipped

skylake = zen3 + "avx512f avx512bw avx512vl avx512dq avx512cd".split()
ok, skipped = bench.supported_coretypes(skylake)
assert ok == ["Haswell", "Zen", "SkylakeX"] and list(skipped) == ["Cooperlake"], (ok, skipped)
assert bench.supported_coretypes(skylake + ["avx512_bf16"])[0] == bench.CORETYPES

# This machine: whatever it is, no chosen core type needs a flag it lacks, and none is skipped for a
# flag it has (the benchmark once passed only its printed subset of the flags, without avx512cd and
# avx512dq, and skipped SkylakeX and Cooperlake on an AVX-512 CPU as "lacks avx512cd avx512dq").
with open("/proc/cpuinfo") as f:
    cpuinfo = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
_, _, flags = bench.cpu_summary()
assert set(flags) == cpuinfo, sorted(set(flags) ^ cpuinfo)
ok, skipped = bench.supported_coretypes(flags)
for ct in ok:
    assert bench.CORETYPE_NEEDS[ct] <= cpuinfo, ct
for ct, missing in skipped.items():
    assert missing and not set(missing) & cpuinfo, (ct, missing)
print("bench core types OK")
