#!/usr/bin/env python3
"""Downstream tasks (issue 58.5/58.6): `normlab eval RUN --tasks` against lm-evaluation-harness itself.

A small llama-family run (pre-ln, SentencePiece BPE trained by normlab) is exported with
`normlab export --format hf`; the harness scores the same items through `lm_eval.simple_evaluate`
with HFLM over that export read by transformers' LlamaForCausalLM (float32) and the run's own
SentencePiece model as a Hugging Face tokenizer (python/normlab_hf_tokenizer.py), on local task
YAMLs (dataset_path json: the scored items and the few-shot pool as two splits of the layouts the
harness's own YAMLs use: test + fewshot_split; ARC's training + test splits; HellaSwag's training +
validation splits, which has the sampler draw K + 1 and drop the scored document, issue 69.1).
Zero- and 3-shot, a HellaSwag-style, an ARC-style and a LAMBADA-style task (zero-shot also contexts ending
in U+0085, and contexts beyond max_length, which both sides cut from the left; 3-shot also the
HellaSwag layout with copies of scored items in the pool): every item's
log-likelihoods within 1e-4 of the harness's (its samples' filtered_resps), greedy matches, each
item's acc / acc_norm and the tasks' acc, acc_norm (exactly), their standard errors and LAMBADA's
perplexity; with 3 shots, each item's few-shot examples are the ones the harness drew (its default
sampler: one random.Random(1234) per task, per item in order rnd.sample(pool, 3), or for an item
with fewshot_exclude rnd.sample(pool, 4) less the pool items equal to it).

Then the same through the harness's model `normlab` (python/normlab_lm_eval.py, issue 68.2b) on a
HybridNorm run, which transformers cannot load: item by item equal to `normlab eval --tasks` on it.

The tokenizer first: the HF tokenizer encodes as SentencePiece does on strings that trip converted
tokenizers (whitespace runs, newlines, NFKC, unknown characters, special-token spellings), adds no
BOS, and leaves bos_token unset so that HFLM puts EOS before an empty context, as normlab does.

usage: check_tasks_lm_eval.py NORMLAB PLUGIN_DIR REPO WORK_DIR    (the venv's python)
Prints SKIP when lm_eval's HF model (lm_eval[hf]: transformers, accelerate) is not importable.
"""
import contextlib
import json
import logging
import math
import os
import random
import shutil
import sys
import time
import warnings

normlab, plugins, repo, work = sys.argv[1:5]
work = os.path.abspath(work)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
# Nothing from the network, nothing cached outside WORK_DIR, no progress bars, no bootstrap pool.
os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "HF_DATASETS_CACHE": os.path.join(work, "hf_datasets"), "HF_HOME": os.path.join(work, "hf_home"),
                   "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1", "DISABLE_MULTIPROC": "1",
                   "TOKENIZERS_PARALLELISM": "false"})
try:
    import sentencepiece
    import torch
    import transformers
    import lm_eval
    import lm_eval.evaluator
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
except ImportError as e:
    print("SKIP: %s (the venv's lm_eval[hf]: pip install 'lm_eval[hf]')" % e)
    sys.exit(0)
logging.disable(logging.WARNING)  # the harness's and transformers' per-task chatter
warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)

sys.path.insert(0, os.path.join(repo, "python"))
import normlab_hf_tokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_checks  # noqa: E402
from cli_checks import check  # noqa: E402

t_start = time.time()
SHOTS = 3
SEED = 1234  # normlab eval --seed's default and simple_evaluate's fewshot_random_seed's


def run(*args):
    return cli_checks.run(normlab, *args, "--plugin-path", plugins)


# A small llama-family language model on a toy grammar (tests/check_tasks.py's), in about a second.
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
p = run("train", manifest)
if p.returncode != 0:
    print("FAIL train: " + p.err[-500:])
    sys.exit(1)
rundir = os.path.join(work, "run")
export = os.path.join(work, "export")
p = run("export", rundir, "--to", export, "--format", "hf")
check(p.returncode == 0 and os.path.isfile(os.path.join(export, "tokenizer.model")),
      f"export --format hf: config.json, model.safetensors, tokenizer.model ({p.err.strip()[-200:]})")
cfg = json.load(open(os.path.join(export, "config.json")))

