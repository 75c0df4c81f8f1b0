#!/usr/bin/env bash
# Issue 43's GPU figures in one device call: build with the device kit (tests included), run the
# GPU paths against their references (ctest gpu_kernels), then bench/gpu_bench.py --llama
# (normlab train against HF LlamaForCausalLM eager and compiled, same run). Prepare here with
# `bash ../shared/device/prepare.sh` and send `.device-kit` along (carry); on the device:
#   bash bench/device_llama.sh llama-374M bf16,fp32,tf32  # ~7 min with the build
#   bash bench/device_llama.sh llama-1.36B bf16         # ~4 min
#   bash bench/device_llama.sh base-6L,d64-18L bf16     # the transformer family (issue 43.6)
#   GRAPHS=1 bash bench/device_llama.sh d64-18L,d64-50L,lm256-24L fp32  # CUDA graphs (issue 43.4):
#     ctest gpu_cuda_graph too, and each row's normlab train again with run.cuda_graph = true
#     (LLaMA shapes: a comment line per row with its ms/update)
# UPDATES / STEPS (default 40 / 20) shorten the normlab run and the peer's timed steps;
# NORMLAB_CUDA_FUSED=0 times normlab without its fused GPU operations (set here when gpu_kernels fails).
# The table goes to $OUT/gpu-<shapes>.md when $OUT is set (the device tool brings it back).
set -u
shapes=${1:-llama-374M}
dtypes=${2:-bf16}
[ -x build-gpu/bin/normlab_tests ] || TESTS=ON bash .device-kit/build.sh || exit 1
# A later call's `carry` replaces .device-kit without the env.sh build.sh wrote: the .debs it
# unpacked are still in /tmp/deb.
# shellcheck disable=SC1091
[ -f .device-kit/env.sh ] && source .device-kit/env.sh ||
  export LD_LIBRARY_PATH=/tmp/deb/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ctest --test-dir build-gpu -R '^gpu_kernels$' --output-on-failure -V > /tmp/gpu_kernels.log 2>&1
kernels_rc=$?
tail -n 60 /tmp/gpu_kernels.log | tee "${OUT:-/tmp}/gpu_kernels.txt"
if [ "${GRAPHS:-0}" = 1 ]; then  # run.cuda_graph against eager through normlab train
  ctest --test-dir build-gpu -R '^gpu_cuda_graph$' --output-on-failure -V > /tmp/gpu_cuda_graph.log 2>&1
  tail -n 30 /tmp/gpu_cuda_graph.log | tee "${OUT:-/tmp}/gpu_cuda_graph.txt"
fi
# The fused operations are timed only where they match their references on this GPU.
if [ $kernels_rc -ne 0 ]; then
  echo "gpu_kernels FAILED: the benchmark runs with NORMLAB_CUDA_FUSED=0 (ATen's compositions)"
  export NORMLAB_CUDA_FUSED=0
fi
case $shapes in
  llama-*) section=(--llama "$shapes")
    [ "${GRAPHS:-0}" = 1 ] && section+=(--llama-cuda-graph) ;;
  *) section=(--shapes "$shapes") ;;  # the transformer family: eager, and compile for bf16
esac
# Each normlab run of the LLaMA rows also profiles one update (PROFILE_UPDATE, 0: none; the default
# 5 lies in the first log interval, which the timing leaves out): a table of its kernels by kind and
# name, and the gzipped trace, in $OUT/profiles.
python3 bench/gpu_bench.py "${section[@]}" --dtypes "$dtypes" --normlab build-gpu/bin/normlab \
  --python python3 --train-updates "${UPDATES:-40}" --eager-steps "${STEPS:-20}" \
  --profile-update "${PROFILE_UPDATE:-5}" --profile-dir "${OUT:-/tmp}/profiles" |
  tee "${OUT:-/tmp}/gpu-${shapes//,/_}.md"
