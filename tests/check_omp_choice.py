#!/usr/bin/env python3
"""Issue 59.13: a lone `normlab train` chooses how LibTorch's idle OpenMP threads wait from the load
at its start: PASSIVE on a busy machine (spinning threads starve there: 10-40x slower), libgomp's
default on a quiet one, and a user's OMP_WAIT_POLICY untouched; the log and env.json say which and
why; run.threads = 0 takes the cores the others leave. The load is forced with NORMLAB_OMP_LOAD (the
machine's own is whatever it is). Issue 66.16: the re-exec also works when normlab was started
through the dynamic loader, and so do a sweep's workers and `train --nproc 2`'s ranks.

usage: check_omp_choice.py NORMLAB PLUGIN_DIR WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

normlab, plugins, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_checks  # noqa: E402

manifest = cli_checks.write_tiny_llama_manifest(os.path.join(work, "m.toml"), work,
                                                "max_updates = 2\n[run]\nthreads = 1\n")
failures = 0


def program_interpreter(exe):
    """The dynamic loader an ELF64 executable names (its PT_INTERP), or None."""
    with open(exe, "rb") as f:
        elf = f.read(64)
        if elf[:4] != b"\x7fELF" or elf[4] != 2:
            return None
        phoff, = struct.unpack_from("<Q", elf, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
        f.seek(phoff)
        headers = f.read(phentsize * phnum)
        for i in range(phnum):
            if struct.unpack_from("<I", headers, i * phentsize)[0] == 3:  # PT_INTERP
                offset, size = struct.unpack_from("<QxxxxxxxxxxxxxxxxQ", headers, i * phentsize + 8)
                f.seek(offset)
                return f.read(size).rstrip(b"\0").decode()
    return None


def case(name, env_set, env_unset, line, policy, chosen, launcher=(), said=None):
    global failures
    env = {k: v for k, v in os.environ.items() if k not in env_unset}
    env.update(env_set)
    out = os.path.join(work, name)
    p = subprocess.run([*launcher, normlab, "train", manifest, "--set", f'run.out_dir="{out}"', "--plugin-path", plugins],
                       capture_output=True, text=True, env=env)
    e = json.load(open(os.path.join(out, "env.json"))) if p.returncode == 0 else {}
    ok = (p.returncode == 0 and (line in p.stdout if line else "OpenMP wait policy" not in p.stdout)
          and e.get("omp_wait_policy") == policy and e.get("omp_wait_policy_chosen", "").startswith(chosen)
          and (said is None or (said in p.stdout and said in e.get("omp_wait_policy_chosen", "")
                                and "run.threads = 0" not in p.stdout)))
    failures += not ok
    print(("ok   " if ok else "FAIL ") + f"{name}: OMP_WAIT_POLICY {policy!r}, chosen {e.get('omp_wait_policy_chosen')!r}"
          + ("" if ok else f" ({p.stdout[-300:]} {p.stderr[-300:]})"))


case("busy", {"NORMLAB_OMP_LOAD": "5"}, {"OMP_WAIT_POLICY", "NORMLAB_OMP_CHOICE"},
     "OpenMP wait policy: PASSIVE, the machine was busy: load 5.00", "PASSIVE", "PASSIVE, the machine was busy",
     # Issue 68.7: a manifest's run.threads = 1 is said as it is (it said "run.threads = 0 takes 1 thread").
     said="run.threads = 1 sets the threads (0 would have taken ")
# Issue 66.16: started through the dynamic loader (`ld-linux-x86-64.so.2 normlab ARGS`), the busy
# machine's re-exec runs the loader again with normlab, not with the verb as its program.
loader = program_interpreter(normlab)
if loader and os.path.exists(loader):
    case("busy, through the loader", {"NORMLAB_OMP_LOAD": "5"}, {"OMP_WAIT_POLICY", "NORMLAB_OMP_CHOICE"},
         "OpenMP wait policy: PASSIVE, the machine was busy: load 5.00", "PASSIVE", "PASSIVE, the machine was busy",
         launcher=(loader,))
    # Every other re-start of normlab goes through the loader too: a sweep's workers (`run-one`)
    # and `train --nproc 2`'s ranks (before, each was the loader with the verb as its program).
    sweep = cli_checks.write_tiny_llama_manifest(
        os.path.join(work, "sweep.toml"), work,
        f'max_updates = 2\n[run]\nthreads = 1\nout_dir = "{work}/sweep_runs"\n'
        '[sweep]\nname = "loader"\n[[sweep.axis]]\nkey = "optim.lr"\nvalues = [0.001, 0.002]\n')
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "NORMLAB_OMP_CHOICE")}
    env["NORMLAB_OMP_LOAD"] = "0"
    p = subprocess.run([loader, normlab, "sweep", sweep, "--jobs", "2", "--plugin-path", plugins],
                       capture_output=True, text=True, env=env)
    states = [json.load(open(os.path.join(work, "sweep_runs", d, "status.json"))).get("status")
              if os.path.exists(os.path.join(work, "sweep_runs", d, "status.json")) else None
              for d in ("lr=0.001", "lr=0.002")]
    ok = p.returncode == 0 and states == ["completed", "completed"] and "run(s) failed" not in p.stdout
    failures += not ok
    print(("ok   " if ok else "FAIL ") + f"sweep --jobs 2 through the loader: exit {p.returncode}, runs {states}"
          + ("" if ok else f" ({p.stdout[-400:]} {p.stderr[-300:]})"))
    out = os.path.join(work, "nproc2")
    p = subprocess.run([loader, normlab, "train", manifest, "--nproc", "2", "--set", f'run.out_dir="{out}"',
                        "--plugin-path", plugins], capture_output=True, text=True, env=env)
    ok = p.returncode == 0 and os.path.exists(os.path.join(out, "checkpoints", "last.safetensors"))
    failures += not ok
    print(("ok   " if ok else "FAIL ") + f"train --nproc 2 through the loader: exit {p.returncode}"
          + ("" if ok else f" ({p.stdout[-300:]} {p.stderr[-300:]})"))
else:
    print(f"note: {normlab} names no dynamic loader that exists ({loader!r}): the loader case is not run")
case("quiet", {"NORMLAB_OMP_LOAD": "0"}, {"OMP_WAIT_POLICY", "NORMLAB_OMP_CHOICE"},
     "OpenMP wait policy: libgomp's default, the machine was quiet", "", "libgomp's default")
case("users", {"OMP_WAIT_POLICY": "ACTIVE", "NORMLAB_OMP_LOAD": "5"}, {"NORMLAB_OMP_CHOICE"}, "", "ACTIVE", "")
case("off", {"NORMLAB_OMP_AUTO": "0", "NORMLAB_OMP_LOAD": "5"}, {"OMP_WAIT_POLICY", "NORMLAB_OMP_CHOICE"}, "", "", "")
# run.threads = 0 means what the machine can give the run: busy, the cores the others leave (at
# least 1); quiet, the cores this process may use (its affinity mask), not every core.
cores = len(os.sched_getaffinity(0))
manifest0 = cli_checks.write_tiny_llama_manifest(os.path.join(work, "m0.toml"), work,
                                                 "max_updates = 2\n[run]\nthreads = 0\n")
for name, load, want in (("busy, threads 0", "5", max(1, cores - 5)), ("quiet, threads 0", "0", cores)):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "NORMLAB_OMP_CHOICE")}
    env["NORMLAB_OMP_LOAD"] = load
    out = os.path.join(work, name.replace(", ", "_").replace(" ", "_"))
    p = subprocess.run([normlab, "train", manifest0, "--set", f'run.out_dir="{out}"', "--plugin-path", plugins],
                       capture_output=True, text=True, env=env)
    e = json.load(open(os.path.join(out, "env.json"))) if p.returncode == 0 else {}
    said = load == "0" or f"run.threads = 0 takes {want} thread" in e.get("omp_wait_policy_chosen", "")
    ok = p.returncode == 0 and e.get("threads") == want and said
    failures += not ok
    print(("ok   " if ok else "FAIL ") + f"{name}: {e.get('threads')} threads (want {want} of {cores} usable cores)"
          + ("" if ok else f" ({e.get('omp_wait_policy_chosen')!r} {p.stderr[-300:]})"))
print("omp choice: %s" % ("FAILED" if failures else "OK"))
sys.exit(1 if failures else 0)
