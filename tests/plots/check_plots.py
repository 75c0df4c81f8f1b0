"""Checks `normlab plot` and `normlab report` end to end through the CLI.

usage: check_plots.py NORMLAB WORK_DIR STEP
  fixture  write the fake sweep and LM run (make_fixture.py) into WORK_DIR/fixture
  plot     plot a run and a sweep run: non-empty PNG and SVG, titles in the SVG, notes for skipped figures;
           what the figures hold (describe_figures.py) on edge cases: no test score, nothing diverged,
           one validation, encoder and decoder lines of scheme_state, overlapping frontier bands
  report   report on the fake sweep: summary.csv rows, HTML table and embedded images, Markdown
  report_paper  the report's paper view on a fake sweep named after B2T Fig. 3 ("b2t-fig3")
  render   the report's HTML in headless Chromium: a non-empty PNG screenshot (SKIP without chromium)
  plot_errors  missing and malformed inputs: exit code 2 and an error naming the file
  real     train a tiny real run (built-in reverse task, every analysis probe) and plot it
"""
import csv
import json
from collections import Counter
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(exe, *args, expect=0):
    p = subprocess.run([exe, *args], capture_output=True, text=True)
    if expect is not None and p.returncode != expect:
        raise AssertionError(f"{' '.join([exe, *args])}: exit {p.returncode}, expected {expect}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def check_png(path):
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == PNG_MAGIC, f"{path}: not a PNG"
    assert os.path.getsize(path) > 5000, f"{path}: suspiciously small ({os.path.getsize(path)} bytes)"


def check_svg(path, *titles):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.lstrip().startswith(("<?xml", "<svg")), f"{path}: not an SVG"
    for t in titles:
        assert t in text, f"{path}: title {t!r} not found"


def listed_files(stdout):
    return [line.strip() for line in stdout.splitlines() if line.startswith("  ")]


def step_fixture(exe, work):
    out = os.path.join(work, "fixture")
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([sys.executable, os.path.join(HERE, "make_fixture.py"), out], check=True)
    assert os.path.exists(os.path.join(out, "sweep", "sweep.json"))


def fixture(work):
    f = os.path.join(work, "fixture")
    if not os.path.exists(os.path.join(f, "frontier", "frontier.json")):  # the last part written
        step_fixture(None, work)
    return f


def step_plot(exe, work):
    fx = fixture(work)
    out = os.path.join(work, "plots")
    shutil.rmtree(out, ignore_errors=True)
    p = run(exe, "plot", os.path.join(fx, "lm_run"), os.path.join(fx, "sweep", "post-ln_L8-8"),
            "--out", out, "--update", "50,last")
    files = listed_files(p.stdout)
    stems = {os.path.splitext(os.path.basename(f))[0] for f in files}
    expected = {"loss", "grad_norm_layers", "update_norm", "update_norm_vs_depth", "ffn_sparsity",
                "ln_input_norm", "scheme_state", "layer_cosine_admin_4L", "act_grad_norm_admin_4L",
                "layer_cosine_post-ln_8L-8L", "act_grad_norm_post-ln_8L-8L"}
    assert expected <= stems, f"missing figures: {expected - stems}\n{p.stdout}"
    for f in files:
        assert os.path.exists(f), f
        if f.endswith(".png"):
            check_png(f)
    titles = {"loss": ["Loss curves", "training nll", "update (optimizer steps)"],
              "grad_norm_layers": ["Gradient norm per layer", "update 50", "admin 4L"],
              "update_norm": ["Model update over training", "diverged @137"],
              "ln_input_norm": ["Norm of the LayerNorm inputs", "√d = 8 (d = 64)"],
              "ffn_sparsity": ["FFN activation sparsity"],
              "scheme_state": ["omega_init.mean"],
              "layer_cosine_admin_4L": ["Cosine similarity of layer outputs", "decoder-only model"],
              "act_grad_norm_post-ln_8L-8L": ["Gradient norms at LayerNorm inputs and outputs",
                                              "self_attn_norm input"]}
    for stem, ts in titles.items():
        check_svg(os.path.join(out, stem + ".svg"), *ts)
    # one format only, and a run without analysis data: figures skipped with a note, not an error
    bare = os.path.join(work, "bare_run")
    shutil.rmtree(bare, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "lm_run"), bare)
    os.remove(os.path.join(bare, "analysis.jsonl"))
    p = run(exe, "plot", bare, "--out", os.path.join(work, "plots_bare"), "--format", "svg")
    assert "note: skipping gradient norm per layer" in p.stdout, p.stdout
    # the figures from train.jsonl alone: loss curves, learning rate and tokens
    assert [os.path.basename(f) for f in listed_files(p.stdout)] == ["loss.svg", "lr_tokens.svg"], p.stdout
    check_svg(os.path.join(work, "plots_bare", "lr_tokens.svg"), "Learning rate and tokens trained on")
    # ... whose manifest does not select the scheme_state probe: said so, not "schemes without
    # state" (issue 46.9)
    with open(os.path.join(bare, "manifest.resolved.toml"), "a") as f:
        f.write('\n[analysis]\nprobes = ["grad_norm"]\n')
    p = run(exe, "plot", bare, "--out", os.path.join(work, "plots_bare2"), "--format", "svg")
    assert "note: skipping scheme state: probe not selected" in p.stdout, p.stdout
    check_figures_say_what_happened(work, fx)


def plot_python():
    """The Python that `normlab plot` runs (analysis/src/plot_command.cpp, find_python)."""
    if os.environ.get("NORMLAB_PYTHON"):
        return os.environ["NORMLAB_PYTHON"]
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else "python3"


def describe(work, name, *args):
    """`normlab plot ARGS` through describe_figures.py: ({figure: what it holds}, stdout)."""
    pydir = os.environ.get("NORMLAB_PYTHON_DIR") or os.path.join(HERE, "..", "..", "analysis", "python")
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)
    p = run(plot_python(), os.path.join(HERE, "describe_figures.py"), pydir, out + ".json", *args,
            "--out", out, "--format", "svg")
    with open(out + ".json", encoding="utf-8") as f:
        return json.load(f), p.stdout


def texts(fig):
    """Every title, axis label, legend entry and text of a described figure."""
    out = [fig["suptitle"]] + [e["text"] for leg in fig["legends"] for e in leg]
    for ax in fig["axes"]:
        out += [ax["title"], ax["xlabel"], ax["ylabel"]] + ax["texts"] + [e["text"] for e in ax["legend"]]
    return out


def panel(fig, title):
    axes = [ax for ax in fig["axes"] if ax["title"] == title]
    assert len(axes) == 1, f"no single panel {title!r} in {[ax['title'] for ax in fig['axes']]}"
    return axes[0]


