"""`normlab train` → `normlab eval` / `translate` / `forward` through the CLI on a tiny reverse-task
run, the scores checked with the real sacreBLEU (PyPI) on the written hypotheses.

usage: check_eval_cli.py NORMLAB_EXE PLUGIN_DIR WORK_DIR
Checks: eval's BLEU and chrF (and signatures, apart from the version) equal sacreBLEU's on
RUN/eval/test.*.hyp against RUN/eval/test.ref; the test score taken at the end of training
(train.jsonl "test") equals sacreBLEU's on its hypotheses; translate of test.src reproduces eval's
hypotheses; forward's JSON is consistent; the test score is in `normlab report`'s summary.csv (log-probs normalized, top-k sorted, given tokens scored).
"""
import json
import math
import os
import shutil
import subprocess
import sys

VENV_PYTHON = os.path.expanduser("~/.cache/normlab/venv/bin/python")
try:
    import sacrebleu
except ImportError:
    if os.path.exists(VENV_PYTHON) and not os.environ.get("NORMLAB_EVAL_REEXEC"):
        os.environ["NORMLAB_EVAL_REEXEC"] = "1"
        os.execv(VENV_PYTHON, [VENV_PYTHON, *sys.argv])
    print(f"FAIL: the sacrebleu module is not importable by {sys.executable} "
          f"(install it with {os.path.dirname(VENV_PYTHON)}/pip install sacrebleu)")
    sys.exit(1)

exe, plugin_dir, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
run = os.path.join(work, "run")
manifest = os.path.join(work, "reverse.toml")
with open(manifest, "w") as f:
    f.write(f"""[model]
d_model = 32
ffn_dim = 64
heads = 2
enc_layers = 2
dec_layers = 2
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
task = "reverse"
synthetic_vocab = 12
synthetic_min_len = 3
synthetic_max_len = 10
synthetic_train = 3000
synthetic_valid = 100
[optim]
lr = 3e-3
warmup_updates = 30
label_smoothing = 0.0
max_tokens = 512
max_updates = 120
[eval]
interval = 0
test_beam = 4
[run]
out_dir = "{run}"
log_interval = 1000
checkpoint_interval = 40
checkpoint_keep_last = 3
threads = 1
""")
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += not ok


