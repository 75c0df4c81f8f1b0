"""Reads normlab run and sweep directories (the trainer's output) for the plot and report scripts.

A run directory holds manifest.resolved.toml, status.json, env.json, train.jsonl and
analysis.csv (or analysis.jsonl). A sweep directory holds sweep.json and one run directory per run.
Every missing required file or malformed line is a DataError naming the file (and line).
Standard library only (tomllib needs Python 3.11).
"""
import csv
import json
import math
import os
import tomllib
from collections import defaultdict

ANALYSIS_FIELDS = ["update", "metric", "stack", "layer", "sublayer", "value"]
STACKS = ("encoder", "decoder")


class DataError(Exception):
    """A missing or malformed input file; the message names the file."""


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: malformed JSON: {e}") from None


def _read_jsonl(path, notes):
    """Objects of a JSON-lines file. A truncated last line (a run still writing) is dropped with a
    note; any other bad line is an error naming file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) and not text.endswith("\n"):
                notes.append(f"{path}:{i}: ignoring a partly written last line")
                continue
            raise DataError(f"{path}:{i}: malformed JSON line: {e}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{i}: expected a JSON object, got {type(obj).__name__}")
        out.append(obj)
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
        with open(csv_path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                return Analysis([])
            if [h.strip() for h in header] != ANALYSIS_FIELDS:
                raise DataError(f"{csv_path}:1: expected the header {','.join(ANALYSIS_FIELDS)}, "
                                f"got {','.join(header)}")
            for row in reader:
                if not row:
                    continue
                line = reader.line_num
                if len(row) != 6:
                    raise DataError(f"{csv_path}:{line}: expected 6 fields, got {len(row)}")
                try:
                    rows.append((int(row[0]), row[1], row[2], int(row[3]), row[4], float(row[5])))
                except ValueError as e:
                    raise DataError(f"{csv_path}:{line}: {e}") from None
        return Analysis(rows)
    if os.path.exists(jsonl_path):
        for i, obj in enumerate(_read_jsonl(jsonl_path, notes), start=1):
            try:
                v = _number(obj["value"])
                rows.append((int(obj["update"]), str(obj["metric"]), str(obj["stack"]),
                             int(obj["layer"]), str(obj["sublayer"]), v if v is not None else math.nan))
            except (KeyError, TypeError, ValueError) as e:
                raise DataError(f"{jsonl_path}: record {i}: missing or bad field {e}") from None
        return Analysis(rows)
    notes.append(f"{run_dir}: no analysis.csv or analysis.jsonl (analysis figures skipped for this run)")
    return None


class Run:
    """One run directory, read eagerly."""

    def __init__(self, path, sweep_id=None, sweep_values=None, notes=None):
        self.path = os.path.normpath(path)
        self.sweep_id = sweep_id
        self.sweep_values = sweep_values or {}
        self.notes = notes if notes is not None else []
        manifest_path = os.path.join(path, "manifest.resolved.toml")
        try:
            with open(manifest_path, "rb") as f:
                self.manifest = tomllib.load(f)
        except FileNotFoundError:
            raise DataError(f"{manifest_path}: missing (not a normlab run directory?)") from None
        except tomllib.TOMLDecodeError as e:
            raise DataError(f"{manifest_path}: malformed TOML: {e}") from None
        self.status = _read_json(os.path.join(path, "status.json"))
        if not isinstance(self.status, dict) or "status" not in self.status:
            raise DataError(f"{os.path.join(path, 'status.json')}: no \"status\" field")
        env_path = os.path.join(path, "env.json")
        self.env = _read_json(env_path) if os.path.exists(env_path) else {}
        self.train, self.valid, self.diverged = [], [], None
        self.test = None  # the test score taken at the end of training (eval.test_beam)
        train_path = os.path.join(path, "train.jsonl")
        if os.path.exists(train_path):
            for rec in _read_jsonl(train_path, self.notes):
                kind = rec.get("kind")
                if kind == "train":
                    self.train.append(rec)
                elif kind == "valid":
                    self.valid.append(rec)
                elif kind == "diverged":
                    self.diverged = rec
                elif kind == "test":
                    self.test = rec
        elif self.state != "failed":  # a run that failed early may have written nothing
            self.notes.append(f"{train_path}: missing (no loss curves for this run)")
        self.analysis = read_analysis(path, self.notes if self.state != "failed" else [])
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
        if s == "completed":
            return "converged"
        if s == "stopped_early":  # eval.patience: finished, at its best validation so far
            return f"converged (stopped early at update {updates})"
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
        """(nll, bleu, update) of the best validation: highest BLEU when BLEU is logged, else
        lowest nll; Nones when there is none."""
        vals = [v for v in self.valid if _finite(_number(v.get("nll")))]
        with_bleu = [v for v in vals if _finite(_number(v.get("bleu")))]
        if with_bleu:
            best = max(with_bleu, key=lambda v: _number(v["bleu"]))
            return _number(best["nll"]), _number(best["bleu"]), best.get("update")
        if vals:
            best = min(vals, key=lambda v: _number(v["nll"]))
            return _number(best["nll"]), None, best.get("update")
        return None, None, None

    def min_valid_nll(self):
        vals = [_number(v.get("nll")) for v in self.valid]
        vals = [v for v in vals if _finite(v)]
        return min(vals) if vals else None

    def tokens_per_s(self):
        vals = [_number(t.get("tokens_per_s")) for t in self.train]
        vals = [v for v in vals if _finite(v)]
        return sum(vals) / len(vals) if vals else None

    def last_train_nll(self):
        for t in reversed(self.train):
            v = _number(t.get("nll"))
            if _finite(v):
                return v
        return None


def _finite(v):
    return v is not None and math.isfinite(v)


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
                with open(cand, encoding="utf-8", errors="replace") as f:
                    return f.read()
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
            sweep = Sweep(p, info)
            sweeps.append(sweep)
            entries = sorted(info["runs"], key=lambda r: r.get("index", 0))
            for i, entry in enumerate(entries):
                if not isinstance(entry, dict) or "dir" not in entry:
                    raise DataError(f"{sweep_json}: runs[{i}] has no \"dir\"")
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


def _dedupe_labels(runs):
    count = defaultdict(int)
    for r in runs:
        count[r.label] += 1
    for r in runs:
        if count[r.label] > 1:
            r.label = f"{r.label} ({os.path.basename(r.path)})"
