#!/usr/bin/env bash
# `normlab sweep --slurm` hands sbatch (and so every task, on other machines) this environment
# without the choices normlab made for the submitting machine: OpenBLAS's core type, a busy
# machine's OMP_WAIT_POLICY=PASSIVE and thread count, and their records. Each task's normlab then
# chooses for its node and env.json says so. A user's settings pass. A fake sbatch (first on PATH)
# records the environment it was started with.
# usage: check_slurm_env.sh NORMLAB REPO_ROOT WORK_DIR
set -u
normlab=$1 repo=$2 work=$3
rm -rf "$work" && mkdir -p "$work/bin"
cat >"$work/bin/sbatch" <<SH
#!/bin/sh
env >"$work/sbatch.env"
echo 4242
SH
chmod +x "$work/bin/sbatch"
status=0
submit() {  # name, then env assignments for normlab
  local name=$1; shift
  rm -f "$work/sbatch.env"
  env -u OPENBLAS_CORETYPE -u NORMLAB_OPENBLAS_CORETYPE_CHOSEN -u OMP_WAIT_POLICY -u NORMLAB_OMP_CHOICE \
    -u NORMLAB_THREADS_CHOICE -u NORMLAB_BLAS_AUTO -u NORMLAB_OMP_AUTO PATH="$work/bin:$PATH" "$@" \
    "$normlab" sweep "$repo/experiments/quickstart-sweep.toml" --slurm \
    --set run.out_dir="\"$work/$name\"" >"$work/$name.out" 2>&1
  if [ ! -f "$work/sbatch.env" ]; then
    echo "FAIL: $name: sbatch was not started"; cat "$work/$name.out"; status=1; return 1
  fi
}
has() { grep -q "^$1=" "$work/sbatch.env"; }
# A busy submitting machine: normlab chooses PASSIVE, a thread count and OpenBLAS's kernels for it.
if submit busy NORMLAB_OMP_LOAD=5 NORMLAB_OPENBLAS_CORETYPE_PREFERRED=Haswell; then
  for v in OPENBLAS_CORETYPE NORMLAB_OPENBLAS_CORETYPE_CHOSEN OMP_WAIT_POLICY NORMLAB_OMP_CHOICE \
           NORMLAB_THREADS_CHOICE; do
    if has "$v"; then echo "FAIL: the job inherits the submitting machine's $(grep "^$v=" "$work/sbatch.env")"; status=1
    else echo "ok: no $v in the job's environment"; fi
  done
fi
# A user's own settings are the user's, on every node.
if submit user OPENBLAS_CORETYPE=Zen OMP_WAIT_POLICY=ACTIVE MY_SETTING=kept; then
  for v in OPENBLAS_CORETYPE=Zen OMP_WAIT_POLICY=ACTIVE MY_SETTING=kept; do
    if grep -qx "$v" "$work/sbatch.env"; then echo "ok: $v passes to the job"
    else echo "FAIL: the user's $v did not reach the job"; status=1; fi
  done
fi
[ $status = 0 ] && echo "slurm environment OK"
exit $status
