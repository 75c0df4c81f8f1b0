#!/usr/bin/env python3
"""Convert public task datasets into normlab's downstream task files (issue 58; docs/downstream.md).

    normlab_tasks.py convert hellaswag arc_easy lambada_openai --out tasks/
    normlab_tasks.py convert winogrande --out tasks/ --revision <commit> --pool all --limit 500
    normlab_tasks.py convert piqa --out tasks/ --from-json exported/    # offline: exported/piqa/<split>.jsonl
    normlab_tasks.py list

Each item is what lm-evaluation-harness scores for the task: its preprocessing (`process_docs`),
its prompt (`doc_to_text`), its choices and gold (`doc_to_choice`, `doc_to_target`), from the same
dataset, configuration and splits as its task YAML (`lm_eval/tasks/...`, version HARNESS_VERSION).
The conversions below are written out here, one pure function per task (a dataset row -> a normlab
item); tests/check_task_conversion.py checks them against the harness's own task objects.

DIR/TASK.jsonl holds the few-shot pool first (lines with "fewshot": true: the whole split the harness
draws few-shot examples from, in that split's order, or its first --pool N rows), then the scored
items in the order of the split the harness scores (its test split, else its validation split), at
most --limit. For a task whose YAML names neither a test split nor a few-shot split (hellaswag,
piqa, winogrande, boolq) the harness passes each scored document to its sampler, which draws K + 1
examples and drops those equal to the document: each scored line then carries "fewshot_exclude",
the pool indices of the rows equal to its row (normlab eval draws as the harness then). With a pool
cut by --pool the examples come from its rows alone: not the harness's prompts.
DIR/TASK.source.json records where they came from: the dataset, the splits, the Hub commit loaded,
the harness version and task YAML followed, the counts and the file's SHA-256.

Loading a Hub dataset needs `datasets` (it is the call the harness makes); --from-json needs nothing
beyond the standard library. Errors are one line, `normlab_tasks: error: ...`, exit 2.
"""
import argparse
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, Optional

# The harness release whose task YAMLs the conversions follow (checked against it by
# tests/check_task_conversion.py).
HARNESS_VERSION = "0.4.13"
DEFAULT_POOL = None  # the whole split, as the harness samples it


class TaskError(Exception):
    """A failure worth one line to the user."""


# ---------------------------------------------------------------- item builders and checks

def _multiple_choice(context, choices, gold):
    if not isinstance(context, str):
        raise ValueError(f"the context is {type(context).__name__}, not a string")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"the choices {choices!r} are not a non-empty list of strings")
    if not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ValueError(f"gold {gold!r} is not an index into {len(choices)} choices")
    return {"context": context, "choices": choices, "gold": gold}


def _label_index(value, n):
    # Labels arrive as ints (piqa, boolq) or strings of digits (hellaswag); an unlabelled split
    # (-1, "") is an error rather than a silently wrong gold.
    try:
        index = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"label {value!r} is not an integer") from None
    if not 0 <= index < n:
        raise ValueError(f"label {value!r} is not an index into {n} choices")
    return index


def _key_index(labels, key):
    if key not in labels:
        raise ValueError(f"answerKey {key!r} is not one of the choice labels {labels!r}")
    return labels.index(key)


# ---------------------------------------------------------------- one function per task

def _hellaswag_clean(text):
    # The WikiHow half of HellaSwag carries "[title]", "[header]", "[step]" markup: the harness
    # (hellaswag/utils.py) turns " [title]" into a sentence break, drops every other bracketed
    # tag, then replaces each pair of spaces by one (one pass: three spaces become two).
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def convert_hellaswag(doc):
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    choices = [_hellaswag_clean(ending) for ending in doc["endings"]]
    return _multiple_choice(_hellaswag_clean(doc["activity_label"] + ": " + ctx), choices,
                            _label_index(doc["label"], len(choices)))


def convert_piqa(doc):
    choices = [doc["sol1"], doc["sol2"]]
    return _multiple_choice(f"Question: {doc['goal']}\nAnswer:", choices,
                            _label_index(doc["label"], len(choices)))