def one_run_figures(work, fx):
    return describe(work, "describe_one_ticks", os.path.join(fx, "edge", "pre-ln_L2-2"))[0]


def spiky_run(work, fx):
    """A copy of the fixture's LM run whose 60 train records have one spike planted in the training
    nll (record 45) and one in the gradient norm (record 50): OLMo 2's spike score finds each, 1 in
    the 40 values with at least 20 before them, 2.5 % (docs/analysis.md#loss-spikes)."""
    spiky = os.path.join(work, "spikes")
    shutil.rmtree(spiky, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "lm_run"), spiky)
    for name in ("analysis.jsonl", "analysis.csv"):  # train.jsonl's figures only: fast
        if os.path.exists(os.path.join(spiky, name)):
            os.remove(os.path.join(spiky, name))
    with open(os.path.join(spiky, "train.jsonl"), "w") as f:
        for i in range(60):
            nll = 3.0 - 0.01 * i + 0.002 * (-1) ** i + (2.0 if i == 45 else 0.0)
            gnorm = (1.0 + 0.01 * math.sin(i)) * (10.0 if i == 50 else 1.0)
            f.write(json.dumps({"kind": "train", "update": 10 * (i + 1), "nll": nll, "loss": nll,
                                "gnorm": gnorm}) + "\n")
    return spiky


