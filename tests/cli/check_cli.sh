#!/bin/bash
# CLI conventions through the real binary: check_cli.sh NORMLAB SOURCE_DIR WORK_DIR CASE
#   usage       usage errors exit 2 (not CLI11's 105/106/109), --help exits 0
#   version     --version: normlab version, git commit, LibTorch version, CUDA yes/no, SDK ABI
#   device      a bad or unusable device is one error line and exit 2, for smoke and train
#   train_dir   `normlab train DIR` is an error naming DIR, and starts nothing
#   status_json `sweep --status --json` of a sweep not yet run: every run pending, valid JSON;
#               `--status --watch S` refreshes while runs are pending, ends when all finished
#   sweep_pipe  `normlab sweep … | head -n 1`: the driver survives the closed pipe, every run completes
#   long_line   `normlab train` on an LM corpus with a 6 KB line, each SentencePiece model type
#               (SentencePiece's warning about it used to segfault the process)
#   recipe      `normlab train RUN/manifest.resolved.toml --set run.out_dir=…` from another directory
#               reproduces the run's losses bitwise; env.json's provenance names build and plugins
#   one_voice   a translation run on files named data.*: no doubled "data: data:", every progress
#               line shows update/max and an ETA, epochs in train.jsonl start at 1
# Every case ends with a scan of all it printed (*.txt, *.log) for a doubled prefix "word: word:".
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

# A tiny translation corpus data.src/data.tgt (the target reverses the source) and a manifest
# naming it by relative paths, in the current directory.
make_corpus() {
  python3 - <<'PY'
words = "a man with a red ball runs near the small house and the dog".split()
src = [" ".join(words[(i * 5 + k) % len(words)] for k in range(3 + i % 6)) for i in range(120)]
open("data.src", "w").write("\n".join(src) + "\n")
open("data.tgt", "w").write("\n".join(" ".join(reversed(s.split())) for s in src) + "\n")
PY
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
  # --watch keeps refreshing while runs are pending (stopped by timeout here)
  timeout 8 "$normlab" sweep "$sweep_manifest" "${quick_sets[@]}" --status --watch 0.3 >watch.txt 2>err.txt
  rc=$?
  [ $rc = 124 ] || fail "--status --watch on a pending sweep: exit $rc, expected to run until stopped ($(cat err.txt))"
  [ "$(grep -c '^sweep quickstart-sweep' watch.txt)" -ge 2 ] || fail "--watch printed $(grep -c '^sweep quickstart-sweep' watch.txt) tables: $(head -c 400 watch.txt)"
  "$normlab" sweep "$sweep_manifest" --watch 1 >out.txt 2>err.txt
  rc=$?
  [ $rc = 2 ] && grep -q -- "--watch requires --status" err.txt || fail "--watch without --status: exit $rc, $(head -c 300 err.txt)"
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
  # every run finished: --watch prints the table once and ends
  timeout 20 "$normlab" sweep "$sweep_manifest" "${quick_sets[@]}" --status --watch 5 >watch.txt 2>err.txt
  rc=$?
  [ $rc = 0 ] && [ "$(grep -c '^sweep quickstart-sweep' watch.txt)" = 1 ] ||
    fail "--watch on a finished sweep: exit $rc, $(grep -c '^sweep quickstart-sweep' watch.txt) tables"
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
one_voice)
  make_corpus
  cat >voice.toml <<'TOML'