def convert_arc(doc):
    choices = doc["choices"]
    return _multiple_choice(f"Question: {doc['question']}\nAnswer:", list(choices["text"]),
                            _key_index(list(choices["label"]), doc["answerKey"]))


def convert_winogrande(doc):
    # Partial scoring: one context per option (the sentence up to the blank, the option filled in),
    # one shared continuation (the rest of the sentence).
    sentence = doc["sentence"]
    blank = sentence.find("_")
    if blank < 0:
        raise ValueError("the sentence has no '_' blank")
    answers = {"1": 0, "2": 1}
    if doc["answer"] not in answers:
        raise ValueError(f"answer {doc['answer']!r} is not '1' or '2'")
    contexts = [sentence[:blank] + doc["option1"], sentence[:blank] + doc["option2"]]
    return {"contexts": contexts, "continuation": sentence[blank + 1:].strip(),
            "gold": answers[doc["answer"]]}


def convert_boolq(doc):
    return _multiple_choice(f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:", ["no", "yes"],
                            _label_index(doc["label"], 2))


def convert_openbookqa(doc):
    choices = doc["choices"]
    return _multiple_choice(doc["question_stem"], list(choices["text"]),
                            _key_index(list(choices["label"]), doc["answerKey"].lstrip()))


def convert_sciq(doc):
    # The harness lists the right answer last, always.
    choices = [doc["distractor1"], doc["distractor2"], doc["distractor3"], doc["correct_answer"]]
    context = f"{doc['support'].lstrip()}\nQuestion: {doc['question']}\nAnswer:"
    return _multiple_choice(context, choices, 3)


def convert_lambada(doc):
    # Split on single spaces, as the harness does: runs of spaces survive in the context.
    words = doc["text"].split(" ")
    # The continuation carries its space and is scored as given (the harness's loglikelihood type);
    # the default target delimiter " " joins only few-shot examples, as the harness joins them.
    return {"context": " ".join(words[:-1]), "continuation": " " + words[-1]}


@dataclass(frozen=True)
class Task:
    name: str
    yaml: str             # the harness task YAML it follows, under lm_eval/tasks/
    version: float        # that YAML's metadata version
    path: str             # its dataset_path and dataset_name
    config: Optional[str]
    split: str            # the split the harness scores: test_split, else validation_split
    fewshot_split: str    # where it draws examples: fewshot_split, else training_split, else the
                          # validation split, else the test split
    kind: str             # multiple_choice, partial or last_word (docs/downstream.md)
    convert: Callable[[dict], dict]
    # The harness passes each scored document to its few-shot sampler as eval_doc (api/task.py
    # fewshot_context: when its few-shot split equals test_split, both unset in these YAMLs): it
    # draws K + 1 and drops the documents equal to the scored one (api/samplers.py).
    passes_eval_doc: bool = False


TASKS = {t.name: t for t in [
    Task("hellaswag", "hellaswag/hellaswag.yaml", 1.0, "Rowan/hellaswag", None,
         "validation", "train", "multiple_choice", convert_hellaswag, passes_eval_doc=True),
    Task("piqa", "piqa/piqa.yaml", 1.0, "baber/piqa", None,
         "validation", "train", "multiple_choice", convert_piqa, passes_eval_doc=True),
    Task("arc_easy", "arc/arc_easy.yaml", 1.0, "allenai/ai2_arc", "ARC-Easy",
         "test", "train", "multiple_choice", convert_arc),
    Task("arc_challenge", "arc/arc_challenge.yaml", 1.0, "allenai/ai2_arc", "ARC-Challenge",
         "test", "train", "multiple_choice", convert_arc),
    Task("winogrande", "winogrande/default.yaml", 1.0, "allenai/winogrande", "winogrande_xl",
         "validation", "train", "partial", convert_winogrande, passes_eval_doc=True),
    Task("boolq", "super_glue/boolq/default.yaml", 2.0, "aps/super_glue", "boolq",
         "validation", "train", "multiple_choice", convert_boolq, passes_eval_doc=True),
    Task("openbookqa", "openbookqa/openbookqa.yaml", 1.0, "allenai/openbookqa", "main",
         "test", "train", "multiple_choice", convert_openbookqa),
    Task("sciq", "sciq/sciq.yaml", 1.0, "allenai/sciq", None,
         "test", "train", "multiple_choice", convert_sciq),
    # lambada_openai has only a test split: the harness draws its few-shot examples from it too.
    Task("lambada_openai", "lambada/lambada_openai.yaml", 1.0, "EleutherAI/lambada_openai", "default",
         "test", "test", "last_word", convert_lambada),
]}


