#!/usr/bin/env python3
"""python/normlab_tasks.py against lm-evaluation-harness's own task objects (issue 58.1).

Hand-written rows with each dataset's real field names (and the artefacts its harness preprocessing
cleans) are planted as the Hub datasets in an offline datasets cache under a made-up commit, and
written as JSON files that the harness's own task YAML reads (`include`d unchanged but for the
dataset source and the few-shot sampler, first_n, so that the examples come in pool order). Then:

- `normlab_tasks.py convert` (from the planted cache, through the Hub code path of `datasets`)
  writes every task; each scored line, expanded into the (context, continuation) pairs
  docs/downstream.md scores, equals the requests the harness builds for that document, zero-shot
  and with every pool line as a few-shot example; its gold is the harness's target; each pool line
  matches the harness's few-shot documents in order;
- the comparison is armed: a changed context, gold, continuation or pool order fails it;
- the task table (datasets, configurations, splits, YAML versions) is the harness's;
- the record: the SHA-256 of the written file, the commit loaded, the counts; --from-json writes
  the same bytes; the default pool is the whole split; --pool / --limit cut the file (with a note);
  unknown tasks, unloadable datasets, a revision the cache does not hold and a bad row are one
  `normlab_tasks: error:` line, exit 2;
- the few-shot draw (issue 69.1): over more rows (with copies of scored rows in the pool), each
  harness YAML included as it is with its default sampler (fewshot seed 1234): every item's 3-shot
  requests are the ones docs/downstream.md's rule builds from the converted file (rnd.sample(pool,
  K), or for a line with fewshot_exclude K + 1 less the listed rows), fewshot_exclude is exactly
  where the harness passes the document to its sampler and lists the pool documents equal to it,
  and either rule alone fails a layout.

usage: check_task_conversion.py [WORKDIR]   (run with a Python that has lm_eval and datasets)
"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "python" / "normlab_tasks.py"
OWN_WORK = len(sys.argv) < 2  # a temporary folder, removed after a pass
WORK = Path(tempfile.mkdtemp(prefix="task_conversion.")) if OWN_WORK else Path(sys.argv[1])
if WORK.exists():
    shutil.rmtree(WORK)
WORK.mkdir(parents=True)
# Never the network, never the user's caches: set before datasets is imported.
ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(WORK / "hf_home"),
           HF_DATASETS_CACHE=str(WORK / "hf_cache"), HF_HUB_DISABLE_TELEMETRY="1",
           HF_DATASETS_DISABLE_PROGRESS_BARS="1", TQDM_DISABLE="1")
os.environ.update(ENV)

try:
    import datasets
    import lm_eval
    import pyarrow
    from datasets.naming import camelcase_to_snakecase
    from lm_eval.tasks import TaskManager
except ImportError as e:
    print(f"SKIP: lm_eval and datasets are needed ({e}); pip install lm_eval into the venv")
    sys.exit(0)

import logging  # noqa: E402

logging.disable(logging.WARNING)  # the harness and datasets warn about every offline lookup
sys.path.insert(0, str(ROOT / "python"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import normlab_tasks  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the planted "Hub commit"
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
    return ok


# ---------------------------------------------------------------- fixture rows (real field names)

def hellaswag_row(ind, label_text, ctx_a, ctx_b, endings, label):
    return {"ind": ind, "activity_label": label_text, "ctx_a": ctx_a, "ctx_b": ctx_b,
            "ctx": ctx_a + " " + ctx_b, "endings": endings, "source_id": f"src~{ind}",
            "split": "val", "split_type": "indomain", "label": label}


def arc_row(qid, question, texts, labels, key):
    return {"id": qid, "question": question, "choices": {"text": texts, "label": labels}, "answerKey": key}


def obqa_row(qid, stem, texts, key):
    return {"id": qid, "question_stem": stem, "choices": {"text": texts, "label": ["A", "B", "C", "D"]},
            "answerKey": key}


def sciq_row(question, d1, d2, d3, correct, support):
    return {"question": question, "distractor3": d3, "distractor1": d1, "distractor2": d2,
            "correct_answer": correct, "support": support}


FIXTURES = {
    "hellaswag": {
        "train": [
            hellaswag_row(1, "Washing face", "A woman is standing at a sink.", "she", [
                "splashes water on her face.", "drives a car  away.", "eats soup.", "sings."], "0"),
            hellaswag_row(2, "Home and Garden", "[header] How to clean a grill [title] Heat it up.",
                          "[step] wait", ["[title] Scrub it.", "Let it cool.", "x", "y"], "1"),
        ],
        "validation": [
            # ActivityNet style; ctx_b is capitalized (the rest lower-cased), label a string.
            hellaswag_row(10, "Removing ice from car", "Then, the man writes over the snow covering the "
                          "window of a car, and a woman wearing winter clothes smiles.", "then THE man", [
                              ", the man adds wax to the windshield and cuts it.",
                              ", a person board a ski lift, while two men supporting the head of "
                              "the person wearing winter clothes snow as the we girls sled.",
                              ", the man puts on a christmas coat, knitted with netting.",
                              ", the man continues removing the snow on his car."], "3"),
            # WikiHow style: [title] / [header] / [step] markup, double and triple spaces,
            # surrounding whitespace, non-ASCII text.
            hellaswag_row(11, "Personal Care and Style", "[header] How to  dye your hair [title] Buy "
                          "the dye.  [step] Pick a café   colour.", "[substeps] rinse  well ", [
                              "[title] Wear gloves. [step] Protect your hands.",
                              "  Apply the dye to  dry hair [header] now ",
                              "Wait 30 minutes   then rinse. 😀",
                              "[title]Stop."], "1"),
            # An empty ctx_b: the context ends in the space the harness strips.
            hellaswag_row(12, "Sharpening knives", "Two men sharpen knives on a stone.", "", [
                "They are done.", "they dance.", "A dog barks.", "The stone breaks."], "0"),
        ],
    },
    "piqa": {
        "train": [{"goal": "To open a jar", "sol1": "twist the lid", "sol2": "hit it", "label": 0}],
        "validation": [
            {"goal": "How do I ready a guinea pig cage for it's new occupants?",
             "sol1": "Provide the guinea pig with a cage full of a few inches of bedding made of "
                     "ripped paper strips, you will also need to supply it with a water bottle.",
             "sol2": "Provide the guinea pig with a cage full of a few inches of bedding made of "
                     "ripped jeans material.", "label": 0},
            # Quotes, a backslash and a newline survive the harness's list-literal round trip.
            {"goal": "Clean a \"dirty\" pan", "sol1": "Use soap, it's fine \\ really",
             "sol2": "Use sand\nand water", "label": 1},
        ],
    },
    "arc_easy": {
        "train": [arc_row("t1", "Which is a gas?", ["ice", "steam", "wood"], ["A", "B", "C"], "B")],
        "test": [
            arc_row("Mercury_7175875", "An astronomer observes that a planet rotates faster after a "
                    "meteorite impact. Which is the most likely effect of this increase in rotation?",
                    ["Planetary density will decrease.", "Planetary years will become longer.",
                     "Planetary days will become shorter.", "Planetary gravity will become stronger."],
                    ["A", "B", "C", "D"], "C"),
            # Numeric labels, as some ARC rows have.
            arc_row("NYSEDREGENTS_2015_4_7", "Which tool measures mass?",
                    ["ruler", "balance", "thermometer", "graduated cylinder"], ["1", "2", "3", "4"], "2"),
            arc_row("x5", "Five choices?", ["a", "b", "c", "d", "e"], ["A", "B", "C", "D", "E"], "E"),
        ],
    },
    "arc_challenge": {
        "train": [arc_row("c1", "Why?", ["because", "no"], ["A", "B"], "A")],
        "test": [arc_row("c2", "George wants to warm his hands quickly by rubbing them. Which skin "
                         "surface will produce the most heat?", ["dry palms", "wet palms", "palms "
                         "covered with oil", "palms covered with lotion"], ["A", "B", "C", "D"], "A"),
                 arc_row("c3", "Three?", ["x", "y", "z"], ["1", "2", "3"], "3")],
    },
    "winogrande": {
        "train": [{"sentence": "Ian volunteered to eat Dennis's menudo after already having a bowl "
                               "because _ despised eating intestine.", "option1": "Ian",
                   "option2": "Dennis", "answer": "2"}],
        "validation": [
            {"sentence": "Sarah was a much better surgeon than Maria so _ always got the harder cases.",
             "option1": "Sarah", "option2": "Maria", "answer": "1"},
            # The blank at the start, and a continuation with surrounding spaces.
            {"sentence": "_ couldn't fit in the box because it was too big .  ", "option1": "The trophy",
             "option2": "The box", "answer": "1"},
            {"sentence": "The café served tea, but Ana preferred the _.", "option1": "tea",
             "option2": "coffee", "answer": "2"},
        ],
    },
    "boolq": {
        "train": [{"question": "is water wet", "passage": "Water is a liquid.", "idx": 0, "label": 1}],
        "validation": [
            {"question": "does ethanol take more energy make that produces",
             "passage": "Ethanol fuel -- All biomass goes through at least some of these steps.",
             "idx": 0, "label": 0},
            {"question": "is house tax and property tax are same",
             "passage": "Property tax or 'house tax' is a local tax on buildings.\nIt is levied on owners.",
             "idx": 1, "label": 1},
        ],
    },
    "openbookqa": {
        "train": [obqa_row("7-980", "The sun is responsible for", ["puppies learning new tricks",
                           "children growing up and getting old", "flowers wilting in a vase",
                           "plants sprouting, blooming and wilting"], "D")],
        "test": [
            obqa_row("8-343", "A person wants to start saving money so that they can afford a nice "
                     "vacation at the end of the year. After looking over their budget and expenses, "
                     "they decide the best way to save money is to", ["make more phone calls",
                     "quit eating lunch out", "buy less with monopoly money",
                     "have lunch with friends"], "B"),
            # A key with a leading space: the harness strips it before looking it up.
            obqa_row("9-1", "Which is a mammal?", ["shark", "whale", "trout", "squid"], " B"),
        ],
    },
    "sciq": {
        "train": [sciq_row("What gas do plants absorb?", "oxygen", "helium", "neon", "carbon dioxide",
                           "Plants take in carbon dioxide.")],
        "test": [
            sciq_row("Compounds that are capable of accepting electrons, such as o 2 or f2, are "
                     "called what?", "antioxidants", "Oxygen", "residues", "oxidants",
                     "\n  Oxidants and Reductants Compounds that are capable of accepting electrons. \n"),
            # An empty support: the prompt starts with its newline (the support above keeps its
            # trailing whitespace: the harness strips only the left).
            sciq_row("What is the unit of force?", "joule", "watt", "pascal", "newton", ""),
        ],
    },
    "lambada_openai": {
        "test": [
            {"text": "In my palm is a clear stone, and inside it is a small ivory statuette. "
                     "A guardian angel. \"Figured if you're going to be out at night getting hit by "
                     "cars, you might as well have some backup.\" I look at him, feeling stunned. "
                     "Like this is some sort of sign. But as I stare at Harlin, his mouth curved in "
                     "a confident grin, I don't care about signs"},
            # A double space inside the text: split on single spaces keeps it.
            {"text": "He said  it was over. She nodded and walked to the café"},
            {"text": "Lonely"},
        ],
    },
}


# ---------------------------------------------------------------- planting the sources

def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def plant_hub_cache(cache, task, splits):
    """The layout `datasets` leaves after loading TASK's dataset from the Hub at COMMIT: read back
    offline (HF_HUB_OFFLINE) through the same load_dataset_builder call a Hub load makes."""
    parts = task.path.split("/")
    snake = camelcase_to_snakecase(parts[-1])
    folder = cache / "___".join(parts[:-1] + [snake]) / (task.config or "default") / "0.0.0" / COMMIT
    if folder.exists():  # arc_easy and arc_challenge share allenai/ai2_arc, other configs
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    split_dict = datasets.SplitDict(dataset_name=snake)
    features = None
    for split, rows in splits.items():
        table = datasets.Dataset.from_list(rows, features=features)
        features = table.features
        with pyarrow.OSFile(str(folder / f"{snake}-{split}.arrow"), "wb") as sink:
            with pyarrow.ipc.new_stream(sink, table.data.table.schema) as writer:
                writer.write_table(table.data.table)
        split_dict.add(datasets.SplitInfo(name=split, num_examples=len(rows)))
    datasets.DatasetInfo(config_name=task.config or "default", dataset_name=snake, features=features,
                         splits=split_dict).write_to_directory(str(folder))


HARNESS_TASKS = Path(lm_eval.__file__).parent / "tasks"


def write_harness_yaml(folder, task, data):
    """The harness's YAML for TASK, included as it is, reading DATA's JSON files instead of the Hub."""
    files = {split: str(data / task.name / f"{split}.jsonl") for split in FIXTURES[task.name]}
    config = {
        "include": str(HARNESS_TASKS / task.yaml),
        "task": f"normlab_check_{task.name}",
        "tag": [],
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": files},
        "fewshot_config": {"sampler": "first_n"},
    }
    (folder / f"normlab_check_{task.name}.yaml").write_text(json.dumps(config, indent=1), encoding="utf-8")


def run_cli(*args, env=None):
    r = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                       env=env or ENV, timeout=300)
    return r.returncode, r.stdout, r.stderr


def said(stderr):
    """The script's own error lines (datasets logs its offline cache lookups to stderr too)."""
    return "; ".join(line for line in stderr.splitlines() if line.startswith("normlab_tasks:")) or stderr[-1500:]


