#!/usr/bin/env bash
# GPU check (ctest label `gpu`): `normlab train` with run.cuda_graph = true against the same run
# without, on the quickstart (translation: its batch shapes vary, padded to buckets), BranchNorm
# (α rising) and a llama language model (one shape, with dropout), the analysis probes on some
# updates: the losses agree within float noise, the log says how many updates the graphs made, and
# both runs' ms/update are printed.
# Prints "SKIP: ..." where no CUDA device is usable.
#   cuda_graph.sh NORMLAB SOURCE_DIR WORK_DIR
set -euo pipefail
normlab=$1 src=$2 work=$3
# shellcheck source=tests/gpu/common.sh
source "$(dirname "$(readlink -f "$0")")/common.sh"

ms() { python3 -c 'import json,statistics,sys
r = [j for j in map(json.loads, open(sys.argv[1])) if j["kind"] == "train"][1:]
print("%.1f" % statistics.median(j["ms_per_update"] for j in r))' "$1"; }
compare() { python3 - "$1" "$2" "$3" <<'EOF'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
assert [x[0] for x in a] == [x[0] for x in b], "updates differ"
d = max(abs(float(x[1]) - float(y[1])) / max(abs(float(x[1])), 1e-12) for x, y in zip(a, b))
print(f"max relative loss difference {d:.3g} over {len(a)} updates")
sys.exit(0 if d <= float(sys.argv[3]) else 1)
EOF
}

fails=0
run_pair() {  # name tolerance manifest args…
  local name=$1 tol=$2 manifest=$3
  shift 3
  "$normlab" train "$manifest" "$@" --set "run.out_dir=\"$work/$name-eager\"" >"$name-eager.log" 2>&1 || {
    echo "FAIL: $name without graphs"; tail -n 20 "$name-eager.log"; fails=$((fails + 1)); return; }
  "$normlab" train "$manifest" "$@" --set run.cuda_graph=true --set "run.out_dir=\"$work/$name-graph\"" \
    >"$name-graph.log" 2>&1 || {
    echo "FAIL: $name with run.cuda_graph"; tail -n 20 "$name-graph.log"; fails=$((fails + 1)); return; }
  if ! grep -q "^cuda graph: update recorded as a CUDA graph" "$name-graph.log" ||
     ! made=$(grep -o "^cuda graph: [0-9]* updates made by the graph path.*" "$name-graph.log"); then
    echo "FAIL: $name: no update was recorded as a CUDA graph"; grep "cuda graph" "$name-graph.log"
    fails=$((fails + 1)); return
  fi
  if result=$(compare <(losses "$work/$name-eager/train.jsonl") <(losses "$work/$name-graph/train.jsonl") "$tol"); then
    echo "ok: $name: $result; ${made#cuda graph: }; ms/update $(ms "$work/$name-eager/train.jsonl") eager," \
         "$(ms "$work/$name-graph/train.jsonl") with graphs"
  else
    echo "FAIL: $name: $result"; fails=$((fails + 1))
  fi
}

short=(--set 'run.device="cuda"' --set optim.max_updates=60 --set run.log_interval=1
       --set run.checkpoint_interval=1000 --set eval.interval=30 --set eval.bleu=false
       --set eval.test_beam=0)
# Translation, fp32, no dropout: the graphs' batches are padded to buckets (other shapes, so other
# rounding, and with dropout other masks); the probes watch updates 1-5 and every 20th, which stay
# eager.
run_pair quickstart 1e-3 "$src/experiments/quickstart.toml" "${short[@]}" \
  --set 'analysis.probes=["grad_norm","update_norm"]' --set analysis.dense_until=5 --set analysis.interval=20
# A llama language model in bf16 with dropout: its blocks keep their shape (not padded), so the
# masks are the eager run's; every update from the graph after its warm-ups.
cat >lm.toml <<'EOF'
[model]
arch = "lm"
family = "llama"
d_model = 256
heads = 4
kv_heads = 2
dec_layers = 24
ffn_dim = 688
[scheme]
name = "pre-ln"
[data]
task = "synthetic-lm"
lm_block = 128
synthetic_vocab = 500
synthetic_train = 2000
[optim]
lr = 1e-3
warmup_updates = 10
clip_norm = 1.0
max_tokens = 2048
[run]
dtype = "bf16"
EOF
run_pair llama-lm256-24L 2e-2 lm.toml "${short[@]}" --set model.dropout=0.1
# BranchNorm: α rises over the first 30 updates (a value the graph reads from the device; kept at
# its recorded value, the losses would part by far more than the tolerance).
run_pair branchnorm 1e-3 "$src/experiments/quickstart.toml" "${short[@]}" --set 'scheme.name="branchnorm"' \
  --set scheme.T=30

[ $fails -eq 0 ] && echo "cuda graph OK" || { echo "$fails failure(s)"; exit 1; }
