"""`normlab bleu` (BLEU, chrF and their signatures) against the real sacreBLEU (PyPI) on the Multi30k
German test set.

Hypotheses are deterministic noisy copies of the references (words dropped, swapped, duplicated;
fixed seeds). For each system the score must agree to two decimals and the n-gram counts, totals
and lengths exactly; the 13a tokenization must agree on every line.

usage: check_bleu_sacrebleu.py NORMLAB_EXE [DATA_DIR]
DATA_DIR defaults to ../shared/data relative to the repository root; without it the check prints
SKIP and exits 0. A missing sacrebleu module is a failure, not a skip.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VENV_PYTHON = os.path.expanduser("~/.cache/normlab/venv/bin/python")

exe = sys.argv[1]
data_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "..", "shared", "data")
ref_path = os.path.join(data_dir, "multi30k", "test_2016_flickr.de")
if not os.path.isfile(ref_path):
    print(f"SKIP: {ref_path} not found (the Multi30k data lives in ../shared/data); "
          "BLEU was not compared with sacreBLEU")
    sys.exit(0)

try:
    import sacrebleu
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
except ImportError:
    # Configured before the venv had sacrebleu: run again with the venv's interpreter.
    if os.path.exists(VENV_PYTHON) and not os.environ.get("NORMLAB_BLEU_REEXEC"):
        os.environ["NORMLAB_BLEU_REEXEC"] = "1"
        os.execv(VENV_PYTHON, [VENV_PYTHON, *sys.argv])
    print(f"FAIL: the sacrebleu module is not importable by {sys.executable}; install it with\n"
          f"  {os.path.dirname(VENV_PYTHON)}/pip install sacrebleu\n"
          "(scripts/normlab.sh test does this) and re-run cmake so the venv's python is used.")
    sys.exit(1)


def load(path):
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [l[:-1] if l.endswith("\r") else l for l in lines]


def write(path, lines):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("".join(l + "\n" for l in lines))


def noisy(refs, seed, p_drop, p_swap, p_dup):
    rng = random.Random(seed)
    out = []
    for ref in refs:
        words = ref.split(" ")
        kept = [w for w in words if rng.random() >= p_drop]
        i = 0
        while i + 1 < len(kept):
            if rng.random() < p_swap:
                kept[i], kept[i + 1] = kept[i + 1], kept[i]
                i += 1
            i += 1
        hyp = []
        for w in kept:
            hyp.append(w)
            if rng.random() < p_dup:
                hyp.append(w)
        out.append(" ".join(hyp))
    return out


refs = load(ref_path)
assert len(refs) == 1000, len(refs)

systems = {
    "light noise": noisy(refs, 1, 0.05, 0.05, 0.03),
    "heavy noise, short (BP < 1)": noisy(refs, 2, 0.30, 0.20, 0.02),
    "duplications (BP = 1)": noisy(refs, 3, 0.02, 0.10, 0.25),
    "first 300 lines, shuffled words": [" ".join(random.Random(i).sample(r.split(), len(r.split())))
                                        for i, r in enumerate(refs[:300])],
}
# Strings that exercise the rest of the tokenizer (no line breaks: the files are line-based).
extra = [
    "&quot;Quoted&quot; &amp; &lt;tag&gt; &amp;lt; x<skipped>y",
    "It costs $3,000.50 (approx.) - really? 1990-2000, 3.5-4.2 a.. b,, .5 ,x 1.a a.1 5-",
    "don't stop-watch e.g. U.S.A. Mr.Müller's café! über. ß,ß Größe: 1,5 m²",
    "a/b:c;d@e[f]g{h}i~j`k^l_m|n\\o",
    "tab\there\u00a0nbsp\u3000ideo\u2009thin\u2028ls\x1cfs\x85nel end \u00a0 ",
    "",
    "   ",
]

systems["odd characters (chrF whitespace, UTF-8)"] = [e + " " + r for e, r in zip(extra, refs)]

failures = 0
with tempfile.TemporaryDirectory(prefix="normlab_bleu_") as tmp:
    ref_file = os.path.join(tmp, "ref.de")
    write(ref_file, refs)
    tok_lines = list(refs) + extra
    for name, hyps in systems.items():
        hyp_file = os.path.join(tmp, "hyp.de")
        write(hyp_file, hyps)
        n = len(hyps)
        this_ref = ref_file
        if n != len(refs):
            this_ref = os.path.join(tmp, "ref_part.de")
            write(this_ref, refs[:n])
        t0 = time.perf_counter()
        run = subprocess.run([exe, "bleu", "--hyp", hyp_file, "--ref", this_ref, "--json"],
                             capture_output=True, text=True, encoding="utf-8")
        elapsed = time.perf_counter() - t0
        if run.returncode != 0:
            print(f"FAIL [{name}]: normlab bleu exited {run.returncode}: {run.stderr}")
            failures += 1
            continue
        ours = json.loads(run.stdout)
        ref_score = sacrebleu.corpus_bleu(hyps, [refs[:n]])
        diff = abs(ours["score"] - ref_score.score)
        same = (f"{ours['score']:.2f}" == f"{ref_score.score:.2f}"
                and ours["counts"] == list(ref_score.counts)
                and ours["totals"] == list(ref_score.totals)
                and ours["sys_len"] == ref_score.sys_len
                and ours["ref_len"] == ref_score.ref_len
                and ours["text"] == str(ref_score))
        print(f"{'ok  ' if same else 'FAIL'} [{name}] {n} lines, normlab bleu {elapsed * 1000:.0f} ms "
              f"(process incl.), |diff| = {diff:.3g}\n"
              f"     normlab:   {ours['text']}  counts {ours['counts']} totals {ours['totals']}\n"
              f"     sacreBLEU: {ref_score}  counts {list(ref_score.counts)} totals {list(ref_score.totals)}")
        failures += not same
        # chrF (sacreBLEU's default chrF2) and both signatures, apart from the version field.
        chrf = sacrebleu.metrics.CHRF()
        chrf_score = chrf.corpus_score(hyps, [refs[:n]])
        bleu_metric = sacrebleu.metrics.BLEU()
        bleu_metric.corpus_score(hyps, [refs[:n]])  # the signature needs a scored corpus
        bleu_sig = bleu_metric.get_signature().format()
        unversioned = lambda sig: sig.rsplit("|version:", 1)[0]
        chrf_same = (f"{ours['chrf']:.6f}" == f"{chrf_score.score:.6f}"
                     and unversioned(ours["chrf_signature"]) == unversioned(chrf.get_signature().format())
                     and unversioned(ours["signature"]) == unversioned(bleu_sig))
        print(f"{'ok  ' if chrf_same else 'FAIL'} [{name}] chrF normlab {ours['chrf']:.6f} {ours['chrf_signature']}\n"
              f"     sacreBLEU {chrf_score.score:.6f} {chrf.get_signature().format()} | BLEU {bleu_sig}")
        failures += not chrf_same
        tok_lines += hyps

    tok_file = os.path.join(tmp, "tok.de")
    write(tok_file, tok_lines)
    run = subprocess.run([exe, "bleu", "--tokenize-13a", tok_file], capture_output=True,
                         text=True, encoding="utf-8", check=True)
    ours = run.stdout.split("\n")[:-1]
    tok = Tokenizer13a()
    theirs = [tok(l) for l in tok_lines]
    bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    if len(ours) != len(theirs) or bad:
        failures += 1
        print(f"FAIL tokenize_13a: {len(ours)} vs {len(theirs)} lines, {len(bad)} differ")
        for i in bad[:10]:
            print(f"  line {i}: {tok_lines[i]!r}\n    normlab   {ours[i]!r}\n    sacreBLEU {theirs[i]!r}")
    else:
        print(f"ok   tokenize_13a: all {len(theirs)} lines identical")

print(f"sacrebleu {sacrebleu.__version__}: " + ("all agree" if not failures else f"{failures} check(s) FAILED"))
sys.exit(1 if failures else 0)