# ---------------------------------------------------------------- what the harness scores

def harness_requests(task_obj, shots):
    """{doc_id: [(context, continuation), ...]} of the harness's own requests with `shots` examples."""
    task_obj.set_config(key="num_fewshot", value=shots)
    task_obj.build_all_requests()
    requests = {}
    for inst in sorted(task_obj.instances, key=lambda i: (i.doc_id, i.idx)):
        requests.setdefault(inst.doc_id, []).append(tuple(inst.arguments[:2]))
    return requests


def harness_gold(task_obj, doc):
    if task_obj.OUTPUT_TYPE != "multiple_choice":
        return None
    if task_obj.multiple_input:
        return task_obj.doc_to_text(doc)  # winogrande: the prompt is the answer's index
    target = task_obj.doc_to_target(doc)
    return target if isinstance(target, int) else task_obj.doc_to_choice(doc).index(target)


# ---------------------------------------------------------------- what normlab scores (docs/downstream.md)

def example_text(item):
    """A pool line written as a few-shot example (before the "\\n\\n" that follows it)."""
    delimiter = item.get("target_delimiter", " ")
    if "contexts" in item:
        return item["contexts"][item["gold"]] + delimiter + item["continuation"]
    if "choices" in item:
        return item["context"] + delimiter + item["choices"][item["gold"]]
    # A last-word example: joined with the target delimiter (lambada_openai leaves it at " "; its
    # scored requests never use it) before the continuation's own space: two spaces.
    return item["context"] + delimiter + item["continuation"]


