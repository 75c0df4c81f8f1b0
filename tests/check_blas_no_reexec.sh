#!/usr/bin/env bash
# normlab chooses OpenBLAS's kernels (OPENBLAS_CORETYPE) and a busy machine's OpenMP wait policy
# before it loads LibTorch, so neither costs a re-execution (~0.4 s of CPU each: LibTorch's start-up
# again): `normlab bench` with a preferred core type that differs from OpenBLAS's own choice runs
# those kernels without starting again; `manifest` and `plot` (file tools, run hundreds of times by
# scripts and tests) never start again either; a user's OPENBLAS_CORETYPE and NORMLAB_BLAS_AUTO=0
# are kept. Re-executions counted with strace's execve trace.
# NORMLAB_BLAS_AUTO and NORMLAB_OMP_AUTO other than 0 or 1 are refused (exit 2).
# usage: check_blas_no_reexec.sh NORMLAB_EXE WORK_DIR
set -u
exe=$1 work=$2
rm -rf "$work" && mkdir -p "$work/run"
unset OPENBLAS_CORETYPE NORMLAB_OPENBLAS_CORETYPE_CHOSEN NORMLAB_BLAS_AUTO NORMLAB_OPENBLAS_CORETYPE_PREFERRED
status=0
# The switches take 0 or 1: another value (false, no, an empty one) is a usage error naming the
# variable, for a verb that computes; a file verb or --help is not concerned.
for var in NORMLAB_BLAS_AUTO NORMLAB_OMP_AUTO; do
  for bad in false no "" 2; do
    env "$var=$bad" "$exe" bench --enc-layers 1 --dec-layers 1 --vocab 64 --batch 2 --length 4 \
      --warmup 0 --steps 1 >"$work/out" 2>&1
    rc=$?
    if [ $rc = 2 ] && grep -q "^normlab: error: $var: expected 0 (off) or 1 (on, the default), got '$bad'" "$work/out"; then
      echo "ok: $var='$bad': exit 2, $(head -1 "$work/out")"
    else
      echo "FAIL: $var='$bad': exit $rc, $(head -2 "$work/out")"; status=1
    fi
  done
  env "$var=false" "$exe" --help >/dev/null 2>&1 || { echo "FAIL: $var=false broke --help"; status=1; }
done
[ $status = 0 ] || exit 1
command -v strace >/dev/null || { echo "SKIP: strace is not installed (scripts/normlab.sh test installs it)"; exit 0; }
real=$(readlink -f "$exe")
bench=(bench --enc-layers 1 --dec-layers 1 --vocab 64 --batch 2 --length 4 --warmup 0 --steps 1)
reexecs() {  # verb args...: how many times the traced process executed normlab again
  strace -f -qq -e trace=execve -o "$work/trace" "$exe" "$@" >"$work/out" 2>&1
  # After the first execve (the start), one of /proc/self/exe or normlab's own path (what
  # runtime_env's self_command_prefix resolves it to) is a re-exec.
  grep 'execve(' "$work/trace" | tail -n +2 | grep -cF -e 'execve("/proc/self/exe"' -e "execve(\"$real\""
}
field() { grep -o "\"$1\":\"[^\"]*\"" "$work/out" | head -n 1 | cut -d'"' -f4; }
# OpenBLAS's own choice, and a core type it did not pick (Haswell, or Zen where it picked Haswell).
NORMLAB_BLAS_AUTO=0 "$exe" "${bench[@]}" >"$work/out" 2>/dev/null
core=$(field blas_core)
if [ -z "$core" ]; then echo "SKIP: this BLAS is not OpenBLAS (no core types)"; exit 0; fi
if [ -n "$(field coretype_env)" ]; then
  echo "FAIL: NORMLAB_BLAS_AUTO=0 still set OPENBLAS_CORETYPE=$(field coretype_env)"; status=1
fi
want=Haswell; [ "${core,,}" = haswell ] && want=Zen
check() {  # expected-count what verb args...
  local want_n=$1 what=$2; shift 2
  local n; n=$(reexecs "$@")
  if [ "$n" = "$want_n" ]; then echo "ok: $what: $n re-exec"; else
    echo "FAIL: $what: $n re-execs, expected $want_n"; cat "$work/out"; status=1; fi
}
NORMLAB_OPENBLAS_CORETYPE_PREFERRED=$want check 0 "bench (OpenBLAS picks '$core', preferred $want)" "${bench[@]}"
if [ "$(field blas_core)" = "$want" ] && [ "$(field coretype_chosen_by)" = normlab ]; then
  echo "ok: bench ran OpenBLAS's $want kernels, chosen by normlab before OpenBLAS loaded"
else
  echo "FAIL: bench ran '$(field blas_core)' (chosen by '$(field coretype_chosen_by)'), expected $want by normlab"
  status=1
fi
# A user's choice stays, whatever normlab prefers.
OPENBLAS_CORETYPE=$core NORMLAB_OPENBLAS_CORETYPE_PREFERRED=$want check 0 "bench with OPENBLAS_CORETYPE=$core" "${bench[@]}"
if [ "$(field blas_core)" = "$core" ] && [ "$(field coretype_chosen_by)" = user ]; then
  echo "ok: the user's OPENBLAS_CORETYPE=$core kept"
else
  echo "FAIL: OPENBLAS_CORETYPE=$core gave '$(field blas_core)' (chosen by '$(field coretype_chosen_by)')"
  status=1
fi
check 0 "manifest" manifest
# A busy machine's OMP_WAIT_POLICY=PASSIVE: libgomp's spin count is PASSIVE's 0 (libgomp's own
# report, OMP_DISPLAY_ENV=verbose; its default spins 300000 times), with no re-exec either.
n=$(NORMLAB_OMP_LOAD=5 OMP_DISPLAY_ENV=verbose reexecs "${bench[@]}")
if [ "$n" = 0 ] && grep -q "GOMP_SPINCOUNT = '0'" "$work/out"; then
  echo "ok: bench on a busy machine: $n re-exec, libgomp waits passively"
else
  echo "FAIL: bench on a busy machine: $n re-execs (expected 0), libgomp's spin count: $(grep GOMP_SPINCOUNT "$work/out")"
  status=1
fi
printf '{"kind":"train","update":1,"loss":1.0}\n' >"$work/run/train.jsonl"
check 0 "plot" plot "$work/run" --out "$work/plots"
[ $status = 0 ] && echo "blas without re-exec OK"
exit $status
