"""The architecture stays visible (issue 28): layers, no circles, short functions.

usage: check_architecture.py REPO_ROOT

1. C++ (core/src): every `#include "…"` between folders goes downward in
   base (util, top-level helpers) < data, model, plugins, manifest < run < eval < train < sweep < commands.
2. Python (analysis/python): the modules' `import normlab_*` graph has no circle, and no normlab
   module is imported inside a function (the way circles used to be dodged).
3. No function in core/ or runner/ is longer than 120 lines, except declarative tables (listed below).
4. The library's code (core/, analysis/, runner/) never includes <torch/torch.h> but
   core/src/torch_api.h: GCC instantiates <torch/torch.h>'s templates again in every unit, even
   precompiled (~4 s of CPU more per unit; docs/testing.md, "Where the build time goes").
Prints each violation as `FAIL: …`; exits 1 when there is any.
"""
import ast
import os
import re
import sys

root = os.path.abspath(sys.argv[1])
src = os.path.join(root, "core", "src")
failures = []

# Lower number: lower layer. A folder may include its own layer and any lower one.
LAYERS = {"util": 0, "(top)": 0, "data": 1, "model": 1, "plugins": 1, "manifest": 1, "run": 2, "eval": 3,
          "train": 4, "sweep": 5, "commands": 6}
# Public headers (core/include/normlab/…) are interfaces of every layer: not checked here.


def folder_of(path):
    rel = os.path.relpath(path, src).split(os.sep)
    return "(top)" if len(rel) == 1 else rel[0]


for dirpath, _, files in os.walk(src):
    for name in files:
        if not name.endswith((".cpp", ".h")):
            continue
        path = os.path.join(dirpath, name)
        here = folder_of(path)
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            m = re.match(r'\s*#include "([^"]+)"', line)
            if not m:
                continue
            inc = m.group(1)
            near, far = os.path.join(dirpath, inc), os.path.join(src, inc)
            target = near if os.path.exists(near) else far if os.path.exists(far) else None
            if target is None:
                continue  # public headers, generated files
            there = folder_of(os.path.normpath(target))
            if there not in LAYERS or here not in LAYERS:
                failures.append(f"{os.path.relpath(path, root)}:{n}: folder {here} or {there} has no layer")
            elif LAYERS[there] > LAYERS[here]:
                failures.append(f"{os.path.relpath(path, root)}:{n}: {here} (layer {LAYERS[here]}) includes "
                                f"{inc} of {there} (layer {LAYERS[there]}): an upward arrow")

# Python: top-level-only imports, no circle.
pydir = os.path.join(root, "analysis", "python")
graph = {}
for name in sorted(os.listdir(pydir)):
    if not name.endswith(".py"):
        continue
    mod = name[:-3]
    tree = ast.parse(open(os.path.join(pydir, name), encoding="utf-8").read())
    graph[mod] = set()
    top = set(id(n) for n in tree.body)
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for imported in names:
            if not imported.startswith("normlab_"):
                continue
            graph[mod].add(imported)
            if id(node) not in top:
                failures.append(f"analysis/python/{name}:{node.lineno}: imports {imported} inside a function")


def cycle_from(start):
    stack, seen = [(start, [start])], set()
    while stack:
        mod, path = stack.pop()
        for nxt in graph.get(mod, ()):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


for mod in graph:
    c = cycle_from(mod)
    if c:
        failures.append("analysis/python: import circle " + " -> ".join(c))
        break

# Function length: a definition (at column 0, or indented: a class's method) has a return type
# before its name and '(', and ends at its closing brace.
LIMIT = 120
TABLES = {("core/src/manifest/manifest.cpp", "schema")}  # one row per manifest key
for dirpath, _, files in [w for top in (src, os.path.join(root, "runner")) for w in os.walk(top)]:
    for name in files:
        if not name.endswith((".cpp", ".h")):
            continue
        path = os.path.join(dirpath, name)
        rel = os.path.relpath(path, root)
        lines = open(path, encoding="utf-8").read().split("\n")
        i = 0
        while i < len(lines):
            head = lines[i]
            m = re.match(r"^\s*[A-Za-z_][\w:<>,&*\s]*?[\s*&:]([\w:~]+)\s*\(", head)
            keyword = head.strip().split(" ")[0] in ("namespace", "struct", "class", "return", "else", "case", "using")
            if m and not head.rstrip().endswith(";") and not keyword:
                j, depth, opened = i, 0, False
                while j < len(lines):
                    code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'|//.*', "", lines[j])
                    depth += code.count("{") - code.count("}")
                    opened = opened or "{" in code
                    if opened and depth <= 0:
                        break
                    if not opened and code.rstrip().endswith(";"):
                        break
                    j += 1
                fn = m.group(1).split("::")[-1]
                if opened and j - i + 1 > LIMIT and (rel, fn) not in TABLES:
                    failures.append(f"{rel}:{i + 1}: {fn} is {j - i + 1} lines (at most {LIMIT})")
                i = max(j, i) + 1
            else:
                i += 1

# The whole of LibTorch's C++ API costs every translation unit of the library ~4 s more.
for top in (os.path.join(root, "core"), os.path.join(root, "analysis"), os.path.join(root, "runner")):
    for dirpath, _, files in os.walk(top):
        for name in files:
            if name.endswith((".cpp", ".h", ".cu", ".cuh")):
                path = os.path.join(dirpath, name)
                for n, line in enumerate(open(path, encoding="utf-8"), 1):
                    if re.match(r"\s*#\s*include\s*<torch/torch\.h>", line):
                        failures.append(f"{os.path.relpath(path, root)}:{n}: includes <torch/torch.h>; "
                                        "include \"torch_api.h\" (or the one LibTorch header needed)")

for f in failures:
    print("FAIL: " + f)
print(f"{len(failures)} failed, architecture {'OK' if not failures else 'violated'}")
sys.exit(1 if failures else 0)
