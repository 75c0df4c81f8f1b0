#!/usr/bin/env bash
# Wortsman et al. 2023 (docs/reproducing.md, "Wortsman et al. 2023: QK-norm and z-loss"): final
# loss vs peak lr for a 2-layer LLaMA-style decoder (d 128, 2 heads of 64, BPE 1000, tinyshakespeare,
# 300 updates of 512 tokens; experiments/paper/wortsman-qknorm.toml), lr 1e-4 … 0.316 (8 half-decade
# points), seed 1, through `normlab frontier` (its lr_sensitivity and Wortsman's, docs/reproducing.md):
#   Pre-LN   without QK-norm, with QK-layernorm, with z-loss 1e-4, with both;
#   Post-LN and Peri-LN without and with QK-layernorm.
# Each (scheme, variant) goes to ${NORMLAB_REPRO_DIR:-runs/reproduce}/wortsman-qknorm/<scheme>.<variant>
# (a rerun resumes: finished trials are reused); the figures and summary.{md,csv} to
# docs/figures/paper/wortsman-qknorm/ (scripts/reproduce/lib/wortsman_summary.py, Debian's python3
# with matplotlib). 64 runs of ~20 s on one thread: about 25 CPU-minutes.
#   NORMLAB_REPRO_JOBS  trials at a time (default 2; every trial uses one thread)
#   --dry-run           validate every trial and list them; train nothing
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/reproduce/lib/common.sh
start=$(date +%s)
jobs=${NORMLAB_REPRO_JOBS:-2}
out=$NORMLAB_REPRO_DIR/wortsman-qknorm
figures=docs/figures/paper/wortsman-qknorm
dry=()
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
for arg in "$@"; do  # an unknown argument must not start the 25-minute sweep
  case $arg in
    --dry-run) dry=(--dry-run) ;;
    -h | --help) usage; exit 0 ;;
    *) echo "wortsman-qknorm.sh: unknown argument '$arg' (expected --dry-run or --help)" >&2; exit 2 ;;
  esac
done

"$NORMLAB" data path tinyshakespeare >/dev/null 2>&1 || "$NORMLAB" data fetch tinyshakespeare ||
  NORMLAB_DATA_MIRROR=../shared/data "$NORMLAB" data fetch tinyshakespeare

run_variant() {  # SCHEME VARIANT [--set key=value]...
  local scheme=$1 variant=$2
  shift 2
  "$NORMLAB" frontier experiments/paper/wortsman-qknorm.toml --schemes "$scheme" --depths 2 \
    --lr 1e-4:0.32 --seeds 1 --updates 300 --bisect 0 --jobs "$jobs" \
    --out "$out/$scheme.$variant" "$@" "${dry[@]}"
}
qk=(--set 'model.qk_norm="layer"' --set 'model.qk_norm_scope="head"')
zloss=(--set optim.z_loss=1e-4)
run_variant pre-ln none
run_variant pre-ln qk "${qk[@]}"
run_variant pre-ln zloss "${zloss[@]}"
for scheme in post-ln peri-ln; do
  run_variant "$scheme" none
  run_variant "$scheme" qk "${qk[@]}"
done
run_variant pre-ln qk-zloss "${qk[@]}" "${zloss[@]}"
[ ${#dry[@]} -gt 0 ] && exit 0

mkdir -p "$figures"
python=${PYTHON:-python3}
"$python" -c 'import matplotlib' 2>/dev/null || python=/usr/bin/python3  # Debian's has matplotlib
"$python" scripts/reproduce/lib/wortsman_summary.py "$out" "$figures" | tee "$figures/summary.md"
report_wall "$start" "Wortsman et al. 2023 QK-norm / z-loss lr sweep"
