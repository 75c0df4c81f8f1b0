#!/usr/bin/env bash
# The depth table (issue 17 item 4): experiments/paper/depth-table.toml — the six seed schemes at
# 6L-6L, 18L-18L and 50L-50L on Multi30k En→De, 1,000 updates each, test BLEU with beam 5 — then its report
# and docs/figures/paper/depth-table/{depth_table.png,depth_table.md}. The same sweep on IWSLT14
# De→En follows into depth-table-iwslt14/ when that corpus can be fetched (network or
# NORMLAB_DATA_MIRROR); otherwise it is skipped with a note. A rerun resumes the sweeps.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/reproduce/lib/common.sh
start=$(date +%s)
jobs=${NORMLAB_REPRO_JOBS:-$(( $(nproc) > 1 ? $(nproc) : 1 ))}

# One corpus: the sweep, its report, the figure and the Markdown table.
depth_table() {  # OUT FIGURES [--set key=value …]
  local out=$1 figures=$2
  shift 2
  "$NORMLAB" sweep experiments/paper/depth-table.toml --set run.out_dir="\"$out\"" "$@" --jobs "$jobs"
  "$NORMLAB" report "$out" --out "$out/report"
  rm -rf "$figures" && mkdir -p "$figures"
  cp "$out/report/figures/depth_table.png" "$figures/"
  python3 -c '
import csv, sys
print("| scheme | layers | outcome | best valid nll | test BLEU (beam 5) |")
print("|---|---|---|---:|---:|")
for r in csv.DictReader(open(sys.argv[1])):
    print("| {scheme} | {depth} | {status_text} | {nll} | {bleu} |".format(
        nll=r["best_valid_nll"] or "–", bleu=r["test_bleu"] or "–", **r))
' "$out/report/summary.csv" > "$figures/depth_table.md"
  cat "$figures/depth_table.md"
}

ensure_multi30k
depth_table "$NORMLAB_REPRO_DIR/depth-table" docs/figures/paper/depth-table
if "$NORMLAB" data path iwslt14 >/dev/null 2>&1 || "$NORMLAB" data fetch iwslt14; then
  depth_table "$NORMLAB_REPRO_DIR/depth-table-iwslt14" docs/figures/paper/depth-table-iwslt14 \
    --set data.dataset='"iwslt14"' --set data.pair='"de-en"'
else
  echo "note: IWSLT14 could not be fetched (no network? set NORMLAB_DATA_MIRROR): its depth table is skipped" >&2
fi
report_wall "$start" "depth table"
