"""The --out folder of `normlab plot` / `normlab report`, claimed before anything is written into it
(issue 42.1): a folder normlab owns holds `.normlab-dir`, {"normlab": KIND}, the marker the C++
side (core/src/util/owned_dir.cpp) reads and writes too. Any other non-empty folder is the user's
and is left untouched. Standard library only.
"""
import json
import os
import re

MARKER = ".normlab-dir"
# The marker's temporary, named as the C++ side's (util/atomic_file.cpp); one left by a kill does
# not make a folder the user's.
MARKER_TMP = re.compile(re.escape(MARKER) + r"\.tmp\.\d+\.\d+")
NEW_FOLDER = "nothing was written: choose a new or empty folder"


class OutDirError(Exception):
    """One line for `normlab: error: ...`; the folder was not written to."""


def owner_kind(path):
    """The kind in path's marker; "" when there is none or it is unreadable."""
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return ""
    kind = data.get("normlab") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else ""


def _figures_only(path, depth=0):
    """Every entry a figure file, or (one level) a folder of them: what `normlab plot` wrote."""
    for e in os.scandir(path):
        if e.is_dir(follow_symlinks=False) and depth == 0:
            if not _figures_only(e.path, 1):
                return False
        elif not (e.is_file(follow_symlinks=False) and e.name.lower().endswith((".png", ".svg", ".pdf"))):
            return False
    return True


def _old_report(path):
    """What `normlab report` wrote before markers: a sweep report, or a frontier one (no CSV)."""
    names = set(os.listdir(path))
    return "report.html" in names and ("summary.csv" in names or names <= {"report.html", "report.md", "figures"})


def _legacy(kind, path):
    try:
        return {"plots": _figures_only, "report": _old_report}[kind](path)
    except OSError:
        return False


def claim(path, kind):
    """Makes path (with its parents) or takes over an empty folder, one with kind's marker or one
    _legacy recognises, and writes the marker; else raises OutDirError."""
    where = f"--out {path}"
    if not os.path.isdir(path):
        try:
            os.makedirs(path)
        except OSError as e:  # a file, a read-only mount, /proc/x, a file as parent, no permission
            raise OutDirError(f"{where}: cannot create it: {e.strerror or e}") from None
    else:
        try:
            names = sorted(n for n in os.listdir(path) if not MARKER_TMP.fullmatch(n))
        except OSError as e:
            raise OutDirError(f"{where}: cannot be read: {e.strerror or e}") from None
        owner = owner_kind(path) if names else ""
        if owner == kind:
            return
        if owner:
            raise OutDirError(f"{where}: is a normlab {owner} folder, not a {kind} folder ({MARKER} says "
                              f"\"{owner}\"); {NEW_FOLDER}")
        if names and not _legacy(kind, path):
            n = len(names)
            has = f"an unreadable {MARKER}" if MARKER in names else f"no {MARKER}"
            raise OutDirError(f"{where}: is neither empty nor a folder normlab made (it holds {n} "
                              f"entr{'y' if n == 1 else 'ies'}, e.g. {', '.join(names[:3])}, and {has}); "
                              f"{NEW_FOLDER}")
    # Temp file + rename: a killed command leaves no half-written marker.
    tmp = os.path.join(path, f"{MARKER}.tmp.{os.getpid()}.0")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"normlab": kind}, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(path, MARKER))
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise OutDirError(f"{where}: cannot write in it: {e.strerror or e}") from None


def write_error(out, e):
    """The one line for an OSError met while writing into the claimed folder (a full disk, ...)."""
    name = getattr(e, "filename", None)  # None where matplotlib wrote through a file object
    return f"normlab: error: --out {out}: cannot write {name or 'in it'}: {e.strerror or e}"
