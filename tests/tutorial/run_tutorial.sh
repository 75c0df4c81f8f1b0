#!/usr/bin/env bash
# "Write your own scheme in 10 minutes" (docs/writing-a-scheme.md), run exactly as written: installs
# this build into a temporary prefix, takes the sh block between <!-- tutorial:begin --> and
# <!-- tutorial:end --> out of docs/writing-a-scheme.md and runs it with bash -euo pipefail, PREFIX, WORK and
# REZERO_SOURCE set and PREFIX/bin first on PATH; then checks what it produced.
# Usage: run_tutorial.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 source=$2 work=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work/scratch"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"

. "$(dirname "$0")/readme_block.sh"
readme_block tutorial "$source/docs/writing-a-scheme.md" "$work/tutorial.sh"

start=$SECONDS
if ! env PREFIX="$work/prefix" WORK="$work/scratch" REZERO_SOURCE="$source/plugins/rezero/rezero.cpp" \
      PATH="$work/prefix/bin:$PATH" NORMLAB_PLUGIN_PATH= \
      bash -euo pipefail "$work/tutorial.sh" > "$work/tutorial.log" 2>&1; then
  tail -n 60 "$work/tutorial.log" >&2
  fail "the tutorial block of docs/writing-a-scheme.md failed (full log: $work/tutorial.log)"
fi
echo "tutorial block ran in $((SECONDS - start)) s"
log=$work/tutorial.log

# plugins list shows the user's plugin from its build folder.
grep -Eq "my-rezero +1\.0\.0 +[0-9]+ +$work/scratch/my-rezero/build/normlab_my_rezero\.so" "$log" ||
  fail "normlab plugins list did not list my-rezero from the tutorial's build folder"

# Every run of the sweep completed, as --status reports.
sweep=$work/scratch/sweeps/rezero-vs-deepnorm
status=$(cd "$work/scratch" && "$work/prefix/bin/normlab" sweep rezero-vs-deepnorm.toml --status)
echo "$status"
for id in my-rezero_L2-2 my-rezero_L6-6 deepnorm_L2-2 deepnorm_L6-6; do
  grep -Eq "^ *[0-9]+ +$id +completed" <<< "$status" || fail "sweep --status: run $id did not complete"
done

# The report: printed last, and a summary.csv of 4 completed runs, both schemes.
report=$(grep '^report: ' "$log" | tail -n 1 | sed 's/^report: //')
[ -n "$report" ] && (cd "$work/scratch" && [ -f "$report" ]) || fail "normlab report printed no report path"
csv=$sweep/report/summary.csv
[ -f "$csv" ] || fail "no $csv"
[ "$(tail -n +2 "$csv" | grep -c .)" = 4 ] || fail "summary.csv does not have 4 rows:
$(cat "$csv")"
[ "$(tail -n +2 "$csv" | grep -c ',completed,')" = 4 ] || fail "summary.csv: not every run completed:
$(cat "$csv")"
[ "$(tail -n +2 "$csv" | grep -c ',my-rezero,')" = 2 ] && [ "$(tail -n +2 "$csv" | grep -c ',deepnorm,')" = 2 ] ||
  fail "summary.csv: not 2 runs of each scheme:
$(cat "$csv")"

# ReZero's gates g are recorded by the scheme_state probe, in every layer, for both my-rezero runs.
for id in my-rezero_L2-2 my-rezero_L6-6; do
  a=$sweep/$id/analysis.csv
  [ -f "$a" ] || fail "no $a"
  grep -q ',scheme_state,encoder,[0-9]*,self_attn_gate,' "$a" && grep -q ',scheme_state,decoder,[0-9]*,cross_attn_gate,' "$a" ||
    fail "$a: no scheme_state rows for ReZero's gates"
done
if grep -q '_gate,' "$sweep/deepnorm_L2-2/analysis.csv"; then fail "deepnorm's analysis.csv has gate rows"; fi
echo "tutorial OK: plugin built, listed, swept against deepnorm, reported at $report"