def check_figures_say_what_happened(work, fx):
    """Issue 27.16: the figures show what happened, no more, on the fixture's edge cases."""
    edge, stdout = describe(work, "describe_edge", os.path.join(fx, "edge"))
    sweep, _ = describe(work, "describe_sweep", os.path.join(fx, "sweep"))
    # 1. No test record (eval.test_beam = 0): no test panel (it was empty and labelled "test
    # perplexity" on a translation sweep), and a note says why. With test scores it is drawn.
    dt = edge["depth_table"]
    assert [ax["title"] for ax in dt["axes"]] == ["Best validation nll vs depth"], dt["axes"]
    assert "no test score recorded" in dt["suptitle"] and not any(
        "test perplexity" in t or "test BLEU" in t for t in texts(dt)), texts(dt)
    assert "note: skipping the depth table's test-score panel: no run recorded a test score" in stdout, stdout
    with open(os.path.join(work, "describe_edge", "depth_table.svg"), encoding="utf-8") as f:
        svg = f.read()
    assert "Best validation nll vs depth" in svg and "test perplexity" not in svg and "Final test" not in svg
    test = panel(sweep["depth_table"], "Final test score vs depth")
    assert test["ylabel"].startswith("test BLEU") and max(ln["points"] for ln in test["lines"]) == 2, test
    # 2. "diverged" in a legend or title only where a run diverged (the sweep's post-ln 8L-8L).
    for name, fig in edge.items():
        assert not any("diverged" in t for t in texts(fig)), (name, texts(fig))
    assert "diverged (no score)" in texts(sweep["depth_table"])
    assert "diverged (value when it stopped)" in texts(sweep["update_norm_vs_depth"])
    assert "× = diverged" in sweep["loss"]["suptitle"] and "× = diverged" in sweep["update_norm"]["suptitle"]
    # 2b. A run that diverged before its first log line (log_interval 5, diverged at update 4: only
    # the diverged record) keeps its × at the recorded nll and its legend entry (issue 46.1).
    early = os.path.join(work, "early_diverged")
    shutil.rmtree(early, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "lm_run"), early)
    for name in ("analysis.jsonl", "analysis.csv"):
        if os.path.exists(os.path.join(early, name)):
            os.remove(os.path.join(early, name))
    with open(os.path.join(early, "train.jsonl"), "w") as f:
        f.write(json.dumps({"kind": "diverged", "update": 4, "nll": 13.96, "gnorm": 1e4}) + "\n")
    with open(os.path.join(early, "status.json"), "w") as f:
        json.dump({"status": "diverged", "updates": 4, "note": "diverged at update 4"}, f)
    ed, _ = describe(work, "describe_early", early)
    crosses = [ln for ln in panel(ed["loss"], "training nll")["lines"]
               if ln["marker"] == "x" and ln["points"] == 1]
    assert len(crosses) == 1, panel(ed["loss"], "training nll")["lines"]
    assert any("diverged @4" in t for t in texts(ed["loss"])), texts(ed["loss"])
    # 2b'. Equal series drawn once, their names joined (issue 46.4): a run whose ffn_norm input
    # equals its self_attn_norm output at every layer and update.
    equal = os.path.join(work, "equal_series")
    shutil.rmtree(equal, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "sweep", "post-ln_L4-4"), equal)
    with open(os.path.join(equal, "analysis.csv"), newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    out_of = {(r[0], r[2], r[3]): r[5] for r in rows[1:]
              if r[1] == "act_grad_norm" and r[4] == "self_attn_norm.out"}
    for r in rows[1:]:
        if r[1] == "act_grad_norm" and r[4] == "ffn_norm.in" and (r[0], r[2], r[3]) in out_of:
            r[5] = out_of[(r[0], r[2], r[3])]
    with open(os.path.join(equal, "analysis.csv"), "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    eq, _ = describe(work, "describe_equal", equal)
    fig = next(v for k, v in eq.items() if k.startswith("act_grad_norm"))
    entries = [e["text"] for leg in fig["legends"] for e in leg]
    joined = [e for e in entries if "ffn_norm input" in e]
    assert len(joined) == 1 and " = " in joined[0] and "self_attn_norm output" in joined[0], entries
    assert not any(e == "self_attn_norm output" for e in entries), entries
    for ax in fig["axes"]:  # one line per legend entry (the encoder has no cross-attention)
        want = len(entries) - (1 if ax["title"].startswith("encoder") else 0) * 2
        assert len(ax["lines"]) == want, (ax["title"], len(ax["lines"]), entries)
    # 2c. Log axes read true (issue 46.3): no two tick labels alike, each label its tick's value
    # at the label's precision, at least 2 labels; a validation nll from 2.19 to 2.1646 among them.
    narrow = os.path.join(work, "narrow_valid")
    shutil.rmtree(narrow, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "lm_run"), narrow)
    with open(os.path.join(narrow, "train.jsonl"), "w") as f:
        for i, nll in enumerate([2.19, 2.183, 2.175, 2.1646]):
            f.write(json.dumps({"kind": "train", "update": 10 * (i + 1), "nll": nll + 0.5,
                                "loss": nll + 0.5, "gnorm": 1.0}) + "\n")
            f.write(json.dumps({"kind": "valid", "update": 10 * (i + 1), "nll": nll, "loss": nll}) + "\n")
    nv, _ = describe(work, "describe_narrow", narrow)
    assert panel(nv["loss"], "validation nll")["yscale"] == "log"
    for described in (nv, edge, sweep, one_run_figures(work, fx)):
        for name, fig in described.items():
            for ax in fig["axes"]:
                if ax["yscale"] != "log" or not ax["lines"]:
                    continue
                labels = [t for _, t in ax["yticks"]]
                where = f"{name}, {ax['title']}: y ticks {ax['yticks']}"
                assert len(labels) >= 2 and len(set(labels)) == len(labels), where
                for v, t in ax["yticks"]:
                    decimals = len(t.split(".")[1]) if "." in t else 0
                    try:
                        shown = float(t.replace("−", "-"))
                    except ValueError:
                        continue  # mathtext (10^k): matplotlib's own decades
                    assert abs(shown - v) <= 0.5 * 10 ** -decimals * 1.0001, where
    # 2d. OLMo 2's spike score (issue 67.5): the spikes planted by spiky_run get a ▲ each.
    sp, _ = describe(work, "describe_spikes", spiky_run(work, fx))
    for title in ("training nll", "gradient norm before clipping (BranchNorm Fig. 4)"):
        marks = [ln for ln in panel(sp["loss"], title)["lines"] if ln["marker"] == "^"]
        assert len(marks) == 1 and marks[0]["points"] == 1, (title, panel(sp["loss"], title)["lines"])
    assert "▲ = a spike" in sp["loss"]["suptitle"], sp["loss"]["suptitle"]
    assert "▲" not in edge["loss"]["suptitle"], edge["loss"]["suptitle"]
    # 3. One validation (update 60) and probes at one update: each one-point line has a marker, and
    # a linear axis around one value v spans 0..2v, not matplotlib's v ± 5% (57–63).
    one, _ = describe(work, "describe_one", os.path.join(fx, "edge", "pre-ln_L2-2"))
    lone = [(name, ax["title"], ln) for name, fig in one.items() for ax in fig["axes"]
            for ln in ax["lines"] if ln["points"] == 1]
    assert {name for name, _, _ in lone} >= {"loss", "update_norm", "ln_input_norm"}, lone
    for name, title, ln in lone:
        assert ln["marker"] not in ("None", "none", "", " ") and ln["markersize"] >= 5, \
            f"{name}, {title}: a lone point without a visible marker: {ln}"
    for title in ("validation nll", "validation BLEU (greedy)"):
        lo, hi = panel(one["loss"], title)["xlim"]
        assert lo <= 0 and hi >= 120, f"loss, {title}: update axis {lo}..{hi} around the one validation at 60"
    lo, hi = panel(one["loss"], "validation BLEU (greedy)")["ylim"]
    assert lo <= 0 < hi, f"loss, validation BLEU: {lo}..{hi} around one score"
    # 4. scheme_state: ReZero 6L-6L's self_attn and ffn gates (12 lines each) show encoder and
    # decoder layers in two styles, each named in the legend; cross_attn (6) keeps a line each.
    ss = edge["scheme_state"]
    for sub in ("self_attn_gate", "ffn_gate"):
        ax = panel(ss, f"scheme state: {sub}")
        styles = Counter((ln["color"], ln["linestyle"]) for ln in ax["lines"])
        legend = {e["text"]: (e["color"], e["linestyle"]) for e in ax["legend"]}
        assert sorted(styles.values()) == [6, 6], f"{sub}: line styles {styles}"
        assert sorted(legend) == ["rezero_L6-6: decoder (one line per layer)",
                                  "rezero_L6-6: encoder (one line per layer)"], legend
        assert set(legend.values()) == set(styles), (legend, styles)
    cross = panel(ss, "scheme state: cross_attn_gate")
    assert len(cross["legend"]) == 6 and len({(ln["color"], ln["linestyle"], ln["marker"])
                                              for ln in cross["lines"]}) == 6
    # One colour per run and stack across every panel of the figure (issue 46.2).
    meaning = {}
    for ax in ss["axes"]:
        for ln in ax["lines"]:
            label = ln["label"]
            if label.startswith("_"):
                continue
            who = label.split(" layer ")[0].replace(" (one line per layer)", "")
            meaning.setdefault(ln["color"], set()).add(who)
    assert all(len(v) == 1 for v in meaning.values()), meaning
    # 6. Two seeds per scheme and depth: one line per scheme through the seeds' means (2 points),
    # each seed a dot; not a line through all four runs in sweep order. A wider DeepNorm (a model
    # table axis holding the depth too) is a line of its own, joined across its depths.
    sd, _ = describe(work, "describe_seeds", os.path.join(fx, "seeds"))
    for fig_name, title in (("depth_table", "Best validation nll vs depth"),
                            ("update_norm_vs_depth", "Model update at each run's last recorded update vs depth\n(DeepNet Fig. 4)")):
        ax = panel(sd[fig_name], title)
        means = [ln for ln in ax["lines"] if ln["marker"] == "o"]
        dots = [ln for ln in ax["lines"] if ln["marker"] == "."]
        assert len(means) == 3 and all(ln["points"] == 2 for ln in means), (fig_name, ax["lines"])
        assert len(dots) == 4 and all(ln["points"] == 2 for ln in dots), (fig_name, ax["lines"])
        assert sorted(e["text"] for e in ax["legend"]) == \
            ["PostLN-paper", "deepnorm, d_model=128", "deepnorm, d_model=64"], ax["legend"]
    # 7. 1-1, 2-2 and 3-1 layers: one axis of total layers for all (the 1-1 run was drawn at 1,
    # 2-2 at 2 and 3-1 at 4 on an axis labelled either way).
    mx, _ = describe(work, "describe_mixed", os.path.join(fx, "mixed"))
    for fig_name in ("depth_table", "update_norm_vs_depth"):
        for ax in mx[fig_name]["axes"]:
            means = [ln for ln in ax["lines"] if ln["marker"] == "o"]
            if not means:
                continue
            assert ax["xlabel"].startswith("total layers N+M"), (fig_name, ax["xlabel"])
            assert [ln["xs"] for ln in means] == [[2.0, 4.0]], (fig_name, ax["lines"])
    # 5. Overlapping frontier bands: each scheme's band its own hatch and edge colour, shown in the
    # legend beside the scheme (tints alone blended into one colour).
    fr, _ = describe(work, "describe_frontier", os.path.join(fx, "frontier"))
    ax = fr["frontier"]["axes"][0]
    bands = ax["bands"]
    assert len(bands) == 2 and all(b["hatch"] for b in bands), bands
    assert bands[0]["hatch"] != bands[1]["hatch"] and bands[0]["edgecolor"] != bands[1]["edgecolor"], bands
    legend = {e["text"]: e for e in ax["legend"]}
    assert [legend[s]["hatch"] for s in ("post-ln", "pre-ln")] == [b["hatch"] for b in bands], ax["legend"]
    # ... and its lr_sensitivity, 0.5 for both schemes: a y axis from 0, not 0.475–0.525
    lo, hi = panel(fr["lr_sensitivity"], "LR sensitivity (Wortsman et al. 2023)")["ylim"]
    assert lo <= 0 and hi >= 1, f"lr_sensitivity: {lo}..{hi} around one value"


def step_report(exe, work):
    fx = fixture(work)
    out = os.path.join(work, "report")
    shutil.rmtree(out, ignore_errors=True)
    p = run(exe, "report", os.path.join(fx, "sweep"), "--out", out)
    html_path = os.path.join(out, "report.html")
    assert p.stdout.rstrip().splitlines()[-1] == f"report: {html_path}", p.stdout
    with open(os.path.join(out, "summary.csv"), newline="", encoding="utf-8") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["post-ln_L4-4", "post-ln_L8-8", "pre-ln_L4-4", "deepnorm_L4-4",
                          "deepnorm_L8-8", "branchnorm_L8-8", "admin_L4-4", "admin_L8-8"], list(rows)
    assert rows["post-ln_L8-8"]["status_text"] == "diverged at update 137"
    assert rows["post-ln_L8-8"]["best_valid_nll"] == ""
    assert rows["deepnorm_L8-8"]["status_text"] == "completed"
    assert rows["admin_L4-4"]["status_text"].startswith("failed: std::bad_alloc")
    assert rows["admin_L8-8"]["status"] == "not started"
    assert rows["branchnorm_L8-8"]["status_text"] == "running (update 600)"
    for rid in ("post-ln_L4-4", "deepnorm_L8-8", "branchnorm_L8-8"):
        assert 0 < float(rows[rid]["best_valid_nll"]) < 5, rows[rid]
        assert 0 < float(rows[rid]["best_valid_bleu"]) <= 100, rows[rid]
        assert float(rows[rid]["tokens_per_s"]) > 0, rows[rid]
        assert rows[rid]["depth"] in ("4L-4L", "8L-8L") and rows[rid]["value:scheme"] == rows[rid]["scheme"]
        # the recipe column (issue 45): the fixture's [optim] with the defaults it leaves out
        assert abs(float(rows[rid]["best_valid_ppl"]) - math.exp(float(rows[rid]["best_valid_nll"]))) < 0.02 * float(rows[rid]["best_valid_ppl"]), rows[rid]
        assert rows[rid]["recipe"] == ("AdamW lr 0.0005, β₂ 0.98, wd 0, warm-up 100, inverse_sqrt, no clip"), rows[rid]
    with open(html_path, encoding="utf-8") as f:
        page = f.read()
    assert "<table id='matrix'>" in page and "<table id='runs'>" in page
    for text in ("diverged at update 137", "failed: std::bad_alloc", "not started", "Sweep manifest",
                 "FAKE fixture sweep", "Layer similarity (B2T Fig. 5)"):
        assert text in page, f"report.html: {text!r} missing"
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) >= 15, f"report.html: {len(images)} embedded images"
    assert not re.search(r"(src|href)=['\"](https?:)?//", page), "report.html references the network"
    import base64
    assert base64.b64decode(images[0])[:8] == PNG_MAGIC
    with open(os.path.join(out, "report.md"), encoding="utf-8") as f:
        md = f.read()
    assert "| scheme | 4L-4L | 8L-8L |" in md, md[:500]
    assert "## Paper view" not in md and "id='paper-view'" not in page  # no run names a paper figure
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        check_png(os.path.join(out, link))
    check_png(os.path.join(out, "figures", "update_norm_vs_depth.png"))
    assert "test-score panel" not in md  # the sweep's completed runs have test scores
    # OLMo 2's spike scores (issue 67.5) in summary.csv and the run table.
    run(exe, "report", spiky_run(work, fx), "--out", os.path.join(work, "report_spikes"))
    with open(os.path.join(work, "report_spikes", "summary.csv"), newline="", encoding="utf-8") as f:
        row = next(csv.DictReader(f))
    assert row["loss_spike_score"] == row["gnorm_spike_score"] == "2.50", row
    with open(os.path.join(work, "report_spikes", "report.md"), encoding="utf-8") as f:
        assert "| loss spikes % | gnorm spikes % |" in f.read()
    # No test score in any run (eval.test_beam = 0): the report's notes say why the depth table has
    # no test panel (issue 27.16).
    run(exe, "report", os.path.join(fx, "edge"), "--out", os.path.join(work, "report_edge"))
    with open(os.path.join(work, "report_edge", "report.md"), encoding="utf-8") as f:
        notes = f.read().split("## Notes", 1)[-1]
    assert "skipping the depth table's test-score panel: no run recorded a test score" in notes, notes
    check_report_controls_and_tasks(exe, work)
    check_best_update(exe, work)


