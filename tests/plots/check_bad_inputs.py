"""`normlab plot` and `normlab report` on hostile run files (issue 27.10): invalid UTF-8, a folder
in a file's place, JSON nested 100k deep, an "update" that is not a non-negative integer. Each
must be one `normlab: error:` line naming the file and exit code 2, never a Python traceback; a
record cut by a kill (the last line, even inside a UTF-8 character) is still skipped with a note.
`normlab ablate`'s eval/ablate.*.csv too (issue 56.13; read for the layer_ablation figure): a
non-integer layer, a non-numeric loss, invalid UTF-8, a missing column, an empty file are one line
naming FILE:LINE.

And --out (issue 42.1, 42.10), for runs and a frontier directory: a folder that is not normlab's
(a user's files, `/`, a "run" marker) is refused and left byte-identical; one that cannot be made
or written (a file, /proc/x, under a file, a read-only mount) is one line with the system's cause;
all exit 2. An empty folder is claimed (.normlab-dir) and reused; a full disk is one line, exit 1.
The tmpfs cases (read-only, full) print SKIP where this process may not mount.

usage: check_bad_inputs.py NORMLAB_EXE WORK_DIR
"""
import html
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixture  # noqa: E402

DEEP = "[" * 100000 + "]" * 100000
failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL: {msg}")


def normlab(exe, sub, target, work):
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    args = [exe, sub, target, "--out", out] + (["--format", "png"] if sub == "plot" else [])
    return subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=300)


def run_out(exe, sub, target, out):
    args = [exe, sub, target, "--out", out] + (["--format", "png"] if sub == "plot" else [])
    return subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=300)


def expect_error(what, p, code, *texts):
    """One stderr line holding every text, exit `code`, no traceback."""
    err = p.stderr.splitlines()
    if "Traceback" in p.stdout + p.stderr:
        fail(f"{what}: a traceback\n{p.stderr[-1500:]}")
    elif p.returncode != code:
        fail(f"{what}: exit {p.returncode}, expected {code}\n{p.stdout[-300:]}{p.stderr[-600:]}")
    elif len(err) != 1 or not all(t in err[0] for t in texts):
        fail(f"{what}: expected one line with {texts}, got {p.stderr[-600:]!r}")
    else:
        print(f"ok: {what}: {err[0][:200]}")


def snapshot(path):
    """{relative path: bytes, or None for a folder} of everything under path."""
    snap = {}
    for root, dirs, files in os.walk(path):
        for d in dirs:
            snap[os.path.relpath(os.path.join(root, d), path)] = None
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                snap[os.path.relpath(os.path.join(root, f), path)] = fh.read()
    return snap


