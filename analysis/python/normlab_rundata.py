"""Reads normlab run and sweep directories (the trainer's output) for the plot and report scripts.

A run directory holds manifest.resolved.toml, status.json, env.json, train.jsonl and
analysis.csv (or analysis.jsonl), and eval/ablate.<split>.<checkpoint>.csv after `normlab ablate`.
A sweep directory holds sweep.json and one run directory per run.
Every missing required file or malformed line is a DataError naming the file (and line), never a
traceback: every file is read through _read_bytes (a folder in its place, a FIFO), _decode (not
UTF-8) and _loads (JSON nested too deeply); an "update" must be a non-negative integer.
Standard library only (tomllib needs Python 3.11).
"""
import csv
import glob
import io
import json
import math
import os
import re
import stat
import tomllib
from collections import defaultdict

ANALYSIS_FIELDS = ["update", "metric", "stack", "layer", "sublayer", "value"]
ABLATE_FIELDS = ["stack", "layer", "nll", "delta_nll", "ppl"]  # core/src/commands/eval_command.cpp
STACKS = ("encoder", "decoder")


class DataError(Exception):
    """A missing or malformed input file; the message names the file."""


def _read_bytes(path, missing="missing"):
    """The bytes of a regular file. A folder, FIFO or device in its place is an error: opening
    one fails with an OSError, blocks, or reads forever."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise DataError(f"{path}: {what}, expected a file")
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: {missing}") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None


def _decode(path, data):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: not UTF-8 text") from None


def _loads(text):
    """json.loads, where nesting deeper than Python's recursion limit and an escaped half of a
    surrogate pair ("\\ud800", which no UTF-8 file, figure or report can hold) are ValueErrors."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if "\\u" in text:
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a \\u escape of half a surrogate pair, not a character") from None
    return obj


def _read_json(path):
    text = _decode(path, _read_bytes(path))
    try:
        return _loads(text)
    except ValueError as e:  # JSONDecodeError, nesting, an integer of more than 4300 digits
        raise DataError(f"{path}: malformed JSON: {e}") from None