LNS_RECIPE = {"lr": 0.003, "weight_decay": 0.0, "beta2": 0.999}


def write_lm_run(run_dir, scheme, ppl, optim, run_keys="", tasks=(), offline=()):
    """A handmade LM run directory (the trainer's files, known values): validation nll ln(ppl) at
    update 200; `tasks` its in-loop task records, `offline` {file name: eval --tasks JSON}."""
    os.makedirs(os.path.join(run_dir, "eval"), exist_ok=True)
    optim = dict(optim, lr_schedule="cosine", min_lr_ratio=0.1, max_updates=200)
    with open(os.path.join(run_dir, "manifest.resolved.toml"), "w") as f:
        f.write('[model]\narch = "lm"\nfamily = "llama"\nd_model = 64\ndec_layers = 4\n\n'
                f'[scheme]\nname = "{scheme}"\n\n[data]\ndataset = "tinyshakespeare"\n\n[optim]\n'
                + "".join(f"{k} = {json.dumps(v)}\n" for k, v in optim.items())
                + f"\n[run]\nseed = 1\n{run_keys}")
    with open(os.path.join(run_dir, "env.json"), "w") as f:
        json.dump({"scheme": {"name": scheme}}, f)
    with open(os.path.join(run_dir, "status.json"), "w") as f:
        json.dump({"status": "completed", "updates": 200}, f)
    with open(os.path.join(run_dir, "train.jsonl"), "w") as f:
        for u, nll in ((100, math.log(ppl) + 1), (200, math.log(ppl))):
            f.write(json.dumps({"kind": "train", "update": u, "nll": nll, "lr": 1e-3, "tokens": 512 * u}) + "\n")
            f.write(json.dumps({"kind": "valid", "update": u, "nll": nll, "ppl": math.exp(nll)}) + "\n")
            for t in tasks:
                f.write(json.dumps(dict(t, kind="task", update=u, tokens=512 * u,
                                        acc=t["acc"] - (0.1 if u == 100 else 0))) + "\n")
    for name, obj in dict(offline).items():
        with open(os.path.join(run_dir, "eval", name), "w") as f:
            json.dump(obj, f)


