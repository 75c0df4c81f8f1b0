#!/usr/bin/env python3
"""The scheme table of README.md, generated from the plugin registry (`normlab plugins list`).

usage: scheme_table.py NORMLAB                 print the table
       scheme_table.py NORMLAB --write FILE    replace the table between the markers in FILE
       scheme_table.py NORMLAB --check FILE    exit 1 when FILE's table differs (the `readme` test)

One row per built-in scheme: the name, linked to docs/schemes/<plugin folder>.md (the folder is
the name with '-' as '_'), and the one-line description the plugin declares. Only the built-in
plugins count: NORMLAB_PLUGIN_PATH is cleared.
"""
import os
import subprocess
import sys

BEGIN, END = "<!-- scheme-table:begin -->\n", "<!-- scheme-table:end -->"


def escape(text):
    for c in "\\|*_<`[]":
        text = text.replace(c, "\\" + c)
    return text


def schemes(normlab):
    """(name, description) of every built-in plugin, as `normlab plugins list` prints them."""
    env = dict(os.environ, NORMLAB_PLUGIN_PATH="")
    p = subprocess.run([normlab, "plugins", "list"], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: {normlab} plugins list exited {p.returncode}:\n{p.stdout}{p.stderr}")
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    if not lines or not lines[0].startswith("NAME") or "DESCRIPTION" not in lines[0]:
        sys.exit(f"FAIL: unexpected output of plugins list:\n{p.stdout}")
    at = lines[0].index("DESCRIPTION")  # the description column starts where its header does
    return [(l.split()[0], l[at:].strip()) for l in lines[1:]]


def table(normlab):
    rows = ["| scheme | what it does |", "|---|---|"]
    for name, description in schemes(normlab):
        page = "docs/schemes/" + name.replace("-", "_") + ".md"
        rows.append(f"| [`{name}`]({page}) | {escape(description)} |")
    return "\n".join(rows) + "\n"


def split(path):
    text = open(path, encoding="utf-8").read()
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b:
        sys.exit(f"FAIL: {path}: no {BEGIN.strip()} ... {END} markers")
    return text[: b + len(BEGIN)], text[b + len(BEGIN) : e], text[e:]


def main(argv):
    if len(argv) == 2:
        sys.stdout.write(table(argv[1]))
        return 0
    if len(argv) != 4 or argv[2] not in ("--write", "--check"):
        sys.exit(__doc__)
    normlab, mode, path = argv[1:]
    head, old, tail = split(path)
    new = table(normlab)
    if mode == "--write":
        with open(path, "w", encoding="utf-8") as f:
            f.write(head + new + tail)
        return 0
    if old != new:
        import difflib

        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                   path, "normlab plugins list"))
        print(f"FAIL: {path}: the scheme table differs from the registry; regenerate it with\n"
              f"  python3 scripts/scheme_table.py {normlab} --write {path}")
        return 1
    print(f"{path}: the scheme table matches the registry ({len(new.splitlines()) - 2} schemes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