def _show(v):
    """A value for an error message: short, on one line."""
    text = repr(v) if isinstance(v, float) else json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def is_update(v):
    """An update number as the trainer writes it: a non-negative integer (not a bool, a float
    such as 1e400 = inf, or a string such as "NaN")."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _read_jsonl(path, notes):
    """(line number, object) of each record of a JSON-lines file. A truncated last line (a run
    still writing, or killed mid-line) is dropped with a note; any other bad line is an error
    naming file and line, so is an "update" that is not a non-negative integer."""
    out = []
    lines = _read_bytes(path).split(b"\n")
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        cut = i == len(lines)  # no newline after it
        try:
            obj = _loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            if cut and e.reason == "unexpected end of data":  # cut inside a multi-byte character
                notes.append(f"{path}:{i}: ignoring a partly written last line")
                continue
            raise DataError(f"{path}:{i}: not UTF-8 text") from None
        except json.JSONDecodeError as e:
            if cut:
                notes.append(f"{path}:{i}: ignoring a partly written last line")
                continue
            raise DataError(f"{path}:{i}: malformed JSON line: {e}") from None
        except ValueError as e:
            raise DataError(f"{path}:{i}: malformed JSON line: {e}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{i}: expected a JSON object, got {type(obj).__name__}")
        if "update" in obj and not is_update(obj["update"]):
            raise DataError(f"{path}:{i}: \"update\" must be a non-negative integer, got {_show(obj['update'])}")
        out.append((i, obj))
    return out


def _number(v):
    """JSON numbers, plus the strings nan/inf a writer may use for non-finite values."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def spike_score(series, window=1000, sigmas=7.0, min_previous=20):
    """OLMo 2's spike score (docs/analysis.md#loss-spikes), as core/src/train/spike_score.cpp
    computes it (the same sums in the same order): (percent or None when nothing was scored,
    [indices of the spikes], values scored). Each finite value with at least `min_previous` finite
    values before it is scored against the mean and population std of the last `window` of them: a
    spike when |x - mean| >= sigmas * std and x != mean. Non-finite values (and None) are skipped."""
    finite = [i for i, v in enumerate(series) if v is not None and math.isfinite(v)]
    spikes, scored = [], 0
    if not finite:
        return None, spikes, scored
    window = max(window, 1)
    st = {"shift": series[finite[0]], "sum": 0.0, "sq": 0.0}

    def resum(lo, hi):  # finite[lo:hi], about its median
        vals = sorted(series[finite[j]] for j in range(lo, hi))
        st["shift"], st["sum"], st["sq"] = vals[len(vals) // 2], 0.0, 0.0
        for j in range(lo, hi):
            d = series[finite[j]] - st["shift"]
            st["sum"] += d
            st["sq"] += d * d

    for k in range(len(finite)):
        n = min(k, window)
        if n > 0 and k % window == 0:
            resum(k - n, k)
        x = series[finite[k]] - st["shift"]
        if n >= min_previous and n > 0:
            mean = st["sum"] / n
            var = max(0.0, st["sq"] / n - mean * mean)
            d = abs(x - mean)
            scored += 1
            if d > 0 and d >= sigmas * math.sqrt(var):
                spikes.append(finite[k])
        st["sum"] += x
        st["sq"] += x * x
        if k >= window:
            old = series[finite[k - window]] - st["shift"]
            st["sum"] -= old
            st["sq"] -= old * old
            if old * old > 1e6 * st["sq"]:
                resum(k + 1 - window, k + 1)
    return (100.0 * len(spikes) / scored if scored else None), spikes, scored


class Analysis:
    """Rows (update, metric, stack, layer, sublayer, value) indexed by metric and by quantity."""

    def __init__(self, rows):
        self.by_metric = defaultdict(list)
        self._by_key = None
        for r in rows:
            self.by_metric[r[1]].append(r)
        for rs in self.by_metric.values():
            rs.sort(key=lambda r: r[0])

    def has(self, metric):
        return bool(self.by_metric.get(metric))

    def rows(self, metric):
        return self.by_metric.get(metric, [])

    def updates(self, metric):
        return sorted({r[0] for r in self.rows(metric)})

    def keys(self, metric):
        """The (stack, layer, sublayer) triples recorded for a metric, sorted."""
        return sorted({(r[2], r[3], r[4]) for r in self.rows(metric)})

    def series(self, metric, stack, layer, sublayer):
        """(updates, values) of one quantity over time."""
        if self._by_key is None:
            self._by_key = defaultdict(list)
            for rs in self.by_metric.values():
                for r in rs:
                    self._by_key[(r[1], r[2], r[3], r[4])].append((r[0], r[5]))
        pts = self._by_key.get((metric, stack, layer, sublayer), [])
        return [p[0] for p in pts], [p[1] for p in pts]

    def at(self, metric, update):
        """{(stack, layer, sublayer): value} of one metric at one update."""
        return {(r[2], r[3], r[4]): r[5] for r in self.rows(metric) if r[0] == update}

    def nearest_update(self, metric, update):
        ups = self.updates(metric)
        if not ups:
            return None
        return min(ups, key=lambda u: (abs(u - update), u))


def read_analysis(run_dir, notes):
    """analysis.csv, else analysis.jsonl, else None (with a note)."""
    csv_path = os.path.join(run_dir, "analysis.csv")
    jsonl_path = os.path.join(run_dir, "analysis.jsonl")
    rows = []
    if os.path.exists(csv_path):
        reader = csv.reader(io.StringIO(_decode(csv_path, _read_bytes(csv_path)), newline=""))
        try:
            header = next(reader, None)
            if header is None:
                return Analysis([])
            if [h.strip() for h in header] != ANALYSIS_FIELDS:
                raise DataError(f"{csv_path}:1: expected the header {','.join(ANALYSIS_FIELDS)}, "
                                f"got {_show(','.join(header))}")
            for row in reader:
                if not row:
                    continue
                line = reader.line_num
                if len(row) != 6:
                    raise DataError(f"{csv_path}:{line}: expected 6 fields, got {len(row)}")
                update, layer = _csv_int(row[0]), _csv_int(row[3])
                if update is None or update < 0:
                    raise DataError(f"{csv_path}:{line}: update must be a non-negative integer, got {_show(row[0])}")
                if layer is None:
                    raise DataError(f"{csv_path}:{line}: layer must be an integer, got {_show(row[3])}")
                try:
                    rows.append((update, row[1], row[2], layer, row[4], float(row[5])))
                except ValueError:
                    raise DataError(f"{csv_path}:{line}: value must be a number, got {_show(row[5])}") from None
        except csv.Error as e:  # e.g. a field over csv's size limit
            raise DataError(f"{csv_path}:{reader.line_num}: {e}") from None
        return Analysis(rows)
    if os.path.exists(jsonl_path):
        for i, obj in _read_jsonl(jsonl_path, notes):
            try:
                v = _number(obj["value"])
                # strict types: int() would take 2.5 or true, and fail on inf with OverflowError
                if not is_update(obj["update"]) or not _is_int(obj["layer"]) or not all(
                        isinstance(obj[k], str) for k in ("metric", "stack", "sublayer")):
                    raise ValueError
                rows.append((obj["update"], obj["metric"], obj["stack"], obj["layer"], obj["sublayer"],
                             v if v is not None else math.nan))
            except KeyError as e:
                raise DataError(f"{jsonl_path}:{i}: missing field {e}") from None
            except ValueError:
                raise DataError(f"{jsonl_path}:{i}: expected update and layer integers, metric, stack "
                                f"and sublayer strings") from None
        return Analysis(rows)
    notes.append(f"{run_dir}: no analysis.csv or analysis.jsonl (analysis figures skipped for this run)")
    return None


def read_ablation(run_dir):
    """(file name, [(stack, layer, delta_nll)]) of the last eval/ablate.*.csv (`normlab ablate`),
    without the full model's row "none"; None without one. Read here with the run, so a bad file is
    one error before plot/report claim --out."""
    files = sorted(glob.glob(os.path.join(glob.escape(run_dir), "eval", "ablate.*.csv")))
    if not files:
        return None
    path, rows = files[-1], []
    reader = csv.reader(io.StringIO(_decode(path, _read_bytes(path)), newline=""))
    try:
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != ABLATE_FIELDS:
            raise DataError(f"{path}:1: expected the header {','.join(ABLATE_FIELDS)}, "
                            f"got {_show(','.join(header)) if header is not None else 'an empty file'}")
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            if len(row) != len(ABLATE_FIELDS):
                raise DataError(f"{path}:{line}: expected {len(ABLATE_FIELDS)} fields, got {len(row)}")
            if row[0] not in ("none",) + STACKS:
                raise DataError(f"{path}:{line}: stack must be none, encoder or decoder, got {_show(row[0])}")
            layer = _csv_int(row[1])
            if layer is None or layer < (-1 if row[0] == "none" else 0):
                raise DataError(f"{path}:{line}: layer must be an integer >= 0 (-1 for none), got {_show(row[1])}")
            for name, text in zip(ABLATE_FIELDS[2:], row[2:]):
                try:
                    float(text)
                except ValueError:
                    raise DataError(f"{path}:{line}: {name} must be a number, got {_show(text)}") from None
            if row[0] != "none":
                rows.append((row[0], layer, float(row[3])))
    except csv.Error as e:  # e.g. a field over csv's size limit, a NUL byte
        raise DataError(f"{path}:{reader.line_num}: {e}") from None
    return os.path.basename(path), rows


def read_offline_tasks(run_dir):
    """Every `normlab eval --tasks` call's results, eval/tasks.*.json (issue 68.6: one file per call,
    named by its tasks, shots and limit), sorted by file name: [{"file", "checkpoint", "shots",
    "limit", "seed", "tasks": {name: metrics}}], the item scores left out."""
    out = []
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "eval", "tasks.*.json"))):
        obj = _read_json(path)
        tasks = obj.get("tasks") if isinstance(obj, dict) else None
        if not isinstance(tasks, dict) or not all(isinstance(t, dict) for t in tasks.values()):
            raise DataError(f"{path}: expected an object with \"tasks\" an object of task results "
                            f"(normlab eval --tasks), got {_show(tasks if isinstance(obj, dict) else obj)}")
        out.append({"file": os.path.basename(path), "checkpoint": obj.get("checkpoint"),
                     "shots": obj.get("shots"), "limit": obj.get("limit"), "seed": obj.get("seed"),
                     "tasks": {n: {k: v for k, v in t.items() if k != "item_scores"} for n, t in tasks.items()}})
    return out


