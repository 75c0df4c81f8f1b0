#!/usr/bin/env bash
# The 2024-25 depth analyses on the llama family (issue 29 item 5): experiments/paper/llama-depth.toml —
# Pre-LN, LayerNorm-Scaling, Mix-LN, Peri-LN, DyT and nGPT, 12 layers, 2 seeds, on tinyshakespeare —
# then `normlab ablate` on every run, the figures into docs/figures/paper/llama-depth/ and the table
# docs/figures/paper/llama-depth/summary.md (scripts/reproduce/lib/llama_depth_summary.py).
# A rerun resumes the sweep.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/reproduce/lib/common.sh
start=$(date +%s)
jobs=${NORMLAB_REPRO_JOBS:-$(( $(nproc) > 1 ? $(nproc) : 1 ))}
out=$NORMLAB_REPRO_DIR/llama-depth
figures=docs/figures/paper/llama-depth

# tinyshakespeare into the data cache: downloaded (SHA-256 pinned) or, offline, from ../shared/data.
"$NORMLAB" data path tinyshakespeare >/dev/null 2>&1 || "$NORMLAB" data fetch tinyshakespeare ||
  NORMLAB_DATA_MIRROR=../shared/data "$NORMLAB" data fetch tinyshakespeare

"$NORMLAB" sweep experiments/paper/llama-depth.toml --set run.out_dir="\"$out\"" --jobs "$jobs"
for run in "$out"/*/; do
  [ -f "$run/checkpoints/best.safetensors" ] && "$NORMLAB" ablate "$run" --drop-layer each | tail -1
done
rm -rf "$figures" && mkdir -p "$figures"
"$NORMLAB" plot "$out"/*/ --out "$figures" --format png
python3 scripts/reproduce/lib/llama_depth_summary.py "$out" | tee "$figures/summary.md"
report_wall "$start" "llama depth analyses"
