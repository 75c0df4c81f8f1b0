#!/usr/bin/env bash
# GPU check (ctest label `gpu`): every manifest in experiments/ trains on --device cuda with every
# analysis probe, and a run killed with SIGKILL resumes to the same losses as the uninterrupted run.
# Prints "SKIP: ..." (ctest reports the test as skipped) where no CUDA device is usable.
#   cuda_manifests.sh NORMLAB SOURCE_DIR WORK_DIR
# NORMLAB_GPU_MANIFESTS="quickstart multi30k" runs only those (names of experiments/*.toml).
set -euo pipefail
normlab=$1 src=$2 work=$3
# Skipped only where there is nothing to test: a build without CUDA, or no device. A smoke run that
# fails on a machine with a device is a failure (a real CUDA crash), never a skip.
# shellcheck source=tests/gpu/common.sh
source "$(dirname "$(readlink -f "$0")")/common.sh"
if ! "$normlab" smoke --device cuda --scheme post-ln --enc-layers 1 --dec-layers 1 >probe.log 2>&1; then
  echo "FAIL: smoke on cuda ($cuda_line):"; tail -n 20 probe.log
  exit 1
fi

short=(--set 'run.device="cuda"' --set optim.max_updates=24 --set run.log_interval=1 --set run.checkpoint_interval=8
       --set eval.interval=12 --set eval.bleu_max_sentences=20 --set data.synthetic_train=2000 --set analysis.interval=4)

