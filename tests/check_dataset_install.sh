#!/usr/bin/env bash
# `scripts/normlab.sh data multi30k DIR` in a scratch copy of the scripts: the verified corpus lands
# in data/multi30k; a corrupted or incomplete source is one error (exit 2) and leaves nothing.
#   check_dataset_install.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
corpus=$src/../shared/data/multi30k
[ -f "$corpus/train.en" ] || { echo "SKIP: $corpus is absent"; exit 0; }
rm -rf "$work" && mkdir -p "$work/checkout" && cp -r "$src/scripts" "$work/checkout/"
cd "$work/checkout"
bash scripts/normlab.sh data multi30k "$corpus"
for f in train.en train.de val.en val.de test_2016_flickr.en test_2016_flickr.de; do
  cmp -s "$corpus/$f" "data/multi30k/$f" || { echo "FAIL: data/multi30k/$f differs"; exit 1; }
done
cp -r "$corpus" "$work/bad" && chmod -R u+w "$work/bad" && echo extra >>"$work/bad/val.en"
rm -rf data
rc=0; bash scripts/normlab.sh data multi30k "$work/bad" 2>err.txt || rc=$?
[ $rc -eq 2 ] && grep -q "SHA-256 mismatch" err.txt || { echo "FAIL: corrupted source: exit $rc, $(cat err.txt)"; exit 1; }
[ -z "$(ls -A data)" ] || { echo "FAIL: left behind: $(ls -A data)"; exit 1; }
rm "$work/bad/train.de"
rc=0; NORMLAB_DATA_MIRROR=$work bash scripts/normlab.sh data multi30k "$work/bad" 2>err.txt || rc=$?
[ $rc -eq 2 ] && grep -q "train.de: no such file" err.txt || { echo "FAIL: incomplete source: exit $rc"; exit 1; }
echo "dataset install OK"
