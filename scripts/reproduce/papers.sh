#!/usr/bin/env bash
# Reproduces DeepNet Fig. 4, B2T Fig. 3 and BranchNorm Fig. 4 + Fig. 7 from scratch
# (docs/reproducing.md): runs the sweeps experiments/paper/{deepnet-fig4,b2t-fig3,
# branchnorm-fig4-fig7}.toml into ${NORMLAB_REPRO_DIR:-runs/reproduce}/<name> (deleted first),
# plots each into docs/figures/paper/<name>/ and writes each sweep's report (with its paper view).
#   NORMLAB      the normlab binary (default build/bin/normlab)
#   NORMLAB_REPRO_JOBS  sweep workers (default 2; every run uses one thread)
# About an hour on a 2-vCPU machine (72 min of sweeps one run at a time on the loaded development
# machine); Multi30k is fetched on first use.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/reproduce/lib/common.sh
ROOT=$NORMLAB_REPRO_DIR
JOBS=${NORMLAB_REPRO_JOBS:-2}
FIGURES=docs/figures/paper
start=$SECONDS
ensure_multi30k
for name in deepnet-fig4 b2t-fig3 branchnorm-fig4-fig7; do
  t0=$SECONDS
  out=$ROOT/$name
  rm -rf "$out"  # from scratch: a sweep directory would otherwise be resumed
  "$NORMLAB" sweep "experiments/paper/$name.toml" --jobs "$JOBS" --set run.out_dir="\"$out\""
  rm -rf "${FIGURES:?}/$name"
  "$NORMLAB" plot "$out" --out "$FIGURES/$name" --format png
  "$NORMLAB" report "$out"
  echo "papers.sh: $name took $((SECONDS - t0)) s (figures in $FIGURES/$name, report in $out/report)"
done
echo "papers.sh: wall time $((SECONDS - start)) s"
