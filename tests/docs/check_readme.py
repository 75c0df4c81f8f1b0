#!/usr/bin/env python3
"""README.md stays a short, true first page (issue 28.7): at most 300 lines, the two commands, every
relative link pointing at a file of the repository, its scheme table equal to what the registry
reports (scripts/scheme_table.py), and its manifest valid (`normlab train --dump-config`); the SDK ABI
number stated in docs/ is sdk/abi.h's.

usage: check_readme.py NORMLAB SOURCE_DIR WORK_DIR
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

normlab, source, work = os.path.abspath(sys.argv[1]), pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
readme = source / "README.md"
text = readme.read_text(encoding="utf-8")
failures = []


def check(ok, message):
    print(("ok   " if ok else "FAIL ") + message)
    if not ok:
        failures.append(message)


lines = text.count("\n")
check(lines <= 300, f"README.md has {lines} lines (at most 300)")
for command in ("bash scripts/normlab.sh run", "bash scripts/normlab.sh test"):
    check(f"```sh\n{command}\n```" in text, f"README.md shows `{command}` in a sh block of its own")

# Relative links and images: the files must exist (the docs pages, the figure).
targets = set(re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text))
local = sorted(t for t in targets if not re.match(r"[a-z]+://", t))
missing = [t for t in local if not (source / t).exists()]
check(not missing, f"{len(local)} relative links of README.md lead to files"
      + (f"; missing: {', '.join(missing)}" if missing else ""))

# The scheme table: generated from the registry.
p = subprocess.run([sys.executable, str(source / "scripts" / "scheme_table.py"), normlab, "--check",
                    str(readme)], capture_output=True, text=True)
sys.stdout.write(p.stdout + p.stderr)
check(p.returncode == 0, "the scheme table is what `normlab plugins list` reports")

# The manifest: loads and validates as written.
m = re.search(r"<!-- readme-manifest:begin -->\n```toml\n(.*?)```\n<!-- readme-manifest:end -->", text,
              re.S)
check(m is not None, "README.md has a toml block between the readme-manifest markers")
if m:
    work.mkdir(parents=True, exist_ok=True)
    manifest = work / "my.toml"
    manifest.write_text(m.group(1), encoding="utf-8")
    keys = [l for l in m.group(1).splitlines() if re.match(r"\s*[a-z_]+\s*=", l)]
    check(len(keys) <= 16, f"the manifest sets {len(keys)} keys (a short one: at most 16)")
    env = dict(os.environ, NORMLAB_PLUGIN_PATH="")
    p = subprocess.run([normlab, "train", str(manifest), "--dump-config"], cwd=work, env=env,
                       capture_output=True, text=True)
    check(p.returncode == 0 and "[scheme]" in p.stdout,
          f"`normlab train my.toml --dump-config` accepts the README's manifest (exit {p.returncode})"
          + (f": {p.stderr.strip()}" if p.returncode else ""))
    # The numbers the README states about it (issue 46.5), per build and CPU class (issue 70.5): the
    # row of this build and class to ±0.5; a class without a row gets the range of its build's rows
    # (±0.5) and the ratio the text states, which hold on every class measured.
    table = re.search(r"<!-- readme-bleu:begin -->\n(.*?)<!-- readme-bleu:end -->", text, re.S)
    rows = re.findall(r"^\| (Debian's 1\.13|PyPI wheel's 2\.x) \| (AVX-512|AVX2 only|AMX) \([^)]+\) \| "
                      r"([0-9.]+) \| ([0-9.]+) \|$", table.group(1), re.M) if table else []
    check(len(rows) >= 2, "README.md states DeepNorm's and Post-LN's validation BLEU per build and CPU class")
    version = subprocess.run([normlab, "--version"], capture_output=True, text=True).stdout
    build = "Debian's 1.13" if re.search(r"^LibTorch 1\.", version, re.M) else "PyPI wheel's 2.x"
    flags = set(re.search(r"^flags\s*:(.*)$", pathlib.Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    # Debian's 1.13 has no AMX kernels: an AMX CPU runs its AVX-512 ones.
    cpu = ("AMX" if "amx_tile" in flags and build != "Debian's 1.13" else
           "AVX-512" if "avx512f" in flags else "AVX2 only")
    ours = [(float(d), float(p)) for b, c, d, p in rows if b == build and c == cpu]
    theirs = [(float(d), float(p)) for b, c, d, p in rows if b == build]
    if rows:
        for scheme in ("deepnorm", "post-ln"):  # a fresh run each time, not "already completed"
            shutil.rmtree(work / ("readme-" + scheme), ignore_errors=True)
        runs = {scheme: subprocess.Popen(
            [normlab, "train", str(manifest), "--set", f'scheme.name="{scheme}"',
             "--set", f'run.out_dir="{work / ("readme-" + scheme)}"'], cwd=work, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for scheme in ("deepnorm", "post-ln")}
        got = {}
        for scheme, proc in runs.items():
            out = proc.communicate()[0]
            m = re.search(r"completed 300 updates .*\| valid BLEU ([0-9.]+)", out)
            got[scheme] = float(m.group(1)) if m else None
            check(m is not None, f"{scheme} on the README's manifest completes 300 updates with a BLEU"
                  + ("" if m else f"; output: {out[-400:]}"))
        if None not in got.values():
            dn, pl = got["deepnorm"], got["post-ln"]
            if ours:
                check(abs(dn - ours[0][0]) <= 0.5 and abs(pl - ours[0][1]) <= 0.5,
                      f"DeepNorm and Post-LN on the README's manifest ({build}, {cpu}): validation BLEU "
                      f"{dn}, {pl} (the README says {ours[0][0]}, {ours[0][1]})")
            else:
                print(f"note: the README has no row for {build} on {cpu}: checking its build's range")
                lo = [min(r[i] for r in theirs) - 0.5 for i in (0, 1)]
                hi = [max(r[i] for r in theirs) + 0.5 for i in (0, 1)]
                check(lo[0] <= dn <= hi[0] and lo[1] <= pl <= hi[1],
                      f"DeepNorm and Post-LN on the README's manifest ({build}, {cpu}): validation BLEU "
                      f"{dn}, {pl} within the README's range {lo[0]}-{hi[0]}, {lo[1]}-{hi[1]}")
            check(dn >= 3 * pl, f"DeepNorm's BLEU {dn} is at least 3 times Post-LN's {pl} (the README: four to six)")

# The plugin ABI the docs state is sdk/abi.h's (issue 28.5).
abi = re.search(r"#define NORMLAB_ABI_VERSION\s*\\?\s*(\d+)",
                (source / "core/include/normlab/sdk/abi.h").read_text(encoding="utf-8")).group(1)
stated = []
for page in sorted((source / "docs").rglob("*.md")):
    for m in re.finditer(r"SDK ABI (\d+)|this normlab has ABI (\d+)|in `sdk/abi.h`, now (\d+)", page.read_text(encoding="utf-8")):
        stated.append((page.relative_to(source), next(g for g in m.groups() if g)))
wrong = [f"{page}: {n}" for page, n in stated if n != abi]
check(stated and not wrong, f"the docs state SDK ABI {abi} as sdk/abi.h ({len(stated)} places)"
      + (f"; other numbers: {', '.join(wrong)}" if wrong else ""))

# Tables the docs repeat from the code (issue 46.11): every named dataset in manifests.md's dataset
# table, every figure `normlab plot` draws in analysis.md's figure table.
p = subprocess.run([normlab, "data", "list"], capture_output=True, text=True)
names = [line.split()[0] for line in p.stdout.splitlines()[1:] if line and not line.startswith("folder:")]
manifests_md = (source / "docs" / "manifests.md").read_text(encoding="utf-8")
table_rows = [line for line in manifests_md.splitlines() if line.startswith("| `")]
absent = [n for n in names if not any(f"`{n}`" in row.split("|")[1] for row in table_rows)]
check(p.returncode == 0 and names and not absent,
      f"docs/manifests.md's dataset table lists the {len(names)} datasets of `normlab data list`"
      + (f"; missing: {', '.join(absent)}" if absent else ""))
plots_py = (source / "analysis" / "python" / "normlab_plots.py").read_text(encoding="utf-8")
keys = set(re.findall(r'self\.save\(\s*fig,\s*"([a-z_]+)"', plots_py))
keys |= {k + "_<run>" for k in re.findall(r'key = "([a-z_]+)_" \+ r\.file_stem', plots_py)}
keys |= set(re.findall(r'self\._per_layer\(\s*"[^"]*",\s*"[^"]*",\s*"([a-z_]+)"', plots_py))
analysis_md = (source / "docs" / "analysis.md").read_text(encoding="utf-8")
documented = set(re.findall(r"^\| `([a-z_<>]+)` \|", analysis_md, re.M))
undocumented = sorted(keys - documented)
check(len(keys) >= 15 and not undocumented,
      f"docs/analysis.md's figure table has the {len(keys)} figures normlab_plots.py saves"
      + (f"; missing: {', '.join(undocumented)}" if undocumented else ""))
# ... and `normlab plot --only` takes each by that name (it took only the steps' names).
sys.path.insert(0, str(source / "analysis" / "python"))
import normlab_plots  # noqa: E402 (no matplotlib needed to parse options)
refused = []
for key in sorted(keys):
    try:
        normlab_plots.parse_only(key)
    except Exception:  # noqa: BLE001 (argparse.ArgumentTypeError)
        refused.append(key)
check(not refused, "`normlab plot --only` takes every figure name of docs/analysis.md's table"
      + (f"; refused: {', '.join(refused)}" if refused else ""))
# Every Debian package scripts/normlab.sh installs is in docs/install.md's table (issue 46.8: a
# package the Python side needs was in neither).
script = (source / "scripts" / "normlab.sh").read_text(encoding="utf-8")
packages = []
for block in re.findall(r"^(?:RUN|TEST)_PACKAGES=\((.*?)^\)", script, re.M | re.S):
    for line in block.splitlines():
        packages += line.split("#")[0].split()
install_md = (source / "docs" / "install.md").read_text(encoding="utf-8")
unlisted = [p for p in packages if f"`{p}`" not in install_md]
check(len(packages) >= 20 and not unlisted,
      f"docs/install.md lists the {len(packages)} Debian packages scripts/normlab.sh installs"
      + (f"; missing: {', '.join(unlisted)}" if unlisted else ""))
if failures:
    sys.exit(f"README check: {len(failures)} failed")
print("README OK")