def _read_manifest(path):
    """manifest.resolved.toml, with the keys the scripts use checked for type."""
    text = _decode(path, _read_bytes(path, "missing (not a normlab run directory?)"))
    try:
        m = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DataError(f"{path}: malformed TOML: {e}") from None
    except RecursionError:
        raise DataError(f"{path}: malformed TOML: nested too deeply") from None
    for table in ("model", "scheme", "run"):
        if not isinstance(m.get(table, {}), dict):
            raise DataError(f"{path}: [{table}] must be a table")
    model = m.get("model", {})
    for key, low in (("enc_layers", 0), ("dec_layers", 0), ("d_model", 1)):
        if key in model and not (_is_int(model[key]) and model[key] >= low):
            raise DataError(f"{path}: model.{key} must be an integer >= {low}, got {_show(model[key])}")
    for table, key in (("model", "arch"), ("scheme", "name")):
        if not isinstance(m.get(table, {}).get(key, ""), str):
            raise DataError(f"{path}: {table}.{key} must be a string")
    return m


class Run:
    """One run directory, read eagerly."""

    def __init__(self, path, sweep_id=None, sweep_values=None, notes=None):
        self.path = os.path.normpath(path)
        self.sweep_id = sweep_id
        self.sweep_values = sweep_values or {}
        self.notes = notes if notes is not None else []
        manifest_path = os.path.join(path, "manifest.resolved.toml")
        self.manifest = _read_manifest(manifest_path)
        status_path = os.path.join(path, "status.json")
        self.status = _read_json(status_path)
        if not isinstance(self.status, dict) or "status" not in self.status:
            raise DataError(f"{status_path}: no \"status\" field")
        if self.status.get("updates") is not None and not is_update(self.status["updates"]):
            raise DataError(f"{status_path}: \"updates\" must be a non-negative integer, got "
                            f"{_show(self.status['updates'])}")
        env_path = os.path.join(path, "env.json")
        self.env = _read_json(env_path) if os.path.exists(env_path) else {}
        if not isinstance(self.env, dict) or not isinstance(self.env.get("scheme", {}), dict):
            raise DataError(f"{env_path}: expected an object (with \"scheme\" an object)")
        dist = self.env.get("distributed")
        if dist is not None and not (isinstance(dist, dict) and is_update(dist.get("world_size"))
                                     and dist["world_size"] >= 1):
            raise DataError(f"{env_path}: \"distributed\" must be an object with \"world_size\" a positive "
                            f"integer, got {_show(dist)}")
        self.train, self.valid, self.diverged = [], [], None
        self.tasks = []  # downstream tasks scored in the loop (eval.tasks): one record per task
        self.test = None  # the test score taken at the end of training (eval.test_beam)
        train_path = os.path.join(path, "train.jsonl")
        if os.path.exists(train_path):
            for line, rec in _read_jsonl(train_path, self.notes):
                kind = rec.get("kind")
                if kind in ("train", "valid", "diverged", "test", "task") and "update" not in rec:
                    raise DataError(f"{train_path}:{line}: a \"{kind}\" record without \"update\"")
                if kind == "task" and not isinstance(rec.get("task"), str):
                    raise DataError(f"{train_path}:{line}: a \"task\" record without its task's name "
                                    f"(\"task\": a string), got {_show(rec.get('task'))}")
                # The x axis of the downstream figure (a key there): the count the trainer writes.
                if kind == "task" and "tokens" in rec and not is_update(rec["tokens"]):
                    raise DataError(f"{train_path}:{line}: \"tokens\" of a \"task\" record must be a "
                                    f"non-negative integer, got {_show(rec['tokens'])}")
                if kind == "train":
                    self.train.append(rec)
                elif kind == "valid":
                    self.valid.append(rec)
                elif kind == "diverged":
                    self.diverged = rec
                elif kind == "test":
                    self.test = rec
                elif kind == "task":
                    self.tasks.append(rec)
        elif self.state != "failed":  # a run that failed early may have written nothing
            self.notes.append(f"{train_path}: missing (no loss curves for this run)")
        self.analysis = read_analysis(path, self.notes if self.state != "failed" else [])
        self.ablation = read_ablation(path)
        self.offline_tasks = read_offline_tasks(path)
        self.label = self.sweep_id or self.default_label()

    # --- manifest facts ---------------------------------------------------------------------
    def model(self, key, default=None):
        return self.manifest.get("model", {}).get(key, default)

    @property
    def scheme(self):
        name = self.manifest.get("scheme", {}).get("name")
        return name or self.env.get("scheme", {}).get("name", "?")

    @property
    def arch(self):
        return self.model("arch", "encdec")

    @property
    def dtype(self):
        """run.dtype: the precision the forward pass trained in (fp32 unless said)."""
        return str(self.manifest.get("run", {}).get("dtype", "fp32"))

    @property
    def world_size(self):
        """Data-parallel ranks (env.json "distributed"; 1 without): each takes its own batches, so
        the update's batch is optim.update_freq x ranks of optim.max_tokens."""
        dist = self.env.get("distributed")
        return dist["world_size"] if isinstance(dist, dict) else 1

    @property
    def d_model(self):
        return self.model("d_model")

    @property
    def enc_layers(self):
        return 0 if self.arch == "lm" else int(self.model("enc_layers", 0))

    @property
    def dec_layers(self):
        return int(self.model("dec_layers", 0))

    @property
    def stacks(self):
        return ("decoder",) if self.arch == "lm" else STACKS

    def depth_text(self):
        if self.arch == "lm":
            return f"{self.dec_layers}L"
        return f"{self.enc_layers}L-{self.dec_layers}L"

    def depth_value(self):
        """Layers per stack when both stacks are equal (or the LM's layers), else N+M."""
        if self.arch == "lm" or self.enc_layers == self.dec_layers:
            return self.dec_layers
        return self.enc_layers + self.dec_layers

    def legend_label(self):
        """The label, plus where the run stopped when it did not complete."""
        k = self.diverged_at()
        if k is not None:
            return f"{self.label} (diverged @{k})"
        u = self.status.get("updates")
        if self.state in ("running", "interrupted") and u is not None:
            return f"{self.label} ({self.state} @{u})"
        return self.label

    def default_label(self):
        return f"{self.scheme} {self.depth_text()}"

    # --- status -------------------------------------------------------------------------------
    @property
    def state(self):
        return str(self.status.get("status"))

    def diverged_at(self):
        if self.diverged is not None and self.diverged.get("update") is not None:
            return int(self.diverged["update"])
        if self.state == "diverged":
            u = self.status.get("updates")
            return int(u) if u is not None else None
        return None

    def status_text(self):
        s, note = self.state, str(self.status.get("note") or "").strip()
        updates = self.status.get("updates")
        # "completed" says the run reached its end, nothing about its quality (a 60-update run at
        # BLEU 0 completes too); early stopping is the one stated criterion (eval.patience).
        if s == "completed":
            return "completed"
        if s == "stopped_early":
            return f"stopped early at update {updates} (eval.patience: no better validation)"
        if s == "diverged":
            k = self.diverged_at()
            return f"diverged at update {k}" if k is not None else "diverged"
        if s == "failed":
            return f"failed: {note}" if note else "failed"
        if s == "interrupted":
            return f"interrupted at update {updates}" if updates is not None else "interrupted"
        if s == "running":
            return f"running (update {updates})" if updates is not None else "running"
        return s

    # --- summaries ----------------------------------------------------------------------------
    def best_valid(self):
        """(lowest nll, highest BLEU, the update of the best validation) over the logged validations;
        the best is by the run's own run.checkpoint_save_best, the one best.safetensors holds: the
        highest BLEU where it is "bleu", else the lowest nll (the first of equals, as the trainer
        marks them). Nones where there is none."""
        vals = [v for v in self.valid if _finite(_number(v.get("nll")))]
        if not vals:
            return None, None, None
        lowest = min(vals, key=lambda v: _number(v["nll"]))
        with_bleu = [v for v in vals if _finite(_number(v.get("bleu")))]
        highest = max(with_bleu, key=lambda v: _number(v["bleu"])) if with_bleu else None
        by_bleu = self.manifest.get("run", {}).get("checkpoint_save_best", "valid_nll") == "bleu"
        best = highest if by_bleu and highest is not None else lowest
        return (_number(lowest["nll"]), None if highest is None else _number(highest["bleu"]),
                best.get("update"))

    def min_valid_nll(self):
        vals = [_number(v.get("nll")) for v in self.valid]
        vals = [v for v in vals if _finite(v)]
        return min(vals) if vals else None

    def tokens_per_s(self):
        vals = [_number(t.get("tokens_per_s")) for t in self.train]
        vals = [v for v in vals if _finite(v)]
        return sum(vals) / len(vals) if vals else None

    def tokens_seen(self):
        """Target tokens trained on by the last logged update (None: not logged)."""
        for t in reversed(self.train):
            n = t.get("tokens")
            if is_update(n):
                return n
        return None

    def task_names(self):
        """The tasks scored in the loop, in the order first recorded."""
        return list(dict.fromkeys(t["task"] for t in self.tasks))

    def last_tasks(self):
        """{task: its record} of the newest update at which every task was scored, and that
        update; ({}, None) without task records."""
        names = self.task_names()
        by_update = {}
        for t in self.tasks:
            by_update.setdefault(t.get("update"), {})[t["task"]] = t
        done = [u for u, recs in by_update.items() if is_update(u) and set(recs) == set(names)]
        if not done:
            return {}, None
        u = max(done)
        return by_update[u], u

    def task_average(self):
        """The mean of the tasks' acc at the newest complete task evaluation, or None."""
        recs, _ = self.last_tasks()
        accs = [_number(r.get("acc")) for r in recs.values()]
        accs = [a for a in accs if _finite(a)]
        return sum(accs) / len(accs) if accs and len(accs) == len(recs) else None

    def spike_scores(self):
        """{"loss": ..., "gnorm": ...}, each spike_score() of the train records' nll / gnorm (the
        spike indices index self.train), as the run's summary record has them."""
        def series(key):
            return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
                    for v in (t.get(key) for t in self.train)]
        return {"loss": spike_score(series("nll")), "gnorm": spike_score(series("gnorm"))}

    def last_train_nll(self):
        for t in reversed(self.train):
            v = _number(t.get("nll"))
            if _finite(v):
                return v
        return None