def normlab_requests(item, pool):
    prefix = "".join(example_text(p) + "\n\n" for p in pool)
    delimiter = item.get("target_delimiter", " ")
    if "contexts" in item:
        return [(prefix + c, delimiter + item["continuation"]) for c in item["contexts"]]
    if "choices" in item:
        return [(prefix + item["context"], delimiter + c) for c in item["choices"]]
    return [(prefix + item["context"], item["continuation"])]  # a last word: scored as given


def compare(name, pool, scored, reference):
    """Failures of the written lines against the harness's reference; empty when they agree."""
    out = []
    if len(pool) != len(reference["pool"]) or len(scored) != len(reference["gold"]):
        return [f"{name}: {len(pool)} pool and {len(scored)} scored lines, the harness has "
                f"{len(reference['pool'])} and {len(reference['gold'])}"]
    for i, (item, (requests, gold)) in enumerate(zip(pool, reference["pool"])):
        if normlab_requests(item, []) != requests or (gold is not None and item["gold"] != gold):
            out.append(f"{name}: pool line {i}: {normlab_requests(item, [])!r} gold {item.get('gold')} "
                       f"!= the harness's few-shot doc {requests!r} gold {gold}")
    for shots, key in ((0, "zero_shot"), (len(pool), "all_shots")):
        for i, item in enumerate(scored):
            mine, theirs = normlab_requests(item, pool[:shots]), reference[key][i]
            if mine != theirs:
                out.append(f"{name}: item {i}, {shots}-shot: {mine!r} != the harness's {theirs!r}")
    for i, (item, gold) in enumerate(zip(scored, reference["gold"])):
        if gold is not None and item["gold"] != gold:
            out.append(f"{name}: item {i}: gold {item['gold']} != the harness's {gold}")
    if any(item.get("fewshot") is not True for item in pool) or any("fewshot" in item for item in scored):
        out.append(f"{name}: the pool lines are not exactly those marked \"fewshot\": true")
    return out


