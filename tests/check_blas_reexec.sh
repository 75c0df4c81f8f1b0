#!/usr/bin/env bash
# normlab re-executes itself (~0.4 s) to choose OpenBLAS's kernels only for the verbs that multiply
# matrices: `normlab bench` does once, `normlab manifest` and `normlab plot` (file tools, run
# hundreds of times by scripts and tests) never do, nor does a busy machine's OpenMP wait policy. Counted with strace's execve trace; the
# preferred core type is forced to differ from OpenBLAS's own choice so that a re-exec is due.
# usage: check_blas_reexec.sh NORMLAB_EXE WORK_DIR
set -u
exe=$1 work=$2
command -v strace >/dev/null || { echo "SKIP: strace is not installed (scripts/normlab.sh test installs it)"; exit 0; }
rm -rf "$work" && mkdir -p "$work/run"
unset OPENBLAS_CORETYPE NORMLAB_OPENBLAS_CORETYPE_CHOSEN NORMLAB_BLAS_AUTO
status=0
real=$(readlink -f "$exe")
reexecs() {  # verb args...: how many times the traced process executed normlab again
  strace -f -qq -e trace=execve -o "$work/trace" "$exe" "$@" >"$work/out" 2>&1
  # After the first execve (the start), one of /proc/self/exe or normlab's own path (what
  # runtime_env's self_command_prefix resolves it to) is a re-exec.
  grep 'execve(' "$work/trace" | tail -n +2 | grep -cF -e 'execve("/proc/self/exe"' -e "execve(\"$real\""
}
# A core type this OpenBLAS did not pick (Haswell, or Zen where it picked Haswell).
core=$(NORMLAB_BLAS_AUTO=0 "$exe" bench --enc-layers 1 --dec-layers 1 --vocab 64 --batch 2 --length 4 \
  --warmup 0 --steps 1 2>/dev/null | grep -o '"blas_core":"[^"]*"' | cut -d'"' -f4)
want=Haswell; [ "${core,,}" = haswell ] && want=Zen
export NORMLAB_OPENBLAS_CORETYPE_PREFERRED=$want
check() {  # expected-count what verb args...
  local want_n=$1 what=$2; shift 2
  local n; n=$(reexecs "$@")
  if [ "$n" = "$want_n" ]; then echo "ok: $what: $n re-exec"; else
    echo "FAIL: $what: $n re-execs, expected $want_n"; cat "$work/out"; status=1; fi
}
check 1 "bench (OpenBLAS picked '$core', preferred $want)" bench --enc-layers 1 --dec-layers 1 \
  --vocab 64 --batch 2 --length 4 --warmup 0 --steps 1
check 0 "manifest" manifest
# A busy machine's OMP_WAIT_POLICY=PASSIVE is chosen by the executable before it loads LibTorch (and
# libgomp, which reads it then): no re-exec (each cost ~0.5 s of CPU), and libgomp's spin count is
# PASSIVE's 0 (libgomp's own report, OMP_DISPLAY_ENV=verbose; its default spins 300000 times).
n=$(NORMLAB_BLAS_AUTO=0 NORMLAB_OMP_LOAD=5 OMP_DISPLAY_ENV=verbose reexecs bench --enc-layers 1 \
  --dec-layers 1 --vocab 64 --batch 2 --length 4 --warmup 0 --steps 1)
if [ "$n" = 0 ] && grep -q "GOMP_SPINCOUNT = '0'" "$work/out"; then
  echo "ok: bench on a busy machine: $n re-exec, libgomp waits passively"
else
  echo "FAIL: bench on a busy machine: $n re-execs (expected 0), libgomp's spin count: $(grep GOMP_SPINCOUNT "$work/out")"
  status=1
fi
printf '{"kind":"train","update":1,"loss":1.0}\n' >"$work/run/train.jsonl"
check 0 "plot" plot "$work/run" --out "$work/plots"
[ $status = 0 ] && echo "blas re-exec OK"
exit $status
