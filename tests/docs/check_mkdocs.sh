#!/usr/bin/env bash
# The documentation site builds with no warning: `mkdocs build --strict` of mkdocs.yml (docs/),
# written to OUT_DIR, never into the source tree. Exit 77 (ctest: skipped) without mkdocs and
# mkdocs-material (Debian 12: apt-get install mkdocs mkdocs-material).
# Usage: check_mkdocs.sh SOURCE_DIR OUT_DIR
set -uo pipefail
source=$1 out=$2
command -v mkdocs >/dev/null || { echo "SKIP: mkdocs is not installed (Debian: apt-get install mkdocs mkdocs-material)"; exit 77; }
# The theme must be one that the Python running mkdocs (its #! line) knows.
py=$(head -n 1 "$(command -v mkdocs)" | sed -n 's/^#! *//p')
${py:-python3} -c 'import sys; from mkdocs.utils import get_theme_names; sys.exit("material" not in get_theme_names())' 2>/dev/null ||
  { echo "SKIP: the mkdocs-material theme is not installed (Debian: apt-get install mkdocs-material)"; exit 77; }
rm -rf "$out"
mkdir -p "$(dirname "$out")"
mkdocs --version
cd "$source" || exit 1
mkdocs build --strict --config-file "$source/mkdocs.yml" --site-dir "$out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: mkdocs build --strict exited $rc"; exit 1; }
[ -f "$out/index.html" ] || { echo "FAIL: no $out/index.html"; exit 1; }
echo "docs site OK: $(find "$out" -name '*.html' | wc -l) pages in $out"