def mutations(pool, scored):
    """Wrong versions of the lines, each of which compare() must reject."""
    def changed(lines, i, **fields):
        return [dict(line, **fields) if j == i else line for j, line in enumerate(lines)]

    item = scored[0]
    if "contexts" in item:
        yield "a context", pool, changed(scored, 0, contexts=[item["contexts"][0] + " x"] + item["contexts"][1:])
        yield "the continuation", pool, changed(scored, 0, continuation=item["continuation"] + ".")
        yield "the gold", pool, changed(scored, 0, gold=1 - item["gold"])
    elif "choices" in item:
        yield "the context", pool, changed(scored, 0, context=item["context"] + " ")
        yield "the gold", pool, changed(scored, 0, gold=(item["gold"] + 1) % len(item["choices"]))
        yield "the delimiter", pool, changed(scored, 0, target_delimiter="")
        yield "a pool gold", changed(pool, 0, gold=(pool[0]["gold"] + 1) % len(pool[0]["choices"])), scored
    else:
        yield "the context", pool, changed(scored, 0, context=item["context"][:-1])
        yield "the continuation", pool, changed(scored, 0, continuation=item["continuation"].lstrip())
        if pool:  # its few-shot examples keep the delimiter: two spaces before the word
            yield "a pool delimiter", changed(pool, 0, target_delimiter=""), scored
    if len(pool) > 1:
        yield "the pool order", pool[::-1], scored


# ---------------------------------------------------------------- the checks

