#!/bin/bash
# `normlab plot`, `report` and `data` run in the normlab executable without loading LibTorch
# (runner/main.cpp: LibTorch's start-up is ~1 s of CPU per process with Debian's build); a verb that
# needs LibTorch loads it (the control, so that the check can fail). `data tokenize` trains a
# SentencePiece model there too: its module (libnormlab_spm.so) is found from the executable, in the
# build tree and in an installed prefix (the build tree moved out of the way by its own path).
# usage: check_light_verbs.sh NORMLAB BUILD_DIR CMAKE_COMMAND WORKDIR
set -u
nl=$1 build=$2 cmake=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
cd "$work" || exit 1
fail=0

# The libraries a command loads, from the dynamic loader's own log (linked and dlopen()ed alike).
loaded() { LD_DEBUG=files "$@" 2>&1 >/dev/null | grep -o 'file=[^ ]*' | sort -u; }

check_light() {
  local libs
  libs=$(loaded "$@")
  if printf '%s\n' "$libs" | grep -q libtorch; then
    echo "FAIL: '$*' loads LibTorch: $(printf '%s\n' "$libs" | grep libtorch | head -1)"
    fail=1
  else
    echo "ok: '$*' runs without LibTorch"
  fi
}

for i in $(seq 1 400); do echo "the quick brown fox $i jumps over the lazy dog number $((i % 7))"; done >corpus.txt
check_light "$nl" data list
check_light "$nl" data path multi30k
check_light "$nl" plot --help
check_light "$nl" report --help
check_light "$nl" data tokenize corpus.txt --out shards --vocab-size 100 --cache-dir cache
[ -f shards/shards.json ] || { echo "FAIL: data tokenize wrote no shards/shards.json"; ls -R shards; fail=1; }
# The verb is found behind global options, one value per --plugin-path (main.cpp routes before
# CLI11 parses): repeated, the flag keeps plot torch-free; two values for one flag are refused, one
# line and exit 2 (they once made main.cpp take the second path for the verb).
check_light "$nl" --plugin-path "$work/p1" --plugin-path="$work/p2" plot --help
"$nl" --plugin-path "$work/p1" "$work/p2" plot "$work" --out "$work/plots" >two.out 2>two.err
rc=$?
if [ "$rc" = 2 ] && grep -q "not expected: $work/p2" two.err && [ ! -e "$work/plots" ]; then
  echo "ok: two values for one --plugin-path: exit 2, $(head -1 two.err)"
else
  echo "FAIL: --plugin-path A B plot: exit $rc, $(head -2 two.err), plots written: $([ -e "$work/plots" ] && echo yes || echo no)"
  fail=1
fi
for verb in "plugins list" "plot $work"; do  # an empty --plugin-path= never swallows the verb
  # shellcheck disable=SC2086
  "$nl" --plugin-path= $verb >empty.out 2>empty.err
  rc=$?
  if [ "$rc" = 2 ] && grep -q "^normlab: error: --plugin-path= names no folder or file" empty.err; then
    echo "ok: --plugin-path= $verb: exit 2, $(head -1 empty.err)"
  else
    echo "FAIL: --plugin-path= $verb: exit $rc, $(head -2 empty.err)"
    fail=1
  fi
done
if loaded "$nl" plugins list | grep -q libtorch; then
  echo "ok: 'normlab plugins list' loads LibTorch (the control)"
else
  echo "FAIL: 'normlab plugins list' loads no LibTorch: this check sees nothing"
  fail=1
fi

# Installed: the executable finds libnormlab_spm.so in PREFIX/lib, not in the build tree.
prefix=$work/prefix
"$cmake" --install "$build" --prefix "$prefix" >install.log 2>&1 || { echo "FAIL: cmake --install"; cat install.log; exit 1; }
spm=$(loaded "$prefix/bin/normlab" data tokenize corpus.txt --out shards2 --vocab-size 100 --cache-dir cache2 |
  grep libnormlab_spm)
case "$spm" in
  "file=$prefix/"*) echo "ok: the installed normlab loads ${spm#file=}" ;;
  *) echo "FAIL: the installed normlab's data tokenize loaded '$spm', not PREFIX's libnormlab_spm.so"; fail=1 ;;
esac
[ -f shards2/shards.json ] ||
  { echo "FAIL: the installed normlab wrote no shards2/shards.json"; fail=1; }

[ "$fail" -eq 0 ] && echo "light verbs OK"
exit "$fail"
