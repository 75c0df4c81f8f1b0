#!/usr/bin/env bash
# The Slurm job arrays of `normlab sweep --slurm`, tested on a real Slurm: a private one-node
# cluster (munged, slurmctld, slurmd from Debian's munge and slurm-wlm) on this machine, in a
# temporary directory with its own config, key, ports, state and spool; everything is stopped and
# removed on exit.
#
#   slurm_localhost_test.sh fake  SCRIPT_TOOL
#       The generated script with a stand-in `normlab run-one` (a shell script that trains until
#       SIGTERM, then "checkpoints" and exits 130; run again, it resumes and completes). Checks the
#       whole path on real daemons: job array over the given indices only, USR1 from Slurm's
#       --signal before the time limit (and one sent by hand with scancel --batch), SIGTERM passed to
#       the run, scontrol requeue, the requeued task resuming and completing, the log of both
#       attempts, run.threads, overrides with spaces and quotes, a sweep directory with a space.
#   slurm_localhost_test.sh sweep NORMLAB SOURCE_DIR
#       The real thing, once `normlab sweep` exists: the quickstart sweep submitted with --slurm,
#       then `normlab sweep --status` must report every run completed.
#
# Needs root (slurmd runs jobs as their user). When the cluster cannot start here (not root,
# packages missing, a daemon dies, the node is not idle within 60 s) it prints
# "SKIP: slurm could not start on this machine: <reason>" and exits 0 (ctest: skipped). Every wait
# has a timeout; the test fails rather than hangs.
set -uo pipefail

