#!/usr/bin/env bash
# Peak RSS of CPU training with and without run.activation_checkpointing, 6 → 200 layers, beside the
# memory estimate normlab prints
# (decoder-only, d64, 2048 tokens per batch, 3 updates, 1 thread); docs/gpus-and-clusters.md, "Big models".
#   bench/checkpointing_rss.sh [NORMLAB] [LAYERS...]
set -euo pipefail
normlab=${1:-./build/bin/normlab}
shift || true
layers=("${@:-6 24 50 100 200}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/m.toml" <<TOML
[model]
arch = "lm"
d_model = 64
ffn_dim = 256
heads = 4
dropout = 0.1
[scheme]
name = "pre-ln"
[data]
task = "synthetic-lm"
synthetic_vocab = 64
synthetic_train = 2000
synthetic_valid = 16
lm_block = 128
[optim]
max_tokens = 2048
max_updates = 3
warmup_updates = 1
[eval]
interval = 0
[run]
threads = 1
log_interval = 1
checkpoint_keep_last = 0
TOML
# Beside each peak, the estimate `normlab train` printed at startup (its "memory: estimated" line).
printf '| layers | peak RSS, all activations kept | (estimate) | with activation checkpointing | (estimate) | ms/update kept | ms/update checkpointed |\n|---|---|---|---|---|---|---|\n'
for n in ${layers[@]}; do
  row="| $n"
  ms=""
  for ckpt in false true; do
    out="$work/run-$n-$ckpt"
    /usr/bin/time -f '%M' -o "$work/rss" "$normlab" train "$work/m.toml" --set model.dec_layers=$n \
      --set run.activation_checkpointing=$ckpt --set "run.out_dir=\"$out\"" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
    row="$row | $(awk '{printf "%.0f MiB", $1 / 1024}' "$work/rss") | $(sed -n 's/^memory: estimated \([^(]*\) (.*/\1/p' "$work/log")"
    ms="$ms | $(python3 -c 'import json,sys
r = [j for j in map(json.loads, open(sys.argv[1])) if j["kind"] == "train"]
print("%.0f" % r[-1]["ms_per_update"])' "$out/train.jsonl")"
  done
  echo "$row$ms |"
done
