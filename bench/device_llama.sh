#!/usr/bin/env bash
# Issue 43's LLaMA figures in one device call: build with the device kit (tests included), run the
# GPU paths against their references (ctest gpu_kernels), then bench/gpu_bench.py --llama
# (normlab train against HF LlamaForCausalLM eager and compiled, same run). Prepare here with
# `bash ../shared/device/prepare.sh` and send `.device-kit` along (carry); on the device:
#   bash bench/device_llama.sh llama-374M bf16,fp32     # ~6 min with the build
#   bash bench/device_llama.sh llama-1.36B bf16         # ~4 min
# UPDATES / STEPS (default 40 / 20) shorten the normlab run and the peer's timed steps.
# The table goes to $OUT/llama-<shapes>.md when $OUT is set (the device tool brings it back).
set -u
shapes=${1:-llama-374M}
dtypes=${2:-bf16}
[ -x build-gpu/bin/normlab_tests ] || TESTS=ON bash .device-kit/build.sh || exit 1
# shellcheck disable=SC1091
source .device-kit/env.sh
ctest --test-dir build-gpu -R '^gpu_kernels$' --output-on-failure -V 2>&1 | tail -n 40 |
  tee "${OUT:-/tmp}/gpu_kernels.txt"
python3 bench/gpu_bench.py --llama "$shapes" --dtypes "$dtypes" --normlab build-gpu/bin/normlab \
  --python python3 --train-updates "${UPDATES:-40}" --eager-steps "${STEPS:-20}" | tee "${OUT:-/tmp}/llama-${shapes//,/_}.md"