def check_best_update(exe, work):
    """summary.csv's best_update is the update of the validation best.safetensors holds (by
    run.checkpoint_save_best), not the best BLEU's whatever the run kept (hostile review, session 18)."""
    runs = os.path.join(work, "best_update")
    shutil.rmtree(runs, ignore_errors=True)
    for name, keep in (("by_nll", ""), ("by_bleu", 'checkpoint_save_best = "bleu"\n')):
        d = os.path.join(runs, name)
        os.makedirs(d)
        with open(os.path.join(d, "manifest.resolved.toml"), "w") as f:
            f.write('[model]\narch = "encdec"\nd_model = 64\nenc_layers = 2\ndec_layers = 2\n\n'
                    f'[scheme]\nname = "post-ln"\n\n[run]\nseed = 1\n{keep}')
        with open(os.path.join(d, "env.json"), "w") as f:
            json.dump({"scheme": {"name": "post-ln"}}, f)
        with open(os.path.join(d, "status.json"), "w") as f:
            json.dump({"status": "completed", "updates": 300}, f)
        with open(os.path.join(d, "train.jsonl"), "w") as f:  # BLEU peaks at 100, nll is lowest at 200
            for u, nll, bleu in ((100, 2.0, 30.0), (200, 1.8, 25.0), (300, 1.8, 24.0)):
                f.write(json.dumps({"kind": "train", "update": u, "nll": nll + 0.1, "lr": 1e-3}) + "\n")
                f.write(json.dumps({"kind": "valid", "update": u, "nll": nll, "bleu": bleu}) + "\n")
    out = os.path.join(work, "best_update_report")
    shutil.rmtree(out, ignore_errors=True)
    run(exe, "report", os.path.join(runs, "by_nll"), os.path.join(runs, "by_bleu"), "--out", out)
    with open(os.path.join(out, "summary.csv"), newline="", encoding="utf-8") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    got = {os.path.basename(r["dir"]): (r["best_update"], r["best_valid_nll"], r["best_valid_bleu"])
           for r in rows.values()}
    assert got == {"by_nll": ("200", "1.8000", "30.00"), "by_bleu": ("100", "1.8000", "30.00")}, got