def make_tree(path, files):
    """A fresh folder holding files ({relative path: text})."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    for rel, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
        with open(os.path.join(path, rel), "w") as f:
            f.write(text)


def marker(path):
    try:
        with open(os.path.join(path, ".normlab-dir")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@contextmanager
def tmpfs(path, options):
    """A tmpfs mounted at path (True), or False where this process may not mount."""
    os.makedirs(path, exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True).returncode == 0
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", path], check=True)


def check_out(exe, work, good):
    """--out claimed before anything is written (issue 42.1, 42.10)."""
    front = os.path.join(work, "frontier")
    os.makedirs(front)
    cells = [{"scheme": "post-ln", "depth": d, "verdict": "frontier", "max_stable_lr": 0.01,
              "min_unstable_lr": 0.1, "lr_sensitivity": 0.5, "best_loss": 2.0, "trials": []} for d in (2, 4)]
    with open(os.path.join(front, "frontier.json"), "w") as f:
        json.dump({"arch": "lm", "lr_min": 0.001, "lr_max": 0.1, "updates": 20, "seeds": [1],
                   "grid": [0.001, 0.01, 0.1], "cells": cells}, f)
    outs = os.path.join(work, "outs")
    user = {"notes.txt": "my notes\n", "status.json": '{"status": "mine"}\n', "train.jsonl": "{}\n"}
    legacy = {"plots": [{"loss.png": "x", "loss.svg": "x", "old/frontier.pdf": "x"}],
              "report": [{"report.html": "x", "summary.csv": "x", "report.md": "x", "figures/loss.png": "x"},
                         {"report.html": "x", "report.md": "x", "figures/frontier.png": "x"}]}  # a frontier one
    for sub, target in (("plot", good), ("report", good), ("plot", front), ("report", front)):  # 4 call sites
        kind = "plots" if sub == "plot" else "report"
        tag = f"{sub} {'frontier' if target == front else 'runs'} --out"
        shutil.rmtree(outs, ignore_errors=True)
        os.makedirs(outs)
        o = os.path.join(outs, "file")
        with open(o, "w") as f:
            f.write("mine\n")
        expect_error(f"{tag} an existing file", run_out(exe, sub, target, o), 2,
                     f"normlab: error: --out {o}: cannot create it: ")
        if snapshot(outs) != {"file": b"mine\n"}:
            fail(f"{tag} an existing file: it changed")
        o = os.path.join(outs, "user")
        make_tree(o, user)
        before = snapshot(o)
        expect_error(f"{tag} a user's folder", run_out(exe, sub, target, o), 2, f"normlab: error: --out {o}: ",
                     "holds 3 entries, e.g. notes.txt, status.json, train.jsonl, and no .normlab-dir",
                     "choose a new or empty folder")
        if snapshot(o) != before:
            fail(f"{tag} a user's folder: its files changed")
        claimed = os.path.join(outs, "empty")
        os.makedirs(claimed)
        for i in (1, 2):  # claimed, then reused
            p = run_out(exe, sub, target, claimed)
            if p.returncode != 0 or p.stderr or marker(claimed) != {"normlab": kind}:
                fail(f"{tag} an empty folder, run {i}: exit {p.returncode}, marker {marker(claimed)}\n"
                     f"{p.stderr[-600:]}")
            else:
                print(f"ok: {tag} an empty folder, run {i}: exit 0, .normlab-dir {marker(claimed)}")
        full = os.path.join(outs, "full")
        with tmpfs(full, "size=8k") as mounted:
            if not mounted:
                print(f"SKIP: {tag} a full disk: this process may not mount a tmpfs")
            else:
                expect_error(f"{tag} a full disk", run_out(exe, sub, target, full), 1,
                             f"normlab: error: --out {full}: cannot write ", ": No space left on device")
        if target == front:  # the rest is the same claim, checked on runs only
            continue
        o = "/proc/normlab_x"
        expect_error(f"{tag} {o}", run_out(exe, sub, target, o), 2, f"normlab: error: --out {o}: cannot create it: ")
        o = os.path.join(outs, "file", "sub")
        expect_error(f"{tag} under a file", run_out(exe, sub, target, o), 2,
                     f"normlab: error: --out {o}: cannot create it: Not a directory")
        top = set(os.listdir("/"))
        expect_error(f"{tag} /", run_out(exe, sub, target, "/"), 2, "normlab: error: --out /: ",
                     "is neither empty nor a folder normlab made")
        for name in set(os.listdir("/")) - top:  # what a failing normlab wrote there
            fail(f"{tag} /: wrote /{name}")
            shutil.rmtree("/" + name) if os.path.isdir("/" + name) else os.remove("/" + name)
        o = os.path.join(outs, "run")
        make_tree(o, {".normlab-dir": '{"normlab": "run"}\n', "train.jsonl": "{}\n"})
        before = snapshot(o)
        expect_error(f"{tag} a run folder", run_out(exe, sub, target, o), 2,
                     f"normlab: error: --out {o}: is a normlab run folder, not a {kind} folder")
        if snapshot(o) != before:
            fail(f"{tag} a run folder: its files changed")
        other, other_kind = ("report", "report") if sub == "plot" else ("plot", "plots")
        before = snapshot(claimed)
        expect_error(f"{other} --out the folder {sub} made", run_out(exe, other, target, claimed), 2,
                     f"is a normlab {kind} folder, not a {other_kind} folder")
        if snapshot(claimed) != before:
            fail(f"{other} --out the folder {sub} made: its files changed")
        for i, files in enumerate(legacy[kind]):
            o = os.path.join(outs, f"legacy{i}")
            make_tree(o, files)
            p = run_out(exe, sub, front, o)  # the claim is the same; frontier figures are quicker
            if p.returncode != 0 or p.stderr or marker(o) != {"normlab": kind}:
                fail(f"{tag} an older normlab's folder {sorted(files)}: exit {p.returncode}, marker {marker(o)}\n"
                     f"{p.stderr[-600:]}")
            else:
                print(f"ok: {tag} an older normlab's folder {sorted(files)}: exit 0, claimed")
        ro = os.path.join(outs, "ro")
        with tmpfs(ro, "ro") as mounted:
            if not mounted:
                print(f"SKIP: {tag} a read-only mount: this process may not mount a tmpfs")
            else:
                o = os.path.join(ro, "sub")
                expect_error(f"{tag} under a read-only mount", run_out(exe, sub, target, o), 2,
                             f"normlab: error: --out {o}: cannot create it: Read-only file system")
                expect_error(f"{tag} a read-only mount", run_out(exe, sub, target, ro), 2,
                             f"normlab: error: --out {ro}: cannot write in it: Read-only file system")


def write(path, data):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    if data is None:  # a folder in the file's place
        os.makedirs(os.path.join(path, "inside"))
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def good_lines(path):
    with open(path, "rb") as f:
        return f.read()


def check_names_as_text(exe, work, good, train):
    """Issue 66.17: a task or run named like mathtext ("m$\\foo$", matplotlib's "$...$") is drawn as
    written, in the SVG's text, never parsed (an unknown TeX symbol failed the whole figure)."""
    names = dict(task="m$\\foo$ & $x^2$", run="r$\\alpha$_1")
    tex = os.path.join(work, "tex")
    shutil.rmtree(tex, ignore_errors=True)
    shutil.copytree(good, tex)
    tasks = "".join(json.dumps({"kind": "task", "update": u, "task": names["task"], "acc": 0.25 + u / 100,
                                "bits_per_byte": 2.0 - u / 100, "tokens": 64 * u}) + "\n" for u in (10, 20))
    write(os.path.join(tex, "r", "train.jsonl"), train + tasks.encode())
    with open(os.path.join(tex, "sweep.json"), "w") as f:
        json.dump({"name": "tex", "runs": [{"index": 0, "id": names["run"], "dir": "r", "values": {}}]}, f)
    out = os.path.join(work, "tex_out")
    for sub, args in (("plot", ["--format", "svg"]), ("report", [])):
        shutil.rmtree(out, ignore_errors=True)
        p = subprocess.run([exe, sub, tex, "--out", out] + args, capture_output=True, text=True,
                           errors="replace", timeout=300)
        # the plot's SVG (svg.fonttype none: a plain text is one <text> element, XML escapes &), the
        # report's HTML (html.escape); the report's figures are PNG, drawn by the same code
        shown = os.path.join(out, "downstream_tasks.svg" if sub == "plot" else "report.html")
        text = open(shown, encoding="utf-8").read() if os.path.isfile(shown) else ""
        want = [(">%s<" if sub == "plot" else "%s") % html.escape(v, quote=False) for v in names.values()]
        if p.returncode != 0 or "Traceback" in p.stdout + p.stderr:
            fail(f"{sub} with mathtext names: exit {p.returncode}\n{p.stdout[-600:]}{p.stderr[-1500:]}")
        elif not all(w in text for w in want):
            fail(f"{sub} with mathtext names: {shown} does not show {want} as text")
        elif sub == "report" and not os.path.isfile(os.path.join(out, "figures", "downstream_tasks.png")):
            fail(f"report with mathtext names: no figures/downstream_tasks.png ({p.stdout[-600:]})")
        else:
            print(f"ok: {sub} with mathtext names: drawn as written ({os.path.basename(shown)})")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    exe, work = sys.argv[1], os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # A minimal valid sweep of one run (20 updates, 2L-2L) in the trainer's format.
    good = os.path.join(work, "good")
    make_fixture.write_run(os.path.join(good, "r"), "post-ln", 2, 2, 1, "completed", 20)
    with open(os.path.join(good, "sweep.json"), "w") as f:
        json.dump({"name": "bad-inputs", "runs": [{"index": 0, "id": "r", "dir": "r", "values": {}}]}, f)
    ablate_rel = "eval/ablate.valid.best.csv"  # as `normlab ablate` writes it (eval_command.cpp)
    ablate = (b"stack,layer,nll,delta_nll,ppl\nnone,-1,2.5,0,12.18\nencoder,0,2.75,0.25,15.64\n"
              b"encoder,1,2.625,0.125,13.81\ndecoder,0,3,0.5,20.08\ndecoder,1,2.5625,0.0625,12.97\n")
    write(os.path.join(good, "r", ablate_rel), ablate)
    train = good_lines(os.path.join(good, "r", "train.jsonl"))
    analysis = good_lines(os.path.join(good, "r", "analysis.csv"))
    analysis_head = b"".join(analysis.splitlines(keepends=True)[:30])

    def rec(update):  # a train record with this raw JSON text as its update
        return ('{"kind": "train", "update": %s, "nll": 2.0, "gnorm": 1.0}\n' % update).encode()

    def jrow(update):
        return ('{"update": %s, "metric": "grad_norm", "stack": "model", "layer": -1, '
                '"sublayer": "total", "value": 1.0}\n' % update).encode()

    cases = [  # (name, file in the run (or the sweep for sweep.json), content; None = a folder)
        ("train.jsonl invalid UTF-8", "train.jsonl", train + b'{"kind": "train", "update": 30, "x": "\xff\xfe"}\n'),
        ("status.json invalid UTF-8", "status.json", b'{"status": "completed", "note": "\xc3\x28"}'),
        ("env.json invalid UTF-8", "env.json", b'{"scheme": {"name": "\xff"}}'),
        ("manifest invalid UTF-8", "manifest.resolved.toml", b'[model]\narch = "\xff"\n'),
        ("analysis.csv invalid UTF-8", "analysis.csv", analysis_head + b"3,grad\xff,model,-1,total,1.0\n"),
        ("analysis.jsonl invalid UTF-8", "analysis.jsonl", jrow(1) + b'{"update": 2, "metric": "\xff"}\n'),
        ("sweep.json invalid UTF-8", "../sweep.json", b'{"name": "\xff", "runs": []}'),
        ("train.jsonl a folder", "train.jsonl", None),
        ("status.json a folder", "status.json", None),
        ("analysis.csv a folder", "analysis.csv", None),
        ("manifest a folder", "manifest.resolved.toml", None),
        ("sweep.json a folder", "../sweep.json", None),
        ("train.jsonl nested 100k deep", "train.jsonl", train + DEEP.encode() + b"\n"),
        ("train.jsonl nested 100k deep, last line", "train.jsonl", train + DEEP.encode()),
        ("train.jsonl nested 100k deep in a record", "train.jsonl",
         train + b'{"kind": "train", "update": 40, "x": ' + DEEP.encode() + b"}\n"),
        ("status.json nested 100k deep", "status.json", DEEP),
        ("sweep.json nested 100k deep", "../sweep.json", DEEP),
        ("analysis.jsonl nested 100k deep", "analysis.jsonl", jrow(1) + DEEP.encode() + b"\n"),
        ("manifest nested 100k deep", "manifest.resolved.toml", "x = " + DEEP + "\n"),
        ("update an object", "train.jsonl", train + rec('{"a": 1}')),
        ("update 1e400", "train.jsonl", train + rec("1e400")),
        ("update \"NaN\"", "train.jsonl", train + rec('"NaN"')),
        ("update NaN", "train.jsonl", train + rec("NaN")),
        ("update -Infinity", "train.jsonl", train + rec("-Infinity")),
        ("update -3", "train.jsonl", train + rec("-3")),
        ("update 2.5", "train.jsonl", train + rec("2.5")),
        ("update true", "train.jsonl", train + rec("true")),
        ("update missing", "train.jsonl", train + b'{"kind": "valid", "nll": 2.0}\n'),
        ("diverged update an object", "train.jsonl",
         train + b'{"kind": "diverged", "update": {"a": 1}}\n'),
        ("analysis.jsonl update 1e400", "analysis.jsonl", jrow(1) + jrow("1e400")),
        ("analysis.jsonl update an object", "analysis.jsonl", jrow(1) + jrow('{"a": 1}')),
        ("analysis.jsonl layer 1e400", "analysis.jsonl", jrow(1) + jrow(2).replace(b'"layer": -1', b'"layer": 1e400')),
        ("analysis.csv update 1e400", "analysis.csv", analysis_head + b"1e400,grad_norm,model,-1,total,1.0\n"),
        ("analysis.csv update nan", "analysis.csv", analysis_head + b"nan,grad_norm,model,-1,total,1.0\n"),
        ("analysis.csv update -1", "analysis.csv", analysis_head + b"-1,grad_norm,model,-1,total,1.0\n"),
        ("status.json updates an object", "status.json", b'{"status": "completed", "updates": {"a": 1}}'),
        ("status.json updates 1e400", "status.json", b'{"status": "completed", "updates": 1e400}'),
        ("sweep.json dir an object", "../sweep.json", b'{"runs": [{"index": 0, "dir": {"a": 1}}]}'),
        ("sweep.json index a string", "../sweep.json",
         b'{"runs": [{"index": 0, "dir": "r"}, {"index": "x", "dir": "r"}]}'),
        ("sweep.json id half a surrogate pair", "../sweep.json",  # no UTF-8 figure can hold it
         b'{"runs": [{"index": 0, "dir": "r", "id": "\\ud800"}]}'),
        # (name, file, content, what the line must hold right after the file's path)
        ("ablate layer 1.5", ablate_rel, ablate + b"encoder,1.5,2.5,0,12.18\n", ":7: layer must be an integer"),
        ("ablate layer x", ablate_rel, ablate.replace(b"decoder,0,", b"decoder,x,"), ":5: layer must be an integer"),
        ("ablate nll abc", ablate_rel, ablate.replace(b"encoder,1,2.625", b"encoder,1,abc"),
         ":4: nll must be a number"),
        ("ablate delta_nll empty", ablate_rel, ablate + b"decoder,1,2.5,,12.18\n", ":7: delta_nll must be a number"),
        ("ablate invalid UTF-8", ablate_rel, ablate + b"decoder,1,2.5,0.0\xff,12.18\n", ":7: not UTF-8 text"),
        ("ablate a missing column", ablate_rel, b"stack,layer,nll,ppl\nencoder,0,2.75,15.64\n",
         ":1: expected the header stack,layer,nll,delta_nll,ppl"),
        ("ablate a row short of a column", ablate_rel, ablate + b"decoder,1,2.5,12.18\n", ":7: expected 5 fields"),
        ("ablate empty", ablate_rel, b"", ":1: expected the header"),
        ("ablate stack middle", ablate_rel, ablate + b"middle,0,2.5,0,12.18\n", ":7: stack must be"),
        ("ablate a folder", ablate_rel, None, ": a directory"),
        # issue 66.17: a task record's tokens are the downstream figure's x (a dict key there)
        ("task tokens a list", "train.jsonl",
         train + b'{"kind": "task", "update": 10, "task": "hs", "acc": 0.5, "bits_per_byte": 2.0, "tokens": [1, 2]}\n',
         ':%d: "tokens" of a "task" record must be a non-negative integer, got [1, 2]' % (train.count(b"\n") + 1)),
        # issue 66.19: the ranks multiply the update's batch (the report pairs runs by it)
        ("env.json world_size a string", "env.json",
         b'{"scheme": {"name": "post-ln"}, "distributed": {"world_size": "2"}}',
         ': "distributed" must be an object with "world_size" a positive integer'),
        ("env.json world_size 0", "env.json", b'{"distributed": {"world_size": 0}}',
         ': "distributed" must be an object with "world_size" a positive integer'),
        ("task tokens -1", "train.jsonl",
         train + b'{"kind": "task", "update": 10, "task": "hs", "acc": 0.5, "tokens": -1}\n',
         ':%d: "tokens" of a "task" record must be a non-negative integer, got -1' % (train.count(b"\n") + 1)),
    ]

    # Control: the valid sweep plots and reports.
    for sub in ("plot", "report"):
        p = normlab(exe, sub, good, work)
        if p.returncode != 0 or "Traceback" in p.stdout + p.stderr:
            fail(f"{sub} on the valid run: exit {p.returncode}\n{p.stdout[-1000:]}{p.stderr[-2000:]}")
    # The same sweep with its training log only (2 figures, not 11): where a check needs figures drawn
    # but is about the files around them (--out claims, a cut last line), not about the figures.
    plain = os.path.join(work, "plain")
    shutil.copytree(good, plain, ignore=shutil.ignore_patterns("analysis.csv", "analysis.jsonl", "eval"))
    check_out(exe, work, plain)

    bad = os.path.join(work, "bad")
    for name, rel, data, *texts in cases:
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(good, bad)
        run_dir = os.path.join(bad, "r")
        if rel == "analysis.jsonl":  # the reader's fallback when there is no analysis.csv
            os.remove(os.path.join(run_dir, "analysis.csv"))
        target = os.path.normpath(os.path.join(run_dir, rel))
        write(target, data)
        for sub in ("plot", "report"):  # both through the CLI: they start without LibTorch
            p = normlab(exe, sub, bad, work)
            err = p.stderr.splitlines()
            what = f"{sub} with {name}"
            if "Traceback" in p.stdout + p.stderr:
                fail(f"{what}: a traceback\n{p.stderr[-1500:]}")
            elif p.returncode != 2:
                fail(f"{what}: exit {p.returncode}, expected 2\n{p.stderr[-600:]}")
            elif len(err) != 1 or not err[0].startswith("normlab: error:") or target + "".join(texts) not in err[0]:
                fail(f"{what}: expected one 'normlab: error:' line naming {target}{''.join(texts)}, "
                     f"got {p.stderr[-600:]!r}")
            else:
                print(f"ok: {what}: {err[0][:160]}")

    # A record cut by a kill, even inside a UTF-8 character, stays a skipped last line; values
    # (not updates) that no figure can show are left out of the lines, as non-finite ones are.
    for name, tail, note in (
            ("a cut record as the last line", b'{"kind": "train", "update": 99', True),
            ("a cut UTF-8 character as the last line",
             '{"kind": "train", "update": 99, "note": "é'.encode()[:-1], True),
            ("BLEU ±1e308 and nll Infinity", b'{"kind": "valid", "update": 20, "nll": Infinity, "bleu": 1e308}\n'
             b'{"kind": "valid", "update": 21, "nll": 2.0, "bleu": -1e308}\n', False)):
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(plain, bad)
        write(os.path.join(bad, "r", "train.jsonl"), train + tail)
        for sub in ("plot", "report"):
            p = normlab(exe, sub, bad, work)
            if p.returncode != 0 or "Traceback" in p.stderr or (
                    note and "ignoring a partly written last line" not in p.stdout):
                fail(f"{sub} with {name}: exit {p.returncode}, expected 0" + (" and a note" if note else "")
                     + f"\n{p.stdout[-600:]}{p.stderr[-600:]}")
            else:
                print(f"ok: {sub} with {name}: exit 0" + (", skipped with a note" if note else ""))

    check_names_as_text(exe, work, good, train)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("bad inputs OK")


if __name__ == "__main__":
    main()
