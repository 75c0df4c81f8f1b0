#!/usr/bin/env python3
"""`normlab eval RUN --tasks` against lm-evaluation-harness on the same items, the same model and the
same machine (issue 58.6). Run it with the venv's python (lm_eval[hf], transformers, sentencepiece).

A llama-family pre-ln model is trained for a few updates on a generated corpus (its quality does not
matter here) and exported with `normlab export --format hf`; a HellaSwag-like file of --items items,
each a long-ish context and 4 long-ish endings, is scored
- by `normlab eval RUN --tasks FILE --json` (one process: start, loading the run, scoring, writing
  the JSON), and
- by `lm_eval.evaluator.simple_evaluate` with HFLM over the export (transformers' LlamaForCausalLM,
  float32; the run's SentencePiece model through python/normlab_hf_tokenizer.py) on a local task YAML
  over the same items, in a fresh Python process per round (imports, loading, building the task,
  scoring).
Both sides run the same number of threads (normlab: the run's run.threads, what `normlab eval` uses
for LibTorch's pool; the harness: torch.set_num_threads) under the same OMP_WAIT_POLICY:
--omp-wait-policy, else the environment's (unset: libgomp's default). normlab's own choice by the
load at its start (NORMLAB_OMP_AUTO) is turned off here: in alternating rounds it could pick PASSIVE
right after a harness round while the harness spins. Spinning OpenMP threads collapse on a busy
machine (../shared/PERF.md): check `uptime` first. Rounds alternate the two sides; medians are
reported.

Per side, items per second: end to end (the process's wall time) and scoring (normlab: the task's
"seconds", evaluate_task; the harness: HFLM.loglikelihood, tokenizing and scoring the requests, and
the whole simple_evaluate call, which also builds the task). The two sides' acc and acc_norm are
printed as a sanity check (equal: the same scores; tests/check_tasks_lm_eval.py checks parity item
by item).

usage: tasks_vs_lm_eval.py [--normlab build/bin/normlab] [--plugins build/plugins] [--items 300]
                           [--threads 1,2] [--rounds 3] [--batch-size 32] [--d-model 256] [--layers 4]
                           [--shots 0] [--omp-wait-policy PASSIVE|ACTIVE] [--work /tmp/normlab-tasks-vs-lm-eval]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def harness_worker(export, task_dir, threads, batch_size, shots):
    """One round of the harness, in its own process: prints one JSON line of its phase times."""
    t0 = time.time()
    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                       "DISABLE_MULTIPROC": "1", "TOKENIZERS_PARALLELISM": "false"})
    import contextlib
    import logging

    import torch
    import transformers
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    sys.path.insert(0, os.path.join(REPO, "python"))
    import normlab_hf_tokenizer

    logging.disable(logging.WARNING)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    t_import = time.time()
    model = transformers.LlamaForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    lm = HFLM(pretrained=model, tokenizer=normlab_hf_tokenizer.from_export(export), batch_size=batch_size,
              device="cpu")
    tm = TaskManager(include_path=task_dir, include_defaults=False)
    scoring = [0.0]  # HFLM.loglikelihood: tokenizing and scoring the requests, as normlab's evaluate_task
    loglikelihood = lm.loglikelihood

    def timed(*args, **kwargs):
        t = time.time()
        out = loglikelihood(*args, **kwargs)
        scoring[0] += time.time() - t
        return out

    lm.loglikelihood = timed
    t_load = time.time()
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        res = simple_evaluate(model=lm, tasks=["bench_hellaswag"], num_fewshot=shots, task_manager=tm,
                              log_samples=False, bootstrap_iters=0)
    t_eval = time.time()
    r = res["results"]["bench_hellaswag"]
    print(json.dumps({"import_s": t_import - t0, "load_s": t_load - t_import, "evaluate_s": t_eval - t_load,
                      "loglikelihood_s": scoring[0],
                      "acc": r["acc,none"], "acc_norm": r["acc_norm,none"], "torch_threads": torch.get_num_threads(),
                      "torch": torch.__version__, "transformers": transformers.__version__}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--normlab", default=os.path.join(REPO, "build/bin/normlab"))
    ap.add_argument("--plugins", default=os.path.join(REPO, "build/plugins"))
    ap.add_argument("--work", default="/tmp/normlab-tasks-vs-lm-eval")
    ap.add_argument("--items", type=int, default=300)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts, each measured")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32, help="HFLM's batch_size (normlab: 2,048 padded tokens)")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--omp-wait-policy", choices=["PASSIVE", "ACTIVE"],
                    help="OMP_WAIT_POLICY for both sides (default: the environment's)")
    ap.add_argument("--harness-worker", nargs=5, metavar=("EXPORT", "TASK_DIR", "THREADS", "BATCH", "SHOTS"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.harness_worker:
        e, d, t, b, s = a.harness_worker
        harness_worker(e, d, int(t), int(b), int(s))
        return
    try:
        import lm_eval
        import lm_eval.models.huggingface  # noqa: F401
    except ImportError as err:
        sys.exit("tasks_vs_lm_eval: error: %s (run with the venv's python, which has lm_eval[hf])" % err)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)

    # A generated corpus of pseudo-words: enough vocabulary for a 1,000-piece BPE and long items.
    rnd = random.Random(58)
    syll = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "pi", "nu", "ash", "qua", "ber", "fi", "gon", "ul"]
    words = sorted({"".join(rnd.choice(syll) for _ in range(rnd.randint(1, 3))) for _ in range(3000)})
    commons = ["the", "a", "of", "and", "to", "in", "is", "was", "with", "on"]

    def sentence(n):
        return " ".join(rnd.choice(commons) if rnd.random() < 0.3 else rnd.choice(words) for _ in range(n)) + "."

    corpus = os.path.join(a.work, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("\n".join(sentence(rnd.randint(8, 24)) for _ in range(20000)) + "\n")
    items = [{"context": sentence(rnd.randint(25, 40)), "choices": [sentence(rnd.randint(10, 18)) for _ in range(4)],
              "gold": rnd.randrange(4)} for _ in range(a.items)]
    pool = [{"context": sentence(rnd.randint(25, 40)), "choices": [sentence(rnd.randint(10, 18)) for _ in range(4)],
             "gold": rnd.randrange(4)} for _ in range(max(8, a.shots))]
    task = os.path.join(a.work, "hellaswag_bench.jsonl")
    with open(task, "w") as f:
        for it in [dict(p, fewshot=True) for p in pool] + items:
            f.write(json.dumps(it) + "\n")
    task_dir = os.path.join(a.work, "lm_eval_tasks")
    os.makedirs(task_dir)
    for split, rows in (("test", items), ("train", pool)):
        with open(os.path.join(task_dir, split + ".jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(task_dir, "bench_hellaswag.yaml"), "w") as f:
        f.write("task: bench_hellaswag\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                f"    test: {json.dumps(os.path.join(task_dir, 'test.jsonl'))}\n"
                f"    train: {json.dumps(os.path.join(task_dir, 'train.jsonl'))}\n"
                "test_split: test\nfewshot_split: train\noutput_type: multiple_choice\n"
                'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{gold}}"\n'
                'target_delimiter: " "\nfewshot_delimiter: "\\n\\n"\n'
                "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")

    threads = [int(t) for t in a.threads.split(",")]
    heads = max(1, a.d_model // 64)
    env = dict(os.environ, HF_DATASETS_CACHE=os.path.join(a.work, "hf_datasets"), HF_HOME=os.path.join(a.work, "hf"),
               NORMLAB_OMP_AUTO="0")
    if a.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = a.omp_wait_policy
    rows = []
    for t in threads:
        run = os.path.join(a.work, f"run-t{t}")
        with open(os.path.join(a.work, f"lm-t{t}.toml"), "w") as f:
            f.write(f'[model]\narch = "lm"\nfamily = "llama"\nd_model = {a.d_model}\n'
                    f'ffn_dim = {a.d_model * 8 // 3 // 8 * 8}\nheads = {heads}\ndec_layers = {a.layers}\n'
                    'dropout = 0.0\n[scheme]\nname = "pre-ln"\n'
                    f'[data]\ntask = "lm"\ntrain = "{corpus}"\nlm_block = 128\ncache_dir = "{a.work}/cache"\n'
                    '[data.tokenizer]\nvocab_size = 1000\nmodel_type = "bpe"\n'
                    '[optim]\nlr = 3e-3\nmax_tokens = 2048\nmax_updates = 10\n[eval]\ninterval = 0\n'
                    f'[run]\nout_dir = "{run}"\nthreads = {t}\n')
        for cmd in (["train", os.path.join(a.work, f"lm-t{t}.toml")],
                    ["export", run, "--to", run + "-hf", "--format", "hf"]):
            p = subprocess.run([a.normlab, *cmd, "--plugin-path", a.plugins], capture_output=True, text=True, env=env)
            if p.returncode:
                sys.exit("tasks_vs_lm_eval: error: normlab %s failed: %s" % (cmd[0], p.stderr[-400:]))
        nl_wall, nl_score, h_wall, h_eval, h_ll, h_info, nl_acc = [], [], [], [], [], None, None
        for _ in range(a.rounds):
            args = [a.normlab, "eval", run, "--tasks", task, "--json", "--plugin-path", a.plugins]
            if a.shots:
                args += ["--shots", str(a.shots)]
            t0 = time.time()
            p = subprocess.run(args, capture_output=True, text=True, env=env)
            nl_wall.append(time.time() - t0)
            if p.returncode:
                sys.exit("tasks_vs_lm_eval: error: normlab eval failed: " + p.stderr[-400:])
            r = json.loads(p.stdout)["tasks"]["hellaswag_bench"]
            nl_score.append(r["seconds"])
            nl_acc = (r["acc"], r["acc_norm"])
            t0 = time.time()
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--harness-worker", run + "-hf", task_dir,
                                str(t), str(a.batch_size), str(a.shots)], capture_output=True, text=True, env=env)
            h_wall.append(time.time() - t0)
            if p.returncode:
                sys.exit("tasks_vs_lm_eval: error: the harness failed: " + p.stderr[-800:])
            h_info = json.loads(p.stdout.strip().splitlines()[-1])
            h_eval.append(h_info["evaluate_s"])
            h_ll.append(h_info["loglikelihood_s"])
        rows.append((t, statistics.median(nl_wall), statistics.median(nl_score), statistics.median(h_wall),
                     statistics.median(h_eval), statistics.median(h_ll), nl_acc, (h_info["acc"], h_info["acc_norm"]),
                     h_info))

    n = a.items
    h = rows[-1][-1]
    print(f"{n} HellaSwag-like items x 4 choices ({a.shots}-shot), llama pre-ln d{a.d_model} {a.layers}L, BPE 1,000, "
          f"fp32 on the CPU; medians of {a.rounds} alternating rounds")
    print(f"normlab: {a.normlab}; threads = the run's run.threads (LibTorch intra-op pool), batches of 2,048 "
          f"padded tokens; harness: lm_eval {lm_eval.__version__}, torch {h['torch']}, transformers "
          f"{h['transformers']}, HFLM batch_size {a.batch_size}, torch.set_num_threads; OMP_WAIT_POLICY="
          f"{env.get('OMP_WAIT_POLICY', '(unset)')} on both sides (NORMLAB_OMP_AUTO=0); "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    print("items/s (seconds): end to end = the whole process; scoring = normlab's evaluate_task (the task's "
          "\"seconds\") against HFLM.loglikelihood (tokenizing + scoring), and simple_evaluate (+ building the task)")
    print("| threads | normlab, end to end | harness, end to end | ratio | normlab, scoring | harness, loglikelihood "
          "| ratio | harness, simple_evaluate | ratio | acc / acc_norm (normlab; harness) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t, nw, ns, hw, he, hl, na, ha, _ in rows:
        print(f"| {t} | {n / nw:.1f} ({nw:.2f} s) | {n / hw:.1f} ({hw:.2f} s) | {hw / nw:.2f}x | {n / ns:.1f} "
              f"({ns:.2f} s) | {n / hl:.1f} ({hl:.2f} s) | {hl / ns:.2f}x | {n / he:.1f} ({he:.2f} s) | "
              f"{he / ns:.2f}x | {na[0]:.4f}/{na[1]:.4f}; {ha[0]:.4f}/{ha[1]:.4f}{'' if na == ha else ' DIFFER'} |")


if __name__ == "__main__":
    main()