def check_report_controls_and_tasks(exe, work):
    """Issue 69.4: every scheme run beside its control or the reason it has none; the gap to the
    baseline Pre-LN split into the recipe's and the scheme's part; the key holds run.device,
    run.tf32, optim.max_epochs and every other optim key such as optim.z_loss (twins differing in
    one of them, given before the control, were taken for it). Issues 69.2, 68.5, 68.6: the task tables (the harness's metrics first, normlab's
    apart, averages over like metrics), every eval --tasks call's file, the downstream figure."""
    sweep = os.path.join(work, "controls_sweep")
    shutil.rmtree(sweep, ignore_errors=True)
    os.makedirs(sweep)
    with open(os.path.join(sweep, "controls.toml"), "w") as f:
        f.write("[optim]\nlr = 0.003\nweight_decay = 0.1\n")
    hs = {"task": "hs", "task_kind": "multiple_choice", "harness_metrics": ["acc", "acc_norm"], "items": 100,
          "acc": 0.4, "acc_stderr": 0.05, "acc_norm": 0.35, "acc_norm_stderr": 0.06, "bits_per_byte": 1.5,
          "chance": 0.25}
    wg = {"task": "wg", "task_kind": "multiple_choice", "harness_metrics": ["acc"], "items": 50, "acc": 0.6,
          "acc_stderr": 0.04, "acc_norm": 0.55, "acc_norm_stderr": 0.045, "bits_per_byte": 1.2, "chance": 0.5}
    lam = {"task": "lam", "task_kind": "last_word", "harness_metrics": ["perplexity", "acc"], "items": 80,
           "acc": 0.2, "acc_stderr": 0.03, "acc_norm": 0.2, "acc_norm_stderr": 0.03, "ppl": 40.0,
           "ppl_stderr": 5.0, "bits_per_byte": 2.0}
    old_hs = {k: v for k, v in hs.items() if k not in ("harness_metrics", "chance")}  # written before 69.2
    offline = {"tasks.last.hs+wg.json": {"checkpoint": "last", "shots": 0, "limit": 0, "seed": 1234, "tasks": {
        "hs": dict(hs, kind="multiple_choice", item_scores=[]), "wg": dict(wg, kind="multiple_choice")}},
        "tasks.last.hs.limit10.json": {"checkpoint": "last", "shots": 0, "limit": 10, "seed": 1234, "tasks": {
            "hs": dict(hs, kind="multiple_choice", items=10, acc=0.7)}}}
    runs = [  # id, scheme, valid ppl, optim, [run] keys, sweep values, tasks, offline
        ("pre-ln", "pre-ln", 60, {"lr": 0.003, "weight_decay": 0.1}, "", {"optim": {"weight_decay": 0.1}}, (), {}),
        ("pre-ln.cuda", "pre-ln", 70, LNS_RECIPE, 'device = "cuda"\n', {"optim": LNS_RECIPE}, (), {}),
        ("pre-ln.tf32", "pre-ln", 71, LNS_RECIPE, "tf32 = true\n", {"optim": LNS_RECIPE}, (), {}),
        ("pre-ln.epochs", "pre-ln", 72, dict(LNS_RECIPE, max_epochs=3), "", {"optim": LNS_RECIPE}, (), {}),
        # a key outside the recipe list the report once had (hostile review: z_loss was ignored)
        ("pre-ln.z-loss", "pre-ln", 73, dict(LNS_RECIPE, z_loss=1e-4), "", {"optim": LNS_RECIPE}, (), {}),
        ("ln-scaling", "ln-scaling", 50, LNS_RECIPE, "", {"optim": LNS_RECIPE}, (hs, wg, lam), offline),
        ("pre-ln.lns-recipe", "pre-ln", 55, LNS_RECIPE, "", {"optim": LNS_RECIPE}, (), {}),
        ("mix-ln.bf16", "mix-ln", 45, LNS_RECIPE, 'dtype = "bf16"\n', {"optim": LNS_RECIPE}, (), {}),
        ("peri-ln", "peri-ln", 90, {"lr": 0.003, "weight_decay": 0.1}, "", {"optim": {"weight_decay": 0.1}},
         (old_hs,), {}),
    ]
    entries = []
    for i, (rid, scheme, ppl, optim, run_keys, values, tasks, off) in enumerate(runs):
        write_lm_run(os.path.join(sweep, rid), scheme, ppl, optim, run_keys, tasks, off)
        entries.append({"index": i, "id": rid, "dir": rid, "values": dict(values, scheme={"name": scheme})})
    with open(os.path.join(sweep, "sweep.json"), "w") as f:
        json.dump({"name": "controls", "manifest": os.path.join(sweep, "controls.toml"), "runs": entries}, f)
    out = os.path.join(work, "report_controls")
    shutil.rmtree(out, ignore_errors=True)
    run(exe, "report", sweep, "--out", out)
    with open(os.path.join(out, "report.md"), encoding="utf-8") as f:
        md = f.read()

    def table(heading):
        section = md.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
        lines = [ln for ln in section.splitlines() if ln.startswith("| ")]
        return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines[1:]]

    controls = {r[0]: r for r in table("Each scheme against its control")}
    assert list(controls) == ["ln-scaling", "mix-ln.bf16", "peri-ln"], controls
    # ppl 50 against its control's 55 and the baseline's 60: −10 = −5 (recipe) + −5 (scheme)
    lns = controls["ln-scaling"]
    assert lns[1:9] == ["pre-ln.lns-recipe", "4L", "50.00", "55.00", "60.00", "-10.00", "-5.00", "-5.00"], lns
    assert "lr 0.003" in lns[9] and "cosine to 0.1·lr" in lns[9] and "β₂ 0.999" in lns[9], lns
    # Peri-LN under the baseline recipe: the baseline is its control, the whole gap the scheme's.
    assert controls["peri-ln"][1:9] == ["pre-ln", "4L", "90.00", "60.00", "60.00", "+30.00", "+0.00", "+30.00"]
    bf16 = controls["mix-ln.bf16"]
    assert bf16[1] == "no control: the closest Pre-LN run, pre-ln.lns-recipe, differs in run.dtype fp32 (this " \
                      "run: bf16)" and bf16[3:9] == ["45.00", "", "", "", "", ""], bf16

    tasks = table("Downstream tasks")
    by_task = {(r[0], r[3]): r for r in tasks}
    assert by_task[("ln-scaling", "hs")][1:] == ["200", "102,400", "hs", "100", "0.250", "acc 0.400 ± 0.050, "
                                                 "acc_norm 0.350 ± 0.060", "bpb 1.500"], by_task[("ln-scaling", "hs")]
    assert by_task[("ln-scaling", "wg")][6:] == ["acc 0.600 ± 0.040", "acc_norm 0.550 ± 0.045, bpb 1.200"]
    assert by_task[("ln-scaling", "lam")][5:] == ["", "perplexity 40.00 ± 5.00, acc 0.200 ± 0.030", "bpb 2.000"]
    # (0.4 + 0.6 + 0.2) / 3; acc_norm is the harness's for hs alone; bpb (1.5 + 1.2 + 2.0) / 3
    assert by_task[("ln-scaling", "averages")][6] == ("mean acc 0.400 (3 tasks: hs, wg, lam); mean acc_norm 0.350 "
                                                      "(1 task: hs); mean bpb 1.567 (3 tasks: hs, wg, lam)")
    assert by_task[("peri-ln", "hs")][6] == "acc 0.400 ± 0.050, acc_norm 0.350 ± 0.060 (assumed: the harness's " \
                                            "defaults)", by_task[("peri-ln", "hs")]
    calls = [(r[1], r[4], r[5], r[6]) for r in table("Downstream tasks scored by normlab eval --tasks")]
    assert calls == [("tasks.last.hs+wg.json", "all", "hs", "100"), ("tasks.last.hs+wg.json", "all", "wg", "50"),
                     ("tasks.last.hs.limit10.json", "10", "hs", "10")], calls

    figs, _ = describe(work, "describe_tasks", sweep)
    fig = figs["downstream_tasks"]
    hs_panel = panel(fig, "hs")
    chance = [ln for ln in hs_panel["lines"] if ln["label"] == "chance"]
    assert len(chance) == 1 and chance[0]["y0"] == 0.25, hs_panel["lines"]
    assert len(hs_panel["bands"]) == 2, hs_panel["bands"]  # ±1 stderr, a band per run
    assert any(t.endswith("K") for t in hs_panel["xticks"]) and hs_panel["xlabel"] == "training tokens", hs_panel
    assert not [ln for ln in panel(fig, "lam")["lines"] if ln["label"] == "chance"]  # a last-word task has none
    ppl = panel(fig, "lam: perplexity ± 1 stderr")
    assert len(ppl["bands"]) == 1 and ppl["lines"][0]["points"] == 2, ppl
    assert panel(fig, "validation perplexity")["lines"][0]["points"] == 2
    assert sum(ax["ylabel"].startswith("bits per byte (gold, normlab's)") for ax in fig["axes"]
               if ax["visible"]) == 3 + 1  # beside acc, per task and their mean


def step_report_paper(exe, work):
    """A sweep named after a paper figure: the report sets our figure beside the paper figure's
    description and the statistic measured; under another name, no paper view."""
    fx = fixture(work)
    out = os.path.join(work, "report_paper")
    shutil.rmtree(out, ignore_errors=True)
    run(exe, "report", os.path.join(fx, "paper"), "--out", out)
    with open(os.path.join(out, "report.md"), encoding="utf-8") as f:
        md = f.read()
    assert "## Paper view" in md, md[:800]
    section = md.split("## Paper view", 1)[1].split("\n## ", 1)[0]
    for text in ("### B2T connection (Takase et al. 2023, Findings of ACL), Fig. 3",
                 "What the paper shows.", "decay exponentially toward the lower layers",
                 "What to compare.", "Measured here** (3 runs)", "](figures/grad_norm_start.png)"):
        assert text in section, f"report.md paper view: {text!r} missing\n{section}"
    # The fixture's Post-LN decoder gradient shrinks 0.2x per 6 layers from the top (8 layers:
    # ratio ~0.12); its B2T is near flat (ratio ~1.2): the measured line must say so.
    m = re.search(r"post-ln: g\(layer 1\)/g\(top layer\) over updates 1–20: decoder ([0-9.e-]+)", section)
    assert m and 0.05 < float(m.group(1)) < 0.25, section
    m = re.search(r"b2t: g\(layer 1\)/g\(top layer\) over updates 1–20: decoder ([0-9.e-]+)", section)
    assert m and 0.9 < float(m.group(1)) < 1.5, section
    check_png(os.path.join(out, "figures", "grad_norm_start.png"))
    with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
        page = f.read()
    view = page.split("id='paper-b2t-fig3'", 1)
    assert len(view) == 2, "report.html: no paper view for b2t-fig3"
    view = view[1].split("<h2", 1)[0]
    assert "<figure id='fig-grad_norm_start'><img" in view and "data:image/png;base64," in view, view[:400]
    assert "What the paper shows." in view and "Measured here" in view, view[:2000]
    # The same runs in a sweep of another name: no paper view.
    other = os.path.join(work, "paper_other")
    shutil.rmtree(other, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "paper"), other)
    with open(os.path.join(other, "sweep.json"), encoding="utf-8") as f:
        info = json.load(f)
    info["name"] = "b2t-fig3-copy"
    with open(os.path.join(other, "sweep.json"), "w", encoding="utf-8") as f:
        json.dump(info, f)
    p = run(exe, "report", other, "--out", os.path.join(work, "report_other"))
    with open(os.path.join(work, "report_other", "report.md"), encoding="utf-8") as f:
        assert "## Paper view" not in f.read()
    # ... but not silently: a name that resembles a paper view is pointed out.
    assert "sweep 'b2t-fig3-copy'" in p.stderr and "did you mean 'b2t-fig3'?" in p.stderr, p.stderr