def check_table(manager):
    """The task table is the harness's: dataset, configuration, splits, YAML and its version."""
    for name, task in normlab_tasks.TASKS.items():
        entry = manager.task_index[name]
        cfg = entry.cfg
        scored = cfg.get("test_split") or cfg.get("validation_split")
        fewshot = (cfg.get("fewshot_split") or cfg.get("training_split") or cfg.get("validation_split")
                   or cfg.get("test_split"))
        want = (cfg["dataset_path"], cfg.get("dataset_name"), scored, fewshot, cfg["metadata"]["version"],
                Path(entry.yaml_path).resolve())
        have = (task.path, task.config, task.split, task.fewshot_split, task.version,
                (HARNESS_TASKS / task.yaml).resolve())
        check(want == have, f"{name}: the table says {have}, the harness {want}")
        check(cfg.get("target_delimiter", " ") == " " and cfg.get("fewshot_delimiter", "\n\n") == "\n\n",
              f"{name}: the harness's delimiters are not the defaults normlab assumes")
        kind = {"multiple_choice": "partial" if name == "winogrande" else "multiple_choice",
                "loglikelihood": "last_word"}[cfg["output_type"]]
        check(task.kind == kind, f"{name}: kind {task.kind}, the harness's output type {cfg['output_type']}")
        # Issue 69.2: the metrics the harness reports (its metric_list), which eval --tasks labels so
        metrics = tuple(m["metric"] for m in cfg.get("metric_list", []))
        check(normlab_tasks.HARNESS_METRICS[name] == metrics,
              f"{name}: HARNESS_METRICS {normlab_tasks.HARNESS_METRICS[name]}, the harness's metric_list {metrics}")


def harness_references(manager):
    """Per task, what the harness builds from the fixture rows: its few-shot documents' requests and
    gold, the scored documents' gold, and their requests with 0 and with all pool examples."""
    loaded = manager.load([f"normlab_check_{name}" for name in FIXTURES])["tasks"]
    references = {}
    for name in FIXTURES:
        task_obj = loaded[f"normlab_check_{name}"]
        pool_docs, eval_docs = list(task_obj.fewshot_docs()), list(task_obj.eval_docs)

        def doc_requests(doc):
            ctx = task_obj.fewshot_context(doc, num_fewshot=0)
            inst = task_obj.construct_requests(doc=doc, ctx=ctx, metadata=(name, 0, 1))
            return [tuple(i.arguments[:2]) for i in (inst if isinstance(inst, list) else [inst])]

        zero, every = harness_requests(task_obj, 0), harness_requests(task_obj, len(pool_docs))
        references[name] = {
            "pool": [(doc_requests(d), harness_gold(task_obj, d)) for d in pool_docs],
            "gold": [harness_gold(task_obj, d) for d in eval_docs],
            "zero_shot": [zero[i] for i in range(len(eval_docs))],
            "all_shots": [every[i] for i in range(len(eval_docs))],
        }
    return references


def check_written(out, references, stdout):
    """Every written line against the harness, the comparison armed, and each task's record."""
    for name in FIXTURES:
        path = out / f"{name}.jsonl"
        raw = path.read_bytes()
        lines = [json.loads(line) for line in raw.decode("utf-8").splitlines()]
        n_pool = sum(1 for line in lines if line.get("fewshot"))
        pool, scored = lines[:n_pool], lines[n_pool:]
        problems = compare(name, pool, scored, references[name])
        failures.extend(problems)
        if not problems:
            for what, bad_pool, bad_scored in mutations(pool, scored):
                check(compare(name, bad_pool, bad_scored, references[name]),
                      f"{name}: a wrong {what} passes the comparison (the check is not armed)")

        record = json.loads((out / f"{name}.source.json").read_text(encoding="utf-8"))
        task = normlab_tasks.TASKS[name]
        check(record["sha256"] == hashlib.sha256(raw).hexdigest(), f"{name}: the record's SHA-256 is not the file's")
        check(record["file"] == path.name and record["task"] == name and record["kind"] == task.kind,
              f"{name}: record file/task/kind {record}")
        source, fmt = record["source"], record["format"]
        check((source["dataset_path"], source["dataset_name"], source["split"], source["fewshot_split"])
              == (task.path, task.config, task.split, task.fewshot_split), f"{name}: record source {source}")
        check(source["revision"] == COMMIT, f"{name}: revision {source['revision']}, the commit loaded is {COMMIT}")
        check((fmt["version"], fmt["task_yaml"], fmt["task_version"], fmt["lm_eval_installed"], fmt["metrics"])
              == (normlab_tasks.HARNESS_VERSION, "lm_eval/tasks/" + task.yaml, task.version, lm_eval.__version__,
                  list(normlab_tasks.HARNESS_METRICS[name])),
              f"{name}: record format {fmt}")
        n_fewshot, n_scored = len(FIXTURES[name][task.fewshot_split]), len(FIXTURES[name][task.split])
        want = {"pool": n_fewshot, "pool_available": n_fewshot, "scored": n_scored, "scored_available": n_scored}
        check(record["counts"] == want, f"{name}: counts {record['counts']}, want {want}")
        check(f"{name}: {n_scored} items" in stdout, f"{name}: no summary line in {stdout!r}")