MODE=${1:-}
START_S=$SECONDS
log() { printf '[slurm-test %3ds] %s\n' "$((SECONDS - START_S))" "$*"; }
SWEEP_LOGS=
fail() {
  log "FAIL: $*"
  local f
  for f in ${SWEEP_LOGS:+"$SWEEP_LOGS"/*.out}; do
    [ -f "$f" ] && { echo "---- $f"; cat "$f"; }
  done
  exit 1
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/normlab-slurm.XXXXXX") || fail "mktemp"
CLUSTER=$TMP/cluster
mkdir -p "$CLUSTER"/{munge,state,spool,log}
PIDS_MUNGED= PID_CTLD= PID_SLURMD=
export SLURM_CONF=$CLUSTER/slurm.conf

dump_logs() {
  for f in "$CLUSTER"/log/*; do
    [ -s "$f" ] || continue
    echo "---- $(basename "$f") (last 15 lines)"
    tail -n 15 "$f"
  done
}

# Stops what this script started, by process id, and removes the directory.
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$PID_CTLD" ] && kill -0 "$PID_CTLD" 2>/dev/null; then
    timeout 10 scancel --quiet --user=root >/dev/null 2>&1
    # Let slurmd's step daemons end their jobs (KillWait=2) before slurmd goes.
    local deadline=$((SECONDS + 15))
    while [ $SECONDS -lt $deadline ] && [ -n "$(timeout 5 squeue -h -t running,completing 2>/dev/null)" ]; do
      sleep 0.5
    done
  fi
  # Anything a step left behind: the job's processes, as slurmd reports them.
  if [ -n "$PID_SLURMD" ] && kill -0 "$PID_SLURMD" 2>/dev/null; then
    for p in $(timeout 5 scontrol listpids 2>/dev/null | awk 'NR>1 && $1 ~ /^[0-9]+$/ {print $1}'); do
      kill -KILL "$p" 2>/dev/null
    done
  fi
  for p in $PID_SLURMD $PID_CTLD $PIDS_MUNGED; do kill -TERM "$p" 2>/dev/null; done
  for p in $PID_SLURMD $PID_CTLD $PIDS_MUNGED; do
    local t=0
    while kill -0 "$p" 2>/dev/null && [ $t -lt 20 ]; do
      sleep 0.25
      t=$((t + 1))
    done
    kill -KILL "$p" 2>/dev/null
  done
  if [ "${KEEP_TMP:-0}" = 1 ]; then
    log "kept $TMP"
  else
    rm -rf "$TMP"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

skip() {
  log "cluster logs:"
  dump_logs
  echo "SKIP: slurm could not start on this machine: $*"
  exit 0
}

# ---------------------------------------------------------------- the one-node cluster
start_cluster() {
  [ "$(id -u)" -eq 0 ] || skip "needs root (slurmd starts jobs as their user); running as $(id -un)"
  local b
  for b in munged munge slurmctld slurmd sbatch squeue sinfo scontrol scancel; do
    command -v "$b" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$b" >/dev/null 2>&1 ||
      skip "no '$b' (Debian packages slurm-wlm and munge)"
  done
  export PATH=$PATH:/usr/sbin:/sbin

  # munged with its own key and socket; the system one if ours cannot start.
  local sock=$CLUSTER/munge/munge.sock
  dd if=/dev/urandom of="$CLUSTER/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$CLUSTER/munge/munge.key"
  chmod 755 "$CLUSTER/munge"
  munged -F --force --key-file="$CLUSTER/munge/munge.key" --socket="$sock" \
    --pid-file="$CLUSTER/munge/munged.pid" --seed-file="$CLUSTER/munge/munged.seed" \
    --log-file="$CLUSTER/log/munged.log" >"$CLUSTER/log/munged.out" 2>&1 &
  PIDS_MUNGED=$!
  local deadline=$((SECONDS + 15))
  until timeout 5 munge -n -S "$sock" 2>/dev/null | timeout 5 unmunge -S "$sock" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 "$PIDS_MUNGED" 2>/dev/null; then
      kill "$PIDS_MUNGED" 2>/dev/null
      PIDS_MUNGED=
      sock=/run/munge/munge.socket.2
      if timeout 5 munge -n -S "$sock" 2>/dev/null | timeout 5 unmunge -S "$sock" >/dev/null 2>&1; then
        log "own munged did not start; using the system munged ($sock)"
        break
      fi
      skip "munged did not start (and no working system munged)"
    fi
    sleep 0.5
  done

  local node conf cpus mem ports
  node=$(hostname -s)
  conf=$(timeout 20 slurmd -C 2>/dev/null | head -n 1)
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$conf")
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$conf")
  [ -n "$cpus" ] && [ -n "$mem" ] || skip "slurmd -C gave no CPUs/RealMemory: '$conf'"
  # Two free TCP ports, so a system Slurm (6817/6818) or another test run is not disturbed.
  ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])' 2>/dev/null) || ports="$((20000 + RANDOM % 20000)) $((40000 + RANDOM % 20000))"
  read -r CTLD_PORT SLURMD_PORT <<<"$ports"
  NODE=$node
  NODE_CPUS=$cpus
  : >"$CLUSTER/plugstack.conf"
  cat >"$SLURM_CONF" <<EOF
ClusterName=normlabtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$CLUSTER/state
SlurmdSpoolDir=$CLUSTER/spool
SlurmctldPidFile=$CLUSTER/slurmctld.pid
SlurmdPidFile=$CLUSTER/slurmd.pid
SlurmctldLogFile=$CLUSTER/log/slurmctld.log
SlurmdLogFile=$CLUSTER/log/slurmd.log
PlugStackConfig=$CLUSTER/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=2
MinJobAge=600
SchedulerParameters=sched_interval=2
GresTypes=gpu
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:1 State=UNKNOWN
PartitionName=normlab Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

  # One stand-in "GPU" (/dev/null as its device file), so --gres=gpu:1 can be scheduled.
  echo "NodeName=$node Name=gpu File=/dev/null" >"$CLUSTER/gres.conf"

  slurmctld -D -c -i -f "$SLURM_CONF" >"$CLUSTER/log/slurmctld.out" 2>&1 &
  PID_CTLD=$!
  slurmd -D -f "$SLURM_CONF" -N "$node" >"$CLUSTER/log/slurmd.out" 2>&1 &
  PID_SLURMD=$!
  deadline=$((SECONDS + 60))
  while :; do
    kill -0 "$PID_CTLD" 2>/dev/null || skip "slurmctld exited"
    kill -0 "$PID_SLURMD" 2>/dev/null || skip "slurmd exited"
    local state
    state=$(timeout 5 sinfo -h -n "$node" -o '%t' 2>/dev/null | head -n 1)
    [ "$state" = idle ] && break
    [ $SECONDS -ge $deadline ] && skip "node '$node' not idle after 60 s (state '${state:-none}')"
    sleep 0.5
  done
  log "cluster up: slurmctld :$CTLD_PORT, slurmd :$SLURMD_PORT, node $node ($cpus CPUs), $(sinfo -V)"
}

# ---------------------------------------------------------------- helpers for the checks
# The field of `scontrol show job` (e.g. JobState) of one array task.
job_field() {
  timeout 10 scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# Waits until `cond` succeeds, at most $1 seconds; else fails with $2.
wait_for() {
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    [ $SECONDS -ge $deadline ] && {
      dump_logs
      fail "timed out after ${limit}s waiting for: $what"
    }
    sleep 1
  done
}

# A requeued task waits out Slurm's requeue delay (BeginTime = requeue + 2 min); the test has no
# such patience: once the task is pending again it is made eligible now. Succeeds when the run's
# second attempt has started (the stand-in counts its attempts in <run dir>/attempts).
released_again() {
  local task=$1 run_dir=$2
  [ "$(cat "$run_dir/attempts" 2>/dev/null)" = 2 ] && return 0
  release_requeued "$task" || true
  return 1
}

# Once the requeued task has been PENDING for 4 s, makes it eligible now (see released_again).
release_requeued() {
  local task=$1 restarts state
  restarts=$(job_field "$task" Restarts)
  [ "${restarts:-0}" -ge 1 ] 2>/dev/null || return 1
  state=$(job_field "$task" JobState)
  # Right after the requeue the task may still show COMPLETING/REQUEUED; StartTime needs PENDING.
  # Not at once either: slurmd refuses a relaunch within the second its credential was revoked
  # ("Job credential revoked", the task then fails), which Slurm's own delay avoids.
  [ "$state" = PENDING ] || return 1
  local key=pending_since_${task//[^0-9]/_}
  [ -n "${!key:-}" ] || printf -v "$key" '%s' "$SECONDS"
  [ $((SECONDS - ${!key})) -ge 4 ] && timeout 10 scontrol update JobId="$task" StartTime=now >/dev/null 2>&1
  return 0
}

# ---------------------------------------------------------------- fake: the script on real Slurm
run_fake() {
  local tool=$1
  [ -x "$tool" ] || fail "no script tool '$tool'"
  start_cluster
  local sweep="$TMP/sweep dir"   # a space: the script must quote it
  SWEEP_LOGS=$sweep/slurm
  local fake="$TMP/bin dir/normlab"
  mkdir -p "$sweep" "$(dirname "$fake")"
  # A stand-in for `normlab run-one M --index I --set ...`: trains (sleeps) until SIGTERM, then
  # "checkpoints" and exits 130; with a checkpoint it resumes and completes at once.
  cat >"$fake" <<'EOF'
#!/bin/bash
[ "$1" = run-one ] || { echo "fake normlab: expected run-one, got $1" >&2; exit 2; }
manifest=$2; shift 2
index= out= sets=()
while [ $# -gt 0 ]; do
  case $1 in
    --index) index=$2; shift 2 ;;
    --set) sets+=("$2"); case $2 in run.out_dir=*) out=${2#run.out_dir=} ;; esac; shift 2 ;;
    *) echo "fake normlab: unknown argument $1" >&2; exit 2 ;;
  esac
done
dir="$out/run-$index"
mkdir -p "$dir"
sleeper=
on_term() {
  [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null
  echo "update 17" >"$dir/checkpoint"
  echo '{"status":"interrupted"}' >"$dir/status.json"
  echo "fake normlab: SIGTERM: saved, exit 130"
  exit 130
}
trap on_term TERM
attempt=$(( $(cat "$dir/attempts" 2>/dev/null || echo 0) + 1 ))
echo $attempt >"$dir/attempts"
echo $$ >"$dir/pid"
{ echo "manifest=$manifest"; printf 'set=%s\n' "${sets[@]}"; echo "gpus=${SLURM_JOB_GPUS:-}"; } >"$dir/args.$attempt"
if [ -f "$dir/checkpoint" ]; then
  echo "fake normlab: run $index resumes from $(cat "$dir/checkpoint")"
  sleep 1
  echo '{"status":"completed"}' >"$dir/status.json"
  exit 0
fi
echo '{"status":"running"}' >"$dir/status.json"
echo "fake normlab: run $index training (attempt $attempt)"
sleep 600 &
sleeper=$!
wait $sleeper
echo "fake normlab: never signalled" >&2
exit 1
EOF
  chmod +x "$fake"

  # Runs 0 and 2 of a 3-run sweep (run 1 counts as done): run 0 gets USR1 by hand right away,
  # run 2 from Slurm's --signal (2 min limit, 90 s lead: USR1 within the first minute).
  local out
  out=$(timeout 60 "$tool" --exe "$fake" --manifest "$TMP/sweep.toml" --sweep-dir "$sweep" \
    --indices 2,0 --time 00:02:00 --signal-lead 90 --cpus 1 --max-parallel 2 \
    --set "run.out_dir=$sweep" --set "data.note=it's \"quoted\" & spaced") ||
    fail "submission failed: $out"
  local job
  job=$(head -n 1 <<<"$out")
  log "submitted job array $job"
  sed 's/^/    /' <<<"$out"
  local script
  script=$(ls "$sweep"/slurm/sweep-*.sbatch 2>/dev/null | head -n 1)
  [ -f "$script" ] || fail "no script in $sweep/slurm"
  grep -q '^#SBATCH --array=0,2%2$' "$script" || fail "array line: $(grep array "$script")"

  wait_for 60 "run 0 training" test -f "$sweep/run-0/args.1"
  log "run 0 started; sending USR1 to its batch shell (as --signal would)"
  timeout 10 scancel --batch --signal=USR1 "${job}_0" || fail "scancel --signal USR1"
  wait_for 30 "run 0 requeued and started again" released_again "${job}_0" "$sweep/run-0"
  log "run 0 requeued and started again (Restarts=$(job_field "${job}_0" Restarts))"
  wait_for 100 "run 2 signalled by Slurm's --signal, requeued, started again" released_again "${job}_2" "$sweep/run-2"
  log "run 2 got USR1 from --signal, was requeued and started again"

  done_run() { grep -q completed "$sweep/run-$1/status.json" 2>/dev/null &&
    [ "$(job_field "${job}_$1" JobState)" = COMPLETED ]; }
  wait_for 60 "run 0 completed" done_run 0
  wait_for 60 "run 2 completed" done_run 2
  log "both runs completed after a requeue"

  local i
  for i in 0 2; do
    local d="$sweep/run-$i" lg="$sweep/slurm/${job}_$i.out"
    [ "$(cat "$d/attempts")" = 2 ] || fail "run $i: $(cat "$d/attempts") attempts, expected 2"
    grep -q 'update 17' "$d/checkpoint" || fail "run $i: no checkpoint from SIGTERM"
    [ -f "$lg" ] || fail "no log $lg"
    grep -q 'SIGTERM: saved, exit 130' "$lg" || fail "run $i log: no SIGTERM in the trainer"
    grep -q "requeueing ${job}_$i" "$lg" || fail "run $i log: no requeue"
    grep -q 'resumes from update 17' "$lg" || fail "run $i log: second attempt did not resume"
    grep -q 'attempt 2' "$lg" || fail "run $i log: not appended across attempts"
    grep -qx "set=run.threads=1" "$d/args.2" || fail "run $i: no run.threads=1: $(cat "$d/args.2")"
    grep -qxF "set=data.note=it's \"quoted\" & spaced" "$d/args.1" ||
      fail "run $i: override mangled: $(cat "$d/args.1")"
    grep -qxF "set=run.out_dir=$sweep" "$d/args.1" || fail "run $i: out_dir mangled"
  done
  [ ! -e "$sweep/run-1" ] || fail "run 1 was not submitted but ran"
  log "log of run 0:"
  sed 's/^/    /' "$sweep/slurm/${job}_0.out"

  # scancel (SIGTERM, no USR1): the run saves and stops, and is not requeued. With a (count-only)
  # stand-in GPU: --gres=gpu:1 is scheduled and the run gets run.device="cuda".
  out=$(timeout 60 "$tool" --exe "$fake" --manifest "$TMP/sweep.toml" --sweep-dir "$sweep" \
    --indices 1 --time 00:10:00 --cpus 1 --gpus 1 --set "run.out_dir=$sweep") || fail "submission: $out"
  job=$(head -n 1 <<<"$out")
  wait_for 60 "run 1 training" test -f "$sweep/run-1/args.1"
  timeout 10 scancel "${job}_1" || fail "scancel"
  is_state() { [ "$(job_field "$1" JobState)" = "$2" ]; }
  wait_for 30 "run 1 cancelled" is_state "${job}_1" CANCELLED
  sleep 2
  grep -q interrupted "$sweep/run-1/status.json" || fail "run 1: not interrupted: $(cat "$sweep/run-1/status.json")"
  [ "$(job_field "${job}_1" Restarts)" = 0 ] || fail "run 1 was requeued after scancel"
  grep -qxF 'set=run.device="cuda"' "$sweep/run-1/args.1" || fail "run 1: no run.device=\"cuda\""
  grep -qx 'gpus=[0-9,]*[0-9]' "$sweep/run-1/args.1" || fail "run 1: no GPU allocated: $(grep gpus= "$sweep/run-1/args.1")"
  grep -qx 'gpus=' "$sweep/run-0/args.1" || fail "run 0 got a GPU without asking"
  log "scancel: run 1 (with a GPU: $(grep gpus= "$sweep/run-1/args.1")) saved and stopped, not requeued"
}

# ---------------------------------------------------------------- sweep: normlab itself
# Ready for when `normlab sweep` is merged (tests/CMakeLists.txt has the entry, commented out).
run_sweep() {
  local normlab=$1 src=$2
  [ -x "$normlab" ] || fail "no normlab '$normlab'"
  start_cluster
  local sweep="$TMP/quickstart sweep"
  SWEEP_LOGS=$sweep/slurm
  local manifest="$src/experiments/quickstart-sweep.toml"
  [ -f "$manifest" ] || fail "no $manifest"
  local out
  out=$(timeout 120 "$normlab" sweep "$manifest" --slurm --time 00:10:00 --cpus-per-run 1 \
    --set "run.out_dir=$sweep" --set optim.max_updates=20 2>&1) || fail "normlab sweep --slurm: $out"
  sed 's/^/    /' <<<"$out"
  all_done() {
    local q
    q=$(timeout 5 squeue -h 2>/dev/null) || return 1
    [ -z "$q" ]
  }
  wait_for 480 "every array task finished" all_done
  out=$(timeout 60 "$normlab" sweep "$manifest" --status --set "run.out_dir=$sweep" \
    --set optim.max_updates=20 2>&1)
  sed 's/^/    /' <<<"$out"
  # "sweep NAME in DIR: N runs (from ...)" ... "N completed | 0 diverged | ..."
  local total completed
  total=$(sed -n 's/^sweep .*: \([0-9][0-9]*\) runs (from .*/\1/p' <<<"$out" | head -n 1)
  completed=$(sed -n 's/^\([0-9][0-9]*\) completed |.*/\1/p' <<<"$out" | tail -n 1)
  [ -n "$total" ] && [ "$total" -gt 0 ] || fail "no run count in --status"
  [ "$completed" = "$total" ] || fail "$completed of $total runs completed"
  for f in "$sweep"/slurm/*.out; do
    grep -q 'run-one exited with 0' "$f" || fail "$(basename "$f"): run-one did not exit 0"
  done
  run_data_parallel "$normlab" "$src"
}

# One run as a data-parallel job: --ntasks-per-run 2 (an srun of 2 Gloo ranks); USR1 by hand while
# it trains: both ranks save and stop, the task is requeued and the job resumes and completes.
# 150 updates (was 300; ~0.3-0.7 s each here): USR1 once update 50 is logged, after the periodic
# checkpoint at 30 (a resume from it rather than from the stop would log 40 and 50 twice), about 90
# updates left to resume with, and a validation (eval.interval 100) after the resume as before.
run_data_parallel() {
  local normlab=$1 src=$2
  local sweep="$TMP/dp sweep" manifest="$TMP/dp.toml"
  SWEEP_LOGS=$sweep/slurm
  sed -e 's/^max_updates = .*/max_updates = 150/' "$src/experiments/quickstart.toml" >"$manifest"
  printf '\n[sweep]\n[[sweep.axis]]\nkey = "scheme.name"\nvalues = ["pre-ln"]\n' >>"$manifest"
  local out
  out=$(timeout 120 "$normlab" sweep "$manifest" --slurm --time 00:10:00 --cpus-per-run 1 --ntasks-per-run 2 \
    --set "run.out_dir=$sweep" --set run.checkpoint_interval=30 --set run.log_interval=10 \
    --set eval.interval=100 2>&1) ||
    fail "normlab sweep --slurm --ntasks-per-run 2: $out"
  local job
  job=$(sed -n 's/^job: *\([0-9][0-9]*\).*/\1/p' <<<"$out" | head -n 1)
  [ -n "$job" ] || fail "no job id in: $out"
  local script
  script=$(ls "$sweep"/slurm/sweep-*.sbatch | head -n 1)
  grep -q '^#SBATCH --ntasks=2$' "$script" || fail "no --ntasks=2 in $script"
  local run_dir="$sweep/run"  # the sweep's one run (its id: "run")
  trained() { [ "$(grep -cs '"kind":"train"' "$run_dir/train.jsonl")" -ge 5 ] 2>/dev/null; }
  wait_for 120 "the 2-rank run training" trained
  timeout 10 scancel --batch --signal=USR1 "${job}_0" || fail "scancel --signal USR1"
  finished() {
    grep -q '"completed"' "$run_dir/status.json" 2>/dev/null &&
      [ "$(job_field "${job}_0" JobState)" = COMPLETED ] && return 0
    release_requeued "${job}_0" || true
    return 1
  }
  wait_for 400 "the 2-rank run requeued, resumed and completed" finished
  local lg="$sweep/slurm/${job}_0.out"
  grep -q 'normlab-slurm: 2 ranks on' "$lg" || fail "no 2-rank srun in $lg"
  grep -q "requeueing ${job}_0" "$lg" || fail "not requeued: $(tail -n 20 "$lg")"
  grep -q 'resuming .* at update' "$lg" || fail "second attempt did not resume"
  grep -q '"world_size": 2' "$run_dir/env.json" || fail "env.json: not a 2-rank job"
  python3 - "$run_dir/train.jsonl" <<'PY' || fail "train.jsonl: updates lost or logged twice"
import json, sys
u = [r["update"] for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "train"]
sys.exit(0 if u == list(range(10, 151, 10)) else 1)
PY
  log "2-rank run: USR1, requeued, resumed, completed; every update logged once"
}

case $MODE in
  fake) run_fake "${2:?script tool}" ;;
  sweep) run_sweep "${2:?normlab}" "${3:?source dir}" ;;
  *)
    echo "usage: $0 fake SCRIPT_TOOL | sweep NORMLAB SOURCE_DIR" >&2
    exit 2
    ;;
esac
log "PASS in $((SECONDS - START_S)) s"