def step_render(exe, work):
    html_path = os.path.join(work, "report", "report.html")
    if not os.path.exists(html_path):
        step_report(exe, work)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("SKIP: chromium not found (Debian package chromium); the HTML was not rendered")
        return
    shot = os.path.join(work, "report_screenshot.png")
    if os.path.exists(shot):
        os.remove(shot)
    p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=1280,2400", "file://" + html_path],
                       capture_output=True, text=True, timeout=120)
    assert os.path.exists(shot), f"chromium wrote no screenshot (exit {p.returncode}):\n{p.stderr[-2000:]}"
    check_png(shot)
    print(f"rendered {html_path} → {shot} ({os.path.getsize(shot)} bytes)")


def step_plot_errors(exe, work):
    fx = fixture(work)
    p = run(exe, "plot", os.path.join(work, "no_such_dir"), "--out", os.path.join(work, "x"), expect=2)
    assert "no_such_dir: no such directory" in p.stderr, p.stderr
    p = run(exe, "plot", HERE, "--out", os.path.join(work, "x"), expect=2)
    assert "neither a run directory" in p.stderr, p.stderr
    bad = os.path.join(work, "bad_run")
    for name, content, message in (
            ("status.json", "{not json", "status.json: malformed JSON"),
            ("analysis.csv", "update,metric,stack,layer,sublayer,value\n1,grad_norm,model,-1,total\n",
             "analysis.csv:2: expected 6 fields"),
            ("train.jsonl", '{"kind": "train", "update": 1}\n{oops\n{"kind": "train", "update": 2}\n',
             "train.jsonl:2: malformed JSON line"),
            ("manifest.resolved.toml", None, "manifest.resolved.toml: missing")):
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(os.path.join(fx, "lm_run"), bad)
        target = os.path.join(bad, name)
        if content is None:
            os.remove(target)
        else:
            with open(target, "w") as f:
                f.write(content)
        for sub in ("plot", "report") if name == "status.json" else ("plot",):
            args = [sub, bad] + (["--out", os.path.join(work, "x")] if sub == "plot" else [])
            p = run(exe, *args, expect=2)
            assert message in p.stderr and bad in p.stderr, f"{sub} with bad {name}: {p.stderr}"
    p = run(exe, "plot", os.path.join(fx, "lm_run"), "--out", os.path.join(work, "x"),
            "--update", "sometimes", expect=2)
    assert "--update" in p.stderr, p.stderr


def step_real(exe, work):
    """A tiny real run of the built-in reverse task, then `normlab plot` on it."""
    run_dir = os.path.join(work, "real_run")
    shutil.rmtree(run_dir, ignore_errors=True)
    manifest = os.path.join(work, "real.toml")
    with open(manifest, "w") as f:
        f.write('[model]\narch = "encdec"\nd_model = 32\nffn_dim = 64\nheads = 2\nenc_layers = 2\n'
                'dec_layers = 2\ndropout = 0.0\n\n[scheme]\nname = "post-ln"\n\n'
                '[data]\ntask = "reverse"\nsynthetic_vocab = 12\nsynthetic_min_len = 3\n'
                'synthetic_max_len = 6\nsynthetic_train = 400\nsynthetic_valid = 40\n\n'
                '[optim]\nlr = 1e-3\nwarmup_updates = 5\nmax_tokens = 256\nmax_updates = 30\n\n'
                '[eval]\ninterval = 15\nbleu = false\n\n'
                f'[run]\nout_dir = "{run_dir}"\nlog_interval = 5\ncheckpoint_interval = 1000\n'
                'threads = 1\n\n'
                '[analysis]\nprobes = ["all"]\ninterval = 5\ndense_until = 10\ncosine_at = [0, 30]\n'
                'tensorboard = false\n')
    run(exe, "train", manifest)
    out = os.path.join(work, "real_plots")
    shutil.rmtree(out, ignore_errors=True)
    p = run(exe, "plot", run_dir, "--out", out)
    files = listed_files(p.stdout)
    assert os.path.join(out, "loss.png") in files, p.stdout
    for f in files:
        if f.endswith(".png"):
            check_png(f)
    check_svg(os.path.join(out, "loss.svg"), "Loss curves", "post-ln 2L-2L")
    stems = {os.path.splitext(os.path.basename(f))[0] for f in files}
    expected = {"loss", "grad_norm_layers", "update_norm", "ffn_sparsity", "ln_input_norm",
                "act_grad_norm_post-ln_2L-2L", "layer_cosine_post-ln_2L-2L", "attn_logit_max",
                "attn_entropy", "output_logits", "activation_kurtosis", "massive_activations"}
    assert expected <= stems, f"missing figures: {expected - stems}\n{p.stdout}"
    check_svg(os.path.join(out, "grad_norm_layers.svg"), "Gradient norm per layer", "first recorded update (1)")
    check_svg(os.path.join(out, "layer_cosine_post-ln_2L-2L.svg"), "update 30")
    # The instability probes (issue 67.4): each attention of the encoder-decoder, over updates and
    # per layer at the last one.
    check_svg(os.path.join(out, "attn_logit_max.svg"), "Attention logit growth", "encoder self-attention",
              "decoder self-attention", "cross-attention", "last recorded update (30)")
    check_svg(os.path.join(out, "attn_entropy.svg"), "Attention entropy", "smallest over the layers")
    check_svg(os.path.join(out, "output_logits.svg"), "Output logit divergence", "mean log Z")
    check_svg(os.path.join(out, "activation_kurtosis.svg"), "kurtosis of the per-feature RMS")
    check_svg(os.path.join(out, "massive_activations.svg"), "Massive activations", "max |h| / median |h|")
    check_serial_same(run_dir, out, p.stdout, work)
    check_failure_same(run_dir, work)
    check_plot_jobs_values(exe, run_dir, work)
    check_interrupt(exe, run_dir, work)
    check_worker_killed(exe, run_dir, work)
    check_same_labels(exe, run_dir, work)
    print("\n".join(files))


