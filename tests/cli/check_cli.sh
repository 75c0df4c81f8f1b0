#!/bin/bash
# CLI conventions through the real binary: check_cli.sh NORMLAB SOURCE_DIR WORK_DIR CASE
#   usage       usage errors exit 2 (not CLI11's 105/106/109), --help exits 0
#   version     --version: normlab version, git commit, LibTorch version, CUDA yes/no, SDK ABI
#   device      a bad or unusable device is one error line and exit 2, for smoke and train
#   train_dir   `normlab train DIR` is an error naming DIR, and starts nothing
#   status_json `sweep --status --json` of a sweep not yet run: every run pending, valid JSON
#   sweep_pipe  `normlab sweep … | head -n 1`: the driver survives the closed pipe, every run completes
#   long_line   `normlab train` on an LM corpus with a 6 KB line, each SentencePiece model type
#               (SentencePiece's warning about it used to segfault the process)
set -u
normlab=$1 src=$2 work=$3 case=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_error CODE REGEX -- ARGS...: exit CODE, stderr exactly one line matching REGEX.
expect_error() {
  local code=$1 regex=$2; shift 3
  "$normlab" "$@" >out.txt 2>err.txt
  local rc=$?
  [ "$rc" = "$code" ] || fail "normlab $*: exit $rc, expected $code ($(head -c 300 err.txt))"
  local lines; lines=$(wc -l <err.txt)
  [ "$lines" = 1 ] || fail "normlab $*: $lines stderr lines, expected 1: $(head -c 600 err.txt)"
  grep -Eq -- "$regex" err.txt || fail "normlab $*: stderr '$(head -c 300 err.txt)' does not match '$regex'"
}

quick_sets=(--set "run.out_dir=\"$work/sw\"" --set optim.max_updates=20 --set eval.interval=10
            --set data.synthetic_train=300 --set data.synthetic_valid=20)
sweep_manifest=$src/experiments/quickstart-sweep.toml

case $case in
usage)
  for args in "train" "no-such-command" "train a.toml --no-such-flag" "sweep x.toml --json" \
              "plugins show deepnorm --param no_equals_sign" "smoke --enc-layers 0"; do
    # shellcheck disable=SC2086
    "$normlab" $args >/dev/null 2>&1
    rc=$?
    [ "$rc" = 2 ] || fail "normlab $args: exit $rc, expected 2"
  done
  "$normlab" --help >/dev/null 2>&1 || fail "normlab --help: exit $?"
  "$normlab" train --help >/dev/null 2>&1 || fail "normlab train --help: exit $?"
  ;;
version)
  "$normlab" --version >out.txt 2>err.txt || fail "normlab --version: exit $?"
  grep -Eq '^normlab [0-9]+\.[0-9]+\.[0-9]+$' out.txt || fail "no 'normlab X.Y.Z' line"
  grep -Eq '^git ([0-9a-f]{12}(-dirty)?|unknown)$' out.txt || fail "no 'git <commit>' line"
  grep -Eq '^LibTorch [0-9]+\.[0-9]+' out.txt || fail "no 'LibTorch X.Y' line"
  grep -Eq '^CUDA (yes|no)( |$)' out.txt || fail "no 'CUDA yes/no' line"
  grep -Eq '^SDK ABI [0-9]+$' out.txt || fail "no 'SDK ABI N' line"
  if head=$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null); then
    grep -q "^git $head" out.txt || fail "git line is not HEAD $head: $(grep '^git' out.txt)"
  fi
  ;;
device)
  expect_error 2 '^normlab: error: --device "cuda:99": ' -- smoke --scheme post-ln --device cuda:99
  expect_error 2 '^normlab: error: --device expected cpu, cuda or cuda:N, got "gpu"' -- smoke --device gpu
  if grep -q '^CUDA no' <("$normlab" --version); then
    expect_error 2 '^normlab: error: --device "cuda": ' -- smoke --scheme post-ln --device cuda
  fi
  expect_error 2 '^normlab: error: .*quickstart.toml: \[run\] device: "cuda:99": ' -- \
    train "$src/experiments/quickstart.toml" --set "run.out_dir=\"$work/run\"" --set run.device=cuda:99
  ;;
train_dir)
  mkdir -p "$work/some dir"
  expect_error 2 "^normlab: error: $work/some dir: is a directory, expected a manifest file \(\.toml\)$" -- \
    train "$work/some dir"
  expect_error 2 "^normlab: error: $work/some dir: is a directory" -- sweep "$work/some dir"
  [ ! -e "$work/runs" ] || fail "train DIR created $work/runs"
  ;;
status_json)
  "$normlab" sweep "$sweep_manifest" "${quick_sets[@]}" --status --json >status.json 2>err.txt ||
    fail "--status --json: exit $? ($(cat err.txt))"
  python3 - status.json <<'PY' || fail "status.json: $(head -c 400 status.json)"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["sweep"] == "quickstart-sweep", j["sweep"]
assert [r["index"] for r in j["runs"]] == [0, 1, 2, 3], j["runs"]
assert all(r["status"] == "pending" and r["updates"] == 0 and r["best_valid_nll"] is None and r["pid"] is None
           for r in j["runs"]), j["runs"]
assert j["counts"]["pending"] == 4 and j["counts"]["completed"] == 0, j["counts"]
PY
  ;;
sweep_pipe)
  "$normlab" sweep "$sweep_manifest" "${quick_sets[@]}" --jobs 2 2>err.txt | head -n 1 >head.txt
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || fail "sweep | head -n 1: the driver exited $rc ($(head -c 300 err.txt))"
  grep -q '^\[sweep\] ' head.txt || fail "head got '$(cat head.txt)'"
  "$normlab" sweep "$sweep_manifest" "${quick_sets[@]}" --status --json >status.json || fail "--status --json: exit $?"
  python3 - status.json <<'PY' || fail "not every run completed: $(head -c 1500 status.json)"
import json, sys
j = json.load(open(sys.argv[1]))
assert len(j["runs"]) == 4 and all(r["status"] == "completed" and r["updates"] == 20 for r in j["runs"]), j["runs"]
assert j["counts"]["completed"] == 4, j["counts"]
PY
  ;;
long_line)
  python3 - <<'PY'
words = [w + str(i) for w in "the man runs over a red ball near house with small dog".split() for i in range(5)]
lines = [" ".join(words[(i * 7 + k) % len(words)] for k in range(3 + i % 8)) + "." for i in range(300)]
lines.insert(100, " ".join(words[k % len(words)] for k in range(1500)))  # about 6 KB
open("text.txt", "w").write("\n".join(lines) + "\n")
PY
  for type in unigram bpe char word; do
    cat >"lm-$type.toml" <<TOML
[model]
arch = "lm"
d_model = 16
ffn_dim = 32
heads = 2
dec_layers = 1
[data]
task = "lm"
train = "text.txt"
lm_block = 16
cache_dir = "cache"
[data.tokenizer]
model_type = "$type"
vocab_size = 40
[optim]
max_updates = 2
max_tokens = 256
[eval]
bleu = false
[run]
out_dir = "run-$type"
TOML
    "$normlab" train "lm-$type.toml" >"train-$type.txt" 2>&1
    rc=$?
    [ "$rc" = 0 ] || fail "train with a 6 KB line, $type: exit $rc: $(tail -c 400 "train-$type.txt")"
  done
  ;;
*)
  fail "unknown case $case"
  ;;
esac
[ "$fails" = 0 ] && echo "cli $case OK"
exit $((fails > 0))