# --- the tokenizer: exactly the run's SentencePiece model ----------------------------------------
sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(export, "tokenizer.model"))
check((sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3) and
      cfg["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3},
      "tokenizer.model and config.json: special ids pad 0, unk 1, bos 2, eos 3")
tok = normlab_hf_tokenizer.from_export(export)
check(tok.eos_token_id == 3 and tok.pad_token_id == 0 and tok.unk_token_id == 1 and tok.bos_token_id is None and
      tok.vocab_size == cfg["vocab_size"] == len(tok),
      f"HF tokenizer: eos 3, pad 0, unk 1, no bos_token, vocabulary {tok.vocab_size} = the model's")
tricky = ["the red cat", "the  red   cat ", " the red cat", "the red\n\ncat", "the\tred\r\ncat",
          "café ｃａｆé", "ﬁ ① ²", "x\u00a0y\u3000z", "", " ", "\n\n", "the </s> <s> <unk> <pad>", "</s>",
          "▁the ▁", "😀 \u200b \x85",
          "Question: which word follows 'the old cat'?\nAnswer: house",
          "the red cat sees the dog.\n\nthe old bird"]
frnd = random.Random(7)
alphabet = list("the redcatsoqu.,'?:") + [" ", "  ", "\n", "\n\n", "\t", "\u00a0", "\u3000", "é", "ｃ", "ﬁ", "①",
                                          "</s>", "<s>", "<unk>", "x", "Q", "\r", "\u200b", "\x0c", "\x85", "😀",
                                          "▁"]
fuzz = ["".join(frnd.choice(alphabet) for _ in range(frnd.randrange(0, 24))) for _ in range(2000)]
bad = [s for s in tricky + fuzz if tok.encode(s) != sp.encode(s) or
       tok(s, add_special_tokens=True)["input_ids"] != sp.encode(s)]
check(not bad, f"HF tokenizer encodes as SentencePiece: {len(tricky)} tricky and {len(fuzz)} random strings, "
               f"special-token spellings as text, no BOS added (differs on {[s for s in bad[:3]]!r})")

# --- the tasks: normlab's JSONL (pool first) and the harness's YAML over the same items -----------
tasks_dir = os.path.join(work, "tasks")
harness_dir = os.path.join(work, "lm_eval_tasks")
os.makedirs(tasks_dir)
os.makedirs(harness_dir)


def sentence():
    return f"the {rnd.choice(adjs)} {rnd.choice(nouns)} {rnd.choice(verbs)} the"


hellaswag = [{"context": sentence(), "choices": [f"{n}." for n in rnd.sample(nouns, 4)], "gold": rnd.randrange(4)}
             for _ in range(24)]
hellaswag[0]["context"] += " "                      # trailing whitespace: moved to the continuation
hellaswag[1]["context"] += "\u00a0"                 # Unicode whitespace that NFKC turns into a space
hellaswag[2]["context"] = hellaswag[2]["context"].replace(" ", "  ", 2) + "\n"   # runs of spaces, a newline
hellaswag[3]["choices"][1] = "ｃａｔ."               # fullwidth: NFKC
hellaswag[4]["choices"][2] = "dog </s> cat."        # a special token's spelling, as text
hellaswag[5]["context"] = ""                        # an empty context: EOS alone
hellaswag[6]["choices"][0] = "bright old café."     # longer: acc_norm by characters
hellaswag_pool = [{"context": sentence(), "choices": [f"{n}." for n in rnd.sample(nouns, 4)],
                   "gold": rnd.randrange(4), "fewshot": True} for _ in range(8)]
arc = [{"context": f"Question: which word follows '{sentence()}'?\nAnswer:",
        "choices": rnd.sample(nouns + ["bright old café", "x"], 3), "gold": rnd.randrange(3)} for _ in range(20)]
arc_pool = [{"context": f"Question: which word follows '{sentence()}'?\nAnswer:",
             "choices": rnd.sample(nouns, 2), "gold": rnd.randrange(2), "fewshot": True} for _ in range(6)]
# Half the last words are the grammar's next word (" the" after a verb: greedy hits), half a noun.
lambada = [{"context": sentence()[:-4], "continuation": " the", "target_delimiter": ""} if k % 2 else
           {"context": sentence(), "continuation": " " + rnd.choice(nouns) + ".", "target_delimiter": ""}
           for k in range(20)]
lambada_pool = [{"context": sentence(), "continuation": " " + rnd.choice(nouns) + ".", "target_delimiter": "",
                 "fewshot": True} for _ in range(6)]
TASKS = {"hellaswag": (hellaswag, hellaswag_pool), "arc": (arc, arc_pool), "lambada": (lambada, lambada_pool)}
# A context ending in whitespace that SentencePiece's normalizer keeps (U+0085, NEL): Python's
# str.rstrip() -- the harness's _encode_pair -- moves it to the continuation like a space.
# normlab must move every character Python's str.isspace() accepts (29 code points), not only ASCII ones.
WHY = {"unicode_space": "the context ends in U+0085: the harness's str.rstrip() moves it to the continuation "
                        "(its token with it); normlab must too"}
EDGE = {"unicode_space": ([{"context": sentence() + "\u0085", "choices": [f"{n}." for n in rnd.sample(nouns, 3)],
                            "gold": 0} for _ in range(4)], [])}
# Issue 66.10: contexts longer than the model's max_length (config.json's max_position_embeddings,
# 2048 here): the harness cuts them from the left, (context + continuation)[-(max_length + 1):][:-1].
WHY["long_context"] = ("a context beyond max_length: the harness keeps its last max_length + 1 - len(continuation) "
                       "tokens; normlab must cut it the same way")
EDGE["long_context"] = ([{"context": " ".join(sentence() + " " + rnd.choice(nouns) + "." for _ in range(400)),
                          "choices": [f"{n}." for n in rnd.sample(nouns, 2)], "gold": 0} for _ in range(2)], [])
# Issue 68.1: identical choices of an item. The harness scores each (its rows are alike) and takes
# np.argmax, the first of equal maxima: an item whose choices are all one text is right exactly when
# its gold is 0; a duplicated gold placed after its copy never wins over it.
WHY["duplicates"] = ("identical choices: the harness's np.argmax takes the first of equal maxima; normlab must "
                     "score them bitwise equal")
EDGE["duplicates"] = ([{"context": sentence(), "choices": [n, n, n][:k], "gold": g}
                       for n, k, g in (("dog.", 2, 1), ("cat.", 3, 0), ("ship.", 3, 2), ("tree.", 2, 0))] +
                      [{"context": sentence(), "choices": ["ship.", "dog.", "ship."], "gold": 2},
                       {"context": sentence(), "choices": ["dog.", "tree.", "dog.", "house."], "gold": 1}], [])


# Issue 69.1: the harness's other few-shot layout. A task whose YAML names neither a test split nor a
# few-shot split (HellaSwag, PIQA, Winogrande, BoolQ: training + validation splits) has each scored
# document passed to the sampler as eval_doc (api/task.py fewshot_context: its few-shot split equals
# test_split, both None): rnd.sample(pool, K + 1), the documents equal to it dropped, the first K
# kept; fewer left: rnd.sample(pool without them, K). "same_split" is laid out so: the HellaSwag-style
# items scored as the validation split; the pool 4 other items and two copies of each of items 0-6,
# so that some draws drop a copy and one draws both (the sampler draws again). normlab's lines say
# so with fewshot_exclude: the pool indices of the copies equal to the item.
def doc_of(it):
    """The harness's document of a line: its fields without normlab's own."""
    return {k: v for k, v in it.items() if k not in ("fewshot", "target_delimiter", "fewshot_exclude")}


same_pool = [dict(doc_of(it), fewshot=True) for it in hellaswag_pool[:4] + [hellaswag[k] for k in range(7) for _ in (0, 1)]]
same_scored = [dict(it, fewshot_exclude=[j for j, p in enumerate(same_pool) if doc_of(p) == doc_of(it)])
               for it in hellaswag]
LAYOUT = {"same_split": (same_scored, same_pool)}
# Each task's splits as its YAML names them (the harness's defaults apply: fewshot_split unset).
SPLITS = {"arc": "arc", "same_split": "hellaswag"}


def write_jsonl(path, items):
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    return path


def harness_task(name, scored, pool, layout="fewshot_split"):
    """The harness's view of one task: a YAML over two JSONL splits, the scored items and the pool in
    file order, laid out as `layout`: test + fewshot_split (train); "arc": training_split +
    test_split, as ARC's YAML; "hellaswag": training_split + validation_split, as HellaSwag's."""
    d = os.path.join(harness_dir, name)
    os.makedirs(d)
    scored_split = "validation" if layout == "hellaswag" else "test"
    files = {scored_split: write_jsonl(os.path.join(d, scored_split + ".jsonl"), [doc_of(it) for it in scored])}
    if pool:
        files["train"] = write_jsonl(os.path.join(d, "train.jsonl"), [doc_of(it) for it in pool])
    last_word = "continuation" in scored[0]
    y = [f"task: normlab_{name}", "dataset_path: json", "dataset_kwargs:", "  data_files:"]
    y += [f"    {split}: {json.dumps(path)}" for split, path in files.items()]
    y += {"fewshot_split": ["test_split: test"] + (["fewshot_split: train"] if pool else []),
          "arc": ["training_split: train", "test_split: test"],
          "hellaswag": ["training_split: train", "validation_split: validation"]}[layout]
    y += ['doc_to_text: "{{context}}"', 'fewshot_delimiter: "\\n\\n"']
    if last_word:
        y += ["output_type: loglikelihood", 'doc_to_target: "{{continuation}}"', 'target_delimiter: ""',
              "metric_list:", "  - metric: acc", "    aggregation: mean", "    higher_is_better: true",
              "  - metric: perplexity", "    aggregation: perplexity", "    higher_is_better: false"]
    else:
        y += ["output_type: multiple_choice", 'doc_to_choice: "{{choices}}"', 'doc_to_target: "{{gold}}"',
              'target_delimiter: " "', "metric_list:", "  - metric: acc", "    aggregation: mean",
              "    higher_is_better: true", "  - metric: acc_norm", "    aggregation: mean",
              "    higher_is_better: true"]
    open(os.path.join(d, name + ".yaml"), "w").write("\n".join(y) + "\n")


files = {}
for name, (scored, pool) in {**TASKS, **EDGE, **LAYOUT}.items():
    files[name] = write_jsonl(os.path.join(tasks_dir, name + ".jsonl"), pool + scored)  # the pool first
    harness_task(name, scored, pool, SPLITS.get(name, "fewshot_split"))

# --- normlab eval --tasks -------------------------------------------------------------------------
t0 = time.time()
normlab_out = {}
for shots in (0, SHOTS):
    names = list(TASKS) + (list(EDGE) if shots == 0 else list(LAYOUT))
    args = ["eval", rundir, "--tasks", ",".join(files[n] for n in names), "--json"]
    if shots:
        args += ["--shots", str(shots)]
    p = run(*args)
    check(p.returncode == 0, f"normlab eval --tasks, {shots}-shot ({p.err.strip()[-300:]})")
    saved = os.path.join(rundir, "eval", "tasks.best.%s%s.json" % ("+".join(sorted(names)),
                                                                   f".{shots}shot" if shots else ""))
    if p.returncode == 0:
        got = json.loads(p.out)
        check(os.path.exists(saved) and json.load(open(saved)) == got, f"{shots}-shot: the --json output is {saved}")
        normlab_out[shots] = got["tasks"]
t_normlab = time.time() - t0

# --- lm_eval.simple_evaluate on the export --------------------------------------------------------
t0 = time.time()
model = transformers.LlamaForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
lm = HFLM(pretrained=model, tokenizer=tok, batch_size=16, device="cpu")
check(lm.prefix_token_id == 3 and lm.add_bos_token in (None, False) and
      lm.max_length == cfg["max_position_embeddings"] == normlab_out.get(0, {}).get("hellaswag", {}).get("max_length"),
      f"HFLM: EOS (3) before an empty context (prefix_token_id {lm.prefix_token_id}), no BOS "
      f"(add_bos_token {lm.add_bos_token}), max_length {lm.max_length}: config.json's "
      f"max_position_embeddings, normlab's max_length")
task_manager = TaskManager(include_path=harness_dir, include_defaults=False)
harness_out = {}
harness_log = os.path.join(work, "lm_eval.log")  # its progress bars and prints
for shots in (0, SHOTS):
    names = list(TASKS) + (list(EDGE) if shots == 0 else list(LAYOUT))
    with open(harness_log, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        res = lm_eval.evaluator.simple_evaluate(
            model=lm, tasks=["normlab_" + n for n in names], num_fewshot=shots, task_manager=task_manager,
            log_samples=True, bootstrap_iters=2, fewshot_random_seed=SEED)
    harness_out[shots] = {n: (res["results"]["normlab_" + n], sorted(res["samples"]["normlab_" + n],
                                                                    key=lambda s: s["doc_id"])) for n in names}
t_harness = time.time() - t0


# --- per item and per task, normlab against the harness --------------------------------------------
def pool_draws(scored, pool, shots, eval_doc=True):
    """The harness's default sampler as docs/downstream.md states it: one Random(seed) per task, per
    item in order rnd.sample(pool, shots); for an item with fewshot_exclude (eval_doc passed),
    rnd.sample(pool, shots + 1) less the listed items, the first `shots` kept, and when fewer are
    left rnd.sample(the pool less them, shots). eval_doc=False: the K-draw rule alone."""
    r, draws = random.Random(SEED), []
    for it in scored:
        if not eval_doc or "fewshot_exclude" not in it:
            draws.append(r.sample(range(len(pool)), shots))
            continue
        kept = [k for k in r.sample(range(len(pool)), shots + 1) if k not in it["fewshot_exclude"]][:shots]
        if len(kept) < shots:
            rest = [k for k in range(len(pool)) if k not in it["fewshot_exclude"]]
            kept = r.sample(rest, shots)
        draws.append(kept)
    return draws


def prefix_of(pool, picks):
    return "".join(pool[k]["context"] + pool[k].get("target_delimiter", " ") +
                   (pool[k]["choices"][pool[k]["gold"]] if "choices" in pool[k] else pool[k]["continuation"]) + "\n\n"
                   for k in picks)


def compare(name, scored, pool, shots):
    t, (hres, samples) = normlab_out[shots][name], harness_out[shots][name]
    ours = t["item_scores"]
    same = len(ours) == len(samples) == len(scored)
    check(same, f"{name} {shots}-shot: {len(scored)} items on both sides")
    if not same:
        return
    draws = pool_draws(scored, pool, shots) if shots else [[] for _ in scored]
    pool_line = lambda k: k + 1  # noqa: E731  (the pool comes first in normlab's file)
    worst, greedy_ok, acc_ok, ctx_ok, draw_ok, first_bad = 0.0, True, True, True, True, None
    direct_ok = True
    tokens_ok = True
    for i, (it, s, h) in enumerate(zip(scored, ours, samples)):
        lls = [float(r[0]) for r in h["filtered_resps"]]
        greedy = [bool(r[1]) for r in h["filtered_resps"]]
        diff = max(abs(a - b) for a, b in zip(s["loglikelihood"], lls))
        if diff > worst:
            worst = diff
        if diff >= 1e-4 and first_bad is None:
            first_bad = (i, s["loglikelihood"], lls)
        greedy_ok &= s["greedy"] == greedy
        # Continuation tokens per choice: the harness's own split (TemplateLM.loglikelihood, _encode_pair).
        tokens_ok &= s["tokens"] == [len(lm.tok_encode(cont)) if ctx == "" else len(lm._encode_pair(ctx, cont)[1])
                                     for ctx, cont in h["arguments"]]
        if "choices" in it:
            acc_ok &= float(s["correct"]) == h["acc"] and float(s["correct_norm"]) == h["acc_norm"]
        else:
            acc_ok &= float(s["correct"]) == h["acc"]
        # The harness's context: the examples it drew, then the item's own context.
        ctx_ok &= h["arguments"][0][0] == prefix_of(pool, draws[i]) + it["context"]
        draw_ok &= s["fewshot"] == [pool_line(k) for k in draws[i]]
        # normlab's examples written out: the harness's context (whatever the rule).
        direct_ok &= h["arguments"][0][0] == prefix_of(pool, [line - 1 for line in s["fewshot"]]) + it["context"]
    check(ctx_ok, f"{name} {shots}-shot: the harness's contexts are docs/downstream.md's draw, random.Random({SEED}) "
                  f"per task, per item in order sample(pool, {shots}) (with fewshot_exclude: sample(pool, {shots + 1}) "
                  "less the listed items), joined as it says" if shots else
                  f"{name} 0-shot: the harness's contexts are the items' own")
    if shots:
        check(draw_ok, f"{name} {shots}-shot: normlab's few-shot examples are the harness's draw "
                       f"(first item: normlab lines {ours[0]['fewshot']}, harness "
                       f"{[pool_line(k) for k in draws[0]]})")
        check(direct_ok, f"{name} {shots}-shot: every item's prompt from normlab's recorded examples is the "
                         "harness's context")
    if shots and name in LAYOUT:
        # The layout's paths were taken, and the K-draw rule would not give the harness's prompts.
        r, dropped, redrawn = random.Random(SEED), 0, 0
        for it in scored:
            drawn = r.sample(range(len(pool)), shots + 1)
            kept = [k for k in drawn if k not in it["fewshot_exclude"]]
            dropped += shots <= len(kept) < len(drawn)
            if len(kept) < shots:
                redrawn += 1
                r.sample(range(len(pool) - len(it["fewshot_exclude"])), shots)
        k_rule = pool_draws(scored, pool, shots, eval_doc=False)
        same = sum(h["arguments"][0][0] == prefix_of(pool, k_rule[i]) + it["context"]
                   for i, (it, h) in enumerate(zip(scored, samples)))
        check(dropped >= 1 and redrawn >= 1 and same < len(scored) // 2,
              f"{name} {shots}-shot: a copy of the item drawn and dropped ({dropped} items), both copies "
              f"drawn and the draw repeated ({redrawn}); rnd.sample(pool, {shots}) alone gives the harness's "
              f"examples for {same} of {len(scored)} items")
    check(worst < 1e-4, f"{name} {shots}-shot: every item's log-likelihoods within 1e-4 of the harness's "
                        f"(max |diff| {worst:.2e}" + (f"; first beyond: item {first_bad[0]}, normlab "
                                                      f"{[round(x, 5) for x in first_bad[1]]}, harness "
                                                      f"{[round(x, 5) for x in first_bad[2]]}" if first_bad else "")
                        + ")" + (f" [{WHY[name]}]" if first_bad and name in WHY else ""))
    check(greedy_ok, f"{name} {shots}-shot: greedy matches as the harness's")
    check(tokens_ok, f"{name} {shots}-shot: each choice's continuation tokens as the harness splits them")
    check(acc_ok, f"{name} {shots}-shot: each item's acc" + (" and acc_norm" if "choices" in scored[0] else "") +
                  " as the harness's")
    check(t["acc"] == hres["acc,none"], f"{name} {shots}-shot: acc {t['acc']:.4f} exactly the harness's "
                                       f"{hres['acc,none']:.4f}")
    check(abs(t["acc_stderr"] - hres["acc_stderr,none"]) < 1e-12,
          f"{name} {shots}-shot: acc_stderr {t['acc_stderr']:.6f}, the harness's {hres['acc_stderr,none']:.6f}")
    if "choices" in scored[0]:
        check(t["acc_norm"] == hres["acc_norm,none"],
              f"{name} {shots}-shot: acc_norm {t['acc_norm']:.4f} exactly the harness's {hres['acc_norm,none']:.4f}")
        check(abs(t["acc_norm_stderr"] - hres["acc_norm_stderr,none"]) < 1e-12,
              f"{name} {shots}-shot: acc_norm_stderr {t['acc_norm_stderr']:.6f}, the harness's "
              f"{hres['acc_norm_stderr,none']:.6f}")
    else:
        check(abs(t["ppl"] / hres["perplexity,none"] - 1) < 1e-6,
              f"{name} {shots}-shot: perplexity {t['ppl']:.4f}, the harness's {hres['perplexity,none']:.4f}")
        # Issue 69.2: its stderr, the harness's bootstrap_stderr at its default 100,000 resamples on
        # normlab's item log-likelihoods (the run above asks 2 resamples, for time): the same draws
        from lm_eval.api.metrics import bootstrap_stderr, perplexity
        want = bootstrap_stderr(perplexity, [s["loglikelihood"][0] for s in t["item_scores"]], iters=100000)
        check(abs(t["ppl_stderr"] / want - 1) < 1e-9,
              f"{name} {shots}-shot: perplexity stderr {t['ppl_stderr']:.6f}, the harness's bootstrap {want:.6f}")


for shots in (0, SHOTS):
    if shots not in normlab_out:
        continue
    for name, (scored, pool) in TASKS.items():
        compare(name, scored, pool, shots)
    if shots == SHOTS:
        for name, (scored, pool) in LAYOUT.items():
            compare(name, scored, pool, shots)
    if shots == 0:
        for name, (scored, pool) in EDGE.items():
            compare(name, scored, pool, 0)
if 0 in normlab_out:
    dup_items, (_, dup_samples) = EDGE["duplicates"][0], harness_out[0]["duplicates"]
    dup_scores = normlab_out[0]["duplicates"]["item_scores"]
    same_text = [i for i, it in enumerate(dup_items) if len(set(it["choices"])) == 1]
    check([dup_samples[i]["acc"] for i in same_text] == [float(dup_items[i]["gold"] == 0) for i in same_text] and
          all(s["loglikelihood"][c] == s["loglikelihood"][k] for it, s in zip(dup_items, dup_scores)
              for c in range(len(it["choices"])) for k in range(c) if it["choices"][c] == it["choices"][k]),
          "duplicates: the harness's acc of an item whose choices are one text is gold == 0 (the first of equal "
          "maxima); normlab's log-likelihoods of identical choices are bitwise equal")
    long_ = normlab_out[0]["long_context"]
    n_ctx = [len(lm._encode_pair(it["context"], " " + it["choices"][0])[0]) for it in EDGE["long_context"][0]]
    cut = [s.get("truncated") for s in long_["item_scores"]]
    check(min(n_ctx) > lm.max_length and long_.get("truncated_items") == len(n_ctx) and all(c and c > 0 for c in cut),
          f"long_context: contexts of {n_ctx} tokens, beyond max_length {lm.max_length}; normlab says each was cut "
          f"({cut} tokens)")

# --- issue 68.2b: the harness's own model `normlab` (python/normlab_lm_eval.py) on a non-Llama scheme ---
# A HybridNorm run of the same body (q/k/v norms in attention, a post-norm FFN: no transformers class
# has it, so export --format hf writes model_type normlab) scored by lm-evaluation-harness through the
# backend, against `normlab eval --tasks` item by item: 0-shot through the documented command line
# (python python/normlab_lm_eval.py --model normlab --model_args path=RUN: the registry as a user gets
# it), 3-shot through lm_eval.simple_evaluate(model="normlab", model_args={"path": EXPORT}).
t0 = time.time()
nonhf_manifest = os.path.join(work, "hybridnorm.toml")
open(nonhf_manifest, "w").write(open(manifest).read().replace('name = "pre-ln"', 'name = "hybridnorm"')
                               .replace(os.path.join(work, "run"), os.path.join(work, "run_hybridnorm")))
nonhf_run, nonhf_export = os.path.join(work, "run_hybridnorm"), os.path.join(work, "export_hybridnorm")
p = run("train", nonhf_manifest)
check(p.returncode == 0, f"train a hybridnorm run ({p.err.strip()[-300:]})")
p = run("export", nonhf_run, "--to", nonhf_export, "--format", "hf")
nonhf_cfg = json.load(open(os.path.join(nonhf_export, "config.json"))) if p.returncode == 0 else {}
check(nonhf_cfg.get("scheme", {}).get("name") == "hybridnorm" and nonhf_cfg.get("model_type") == "normlab",
      f"hybridnorm export --format hf: model_type {nonhf_cfg.get('model_type')!r} (no transformers class: "
      f"{nonhf_cfg.get('model_type_note', '')[:60]}…)")
BACKEND = {0: list(TASKS)[:2] + list(EDGE), SHOTS: list(TASKS) + list(LAYOUT)}
nonhf_out, backend_out = {}, {}
for shots, names in BACKEND.items():
    args = ["eval", nonhf_run, "--tasks", ",".join(files[n] for n in names), "--json"] + \
        (["--shots", str(shots)] if shots else [])
    p = run(*args)
    check(p.returncode == 0, f"hybridnorm: normlab eval --tasks, {shots}-shot ({p.err.strip()[-300:]})")
    nonhf_out[shots] = json.loads(p.out)["tasks"] if p.returncode == 0 else {}
# 0-shot: the command line as docs/downstream.md gives it (`python python/normlab_lm_eval.py ARGS`, run
# here as runpy runs a script: its __main__ branch registers the model, then lm_eval's cli_evaluate
# parses ARGS), in this process: the CLI's TaskManager also indexes the harness's own task YAMLs
# (about a minute on a busy 2-core machine), skipped here (include_defaults=False) for time.
out_dir = os.path.join(work, "backend_cli")
argv = ["normlab_lm_eval.py", "--model", "normlab",
        "--model_args", f"path={nonhf_run},normlab={normlab},plugin_path={plugins}", "--include_path", harness_dir,
        "--tasks", ",".join("normlab_" + n for n in BACKEND[0]), "--device", "cpu", "--batch_size", "16",
        "--log_samples", "--output_path", out_dir]
import runpy  # noqa: E402
import lm_eval.tasks  # noqa: E402
manager_init, saved_argv = lm_eval.tasks.TaskManager.__init__, sys.argv
lm_eval.tasks.TaskManager.__init__ = lambda self, *a, **k: manager_init(self, *a, **dict(k, include_defaults=False))
cli_error = None
try:
    sys.argv = argv
    with open(harness_log, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        runpy.run_path(os.path.join(repo, "python", "normlab_lm_eval.py"), run_name="__main__")
except (Exception, SystemExit) as e:  # noqa: BLE001  (reported as a failed check)
    cli_error = repr(e)
finally:
    lm_eval.tasks.TaskManager.__init__, sys.argv = manager_init, saved_argv
logging.disable(logging.WARNING)  # cli_evaluate's setup_logging
check(cli_error is None, f"python python/normlab_lm_eval.py --model normlab --model_args path=RUN ... "
                         f"({cli_error or 'ran'}; log {harness_log})")
if cli_error is None:
    found = {f: os.path.join(d, f) for d, _, fs in os.walk(out_dir) for f in fs}
    results = json.load(open(next(v for k, v in found.items() if k.startswith("results_"))))["results"]
    backend_out[0] = {n: (results["normlab_" + n], sorted(
        (json.loads(line) for line in open(next(v for k, v in found.items() if k.startswith(f"samples_normlab_{n}_")))),
        key=lambda s: s["doc_id"])) for n in BACKEND[0]}
# 3 shots: the registry from Python, on the export.
import normlab_lm_eval  # noqa: E402  (registers "normlab")
from lm_eval.api.registry import get_model  # noqa: E402
check(get_model("normlab") is normlab_lm_eval.NormlabLM and get_model("hf") is HFLM,
      "import normlab_lm_eval registers the model normlab, the harness's own (hf) still there")
with open(harness_log, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    res = lm_eval.evaluator.simple_evaluate(
        model="normlab", model_args={"path": nonhf_export}, batch_size=16, device="cpu",
        tasks=["normlab_" + n for n in BACKEND[SHOTS]], num_fewshot=SHOTS, task_manager=task_manager,
        log_samples=True, bootstrap_iters=2, fewshot_random_seed=SEED)
backend_out[SHOTS] = {n: (res["results"]["normlab_" + n], sorted(res["samples"]["normlab_" + n],
                                                                key=lambda s: s["doc_id"])) for n in BACKEND[SHOTS]}
worst_backend = 0.0
for shots, names in BACKEND.items():
    for name in names:
        t, (hres, samples) = nonhf_out.get(shots, {}).get(name), backend_out.get(shots, {}).get(name, (None, []))
        if t is None or hres is None:
            check(False, f"hybridnorm {name} {shots}-shot: scored on both sides")
            continue
        ours = t["item_scores"]
        lls = [[float(r[0]) for r in s["filtered_resps"]] for s in samples]
        greedy = [[r[1] in (True, "True") for r in s["filtered_resps"]] for s in samples]
        worst = max((abs(a - b) for s, h in zip(ours, lls) for a, b in zip(s["loglikelihood"], h)), default=0.0)
        worst_backend = max(worst_backend, worst)
        mc = "choices" in (TASKS.get(name) or EDGE.get(name) or LAYOUT.get(name))[0][0]
        check(len(ours) == len(samples) and worst < 1e-4 and all(len(s["loglikelihood"]) == len(h)
                                                                 for s, h in zip(ours, lls)),
              f"hybridnorm {name} {shots}-shot, harness through --model normlab: {len(samples)} items, every "
              f"log-likelihood within 1e-4 of normlab eval --tasks (max |diff| {worst:.2e})")
        check([s["greedy"] for s in ours] == greedy and
              all(float(s["correct"]) == h["acc"] and (not mc or float(s["correct_norm"]) == h["acc_norm"])
                  for s, h in zip(ours, samples)),
              f"hybridnorm {name} {shots}-shot: each item's greedy matches, acc" + (" and acc_norm" if mc else "") +
              " as normlab's")
        check(t["acc"] == hres["acc,none"] and (not mc or t["acc_norm"] == hres["acc_norm,none"]),
              f"hybridnorm {name} {shots}-shot: acc {t['acc']:.4f}" +
              (f", acc_norm {t['acc_norm']:.4f}" if mc else "") +
              f" exactly the harness's {hres['acc,none']:.4f}" +
              (f", {hres['acc_norm,none']:.4f}" if mc else ""))
# The other requests of the backend: rolling log-likelihood (perplexity tasks) and greedy generation.
nonhf_lm = normlab_lm_eval.NormlabLM(path=nonhf_export, device="cpu")


def refused(**model_args):
    try:
        normlab_lm_eval.NormlabLM(**model_args)
    except normlab_lm_eval.NormlabError as e:
        return str(e)
    return "accepted"


nowhere = os.path.join(work, "nowhere")
bad = [refused(path=nowhere), refused(path=nonhf_export, checkpoint="last"), refused(path=nonhf_export, pretrained="x"),
       refused(path=nonhf_export, batch_size=0)]
check(f"path={nowhere}" in bad[0] and "manifest.resolved.toml" in bad[0] and "checkpoint=last" in bad[1] and
      "unknown model_args pretrained" in bad[2] and "batch_size=0" in bad[3],
      f"bad model_args are one error naming the key and what was expected ({bad[0][:80]}…)")
# Hostile review: a raw ValueError for max_length=abc, torch's RuntimeError for device=tpu, and
# "failed (exit 1): " with nothing after it for a normlab= that prints nothing.
bad = [refused(path=nonhf_export, max_length="abc"), refused(path=nonhf_export, device="tpu"),
       refused(path=nonhf_run, normlab="/bin/false")]
check("max_length=abc: expected an integer >= 1" in bad[0] and
      "device=tpu: expected cpu, cuda or cuda:N" in bad[1] and "printed nothing" in bad[2],
      f"max_length=abc, device=tpu and normlab=/bin/false are one error each ({bad})")
nonhf_model = nonhf_lm.model


class Req:
    def __init__(self, *args):
        self.args = args


text = "the red cat sees the old dog. the quiet bird finds the king."
ids = nonhf_lm.tok_encode(text)
with torch.no_grad():
    logp = torch.log_softmax(nonhf_model.forward_lm(torch.tensor([[3] + ids]))[0, :-1].float(), -1)
by_hand = float(logp.gather(1, torch.tensor(ids).unsqueeze(1)).sum())
nonhf_lm._max_length = 8  # several rolling windows
rolled = nonhf_lm.loglikelihood_rolling([Req(text)])[0]
nonhf_lm._max_length = 2048
whole = nonhf_lm.loglikelihood_rolling([Req(text)])[0]
check(abs(whole - by_hand) < 1e-4 and abs(rolled - whole) > 1e-3,
      f"loglikelihood_rolling: EOS then the text, Σ log p {whole:.5f} (by hand {by_hand:.5f}); in windows of 8 "
      f"tokens {rolled:.5f} (less context)")
prompt = "the red cat"
gen = nonhf_lm.generate_until([Req(prompt, {"until": ["."], "max_gen_toks": 12})])[0]
new = []
with torch.no_grad():
    for _ in range(12):  # argmax of the last position, the whole prefix each step
        nxt = int(nonhf_model.forward_lm(torch.tensor([nonhf_lm.tok_encode(prompt) + new]))[0, -1].argmax())
        if nxt == nonhf_cfg["special_ids"]["eos"]:
            break
        new.append(nxt)
        if "." in nonhf_lm.tok_decode(new):
            break
check(gen == nonhf_lm.tok_decode(new).split(".")[0] and len(new) >= 1,
      f"generate_until: greedy until '.' ({len(new)} tokens, {gen!r})")
t_backend = time.time() - t0

print(f"     times: normlab eval {t_normlab:.1f} s (2 runs), harness {t_harness:.1f} s "
      f"(model load + 2 simple_evaluate), hybridnorm through --model normlab {t_backend:.1f} s, "
      f"whole check {time.time() - t_start:.1f} s; "
      f"lm_eval {lm_eval.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
cli_checks.finish("lm_eval parity")
