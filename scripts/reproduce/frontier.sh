#!/usr/bin/env bash
# The stability frontier of the seed schemes (docs/sweeps.md, "Stability frontier"): `normlab frontier` on
# the built-in LM task (experiments/paper/frontier-lm.toml, 2/6/18/50 layers, 50 updates per trial)
# and on Multi30k En→De (experiments/paper/frontier-multi30k.toml, 2L-2L, 6L-6L and 18L-18L, 30 updates),
# lr grid 3e-4 … 3e-1 (half decades), seeds 1 and 2, one bisection step. Trials go to
# ${NORMLAB_REPRO_DIR:-runs/reproduce}/frontier-{lm,multi30k} (a rerun resumes: finished trials are
# reused; delete the directory to start over); the figures and frontier.csv to
# docs/figures/frontier/{lm,multi30k}/, the report to <dir>/report/.
#   NORMLAB              the normlab binary (default build/bin/normlab)
#   NORMLAB_REPRO_JOBS   trials at a time (default 2; every trial uses one thread)
# About 70 minutes of CPU (~770 trials); Multi30k is fetched on first use.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/reproduce/lib/common.sh
ROOT=$NORMLAB_REPRO_DIR
JOBS=${NORMLAB_REPRO_JOBS:-2}
SCHEMES=post-ln,pre-ln,deepnorm,branchnorm,b2t,admin
FIGURES=docs/figures/frontier
start=$SECONDS
frontier() {  # NAME DEPTHS UPDATES
  local name=$1 depths=$2 updates=$3 t0=$SECONDS out=$ROOT/frontier-$1
  "$NORMLAB" frontier "experiments/paper/frontier-$name.toml" --schemes "$SCHEMES" --depths "$depths" \
    --lr 3e-4:3e-1 --seeds 1,2 --updates "$updates" --bisect 1 --jobs "$JOBS" --out "$out"
  rm -rf "${FIGURES:?}/$name"
  "$NORMLAB" plot "$out" --out "$FIGURES/$name" --format png
  cp "$out/frontier.csv" "$FIGURES/$name/frontier.csv"
  "$NORMLAB" report "$out"
  echo "frontier.sh: $name took $((SECONDS - t0)) s (figures in $FIGURES/$name, report in $out/report)"
}
frontier lm 2,6,18,50 50
ensure_multi30k
frontier multi30k 2,6,18 30
echo "frontier.sh: wall time $((SECONDS - start)) s"
