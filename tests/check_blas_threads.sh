#!/usr/bin/env bash
# env.json's blas.threads is what OpenBLAS's GEMMs may take in the run: with Debian's OpenMP
# OpenBLAS, run.threads (it read openblas_get_num_threads, which says the pool's size until the
# first GEMM: 2 for every run.threads = 1 run of a sweep on 2 cores).
# usage: check_blas_threads.sh NORMLAB_EXE WORK_DIR
set -u
exe=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
status=0
for threads in 1 2 3; do
  cat >"$work/t$threads.toml" <<TOML
[model]
arch = "encdec"
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 1
dec_layers = 1
[scheme]
name = "post-ln"
[data]
task = "reverse"
synthetic_vocab = 12
synthetic_train = 40
synthetic_valid = 8
[optim]
max_tokens = 128
max_updates = 2
[eval]
interval = 1000
bleu = false
[run]
out_dir = "$work/run$threads"
threads = $threads
checkpoint_interval = 1000
TOML
  "$exe" train "$work/t$threads.toml" >"$work/out$threads" 2>&1 || { echo "FAIL: train with run.threads = $threads"; cat "$work/out$threads"; exit 1; }
  got=$(python3 -c 'import json, sys; b = json.load(open(sys.argv[1]))["blas"]; print(b["parallel"], b["threads"])' "$work/run$threads/env.json")
  case "$got" in
    "openmp $threads") echo "ok: run.threads = $threads: env.json blas: $got" ;;
    openmp*) echo "FAIL: run.threads = $threads: env.json blas: $got"; status=1 ;;
    *) echo "SKIP: OpenBLAS here is not the OpenMP build ($got)"; exit 0 ;;
  esac
done
# normlab bench --threads: 0 (the default) or more; a negative count was taken as 0.
"$exe" bench --threads -3 --enc-layers 1 --dec-layers 1 --steps 1 --warmup 0 >"$work/neg" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "^--threads: expected a number of 0 or more, got '-3'" "$work/neg"; then
  echo "ok: bench --threads -3 refused"
else
  echo "FAIL: bench --threads -3: exit $rc, $(head -2 "$work/neg")"; status=1
fi
"$exe" bench --threads 1 --enc-layers 1 --dec-layers 1 --vocab 64 --batch 2 --length 4 --steps 1 --warmup 0 >"$work/one" 2>&1
if grep -q '"threads":1' "$work/one" && grep -q '"blas_threads":1' "$work/one"; then
  echo "ok: bench --threads 1 runs with 1 thread, BLAS too"
else
  echo "FAIL: bench --threads 1: $(grep -o '"[a-z_]*threads":[0-9]*' "$work/one" | tr '\n' ' ')"; status=1
fi
[ $status = 0 ] && echo "blas threads OK"
exit $status