[model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 1
dec_layers = 1
[data]
task = "translation"
train_src = "data.src"
train_tgt = "data.tgt"
valid_src = "data.src"
valid_tgt = "data.tgt"
cache_dir = "cache"
[data.tokenizer]
vocab_size = 30
[optim]
max_updates = 1000
max_epochs = 2
max_tokens = 300
[eval]
interval = 0
bleu = false
[run]
out_dir = "voice-run"
log_interval = 2
threads = 1
TOML
  "$normlab" train voice.toml >voice.txt 2>&1 || fail "train voice.toml: exit $? ($(tail -c 400 voice.txt))"
  grep -q '^data: data (translation): ' voice.txt || fail "no corpus summary line: $(grep '^data' voice.txt)"
  grep '^train  |' voice.txt >train-lines.txt || fail "no train lines"
  if grep -Ev '\| update +[0-9]+/1000 \| epoch +[12]/2 \|.*\| ETA ([0-9:]+|--:--)$' train-lines.txt >bad.txt; then
    fail "progress lines without update/max, epoch/max or ETA: $(head -c 300 bad.txt)"
  fi
  grep -Eq '^valid  \| update +[0-9]+/1000 \|' voice.txt || fail "valid line without update/max"
  python3 - voice-run/train.jsonl <<'PY' || fail "train.jsonl epochs are not 1-based: $(head -c 300 voice-run/train.jsonl)"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
epochs = [r["epoch"] for r in recs if "epoch" in r]
assert epochs and min(epochs) == 1 and max(epochs) == 2, epochs
assert epochs == sorted(epochs), epochs
PY
  ;;
recipe)
  # The run's manifest.resolved.toml is a recipe: run from another directory (relative paths in
  # the original manifest, default cache folder), it reproduces train.jsonl's losses bitwise.
  mkdir -p first elsewhere && cd first && make_corpus
  cat >m.toml <<'TOML'
[model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 1
dec_layers = 1
dropout = 0.1
[data]
task = "translation"
train_src = "data.src"
train_tgt = "data.tgt"
valid_src = "data.src"
valid_tgt = "data.tgt"
[data.tokenizer]
vocab_size = 30
[optim]
max_updates = 12
max_tokens = 300
[eval]
interval = 6
bleu = false
[run]
out_dir = "runA"
log_interval = 1
threads = 1
TOML
  HOME="$work/home" "$normlab" train m.toml >../first.txt 2>&1 || fail "train m.toml: exit $? ($(tail -c 400 ../first.txt))"
  cd ../elsewhere
  HOME="$work/other-home" "$normlab" train ../first/runA/manifest.resolved.toml --set "run.out_dir=\"$work/elsewhere/runB\"" \
    >../second.txt 2>&1 || fail "train runA/manifest.resolved.toml from elsewhere: exit $? ($(tail -c 400 ../second.txt))"
  cd "$work"
  grep -Eq "^(train_src|out_dir|cache_dir) = '[^/]" first/runA/manifest.resolved.toml &&
    fail "relative paths in the resolved manifest: $(grep -E '_src|_tgt|out_dir|cache_dir' first/runA/manifest.resolved.toml)"
  python3 - first/runA elsewhere/runB <<'PY' || fail "the rerun from the resolved manifest differs"
import hashlib, json, sys
a, b = sys.argv[1], sys.argv[2]
def losses(run):
    records = list(map(json.loads, open(run + "/train.jsonl")))
    return ([(r["kind"], r["update"], r["loss"], r.get("nll")) for r in records if r["kind"] != "summary"],
            [r for r in records if r["kind"] == "summary"])
(la, sa), (lb, sb) = losses(a), losses(b)
assert len(la) == 14 and la == lb, (la[:3], lb[:3])
assert len(sa) == 1 and sa == sb, (sa, sb)  # the run's summary record (issue 67.5's spike scores)
env = json.load(open(a + "/env.json"))
p = env["provenance"]
assert p["normlab"] and p["libtorch"] and p["device"] == "cpu" and p["source_revision"], p
plugins = {x["name"]: x for x in p["plugins"]}
used = plugins["post-ln"]
assert used["version"] and hashlib.sha256(open(used["file"], "rb").read()).hexdigest() == used["sha256"], used
PY
  ;;
*)
  fail "unknown case $case"
  ;;
esac
# One voice: no message repeats its prefix ("data: data: …", "error: error: …").
while IFS= read -r -d '' file; do
  if grep -EHn '(^|[^A-Za-z_])([A-Za-z_]+): \2: ' "$file" >doubled.out; then
    fail "doubled prefix in $(head -c 300 doubled.out)"
  fi
done < <(find "$work" -type f \( -name '*.txt' -o -name '*.log' \) -print0)
[ "$fails" = 0 ] && echo "cli $case OK"
exit $((fails > 0))