# What the harness reports for each task: its YAML's metric_list (lm_eval 0.4.13), in order. `normlab
# eval --tasks` reads it from TASK.source.json ("format": "metrics") to tell the harness's metrics
# from its own (docs/downstream.md); checked against the harness by tests/check_task_conversion.py.
HARNESS_METRICS = {
    "hellaswag": ("acc", "acc_norm"), "piqa": ("acc", "acc_norm"), "arc_easy": ("acc", "acc_norm"),
    "arc_challenge": ("acc", "acc_norm"), "winogrande": ("acc",), "boolq": ("acc",),
    "openbookqa": ("acc", "acc_norm"), "sciq": ("acc", "acc_norm"), "lambada_openai": ("perplexity", "acc"),
}


def get_task(name):
    if name not in TASKS:
        raise TaskError(f"unknown task '{name}' (known: {', '.join(TASKS)})")
    return TASKS[name]


def _row_key(row):
    # Rows compare as the harness compares documents (dict equality); one schema per dataset, so
    # their canonical JSON is equal exactly when they are.
    return json.dumps(dict(row), sort_keys=True, ensure_ascii=False, default=repr)


def pool_index(pool_rows):
    """{row key: [pool indices]} of the pool's rows, for fewshot_exclude."""
    index = {}
    for i, row in enumerate(pool_rows):
        index.setdefault(_row_key(row), []).append(i)
    return index


def convert_rows(task, split, rows, fewshot=False, pool=None):
    """Yields the normlab items of `rows` (dicts of the dataset's fields), in order. With `pool`
    (pool_index of the few-shot rows written), each item carries fewshot_exclude: the indices of
    the pool rows equal to its row."""
    for i, row in enumerate(rows):
        try:
            item = task.convert(row)
        except KeyError as e:
            raise TaskError(f"{task.name}: {split} row {i}: no field {e}") from None
        except (ValueError, TypeError, AttributeError) as e:
            raise TaskError(f"{task.name}: {split} row {i}: {e}") from None
        if pool is not None:
            item["fewshot_exclude"] = pool.get(_row_key(row), [])
        yield {"fewshot": True, **item} if fewshot else item


# ---------------------------------------------------------------- loading