# "N updates, last M ms/update, loss L" of a train.jsonl
speed() { python3 -c 'import json,sys
r = [j for j in map(json.loads, open(sys.argv[1])) if j["kind"] == "train"]
print("%d updates, last %.0f ms/update, loss %.3f" % (len(r), r[-1]["ms_per_update"], r[-1]["loss"]))' "$1"; }

# max relative difference of two loss listings (same updates required)
compare() { python3 - "$1" "$2" <<'EOF'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
assert [x[0] for x in a] == [x[0] for x in b], f"updates differ: {[x[0] for x in a]} vs {[x[0] for x in b]}"
d = max(abs(float(x[1]) - float(y[1])) / max(abs(float(x[1])), 1e-12) for x, y in zip(a, b))
print(f"max relative loss difference {d:.3g} over {len(a)} updates" + (" (bitwise)" if a == b else ""))
# cuBLAS/cuDNN reductions and atomics (embedding backward) are not bit-reproducible across processes;
# a resumed run must stay within float noise of the uninterrupted one.
sys.exit(0 if d <= 1e-4 else 1)
EOF
}

fails=0
for manifest in "$src"/experiments/*.toml; do
  name=$(basename "$manifest" .toml)
  if [ -n "${NORMLAB_GPU_MANIFESTS:-}" ] && [[ " $NORMLAB_GPU_MANIFESTS " != *" $name "* ]]; then
    echo "note: $name is not in NORMLAB_GPU_MANIFESTS: not run"
    continue
  fi
  if grep -q '^dataset = "multi30k"' "$manifest" && [ -z "${NORMLAB_DATA_MIRROR:-}" ] &&
     ! "$normlab" data path multi30k >/dev/null 2>&1; then
    echo "note: $name needs the dataset multi30k (normlab data fetch multi30k, or NORMLAB_DATA_MIRROR): not run"
    continue
  fi
  # Manifests that name Multi30k's files beside the repository (../data/multi30k/…).
  if grep -q '"\.\./data/multi30k/' "$manifest" && [ ! -f "$src/../data/multi30k/train.en" ]; then
    echo "note: $name reads ../data/multi30k (scripts/normlab.sh data multi30k): not run"
    continue
  fi
  if grep -q '^\[sweep\]' "$manifest"; then
    # A sweep: every run on the GPU, one at a time.
    if "$normlab" sweep "$manifest" --jobs 1 "${short[@]}" --set "run.out_dir=\"$work/$name\"" >"$name.log" 2>&1 &&
       "$normlab" sweep "$manifest" --status --set "run.out_dir=\"$work/$name\"" >>"$name.log" 2>&1 &&
       grep -q ' 0 running | 0 interrupted | 0 failed' "$name.log"; then
      echo "ok: $name (sweep) on cuda"
    else
      echo "FAIL: $name (sweep) on cuda"; tail -n 30 "$name.log"; fails=$((fails + 1))
    fi
    continue
  fi
  if grep -q '^activation_checkpointing = true' "$manifest"; then
    # The 1000-layer manifest (3.7B parameters): a few updates and its ms/update. No kill/resume
    # here: each checkpoint is ~44 GB (resume itself is covered by the other manifests).
    if "$normlab" train "$manifest" "${short[@]}" --set optim.max_updates=4 --set eval.interval=0 \
         --set eval.bleu=false --set eval.test_beam=0 --set run.checkpoint_keep_last=0 \
         --set 'run.checkpoint_save_best="none"' --set "run.out_dir=\"$work/$name\"" >"$name.log" 2>&1; then
      echo "ok: $name on cuda: $(speed "$work/$name/train.jsonl")"
    else
      echo "FAIL: $name on cuda"; tail -n 30 "$name.log"; fails=$((fails + 1))
    fi
    rm -rf "$work/$name/checkpoints"
    continue
  fi
  # Uninterrupted, then killed after a checkpoint and resumed; with dropout, so the GPU generator's
  # state must be restored too (a manifest without dropout would pass with a broken restore).
  drop=(--set model.dropout=0.1 --set model.attention_dropout=0.1 --set model.activation_dropout=0.1)
  if ! "$normlab" train "$manifest" "${short[@]}" "${drop[@]}" --set "run.out_dir=\"$work/$name-a\"" >"$name-a.log" 2>&1; then
    echo "FAIL: $name on cuda"; tail -n 30 "$name-a.log"; fails=$((fails + 1)); continue
  fi
  "$normlab" train "$manifest" "${short[@]}" "${drop[@]}" --set "run.out_dir=\"$work/$name-b\"" >"$name-b.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    [ -f "$work/$name-b/checkpoints/step_16.safetensors" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  kill -9 $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  if ! "$normlab" train "$manifest" "${short[@]}" "${drop[@]}" --set "run.out_dir=\"$work/$name-b\"" >>"$name-b.log" 2>&1; then
    echo "FAIL: $name resume on cuda"; tail -n 30 "$name-b.log"; fails=$((fails + 1)); continue
  fi
  losses "$work/$name-a/train.jsonl" >"$name-a.losses"
  losses "$work/$name-b/train.jsonl" >"$name-b.losses"
  if result=$(compare "$name-a.losses" "$name-b.losses"); then
    echo "ok: $name on cuda, killed and resumed: $result"
  else
    echo "FAIL: $name resumed differs: $result"; fails=$((fails + 1))
  fi
done
# fp16 (dynamic loss scaling) runs on CUDA only: once, on the quickstart.
if "$normlab" train "$src/experiments/quickstart.toml" "${short[@]}" --set 'run.dtype="fp16"' \
     --set "run.out_dir=\"$work/quickstart-fp16\"" >quickstart-fp16.log 2>&1; then
  echo "ok: quickstart fp16 on cuda: $(speed "$work/quickstart-fp16/train.jsonl")"
else
  echo "FAIL: quickstart fp16 on cuda"; tail -n 30 quickstart-fp16.log; fails=$((fails + 1))
fi
# Data-parallel on NCCL where there are two GPUs: 2 ranks against one process with update_freq 2.
gpus=$(echo "$cuda_line" | sed -n 's/^CUDA yes (\([0-9]*\) device.*/\1/p')
if [ "${gpus:-1}" -ge 2 ]; then
  dp=("${short[@]}" --set model.dropout=0.0 --set model.attention_dropout=0.0 --set model.activation_dropout=0.0)
  if "$normlab" train "$src/experiments/quickstart.toml" "${dp[@]}" --nproc 2 --set "run.out_dir=\"$work/dp2\"" >dp2.log 2>&1 &&
     "$normlab" train "$src/experiments/quickstart.toml" "${dp[@]}" --set optim.update_freq=2 \
       --set "run.out_dir=\"$work/dp1\"" >dp1.log 2>&1 &&
     result=$(compare <(losses "$work/dp2/train.jsonl") <(losses "$work/dp1/train.jsonl")); then
    echo "ok: 2 ranks (nccl) against update_freq 2: $result"
  else
    echo "FAIL: data-parallel on 2 GPUs"; tail -n 30 dp2.log; fails=$((fails + 1))
  fi
else
  echo "note: one GPU: the 2-rank NCCL check needs two"
fi
[ $fails -eq 0 ] && echo "gpu manifests OK" || { echo "$fails failure(s)"; exit 1; }
