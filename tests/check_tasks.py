#!/usr/bin/env python3
"""Downstream tasks (issue 58): `normlab eval RUN --tasks` against an independent implementation of
lm-evaluation-harness's scoring, written here from the harness's code (lm_eval/models/huggingface.py
_encode_pair and _loglikelihood_tokens; lm_eval/api/task.py process_results: acc, acc_norm by the
choice's length in characters; lambada: greedy match) over the run's export read by
python/normlab_torch.py: every item's log-likelihood within 1e-4, acc and acc_norm exactly, zero- and
3-shot (the few-shot examples drawn as the harness's sampler draws them), on a HellaSwag-style, an
ARC-style, a LAMBADA-style and a Winogrande-style (partial scoring) file; a 31 kB line cut to the
harness's window of max_length tokens, in bounded memory (issue 66.10). Then bad task files: one line
naming the file, line and field, exit 2 (--shots on pre-tokenized items, two files of one name, JSON
nested 200,000 deep: issue 66.4, 66.5, 66.13), and eval.tasks that would fail stopping a run before its
first update (66.12).

usage: check_tasks.py NORMLAB PLUGIN_DIR REPO WORK_DIR
"""
import json
import math
import os
import random
import shutil
import sys

normlab, plugins, repo, work = sys.argv[1:5]
sys.path.insert(0, os.path.join(repo, "python"))
try:
    import torch  # noqa: F401
    import sentencepiece  # noqa: F401
except ImportError as e:
    print("SKIP: %s (python3-torch and python3-sentencepiece)" % e)
    sys.exit(0)
import normlab_torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_checks  # noqa: E402
from cli_checks import check, one_error  # noqa: E402

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def run(*args):
    p = cli_checks.run(normlab, *args)
    p.stdout, p.stderr = p.out, p.err
    return p


# A small text language model (words of a toy grammar, so it learns something in seconds).
rnd = random.Random(58)
nouns = ["cat", "dog", "bird", "king", "queen", "horse", "river", "tree", "house", "ship"]
verbs = ["sees", "likes", "finds", "follows", "hears", "keeps"]
adjs = ["red", "old", "small", "quiet", "bright", "café"]
lines = [f"the {rnd.choice(adjs)} {rnd.choice(nouns)} {rnd.choice(verbs)} the {rnd.choice(nouns)}."
         for _ in range(6000)]
corpus = os.path.join(work, "corpus.txt")
open(corpus, "w", encoding="utf-8").write("\n".join(lines) + "\n")
manifest = os.path.join(work, "lm.toml")
open(manifest, "w").write(f"""[model]
arch = "lm"
family = "llama"
d_model = 32
ffn_dim = 64
heads = 4
kv_heads = 2
dec_layers = 2
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
task = "lm"
train = "{corpus}"
lm_block = 32
cache_dir = "{os.path.join(work, 'cache')}"
[data.tokenizer]
vocab_size = 60
model_type = "bpe"
[optim]
lr = 1e-2
max_tokens = 1024
max_updates = 80
[eval]
interval = 40
[run]
out_dir = "{os.path.join(work, 'run')}"
threads = 1
""")
p = run("train", manifest, "--plugin-path", plugins)
if p.returncode != 0:
    print("FAIL train: " + p.stderr[-500:])
    sys.exit(1)
rundir = os.path.join(work, "run")

# Task files: each line one item; "fewshot": true lines are the pool.
tasks = os.path.join(work, "tasks")
os.makedirs(tasks)


