#!/bin/bash
# `cmake --install` puts python/normlab_torch.py under PREFIX/share/normlab/python, byte for byte,
# and (where PYTHON has torch) it imports from there alone.
# Usage: check_python_install.sh BUILD_DIR CMAKE_COMMAND SOURCE_DIR [PYTHON]
set -u
build=$1 cmake=$2 source=$3 python=${4:-}
prefix=$(mktemp -d /tmp/normlab_python_prefix.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
"$cmake" --install "$build" --component python --prefix "$prefix" >/dev/null || { echo "FAIL: cmake --install failed"; exit 1; }
installed=$prefix/share/normlab/python/normlab_torch.py
cmp -s "$installed" "$source/python/normlab_torch.py" || { echo "FAIL: $installed missing or not python/normlab_torch.py"; exit 1; }
if [ -n "$python" ] && "$python" -c 'import torch' 2>/dev/null; then
  (cd "$prefix" && "$python" -c "import sys; sys.path.insert(0, '$prefix/share/normlab/python'); import normlab_torch as m; assert m.__file__.startswith('$prefix'), m.__file__") \
    || { echo "FAIL: $python cannot import the installed normlab_torch"; exit 1; }
  echo "python install OK: share/normlab/python/normlab_torch.py, imported by $python"
else
  echo "python install OK: share/normlab/python/normlab_torch.py (no Python with torch to import it)"
fi