def harness_metrics_of(rec):
    """(the metrics lm-evaluation-harness reports for a task result, assumed): the record's
    "harness_metrics" (issue 69.2), else the harness's defaults for its output type (a last-word
    task: perplexity, acc; a multiple-choice one: acc, acc_norm), assumed = True."""
    m = rec.get("harness_metrics")
    if isinstance(m, list) and m and all(isinstance(x, str) for x in m):
        return list(m), False
    return (["perplexity", "acc"] if task_kind(rec) == "last_word" else ["acc", "acc_norm"]), True


def task_kind(rec):
    """multiple_choice or last_word: "task_kind" in train.jsonl (whose "kind" is "task"), "kind" in
    eval/tasks.*.json."""
    return rec.get("task_kind", rec.get("kind"))


def _finite(v):
    return v is not None and math.isfinite(v)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _csv_int(text):
    """An integer field as the trainer writes it, else None (int() would take 1_000 or ' 7')."""
    return int(text) if re.fullmatch(r"-?[0-9]{1,18}", text) else None


class Sweep:
    def __init__(self, path, info):
        self.path = os.path.normpath(path)
        self.info = info
        self.name = info.get("name") or os.path.basename(self.path)
        self.manifest_path = info.get("manifest")

    def manifest_text(self):
        """The sweep manifest's text, or None when it cannot be found."""
        p = self.manifest_path
        if not p:
            return None
        for cand in (p, os.path.join(self.path, p), os.path.join(self.path, os.path.basename(p))):
            if os.path.isfile(cand):
                try:
                    with open(cand, encoding="utf-8", errors="replace") as f:
                        return f.read()
                except OSError:  # unreadable: shown as not found, the report goes on
                    return None
        return None


