#!/usr/bin/env bash
# Issue 70.1: the AVX2 clones of normlab's elementwise CPU kernels must be vectorized (ymm
# registers): on an AVX2-only CPU the dropout mask loop's clone was scalar and branchy (GCC 12 does
# not vectorize a float select there), 21 % of a d64 50L training step. Reads the disassembly of
# libnormlab (objdump -d -C) and checks each named kernel's AVX2 build (NAME_avx2, model/cpu_isa.h)
# for packed arithmetic on ymm registers (moves and broadcasts alone do not count: the scalar
# build had those too).
# usage: check_avx2_clones.sh LIBNORMLAB FUNCTION...
set -u
lib=$1
shift
[ "$(uname -m)" = x86_64 ] || { echo "SKIP: not x86-64"; exit 0; }
command -v objdump >/dev/null || { echo "SKIP: objdump is not installed"; exit 0; }
dis=$(mktemp)
trap 'rm -f "$dis"' EXIT
objdump -d -C --no-show-raw-insn "$lib" >"$dis"
status=0
for fn in "$@"; do
  # The build's body: from its header line to the next blank line.
  body=$(awk -v fn="::${fn}_avx2(" 'index($0, fn) && />:$/ {on = 1; next} on && /^$/ {exit} on' "$dis")
  if [ -z "$body" ]; then
    echo "FAIL: $fn: no ${fn}_avx2 in $lib"
    status=1
  elif ymm=$(grep -E '%ymm' <<<"$body" | grep -cE $'\tv(p(add|sub|mul|and|or|xor|max|min|cmp|sr|sl)[a-z]*|(add|sub|mul|div|sqrt|max|min|and|andn|or|xor|cmp[a-z]*|blendv)ps|cvt[a-z0-9]*) ') \
    && [ "$ymm" -gt 0 ]; then
    echo "ok: ${fn}_avx2: $ymm packed arithmetic instructions on ymm registers"
  else
    echo "FAIL: ${fn}_avx2 does no packed arithmetic on ymm registers (scalar)"
    status=1
  fi
done
[ $status = 0 ] && echo "avx2 clones vectorized: OK"
exit $status
