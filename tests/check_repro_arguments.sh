#!/usr/bin/env bash
# A reproduction script given an argument it does not know stops before training (hostile review:
# wortsman-qknorm.sh --help started its 25-minute sweep). usage: check_repro_arguments.sh NORMLAB
set -u
cd "$(dirname "$0")/.."
export NORMLAB=$1 NORMLAB_REPRO_DIR=$(mktemp -d)
trap 'rm -rf "$NORMLAB_REPRO_DIR"' EXIT
help=$(bash scripts/reproduce/wortsman-qknorm.sh --help) || { echo "FAIL --help: exit $?"; exit 1; }
grep -q NORMLAB_REPRO_JOBS <<<"$help" || { echo "FAIL --help printed: $help"; exit 1; }
for arg in --bogus --dryrun extra; do
  out=$(bash scripts/reproduce/wortsman-qknorm.sh "$arg" 2>&1)
  rc=$?
  [ $rc -eq 2 ] && grep -q "unknown argument '$arg'" <<<"$out" || { echo "FAIL $arg: exit $rc: $out"; exit 1; }
  [ -z "$(ls -A "$NORMLAB_REPRO_DIR")" ] || { echo "FAIL $arg: it wrote $NORMLAB_REPRO_DIR"; exit 1; }
done
echo "repro arguments OK"