def check_options(data, out):
    """--from-json writes the same bytes as the Hub path; --pool / --limit keep the first lines."""
    rc, _, stderr = run_cli("convert", *FIXTURES, "--out", WORK / "from_json", "--pool", "all",
                            "--from-json", data)
    if check(rc == 0, f"convert --from-json exits {rc}: {said(stderr)}"):
        for name in FIXTURES:
            check((WORK / "from_json" / f"{name}.jsonl").read_bytes() == (out / f"{name}.jsonl").read_bytes(),
                  f"{name}: --from-json writes other lines than the Hub path")
        record = json.loads((WORK / "from_json" / "sciq.source.json").read_text(encoding="utf-8"))
        want = hashlib.sha256((data / "sciq" / "test.jsonl").read_bytes()).hexdigest()
        check(record["source"]["revision"] is None and record["source"]["files"]["test"]["sha256"] == want,
              f"--from-json record: {record['source']}")

    rc, _, stderr = run_cli("convert", "hellaswag", "winogrande", "--out", WORK / "cut", "--pool", "1",
                            "--limit", "2")
    if check(rc == 0, f"convert --pool 1 --limit 2 exits {rc}: {said(stderr)}"):
        check("normlab_tasks: note: hellaswag's pool is the first 1 of 2 train rows: few-shot examples are "
              "drawn from those alone, not the harness's" in stderr, f"--pool 1: no note in {stderr[-400:]!r}")
        for name in ("hellaswag", "winogrande"):
            full = (out / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
            n_pool = len(FIXTURES[name]["train"])
            cut = (WORK / "cut" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
            check(cut == full[:1] + full[n_pool:n_pool + 2], f"{name}: --pool 1 --limit 2 wrote {cut}")
            record = json.loads((WORK / "cut" / f"{name}.source.json").read_text(encoding="utf-8"))
            check(record["counts"]["pool"] == 1 and record["counts"]["scored"] == 2
                  and record["options"] == {"pool": 1, "limit": 2}, f"{name}: cut record {record['counts']}")
            whole = n_pool == 1  # winogrande's fixture pool is one row: the whole split
            check(record["fewshot"]["harness_prompts"] is whole, f"{name}: --pool 1: record {record['fewshot']}")
    # Issue 69.1: the default pool is the whole split (the harness samples all of it); a cut one is
    # said to give other prompts.
    big = WORK / "big_pool"  # more rows than the old default pool, 1000
    write_jsonl(big / "hellaswag" / "train.jsonl", [generated_row("hellaswag", i) for i in range(1001)])
    write_jsonl(big / "hellaswag" / "validation.jsonl", FIXTURES["hellaswag"]["validation"])
    rc, _, stderr = run_cli("convert", "hellaswag", "--out", WORK / "default_pool", "--from-json", big)
    if check(rc == 0, f"convert with the default pool exits {rc}: {said(stderr)}"):
        lines = (WORK / "default_pool" / "hellaswag.jsonl").read_text(encoding="utf-8").splitlines()
        n_pool = sum(1 for line in lines if json.loads(line).get("fewshot"))
        check(n_pool == 1001, f"the default pool: {n_pool} of the split's 1001 rows")
        record = json.loads((WORK / "default_pool" / "hellaswag.source.json").read_text(encoding="utf-8"))
        check(record["fewshot"] == {"draw": "K + 1 less the pool rows equal to the item (fewshot_exclude)",
                                    "harness_prompts": True} and "note:" not in stderr,
              f"default pool: record fewshot {record['fewshot']}, stderr {stderr[-300:]!r}")


def check_errors(data):
    """One `normlab_tasks: error:` line and exit 2 for each refusal, and no file left behind."""
    bad = WORK / "bad_rows"
    write_jsonl(bad / "hellaswag" / "train.jsonl", FIXTURES["hellaswag"]["train"])
    write_jsonl(bad / "hellaswag" / "validation.jsonl",
                FIXTURES["hellaswag"]["validation"][:1] + [dict(FIXTURES["hellaswag"]["validation"][1], label="")])
    known = ", ".join(normlab_tasks.TASKS)
    cases = [
        (("convert", "hellaswag", "nosuchtask", "--out", WORK / "e1"), ENV,
         f"normlab_tasks: error: unknown task 'nosuchtask' (known: {known})"),
        (("convert", "sciq", "--out", WORK / "e2"), dict(ENV, HF_DATASETS_CACHE=str(WORK / "empty_cache")),
         "normlab_tasks: error: could not load dataset allenai/sciq for sciq: "),
        (("convert", "arc_easy", "--out", WORK / "e3", "--revision", "fedcba9"), ENV,
         f"normlab_tasks: error: asked for allenai/ai2_arc (ARC-Easy) at revision fedcba9 but loaded {COMMIT}"),
        (("convert", "hellaswag", "--out", WORK / "e4", "--from-json", bad), ENV,
         "normlab_tasks: error: hellaswag: validation row 1: label '' is not an integer"),
        (("convert", "boolq", "--out", WORK / "e5", "--from-json", WORK / "nowhere"), ENV,
         "normlab_tasks: error: could not read boolq's train split from "),
    ]
    for args, env, want in cases:
        rc, _, stderr = run_cli(*args, env=env)
        lines = [line for line in stderr.splitlines() if line.startswith("normlab_tasks:")]
        check(rc == 2 and len(lines) == 1 and lines[0].startswith(want) and "Traceback" not in stderr,
              f"{' '.join(map(str, args[:3]))}: exit {rc}, {said(stderr)!r}; want {want!r}")
        left = list(Path(args[3]).glob("*.jsonl*")) + list(Path(args[3]).glob(".*.tmp"))
        check(not left, f"{args[1]}: a failed conversion left {left}")


# ---------------------------------------------------------------- the few-shot draw (issue 69.1)

DRAW_SHOTS, DRAW_SEED = 3, 1234  # simple_evaluate's fewshot_random_seed


def generated_row(name, i):
    """Row i of more made-up rows in TASK's fields, so that 3 of a pool can be drawn."""
    if name == "hellaswag":
        return hellaswag_row(100 + i, "Cooking", f"A cook stirs pot {i}.", "he", [
            f"adds salt {i}.", "leaves.", "sings.", "sleeps."], str(i % 4))
    if name == "piqa":
        return {"goal": f"To do task {i}", "sol1": f"way {i} one", "sol2": f"way {i} two", "label": i % 2}
    if name in ("arc_easy", "arc_challenge"):
        return arc_row(f"g{i}", f"Which is number {i}?", [f"{i}", "x", "y"], ["A", "B", "C"], "A")
    if name == "winogrande":
        return {"sentence": f"Tom met Ann at stop {i} so _ waved.", "option1": "Tom", "option2": "Ann",
                "answer": "12"[i % 2]}
    if name == "boolq":
        return {"question": f"is {i} even", "passage": f"The number {i}.", "idx": 100 + i, "label": (i + 1) % 2}
    if name == "openbookqa":
        return obqa_row(f"o{i}", f"Stem number {i}", ["a", "b", "c", "d"], "ABCD"[i % 4])
    if name == "sciq":
        return sciq_row(f"What is {i}?", "one", "two", "three", f"answer {i}", f"Support {i}.")
    return {"text": f"The story number {i} ends with word{i}"}


def draw_splits(name):
    """FIXTURES' rows and made-up ones: 5 more scored rows; the pool 8 more rows and two copies each of
    scored rows 0 and 1 (the harness drops them from an item's draw where it passes the document)."""
    task = normlab_tasks.TASKS[name]
    splits = {split: list(rows) for split, rows in FIXTURES[name].items()}
    splits[task.split] += [generated_row(name, 50 + i) for i in range(5)]
    if task.fewshot_split != task.split:
        scored = splits[task.split]
        splits[task.fewshot_split] += [generated_row(name, i) for i in range(8)] + [scored[0], scored[0], scored[1],
                                                                                    scored[1]]
    return splits


def draws_of(pool, scored, eval_doc_rule):
    """docs/downstream.md's draw: one Random(seed) per task, per item in order rnd.sample(pool, K); an
    item with fewshot_exclude (or every item, eval_doc_rule True) rnd.sample(pool, K + 1) less the
    listed pool lines, the first K kept, else rnd.sample(the pool less them, K). eval_doc_rule None:
    each line as it says; False: K alone."""
    r, out = random.Random(DRAW_SEED), []
    for item in scored:
        exclude = item.get("fewshot_exclude", []) if eval_doc_rule is not False else None
        if exclude is None or (eval_doc_rule is None and "fewshot_exclude" not in item):
            out.append(r.sample(range(len(pool)), DRAW_SHOTS))
            continue
        kept = [k for k in r.sample(range(len(pool)), DRAW_SHOTS + 1) if k not in exclude][:DRAW_SHOTS]
        if len(kept) < DRAW_SHOTS:
            kept = r.sample([k for k in range(len(pool)) if k not in exclude], DRAW_SHOTS)
        out.append(kept)
    return out


def check_draws():
    """Each real task YAML (default sampler) against the converted file and the documented draw."""
    data, yamls, out = WORK / "draw_data", WORK / "draw_yaml", WORK / "draw_out"
    yamls.mkdir()
    for name in FIXTURES:
        task = normlab_tasks.TASKS[name]
        splits = draw_splits(name)
        for split, rows in splits.items():
            write_jsonl(data / name / f"{split}.jsonl", rows)
        config = {"include": str(HARNESS_TASKS / task.yaml), "task": f"normlab_draw_{name}", "tag": [],
                  "dataset_path": "json", "dataset_name": None,
                  "dataset_kwargs": {"data_files": {s: str(data / name / f"{s}.jsonl") for s in splits}}}
        (yamls / f"normlab_draw_{name}.yaml").write_text(json.dumps(config, indent=1), encoding="utf-8")
    # The default pool: the whole split.
    rc, _, stderr = run_cli("convert", *FIXTURES, "--out", out, "--from-json", data)
    if not check(rc == 0, f"convert (draw rows) exits {rc}: {said(stderr)}"):
        return
    loaded = TaskManager(include_path=str(yamls)).load([f"normlab_draw_{name}" for name in FIXTURES])["tasks"]
    summary = []
    for name in FIXTURES:
        task, task_obj = normlab_tasks.TASKS[name], loaded[f"normlab_draw_{name}"]
        lines = [json.loads(line) for line in (out / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
        pool = [line for line in lines if line.get("fewshot")]
        scored = [line for line in lines if not line.get("fewshot")]
        # Where the harness passes the document (api/task.py fewshot_context), and which pool
        # documents equal it (samplers.py rm_eval_doc): its own task object says.
        passes = task_obj.fewshot_cfg.split == task_obj.config.test_split
        check(task.passes_eval_doc == passes, f"{name}: passes_eval_doc {task.passes_eval_doc}, the harness {passes}")
        pool_docs, eval_docs = list(task_obj.fewshot_docs()), list(task_obj.eval_docs)
        equal = [[j for j, d in enumerate(pool_docs) if d == doc] for doc in eval_docs]
        have = [line.get("fewshot_exclude") for line in scored]
        check(have == (equal if passes else [None] * len(scored)),
              f"{name}: fewshot_exclude {have}; the harness's pool documents equal to each item: "
              f"{equal if passes else 'none passed'}")
        task_obj.set_fewshot_seed(seed=DRAW_SEED)
        theirs = harness_requests(task_obj, DRAW_SHOTS)

        def agree(draws):
            return sum(normlab_requests(item, [pool[k] for k in draws[i]]) == theirs[i]
                       for i, item in enumerate(scored))

        n = len(scored)
        documented, k_rule, k1_rule = (agree(draws_of(pool, scored, rule)) for rule in (None, False, True))
        check(documented == n, f"{name}: {DRAW_SHOTS}-shot requests as docs/downstream.md draws them for "
                               f"{documented} of {n} items")
        wrong = k_rule if passes else k1_rule
        check(wrong < n, f"{name}: the draw is not armed: the {'K' if passes else 'K + 1'} rule gives the "
                         f"harness's requests for all {n} items")
        summary.append(f"{name} {documented}/{n} ({'K' if passes else 'K + 1'} rule: {wrong}/{n})")
    print(f"few-shot draw, {DRAW_SHOTS} shots, each YAML's default sampler, items as the harness draws them: "
          + ", ".join(summary))


def main():
    data, yamls, out = WORK / "data", WORK / "yaml", WORK / "out"
    yamls.mkdir()
    for name, splits in FIXTURES.items():
        task = normlab_tasks.TASKS[name]
        for split, rows in splits.items():
            write_jsonl(data / name / f"{split}.jsonl", rows)
        plant_hub_cache(WORK / "hf_cache", task, splits)
        write_harness_yaml(yamls, task, data)
    check(set(FIXTURES) == set(normlab_tasks.TASKS), "every task has fixture rows")

    manager = TaskManager(include_path=str(yamls))
    check_table(manager)
    references = harness_references(manager)
    # Through the Hub code path of datasets (the planted cache), every pool line.
    rc, stdout, stderr = run_cli("convert", *FIXTURES, "--out", out, "--pool", "all")
    if check(rc == 0, f"convert exits {rc}: {said(stderr)}"):
        check_written(out, references, stdout)
        check_options(data, out)
    check_errors(data)
    check_draws()
    print(f"task conversion: {len(FIXTURES)} tasks, {sum(len(r['gold']) for r in references.values())} items "
          f"and {sum(len(r['pool']) for r in references.values())} pool lines as lm_eval {lm_eval.__version__} "
          "builds them (0-shot and all-shot)")


if __name__ == "__main__":
    main()
    for f in failures:
        print("FAIL:", f)
    if failures:
        sys.exit(1)
    if OWN_WORK:
        shutil.rmtree(WORK)
    print("task conversion: OK")