def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_jsonl(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise TaskError(f"{path}:{n}: not JSON ({e})") from None
    return rows


def load_from_json(task, directory):
    """Rows from DIR/TASK/SPLIT.jsonl, one dataset row a line (e.g. a split's `to_json`)."""
    splits, files = {}, {}
    for split in dict.fromkeys([task.fewshot_split, task.split]):
        path = os.path.join(directory, task.name, split + ".jsonl")
        try:
            splits[split] = _read_jsonl(path)
        except (OSError, UnicodeDecodeError) as e:
            raise TaskError(f"could not read {task.name}'s {split} split from {path}: "
                            f"{getattr(e, 'strerror', None) or e}") from None
        files[split] = {"path": os.path.abspath(path), "sha256": _sha256_file(path)}
    source = {"dataset_path": task.path, "dataset_name": task.config,
              "from_json": os.path.abspath(directory), "files": files, "revision": None,
              "revision_note": "unknown: rows read from local files (see their SHA-256)"}
    return splits, source


def _one_line(error):
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def load_from_hub(task, revision):
    """The task's splits as `datasets.load_dataset(path, name, revision=...)` loads them.

    Through its builder (what load_dataset runs) so that the Hub commit it resolved is known: the
    builder's hash is that commit's SHA, whether it came from the Hub or, offline, from the
    datasets cache (whose folder is named after it).
    """
    label = task.path + (f" ({task.config})" if task.config else "")
    try:
        import datasets
    except ImportError:
        raise TaskError(f"loading {label} needs the `datasets` package (pip install datasets), "
                        "or convert exported rows with --from-json") from None
    try:
        builder = datasets.load_dataset_builder(task.path, task.config, revision=revision)
        builder.download_and_prepare()
        splits = {s: builder.as_dataset(split=s) for s in dict.fromkeys([task.fewshot_split, task.split])}
    except Exception as e:  # any failure of the Hub, the cache or the files is one line
        raise TaskError(f"could not load dataset {label} for {task.name}"
                        f"{f' at revision {revision}' if revision else ''}: {_one_line(e)}") from None
    sha = builder.hash if isinstance(builder.hash, str) and re.fullmatch(r"[0-9a-f]{40}", builder.hash) else None
    from_cache = type(builder).__module__.startswith("datasets.packaged_modules.cache")
    if revision and sha and re.fullmatch(r"[0-9a-f]{7,40}", revision) and not sha.startswith(revision):
        # Offline, datasets takes the newest cached copy whatever revision was asked for.
        raise TaskError(f"asked for {label} at revision {revision} but loaded {sha} "
                        f"({'from the offline cache' if from_cache else 'from the Hub'})")
    note = "the Hub commit loaded" if sha else "unknown: datasets did not expose a commit"
    if from_cache:
        note += ", read from the local datasets cache (offline)"
        if revision and not re.fullmatch(r"[0-9a-f]{7,40}", revision):
            note += f"; whether it is {revision!r} could not be checked offline"
    source = {"dataset_path": task.path, "dataset_name": task.config, "revision_requested": revision,
              "revision": sha, "revision_note": note, "datasets_version": datasets.__version__}
    return splits, source


# ---------------------------------------------------------------- writing

def _write_atomic(path, lines):
    """Writes the lines (str, without newline) to path via a temporary file; returns its SHA-256."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            for line in lines:
                data = (line + "\n").encode("utf-8")
                h.update(data)
                f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return h.hexdigest()


def _harness_installed():
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("lm_eval")
    except (ImportError, PackageNotFoundError):
        return None


def convert_task(task, out_dir, revision=None, pool=DEFAULT_POOL, limit=None, from_json=None):
    """Writes OUT/TASK.jsonl and OUT/TASK.source.json; returns the record."""
    if from_json and revision:
        raise TaskError("--revision names a Hub commit; it does not apply to --from-json")
    splits, source = load_from_json(task, from_json) if from_json else load_from_hub(task, revision)
    pool_rows, scored_rows = splits[task.fewshot_split], splits[task.split]
    n_pool = len(pool_rows) if pool is None else min(pool, len(pool_rows))
    n_scored = len(scored_rows) if limit is None else min(limit, len(scored_rows))

    def rows(data, n):
        # The first n rows of a list or of a datasets.Dataset (whose select keeps the split's order).
        return data.select(range(n)) if hasattr(data, "select") else data[:n]

    def lines():
        pool = rows(pool_rows, n_pool)
        yield from (json.dumps(item, ensure_ascii=False)
                    for item in convert_rows(task, task.fewshot_split, pool, fewshot=True))
        index = pool_index(pool) if task.passes_eval_doc else None
        yield from (json.dumps(item, ensure_ascii=False)
                    for item in convert_rows(task, task.split, rows(scored_rows, n_scored), pool=index))

    file_name = task.name + ".jsonl"
    try:
        os.makedirs(out_dir, exist_ok=True)
        sha = _write_atomic(os.path.join(out_dir, file_name), lines())
    except UnicodeEncodeError as e:
        raise TaskError(f"{task.name}: a row holds text that is not valid Unicode ({e.reason})") from None
    except OSError as e:
        raise TaskError(f"could not write {os.path.join(out_dir, file_name)}: {e.strerror or e}") from None
    record = {
        "task": task.name,
        "file": file_name,
        "sha256": sha,
        "kind": task.kind,
        "format": {"harness": "lm-evaluation-harness", "version": HARNESS_VERSION,
                   "task_yaml": "lm_eval/tasks/" + task.yaml, "task_version": task.version,
                   "metrics": list(HARNESS_METRICS[task.name]),
                   "lm_eval_installed": _harness_installed()},
        "source": {**source, "split": task.split, "fewshot_split": task.fewshot_split},
        "counts": {"pool": n_pool, "pool_available": len(pool_rows),
                   "scored": n_scored, "scored_available": len(scored_rows)},
        # How normlab eval --shots draws each item's examples, and whether they are the harness's.
        "fewshot": {"draw": "K + 1 less the pool rows equal to the item (fewshot_exclude)"
                            if task.passes_eval_doc else "K",
                    "harness_prompts": n_pool == len(pool_rows)},
        "options": {"pool": "all" if pool is None else pool, "limit": limit},
    }
    record_path = os.path.join(out_dir, task.name + ".source.json")
    try:
        _write_atomic(record_path, [json.dumps(record, indent=2, ensure_ascii=False)])
    except OSError as e:
        raise TaskError(f"could not write {record_path}: {e.strerror or e}") from None
    return record


# ---------------------------------------------------------------- command line

def _pool_arg(text):
    if text == "all":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not a count or 'all'")
    return int(text)


def _count_arg(text):
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive count")
    return int(text)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(2, f"normlab_tasks: error: {message}\n")


def main(argv=None):
    parser = _Parser(prog="normlab_tasks.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    convert = commands.add_parser("convert", help="write OUT/TASK.jsonl and OUT/TASK.source.json")
    convert.add_argument("tasks", nargs="+", metavar="TASK", help="one of: " + ", ".join(TASKS))
    convert.add_argument("--out", required=True, metavar="DIR", help="where TASK.jsonl and TASK.source.json go")
    convert.add_argument("--revision", metavar="REV", help="a Hub commit, branch or tag (default: main)")
    convert.add_argument("--pool", type=_pool_arg, default=DEFAULT_POOL, metavar="N",
                         help="few-shot pool lines: 'all' (default: the whole split, as the harness "
                              "samples it) or its first N rows (then the examples are not the harness's)")
    convert.add_argument("--limit", type=_count_arg, metavar="N", help="score only the first N items")
    convert.add_argument("--from-json", metavar="DIR",
                         help="read DIR/TASK/SPLIT.jsonl (dataset rows) instead of the Hub")
    commands.add_parser("list", help="the tasks, their datasets and splits")
    args = parser.parse_args(argv)

    if args.command == "list":
        for t in TASKS.values():
            name = t.path + (f" {t.config}" if t.config else "")
            draw = "K+1 less the item" if t.passes_eval_doc else "K"
            print(f"{t.name:15} {name:35} scored: {t.split:10} pool: {t.fewshot_split:6} draws: {draw:17} {t.yaml}")
        return 0
    try:
        tasks = [get_task(name) for name in args.tasks]
        for task in tasks:
            record = convert_task(task, args.out, args.revision, args.pool, args.limit, args.from_json)
            counts = record["counts"]
            print(f"{task.name}: {counts['scored']} items, {counts['pool']} few-shot pool lines -> "
                  f"{os.path.join(args.out, record['file'])} (sha256 {record['sha256'][:12]}, "
                  f"revision {record['source']['revision'] or 'unknown'})")
            if not record["fewshot"]["harness_prompts"]:
                print(f"normlab_tasks: note: {task.name}'s pool is the first {counts['pool']} of "
                      f"{counts['pool_available']} {task.fewshot_split} rows: few-shot examples are drawn "
                      "from those alone, not the harness's", file=sys.stderr)
    except TaskError as e:
        print(f"normlab_tasks: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