def normlab(*args, stdin=None):
    p = subprocess.run([exe, *args, "--plugin-path", plugin_dir], capture_output=True, text=True,
                       encoding="utf-8", input=stdin)
    if p.returncode != 0:
        print(f"FAIL: normlab {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        sys.exit(1)
    return p.stdout


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


unversioned = lambda sig: sig.rsplit("|version:", 1)[0]
normlab("train", manifest)
for checkpoint in ["last", "avg:3"]:
    out = json.loads(normlab("eval", run, "--split", "test", "--beam", "5", "--checkpoint", checkpoint, "--json"))
    hyps, refs = lines(out["hypotheses"]), lines(os.path.join(run, "eval", "test.ref"))
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    check(len(hyps) == len(refs) == out["sentences"] == 100, f"[{checkpoint}] {len(hyps)} hypotheses")
    check(out["bleu"]["text"] == f"BLEU|{out['bleu']['signature']}" + str(b)[4:],
          f"[{checkpoint}] BLEU: normlab {out['bleu']['text']} | sacreBLEU {b}")
    check(abs(out["chrf"]["score"] - c.score) < 1e-9, f"[{checkpoint}] chrF: normlab {out['chrf']['score']} | sacreBLEU {c.score}")
    check(unversioned(out["bleu"]["signature"]) == unversioned(bleu.get_signature().format())
          and unversioned(out["chrf"]["signature"]) == unversioned(chrf.get_signature().format()),
          f"[{checkpoint}] signatures {out['bleu']['signature']} / {out['chrf']['signature']}")
    check(out["ppl"] == math.exp(out["nll"]) and out["nll"] > 0, f"[{checkpoint}] test ppl {out['ppl']:.3f}")

# The test score of the end of training, on its own hypotheses.
test = [json.loads(l) for l in lines(os.path.join(run, "train.jsonl")) if '"kind":"test"' in l]
check(len(test) == 1, "one test record in train.jsonl")
final_hyps = lines(os.path.join(run, "eval", "test.final.beam4.hyp"))
check(abs(test[0]["bleu"] - sacrebleu.corpus_bleu(final_hyps, [refs]).score) < 1e-9,
      f"end-of-training test BLEU {test[0]['bleu']:.4f} is sacreBLEU's on test.final.beam4.hyp")

# `eval` decodes as the end of training did (its max_len_a/b default to the run's eval.max_len_a/b):
# two test decodes of one checkpoint agree (issue 27.15).
same = json.loads(normlab("eval", run, "--split", "test", "--beam", "4", "--checkpoint", "last", "--json"))
check(lines(same["hypotheses"]) == final_hyps and abs(same["bleu"]["score"] - test[0]["bleu"]) < 1e-9,
      f"eval --beam 4 of last reproduces the end-of-training test decode (BLEU {same['bleu']['score']:.2f})")

# ... and in `normlab report` (which needs matplotlib in the Python it runs).
rep = subprocess.run([exe, "report", run, "--out", os.path.join(work, "report")], capture_output=True, text=True)
if rep.returncode == 0:
    import csv
    with open(os.path.join(work, "report", "summary.csv"), newline="", encoding="utf-8") as f:
        row = next(csv.DictReader(f))
    check(row["test_bleu"] == f"{test[0]['bleu']:.2f}" and row["test_ppl"] == f"{test[0]['ppl']:.2f}",
          f"report summary.csv: test_bleu {row['test_bleu']}, test_ppl {row['test_ppl']}")
else:
    print(f"note: normlab report did not run here (not checked): {rep.stderr.strip()}")

# eval says how far its decode is (issue 27.15): on stderr, the last line counts every sentence.
p = subprocess.run([exe, "eval", run, "--split", "test", "--beam", "2", "--plugin-path", plugin_dir],
                   capture_output=True, text=True, encoding="utf-8")
n_test = len(lines(os.path.join(run, "eval", "test.ref")))
check(p.returncode == 0 and f"eval: decoded {n_test}/{n_test} test sentences (beam 2)" in p.stderr,
      f"eval shows its progress on stderr ({p.stderr.strip().splitlines()[-1:]})")

# translate: the same sources give eval's hypotheses (last.safetensors, beam 5).
out = json.loads(normlab("eval", run, "--checkpoint", "last", "--json"))
srcs = lines(os.path.join(run, "eval", "test.src"))
translated = normlab("translate", run, "--checkpoint", "last", "--beam", "5",
                     stdin="".join(s + "\n" for s in srcs)).split("\n")[:-1]
check(translated == lines(out["hypotheses"]), f"translate reproduces eval's {len(translated)} hypotheses")

# forward: the given target tokens are scored, log-probs are normalized, top-k is sorted.
inp = os.path.join(work, "forward.txt")
with open(inp, "w") as f:
    f.write(f"{srcs[0]}\t{refs[0]}\n{srcs[1]}\n")
fw = json.loads(normlab("forward", run, "--input", inp, "--json", "--top-k", "3", "--hidden"))
s0, s1 = fw["sentences"]
ok = len(s0["positions"]) == len(refs[0].split()) + 1 and len(s1["positions"]) == 1
for p in s0["positions"] + s1["positions"]:
    tops = [t["logprob"] for t in p["top"]]
    ok &= len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
    if "next" in p:
        ok &= p["next"]["logprob"] <= tops[0] + 1e-12
        # log p = logit - logsumexp(logits): the same offset for every token of the position
        ok &= abs((p["next"]["logit"] - p["next"]["logprob"]) - (p["top"][0]["logit"] - tops[0])) < 1e-9
ok &= len(s0["hidden"]["encoder"]) == 2 and len(s0["hidden"]["decoder"]) == 2
ok &= len(s0["hidden"]["decoder"][0]) == len(s0["positions"]) and len(s0["hidden"]["decoder"][0][0]) == 32
check(ok, f"forward JSON consistent ({len(s0['positions'])} positions, top-3, hidden states of 2+2 layers)")

print(f"sacrebleu {sacrebleu.__version__}: " + ("all agree" if not failures else f"{failures} check(s) FAILED"))
sys.exit(1 if failures else 0)