class Missing:
    """A sweep entry whose run directory holds no run yet."""

    def __init__(self, path, sweep_id, values, why):
        self.path, self.label, self.sweep_id, self.sweep_values, self.why = path, sweep_id, sweep_id, values, why


def load(paths):
    """Expands run and sweep directories. Returns (runs, missing, sweeps, notes): runs in the given
    order (a sweep's in its index order); missing = sweep entries without a run yet."""
    runs, missing, sweeps, notes = [], [], [], []
    for p in paths:
        if not os.path.isdir(p):
            raise DataError(f"{p}: no such directory")
        sweep_json = os.path.join(p, "sweep.json")
        if os.path.exists(sweep_json):
            info = _read_json(sweep_json)
            if not isinstance(info, dict) or not isinstance(info.get("runs"), list):
                raise DataError(f"{sweep_json}: expected an object with a \"runs\" list")
            for key in ("name", "manifest"):
                if not isinstance(info.get(key) or "", str):
                    raise DataError(f"{sweep_json}: \"{key}\" must be a string")
            for i, entry in enumerate(info["runs"]):  # checked before sorting by index
                if not isinstance(entry, dict) or not isinstance(entry.get("dir"), str) or not entry["dir"]:
                    raise DataError(f"{sweep_json}: runs[{i}] has no \"dir\" string")
                if not _is_int(entry.get("index", 0)) or not isinstance(entry.get("values") or {}, dict):
                    raise DataError(f"{sweep_json}: runs[{i}]: \"index\" must be an integer, "
                                    f"\"values\" an object")
            sweep = Sweep(p, info)
            sweeps.append(sweep)
            entries = sorted(info["runs"], key=lambda r: r.get("index", 0))
            for entry in entries:
                rdir = os.path.join(p, entry["dir"])
                rid = str(entry.get("id") or entry["dir"])
                values = entry.get("values") or {}
                if not os.path.exists(os.path.join(rdir, "status.json")):
                    why = "not started" if not os.path.isdir(rdir) else "no status.json yet"
                    missing.append(Missing(rdir, rid, values, why))
                    notes.append(f"{rdir}: {why}; skipped")
                    continue
                runs.append(Run(rdir, sweep_id=rid, sweep_values=values, notes=notes))
        elif any(os.path.exists(os.path.join(p, f)) for f in
                 ("manifest.resolved.toml", "status.json", "train.jsonl")):
            runs.append(Run(p, notes=notes))  # a run directory: names what it lacks
        else:
            raise DataError(f"{p}: neither a run directory (no manifest.resolved.toml) nor a sweep "
                            f"directory (no sweep.json)")
    _dedupe_labels(runs)
    return runs, missing, sweeps, notes