def write(name, items):
    path = os.path.join(tasks, name + ".jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    return path


def sentence():
    return f"the {rnd.choice(adjs)} {rnd.choice(nouns)} {rnd.choice(verbs)} the"


hellaswag = [{"context": sentence(), "choices": [f"{n}." for n in rnd.sample(nouns, 4)], "gold": rnd.randrange(4)}
             for _ in range(24)]
hellaswag[0]["context"] += " "  # trailing space: moved to the continuation, as the harness does
hellaswag += [{"context": sentence(), "choices": [f"{n}." for n in rnd.sample(nouns, 4)], "gold": 1, "fewshot": True}
              for _ in range(6)]
arc = [{"context": f"Question: which word follows '{sentence()}'?\nAnswer:",
        "choices": rnd.sample(nouns + ["bright old café", "x"], 3), "gold": rnd.randrange(3)} for _ in range(20)]
arc += [{"context": f"Question: which word follows '{sentence()}'?\nAnswer:", "choices": ["house", "queen"],
         "gold": 0, "fewshot": True} for _ in range(4)]
# LAMBADA as the harness has it: the continuation carries its space and is scored as given; the
# default target delimiter " " joins only the few-shot examples (two spaces).
lambada = [{"context": sentence(), "continuation": " " + rnd.choice(nouns) + "."} for _ in range(20)]
lambada += [{"context": sentence(), "continuation": " dog.", "fewshot": True} for _ in range(4)]
# Winogrande-style partial scoring: each context (the blank filled with an option), one continuation.
winogrande = []
for k in range(16):
    a, b = rnd.sample(nouns, 2)
    winogrande.append({"contexts": [f"the {rnd.choice(adjs)} {a}", f"the {rnd.choice(adjs)} {b}"],
                       "continuation": f"{rnd.choice(verbs)} the {rnd.choice(nouns)}.", "gold": k % 2,
                       "fewshot": k < 4})
files = {"hellaswag": write("hellaswag", hellaswag), "arc": write("arc", arc), "lambada": write("lambada", lambada),
         "winogrande": write("winogrande", winogrande)}

# The reference: the export read by normlab_torch, the harness's scoring written out here.
export = os.path.join(work, "export")
p = run("export", rundir, "--to", export, "--plugin-path", plugins)
check(p.returncode == 0, f"export ({p.stderr.strip()[-200:]})")
model = normlab_torch.load(export).eval()
toks = normlab_torch.load_tokenizers(export)
enc = toks.tgt.encode
eot = toks.eos_id


def encode_pair(context, continuation):  # lm_eval/api/model.py TemplateLM._encode_pair
    if context == "":
        return [eot], enc(continuation)
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = enc(context + continuation)
    ctx = enc(context)
    return ctx, whole[len(ctx):]


# The harness's max_length: HFLM reads config.json's max_position_embeddings, which
# `normlab export --format hf` writes as max(data.lm_block, 2048) (here lm_block = 32).
MAX_LENGTH = 2048


def loglikelihood(context, continuation, max_length=MAX_LENGTH):  # huggingface.py _loglikelihood_tokens
    ctx, cont = encode_pair(context, continuation)
    # When too long, the harness cuts from the left: (context + continuation)[-(max_length + 1):][:-1].
    inp = torch.tensor([(ctx + cont)[-(max_length + 1):][:-1]], dtype=torch.long)
    with torch.no_grad():
        logits = torch.log_softmax(model.forward_lm(inp).float(), dim=-1)[0]
    logits = logits[inp.shape[1] - len(cont):]
    greedy = bool((logits.argmax(dim=-1) == torch.tensor(cont)).all())
    return float(logits.gather(1, torch.tensor(cont).unsqueeze(1)).sum()), greedy


scored_by_shots = {}  # the default (packed) runs, reused below as the reference of other options
for shots in (0, 3):
    p = run("eval", rundir, "--tasks", ",".join(files.values()), "--shots", str(shots), "--json",
            "--plugin-path", plugins)
    scored_by_shots[shots] = p
    check(p.returncode == 0, f"eval --tasks, {shots}-shot ({p.stderr.strip()[-300:]})")
    if p.returncode:
        continue
    got = json.loads(p.stdout)
    saved = os.path.join(rundir, "eval", "tasks.best.%s%s.json" % ("+".join(sorted(files)),
                                                                   f".{shots}shot" if shots else ""))
    check(os.path.exists(saved) and json.load(open(saved)) == got, f"{shots}-shot: written to {saved}")
    for name, path in files.items():
        items = [json.loads(line) for line in open(path, encoding="utf-8")]
        scored = [it for it in items if not it.get("fewshot")]
        by_line = {i + 1: it for i, it in enumerate(items)}
        pool = [i + 1 for i, it in enumerate(items) if it.get("fewshot")]
        t = got["tasks"][name]
        # The harness's default sampler (lm_eval/api/samplers.py): one random.Random(1234) per task,
        # rnd.sample(pool, shots) for each scored item in order.
        sampler = random.Random(1234)
        drawn = [sampler.sample(pool, shots) if shots else [] for _ in scored]
        check([s["fewshot"] for s in t["item_scores"]] == drawn,
              f"{name} {shots}-shot: the few-shot examples are the harness's draw, item by item")

        def pair(it, c):  # (context, continuation) of choice c, as the harness's doc_to_text/choice
            if "contexts" in it:
                return it["contexts"][c], it["continuation"]
            return it["context"], (it["choices"][c] if "choices" in it else it["continuation"])

        worst, acc, acc_norm, greedy_ok = 0.0, [], [], True
        for it, s in zip(scored, t["item_scores"]):
            prefix = "".join("%s%s%s\n\n" % (pair(by_line[k], by_line[k].get("gold", 0))[0],
                                              by_line[k].get("target_delimiter", " "),
                                              pair(by_line[k], by_line[k].get("gold", 0))[1])
                             for k in s["fewshot"])
            n_choices = len(it["contexts"]) if "contexts" in it else len(it.get("choices", [0]))
            # The harness's loglikelihood output type (a last-word item) scores the target alone.
            delim = "" if "continuation" in it and "contexts" not in it else it.get("target_delimiter", " ")
            ref = [loglikelihood(prefix + pair(it, c)[0], delim + pair(it, c)[1]) for c in range(n_choices)]
            choices = it["contexts"] if "contexts" in it else it.get("choices", [])
            worst = max(worst, max(abs(a - b[0]) for a, b in zip(s["loglikelihood"], ref)))
            greedy_ok &= s["greedy"] == [b[1] for b in ref]
            if choices:
                lls = [r[0] for r in ref]
                acc.append(float(max(range(len(lls)), key=lambda i: (lls[i], -i)) == it["gold"]))
                norm = [lls[i] / len(c) for i, c in enumerate(choices)]
                acc_norm.append(float(max(range(len(norm)), key=lambda i: (norm[i], -i)) == it["gold"]))
            else:
                acc.append(float(ref[0][1]))
        check(worst < 1e-4, f"{name} {shots}-shot: every item's log-likelihoods within 1e-4 of the reference "
                            f"(max |diff| {worst:.2e})")
        check(greedy_ok, f"{name} {shots}-shot: greedy matches as the reference")
        check(t["acc"] == sum(acc) / len(acc), f"{name} {shots}-shot: acc {t['acc']:.4f} exactly the reference's")
        if acc_norm:
            check(t["acc_norm"] == sum(acc_norm) / len(acc_norm),
                  f"{name} {shots}-shot: acc_norm {t['acc_norm']:.4f} exactly the reference's")
        sd = math.sqrt(sum((a - t["acc"]) ** 2 for a in acc) / (len(acc) - 1) / len(acc))
        check(abs(t["acc_stderr"] - sd) < 1e-12, f"{name} {shots}-shot: acc_stderr the sample stderr")
    # --limit: the first N items only.
    if shots == 0:
        p = run("eval", rundir, "--tasks", files["arc"], "--limit", "5", "--json", "--plugin-path", plugins)
        check(p.returncode == 0 and json.loads(p.stdout)["tasks"]["arc"]["items"] == 5, "--limit 5: five items")

# Each context read once with its choices packed after it (the default) against every choice a
# sequence of its own (--separate-choices, as the harness runs them): the same scores.
for shots in (0, 3):
    runs_ = [scored_by_shots[shots], run("eval", rundir, "--tasks", ",".join(files.values()), "--shots", str(shots),
                                         "--json", "--plugin-path", plugins, "--separate-choices")]
    if all(p.returncode == 0 for p in runs_):
        a, b = (json.loads(p.stdout)["tasks"] for p in runs_)
        worst = max(abs(x - y) for n in a for sa, sb in zip(a[n]["item_scores"], b[n]["item_scores"])
                    for x, y in zip(sa["loglikelihood"], sb["loglikelihood"]))
        check(worst < 1e-5 and all(a[n]["acc"] == b[n]["acc"] for n in a),
              f"{shots}-shot: shared contexts score as --separate-choices (max |diff| {worst:.2e})")
    else:
        check(False, f"--separate-choices ({runs_[1].stderr.strip()[-200:]})")

# --nproc 2: the items split across two processes (a gloo group), the same scores as one process.
one = scored_by_shots[3]
two = run("eval", rundir, "--tasks", ",".join(files.values()), "--shots", "3", "--json", "--nproc", "2",
          "--plugin-path", plugins)
if one.returncode == 0 and two.returncode == 0:
    a, b = json.loads(one.stdout)["tasks"], json.loads(two.stdout)["tasks"]
    # Up to float32 rounding: each rank batches other rows, and kernels round by batch shape (1.9e-6 seen).
    worst = max(abs(x - y) for n in a for sa, sb in zip(a[n]["item_scores"], b[n]["item_scores"])
                for x, y in zip(sa["loglikelihood"], sb["loglikelihood"]))
    same = all(sa[k] == sb[k] for n in a for sa, sb in zip(a[n]["item_scores"], b[n]["item_scores"])
               for k in ("fewshot", "greedy", "correct", "correct_norm", "tokens", "line"))
    check(worst < 1e-5 and same and all(a[n]["acc"] == b[n]["acc"] and a[n]["acc_norm"] == b[n]["acc_norm"]
                                        for n in a),
          f"--nproc 2: every item's examples, tokens, greedy matches and correctness those of one process, "
          f"log-likelihoods within 1e-5 (max |diff| {worst:.2e})")
else:
    check(False, f"eval --tasks --nproc 2 ({two.stderr.strip()[-300:]})")
p = run("eval", rundir, "--nproc", "2", "--plugin-path", plugins)
check(one_error(p, 2, "--nproc: with --tasks only"), f"--nproc without --tasks: one line ({p.stderr.strip()})")

# Pre-tokenized items (for models whose tokenizer normlab cannot run): the same scores.
pre = []
for it in [it for it in lambada if not it.get("fewshot")][:5]:
    ctx, cont = encode_pair(it["context"], it["continuation"])
    pre.append({"context_ids": ctx, "continuation_ids": cont, "continuation": it["continuation"]})
p_ids = run("eval", rundir, "--tasks", write("pre", pre), "--json", "--plugin-path", plugins)
p_txt = run("eval", rundir, "--tasks", files["lambada"], "--limit", "5", "--json", "--plugin-path", plugins)
check(p_ids.returncode == 0 and p_txt.returncode == 0 and
      [s["loglikelihood"] for s in json.loads(p_ids.stdout)["tasks"]["pre"]["item_scores"]] ==
      [s["loglikelihood"] for s in json.loads(p_txt.stdout)["tasks"]["lambada"]["item_scores"]],
      f"pre-tokenized ids score as their text ({p_ids.stderr.strip()[-200:]})")

# Issue 66.10: a context longer than max_length is cut from the left as the harness cuts it, said
# per item, and memory stays bounded (a 31 kB line took 2.4 GiB when the whole line was one row).
long_ctx = " ".join(sentence() + " " + rnd.choice(nouns) + "." for _ in range(1000))[:31000]
long_items = [{"context": long_ctx, "choices": [f"{n}." for n in rnd.sample(nouns, 4)], "gold": 0},
              {"context": long_ctx[:15000], "continuation": " dog."},
              {"context": sentence(), "continuation": " cat."}]
n_long = len(encode_pair(long_ctx, " cat.")[0])
p = run("eval", rundir, "--tasks", write("long", long_items), "--json", "--plugin-path", plugins)
check(p.returncode == 0, f"eval --tasks on a 31 kB line ({p.stderr.strip()[-300:]})")
if p.returncode == 0:
    t = json.loads(p.stdout)["tasks"]["long"]
    worst, moved, cut = 0.0, 0.0, []
    for it, s in zip(long_items, t["item_scores"]):
        conts = [" " + c for c in it["choices"]] if "choices" in it else [it["continuation"]]
        ref = [loglikelihood(it["context"], c)[0] for c in conts]
        # 200 more tokens of context would move the scores: the check above can tell the windows apart.
        wider = [loglikelihood(it["context"], c, max_length=MAX_LENGTH + 200)[0] for c in conts]
        worst = max([worst] + [abs(a - b) for a, b in zip(s["loglikelihood"], ref)])
        moved = max([moved] + [abs(a - b) for a, b in zip(ref, wider)])
        cut.append(s.get("truncated"))
    check(worst < 1e-4 and moved > 1e-3,
          f"a {n_long}-token context: log-likelihoods within 1e-4 of the harness's window of {MAX_LENGTH} "
          f"(max |diff| {worst:.2e}; a window of {MAX_LENGTH + 200} would move them {moved:.2e})")
    # The tokens cut from item 0: its longest choice's (context + continuation) beyond max_length + 1.
    over = max(sum(map(len, encode_pair(long_ctx, " " + c))) for c in long_items[0]["choices"]) - (MAX_LENGTH + 1)
    check(t.get("max_length") == MAX_LENGTH and t.get("truncated_items") == 2 and cut[2] == 0 and
          cut[0] == over and cut[1] > 0,
          f"truncation said per item ({cut}) and per task ({t.get('truncated_items')} items, "
          f"max_length {t.get('max_length')})")
    check(p.peak_rss_mb < 1024, f"a 31 kB line scored in {p.peak_rss_mb:.0f} MB (rows of at most {MAX_LENGTH} tokens)")

# Issue 66.4: --shots on pre-tokenized items is refused (they were scored zero-shot, recorded K-shot).
pre_pool = write("pre_pool", [{"context": sentence(), "continuation": " dog.", "fewshot": True}] + pre)
p = run("eval", rundir, "--tasks", pre_pool, "--shots", "1", "--plugin-path", plugins)
check(one_error(p, 2, "--shots 1: " + pre_pool + ":2 is pre-tokenized (context_ids): such items are scored "
                "zero-shot only") and not os.path.exists(os.path.join(rundir, "eval", "tasks.best.pre_pool.1shot.json")),
      f"--shots on pre-tokenized items: refused, nothing written ({p.stderr.strip()[-300:]})")

# Issue 66.5: results are keyed by the file's name: two files of one name are refused.
os.makedirs(os.path.join(tasks, "again"), exist_ok=True)
again = os.path.join(tasks, "again", "arc.jsonl")
shutil.copy(files["arc"], again)
p = run("eval", rundir, "--tasks", files["arc"] + "," + again, "--plugin-path", plugins)
check(one_error(p, 2, f"--tasks: {files['arc']} and {again} are both task 'arc'") and p.stdout == "",
      f"two task files named arc: refused before scoring ({p.stderr.strip()[-300:]})")

# Bad task files: one line naming the file, the line and the field; exit 2.
vocab = json.load(open(os.path.join(export, "config.json")))["tgt_vocab"]
bad_cases = [
    ("missing", '{"choices": ["a", "b"], "gold": 0}', "missing.jsonl:2: context: missing"),
    ("gold", '{"context": "x", "choices": ["a", "b"], "gold": 2}', "gold.jsonl:2: gold: expected an index from 0 to 1"),
    ("empty", '{"context": "x", "choices": [], "gold": 0}', "empty.jsonl:2: choices: expected a non-empty list"),
    ("utf8", b'{"context": "x\xff", "choices": ["a"], "gold": 0}', "utf8.jsonl:2: (line): invalid UTF-8"),
    ("json", '{"context": "x", ', "json.jsonl:2: (line): not JSON"),
    ("ids", '{"context_ids": [1, %d], "continuation_ids": [5], "continuation": " a"}' % vocab,
     "ids.jsonl:2: context_ids: expected token ids from 0 to %d" % (vocab - 1)),
    ("both", '{"context": "x", "choices": ["a"], "gold": 0, "continuation": "b"}', "both.jsonl:2: continuation: expected either"),
    ("blank_context", '{"context": "   ", "choices": ["a", "b"], "gold": 0}',
     "blank_context.jsonl:2: the context of choice 0 encodes to no token"),
    ("partial_gold", '{"contexts": ["a", "b"], "continuation": "c", "gold": 2}',
     "partial_gold.jsonl:2: gold: expected an index from 0 to 1 into contexts"),
    ("partial_cont", '{"contexts": ["a", "b"], "gold": 0}', "partial_cont.jsonl:2: continuation: missing"),
    ("partial_both", '{"contexts": ["a"], "context": "a", "continuation": "c", "gold": 0}',
     "partial_both.jsonl:2: context: expected either"),
    # Hostile review, session 18: a key given twice was taken silently (the last "gold" scored);
    # an empty continuation was "choice 0"; a lone surrogate escape was "not JSON".
    ("twice", '{"context": "x", "choices": ["a", "b"], "gold": 0, "gold": 1}',
     "twice.jsonl:2: gold: given twice in one object"),
    ("twice_nested", '{"context": "x", "choices": ["a", "b"], "gold": 0, "meta": {"k": 1, "k": 2}}',
     "twice_nested.jsonl:2: k: given twice in one object"),
    ("empty_continuation", '{"context": "x", "continuation": ""}',
     "empty_continuation.jsonl:2: the continuation encodes to no token"),
    ("surrogate", '{"context": "x\\ud800", "choices": ["a", "b"], "gold": 0}',
     "surrogate.jsonl:2: (line): a \\u escape of a lone UTF-16 surrogate"),
    # Issue 66.13: 200,000 levels crashed the message's recursive dump (SIGSEGV).
    ("deep", '{"context": "x", "choices": ["a", "b"], "gold": %s}' % ("[" * 200000 + "]" * 200000),
     "deep.jsonl:2: (line): JSON nested deeper than 64 levels"),
    # Issue 69.1: fewshot_exclude lists pool indices, on scored lines.
    ("exclude_type", '{"context": "x", "choices": ["a"], "gold": 0, "fewshot_exclude": 0}',
     "exclude_type.jsonl:2: fewshot_exclude: expected a list of pool indices"),
    ("exclude_index", '{"context": "x", "choices": ["a"], "gold": 0, "fewshot_exclude": [-1]}',
     "exclude_index.jsonl:2: fewshot_exclude: expected pool indices from 0"),
    ("exclude_range", '{"context": "x", "choices": ["a"], "gold": 0, "fewshot_exclude": [0]}',
     "exclude_range.jsonl:2: fewshot_exclude: 0 is not a pool index (0-based; the file has 0 \"fewshot\" lines)"),
    ("exclude_pool", '{"context": "x", "choices": ["a"], "gold": 0, "fewshot": true, "fewshot_exclude": []}',
     "exclude_pool.jsonl:2: fewshot_exclude: only for scored items"),
]
for name, line, needle in bad_cases:
    path = os.path.join(tasks, name + ".jsonl")
    with open(path, "wb") as f:
        f.write(b'{"context": "ok", "choices": ["a", "b"], "gold": 1}\n')
        f.write(line if isinstance(line, bytes) else line.encode())
        f.write(b"\n")
    p = run("eval", rundir, "--tasks", path, "--plugin-path", plugins)
    check(one_error(p, 2, needle),
          f"bad task file '{name}': exit 2, one line with '{needle}' (exit {p.returncode}: {p.stderr.strip()[-200:]})")
p = run("eval", rundir, "--tasks", files["lambada"], "--shots", "9", "--plugin-path", plugins)
check(p.returncode == 2 and "has 4 few-shot items" in p.stderr, f"--shots beyond the pool: refused ({p.stderr.strip()})")
# Issue 69.1: an item with fewshot_exclude draws one more example than --shots (the harness's
# rnd.sample(pool, K + 1)), from the pool less the items it lists when it draws again.
pool4 = [{"context": f"the {n} sees the", "choices": ["cat.", "dog."], "gold": 0, "fewshot": True}
         for n in ("cat", "dog", "bird", "king")]
p = run("eval", rundir, "--tasks", write("exclude_shots", pool4 + [dict(hellaswag[0], fewshot_exclude=[])]),
        "--shots", "4", "--plugin-path", plugins)
check(one_error(p, 2, "has fewshot_exclude, for which the harness draws 4 + 1 examples (then drops the item "
                "itself), but the file has 4 few-shot items"), f"--shots 4 of a pool of 4 with fewshot_exclude: refused "
      f"({p.stderr.strip()[-300:]})")
p = run("eval", rundir, "--tasks", write("exclude_all", pool4 + [dict(hellaswag[0], fewshot_exclude=[0, 1, 2, 3])]),
        "--shots", "1", "--plugin-path", plugins)
check(one_error(p, 2, "exclude_all.jsonl:5: 0 few-shot items are left once fewshot_exclude's are removed"),
      f"fewshot_exclude listing the whole pool: refused ({p.stderr.strip()[-300:]})")
# A message quotes at most a few dozen characters of a value (a line may hold megabytes).
p = run("eval", rundir, "--tasks", write("huge", [{"context": "x", "choices": ["a"], "gold": "z" * 100000}]),
        "--plugin-path", plugins)
check(one_error(p, 2, "huge.jsonl:1: gold: expected an index") and len(p.stderr) < 400,
      f"a 100 kB gold value: its message cut ({len(p.stderr)} bytes)")

# Issue 66.12: what scoring eval.tasks would refuse stops the run before its first update, not at
# its first in-loop evaluation.
bad_loop = os.path.join(work, "bad_loop.toml")
open(bad_loop, "w").write(open(manifest).read().replace(
    f'out_dir = "{os.path.join(work, "run")}"', f'out_dir = "{os.path.join(work, "bad_loop")}"').replace(
    "[eval]\ninterval = 40\n", "[eval]\ninterval = 40\ntasks = [\"tasks/lambada.jsonl\"]\ntasks_shots = 9\n").replace(
    "[run]\n", "[run]\nlog_interval = 1\n"))
p = run("train", bad_loop, "--plugin-path", plugins)
log = os.path.join(work, "bad_loop", "train.jsonl")
trained = [r for r in map(json.loads, open(log)) if r.get("kind") == "train"] if os.path.exists(log) else []
check(p.returncode != 0 and "eval.tasks_shots = 9: " in p.stderr and "has 4 few-shot items" in p.stderr and
      not trained, f"eval.tasks_shots beyond the pool: the run stops before its first update "
                   f"({len(trained)} updates logged; {p.stderr.strip()[-200:]})")

# In the loop (eval.tasks): a sweep of two depths scores two tasks at each validation and at the
# end; a record per task in train.jsonl, apart from the validation's time; the final one equals
# `normlab eval --tasks` on the last checkpoint; plot, report and sweep --status show them.
sweep_manifest = os.path.join(work, "sweep.toml")
text = open(manifest).read().replace(f'out_dir = "{os.path.join(work, "run")}"',
                                     f'out_dir = "{os.path.join(work, "sweep")}"')
# 40 updates, a validation at 20 (the run above: 80 and 40): what is checked is when the tasks are
# scored and that the final scores are eval --tasks', not how much the model learnt.
text = text.replace("max_updates = 80\n", "max_updates = 40\n")
text = text.replace("[eval]\ninterval = 40\n", "[eval]\ninterval = 20\ntasks = [\"tasks/hellaswag.jsonl\", "
                    "\"tasks/winogrande.jsonl\"]\ntasks_limit = 10\nvalid_tokens = 64\n")
text += '[sweep]\nname = "tasks"\n[[sweep.axis]]\nkey = "model.dec_layers"\nvalues = [1, 2]\n'
open(sweep_manifest, "w").write(text)
p = run("sweep", sweep_manifest, "--plugin-path", plugins)
check(p.returncode == 0, f"sweep with eval.tasks ({p.stderr.strip()[-300:]})")
run_dirs = sorted(os.path.join(work, "sweep", d) for d in os.listdir(os.path.join(work, "sweep"))
                  if os.path.exists(os.path.join(work, "sweep", d, "train.jsonl")))
check(len(run_dirs) == 2, f"two runs in the sweep ({run_dirs})")
for rd_ in run_dirs:
    recs = [json.loads(line) for line in open(os.path.join(rd_, "train.jsonl"))]
    task_recs = [r for r in recs if r.get("kind") == "task"]
    check(sorted((r["update"], r["task"]) for r in task_recs) ==
          [(20, "hellaswag"), (20, "winogrande"), (40, "hellaswag"), (40, "winogrande")],
          f"{os.path.basename(rd_)}: a task record per task at updates 20 and 40")
    check(all(r["items"] == 10 and r["seconds"] >= 0 and r["tokens"] > 0 for r in task_recs),
          f"{os.path.basename(rd_)}: each on eval.tasks_limit = 10 items, with its time and the tokens trained on")
    check(all("seconds" in r for r in recs if r.get("kind") == "valid"),
          f"{os.path.basename(rd_)}: each validation record has its own time")
    off = run("eval", rd_, "--checkpoint", "last", "--tasks", files["hellaswag"] + "," + files["winogrande"],
              "--limit", "10", "--json", "--plugin-path", plugins)
    check(off.returncode == 0, f"eval --tasks on the sweep's run ({off.stderr.strip()[-200:]})")
    if off.returncode == 0:
        offline = json.loads(off.stdout)["tasks"]
        final = {r["task"]: r for r in task_recs if r["update"] == 40}
        check(all(final[n][k] == offline[n][k] for n in final for k in ("acc", "acc_norm", "bits_per_byte")),
              f"{os.path.basename(rd_)}: the final in-loop scores equal normlab eval --tasks on the last checkpoint")
p = run("sweep", sweep_manifest, "--status", "--json")
status = json.loads(p.stdout) if p.returncode == 0 else {"runs": []}
averages = [r.get("tasks_average_acc") for r in status["runs"]]
expected = []
for rd_ in sorted(os.path.join(work, "sweep", r["dir"]) for r in status["runs"]):
    final = [json.loads(line) for line in open(os.path.join(rd_, "train.jsonl"))]
    final = [r["acc"] for r in final if r.get("kind") == "task" and r["update"] == 40]
    expected.append(sum(final) / len(final))
check(sorted(a for a in averages if a is not None) == sorted(expected),
      f"sweep --status --json: each run's tasks_average_acc the mean of its final task accs ({averages})")
p = run("sweep", sweep_manifest, "--status")
check(p.returncode == 0 and "tasks acc" in p.out, "sweep --status: a 'tasks acc' column")
p = run("plot", os.path.join(work, "sweep"), "--only", "downstream_tasks", "--out", os.path.join(work, "figures"))
check(p.returncode == 0 and os.path.exists(os.path.join(work, "figures", "downstream_tasks.png")),
      f"plot --only downstream_tasks: downstream_tasks.png ({p.err.strip()[-300:]})")
p = run("report", os.path.join(work, "sweep"), "--out", os.path.join(work, "report"))
report_md = os.path.join(work, "report", "report.md")
md = open(report_md, encoding="utf-8").read() if os.path.exists(report_md) else ""
rows = [ln.split(" | ") for ln in md.split("## Downstream tasks\n", 1)[-1].split("\n## ", 1)[0].splitlines()
        if ln.startswith("| ")]
check(p.returncode == 0 and [r[3] for r in rows[1:4]] == ["hellaswag", "winogrande", "averages"] and
      rows[1][6].startswith("acc ") and "acc_norm" in rows[1][6] and rows[2][6].startswith("acc ") and
      "mean acc " in rows[3][6],
      f"report: a Downstream tasks table, a row per task (the harness's metrics first) and the averages "
      f"({p.err.strip()[-300:]}; {rows[:4]})")
# Issue 68.6: the offline calls above (several tasks, one task with --limit 5) each kept their file,
# and the report lists them
calls = {ln.split(" | ")[1] for ln in md.split("## Downstream tasks scored by normlab eval --tasks", 1)[-1]
         .split("\n## ", 1)[0].splitlines() if ln.startswith("| ") and "---" not in ln}
check({"tasks.last.hellaswag+winogrande.limit10.json"} <= calls,
      f"report: every eval --tasks file of the sweep's runs listed ({sorted(calls)})")

# Issue 59.7: eval says what share of the held-out split it scored (eval.valid_tokens = 64: two
# blocks of 32), and --all-tokens scores every block.
part = run("eval", run_dirs[0], "--split", "valid", "--json", "--plugin-path", plugins)
whole = run("eval", run_dirs[0], "--split", "valid", "--json", "--all-tokens", "--plugin-path", plugins)
if part.returncode == 0 and whole.returncode == 0:
    a, b = json.loads(part.stdout), json.loads(whole.stdout)
    check(a["blocks"] == 2 and a["available_blocks"] > 2 and b["blocks"] == b["available_blocks"] ==
          a["available_blocks"], f"eval: 2 of {a['available_blocks']} blocks scored; --all-tokens: all of them")
    text_out = run("eval", run_dirs[0], "--split", "valid", "--plugin-path", plugins).stdout
    check(f"scored 2 of the split's {a['available_blocks']} blocks" in text_out and "--all-tokens" in text_out,
          "eval prints the share of the split it scored")
else:
    check(False, f"eval --split valid [--all-tokens] ({whole.stderr.strip()[-300:]})")

cli_checks.finish("tasks check")