def session_alive(sid):
    """The processes of session `sid` still running (zombies excluded)."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            alive.append(int(pid))
    return alive


def check_interrupt(exe, run_dir, work):
    """Ctrl-C while the figures render in worker processes: `normlab plot` ends at once and leaves
    no process behind (a pool whose workers caught the interrupt too could hang)."""
    out = os.path.join(work, "real_plots_interrupted")
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.Popen([exe, "plot", run_dir, "--out", out], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and len(session_alive(p.pid)) < 3:
        time.sleep(0.05)  # normlab, its Python and a worker
    assert p.poll() is None, "normlab plot ended before its workers started: nothing to interrupt"
    os.killpg(p.pid, signal.SIGINT)
    try:
        p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError("normlab plot still running 30 s after Ctrl-C")
    for _ in range(50):
        if not session_alive(p.pid):
            return
        time.sleep(0.1)
    left = session_alive(p.pid)
    os.killpg(p.pid, signal.SIGKILL)
    raise AssertionError(f"processes left after Ctrl-C: {left}")


def plot_in_process(run_dir, out, jobs):
    """normlab_plots.main in a Python of its own with JOBS = jobs (None: the default)."""
    pydir = os.environ.get("NORMLAB_PYTHON_DIR") or os.path.join(HERE, "..", "..", "analysis", "python")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import normlab_plots as p; "
            f"p.JOBS = {jobs}; sys.exit(p.main(sys.argv[2:]))")
    return run(plot_python(), "-c", code, pydir, run_dir, "--out", out, expect=None)


def check_failure_same(run_dir, work):
    """A step that fails (a folder where its file goes): with workers as in one process, the notes
    before it, one error line, exit 1, and no file of the steps after it."""
    got = {}
    for jobs in ("1", "None"):
        out = os.path.join(work, f"failing_plots_{jobs}")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(os.path.join(out, "attn_entropy.png"))
        p = plot_in_process(run_dir, out, jobs)
        files = sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs)
        got[jobs] = (p.returncode, p.stdout, p.stderr.replace(out, "OUT"), files)
    assert got["1"][0] == 1 and "cannot write" in got["1"][2], got["1"]
    assert got["None"] == got["1"], f"one process:\n{got['1']}\nworkers:\n{got['None']}"


def check_plot_jobs_values(exe, run_dir, work):
    """NORMLAB_PLOT_JOBS: a whole number >= 1; anything else is one error line, exit 2, no output."""
    for bad in ("0", "-1", "two", "", "1.5"):
        out = os.path.join(work, "plot_jobs_bad")
        shutil.rmtree(out, ignore_errors=True)
        p = subprocess.run([exe, "plot", run_dir, "--out", out], capture_output=True, text=True,
                           env={**os.environ, "NORMLAB_PLOT_JOBS": bad})
        assert p.returncode == 2 and p.stderr.strip() == (
            f"normlab: error: NORMLAB_PLOT_JOBS: expected a whole number >= 1, got '{bad}'"), (bad, p.stderr)
        assert not os.path.exists(out), f"NORMLAB_PLOT_JOBS={bad!r} wrote {out}"


def check_worker_killed(exe, run_dir, work):
    """A worker killed while drawing (the OOM killer): one error line, exit 1, nothing left."""
    out = os.path.join(work, "real_plots_killed")
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.Popen([exe, "plot", run_dir, "--out", out], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and len(session_alive(p.pid)) < 3:
        time.sleep(0.05)
    assert p.poll() is None, "normlab plot ended before its workers started"
    os.kill(max(session_alive(p.pid)), signal.SIGKILL)  # the newest: a worker
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError("normlab plot hangs after a worker was killed")
    assert p.returncode == 1 and err.startswith("normlab: error: a figure process died"), (p.returncode, err)
    assert len(err.strip().splitlines()) == 1, err
    time.sleep(0.5)
    assert not session_alive(p.pid), session_alive(p.pid)


def check_same_labels(exe, run_dir, work):
    """Runs that share a label (two sweeps with the same run ids, a copy of a run, the same folder
    twice): each keeps its own per-run figures (they overwrote each other), every listed file
    exists once."""
    copy = os.path.join(work, "elsewhere", os.path.basename(run_dir))
    shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
    shutil.copytree(run_dir, copy)
    out = os.path.join(work, "same_label_plots")
    shutil.rmtree(out, ignore_errors=True)
    p = run(exe, "plot", run_dir, copy, run_dir, "--out", out, "--format", "png")
    files = listed_files(p.stdout)
    assert len(files) == len(set(files)) and all(os.path.isfile(f) for f in files), p.stdout
    per_run = sorted(os.path.basename(f) for f in files if os.path.basename(f).startswith("act_grad_norm_"))
    assert len(per_run) == 3 and len(set(per_run)) == 3, per_run
    assert any("elsewhere" in f for f in per_run), per_run


def check_serial_same(run_dir, out, stdout, work):
    """The figures render in forked processes (normlab_plots.make_figures): the same PNG bytes, the
    same files and the same notes, in the same order, as one process gives."""
    pydir = os.environ.get("NORMLAB_PYTHON_DIR") or os.path.join(HERE, "..", "..", "analysis", "python")
    serial = os.path.join(work, "real_plots_serial")
    shutil.rmtree(serial, ignore_errors=True)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import normlab_plots as p; p.JOBS = 1; "
            "sys.exit(p.main(sys.argv[2:]))")
    q = run(plot_python(), "-c", code, pydir, run_dir, "--out", serial)
    assert q.stdout.replace(serial, out) == stdout, f"serial:\n{q.stdout}\nforked:\n{stdout}"
    pngs = sorted(f for f in os.listdir(out) if f.endswith(".png"))
    assert pngs == sorted(f for f in os.listdir(serial) if f.endswith(".png")) and len(pngs) >= 12, pngs
    for f in pngs:
        with open(os.path.join(out, f), "rb") as a, open(os.path.join(serial, f), "rb") as b:
            assert a.read() == b.read(), f"{f}: the forked rendering differs from the serial one"


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    exe, work, step = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
    os.makedirs(work, exist_ok=True)
    globals()[f"step_{step}"](exe, work)
    print(f"ok: {step}")


if __name__ == "__main__":
    main()
