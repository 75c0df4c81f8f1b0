"""What the command-line checks of tests/check_*.py share: a named check that counts failures, and
a normlab run whose output, exit code and peak memory come back (imported by check_data_trust.py,
check_trust4_cli.py, check_tasks.py, check_omp_choice.py, check_recipe_controls.py,
check_shard_tokenizer.py and check_tokenize_inputs.py)."""
import os
import subprocess
import tempfile
import threading

failures = 0


def check(cond, what):
    """Prints `ok` or `FAIL` and the check; a failure is counted for finish()."""
    global failures
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    failures += not cond


def finish(name):
    """The last line (`NAME: OK` or `NAME: FAILED`); exits 1 when a check failed."""
    print("%s: %s" % (name, "FAILED" if failures else "OK"), flush=True)
    raise SystemExit(1 if failures else 0)


def run(normlab, *args, timeout=300):
    """normlab ARGS: .returncode, .out, .err, .errors (the "normlab: error" lines) and .peak_rss_mb,
    the child's own (os.wait4). Output goes to files, not pipes: a chatty child never blocks, and a
    child past `timeout` seconds is killed."""
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        p = subprocess.Popen([normlab, *map(str, args)], stdout=fo, stderr=fe)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        p.peak_rss_mb = usage.ru_maxrss / 1024.0
        fo.seek(0)
        fe.seek(0)
        p.out = fo.read().decode("utf-8", "replace")
        p.err = fe.read().decode("utf-8", "replace")
    p.errors = [line for line in p.err.splitlines() if line.startswith("normlab: error")]
    return p


def one_error(p, code, *needles):
    """Exit `code` and exactly one "normlab: error" line, holding every needle."""
    return p.returncode == code and len(p.errors) == 1 and all(n in p.errors[0] for n in needles)


def said(p, n=400):
    return f"exit {p.returncode}: {p.err.strip()[-n:]}"


def write_tiny_llama_manifest(path, work, extra="", data=None, max_tokens=64):
    """A one-second llama run on the built-in synthetic language model (caches under WORK), or on
    `data` (the [data] table's lines instead), with `extra` TOML appended (a [run] table, …);
    returns `path`."""
    if data is None:
        data = (f'task = "synthetic-lm"\nsynthetic_vocab = 16\nlm_block = 8\nsynthetic_train = 40\n'
                f'synthetic_valid = 8\ncache_dir = "{work}/cache"')
    with open(path, "w") as f:
        f.write(f"""[model]
arch = "lm"
family = "llama"
d_model = 16
heads = 2
dec_layers = 2
ffn_multiple_of = 8
dropout = 0.0
[scheme]
name = "pre-ln"
[data]
{data}
[optim]
max_tokens = {max_tokens}
{extra}""")
    return path
