#!/usr/bin/env bash
# The depth table (issue 17 item 4): experiments/paper/depth-table.toml — the six seed schemes at
# 6L-6L and 18L-18L on Multi30k En→De, 1,000 updates each, test BLEU with beam 5 — then its report
# and docs/figures/paper/depth-table/{depth_table.png,depth_table.md}.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/reproduce/lib/common.sh
start=$(date +%s)
ensure_multi30k
out=$NORMLAB_REPRO_DIR/depth-table
jobs=${NORMLAB_REPRO_JOBS:-$(( $(nproc) > 1 ? $(nproc) : 1 ))}
"$NORMLAB" sweep experiments/paper/depth-table.toml --set run.out_dir="\"$out\"" --jobs "$jobs"
"$NORMLAB" report "$out" --out "$out/report"
figures=docs/figures/paper/depth-table
rm -rf "$figures" && mkdir -p "$figures"
cp "$out/report/figures/depth_table.png" "$figures/"
python3 - "$out/report/summary.csv" > "$figures/depth_table.md" <<'PYEOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| scheme | layers | outcome | best valid nll | test BLEU (beam 5) |")
print("|---|---|---|---:|---:|")
for r in rows:
    print(f"| {r['scheme']} | {r['depth']} | {r['status_text']} | {r['best_valid_nll'] or '–'} | {r['test_bleu'] or '–'} |")
PYEOF
cat "$figures/depth_table.md"
report_wall "$start" "depth table"