def safe_name(text):
    """`text` as a file name: every run of characters outside [A-Za-z0-9._-] becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


def _dedupe_labels(runs):
    """Labels that tell the runs apart — equal ones get the shortest end of their paths that differs
    (two sweeps with the same run ids: `id (sweepA/id)`, `id (sweepB/id)`), the same folder given
    twice a number — and file stems (`file_stem`) that do too, after safe_name (`x y` and `x_y`)."""
    groups = defaultdict(list)
    for r in runs:
        groups[r.label].append(r)
    for label, same in groups.items():
        if len(same) < 2:
            continue
        parts = [os.path.abspath(r.path).split(os.sep) for r in same]
        for k in range(1, max(map(len, parts)) + 1):
            ends = ["/".join(p[-k:]) for p in parts]
            if len(set(ends)) == len(ends):
                break
        for r, end in zip(same, ends):
            r.label = f"{label} ({end})"
    seen = defaultdict(int)
    for r in runs:
        seen[r.label] += 1
        if seen[r.label] > 1:
            r.label = f"{r.label} #{seen[r.label]}"
    stems = defaultdict(int)
    for r in runs:
        stem = safe_name(r.label)
        stems[stem] += 1
        r.file_stem = stem if stems[stem] == 1 else f"{stem}_{stems[stem]}"
