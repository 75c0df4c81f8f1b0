#!/usr/bin/env bash
# Every C++ file of the repository is formatted by its .clang-format (clang-format --dry-run --Werror).
# Exit 77 (ctest: skipped) without clang-format. usage: check_format.sh REPO_ROOT
set -uo pipefail
root=$1
command -v clang-format >/dev/null || { echo "SKIP: clang-format is not installed (Debian: clang-format)"; exit 77; }
cd "$root" || exit 1
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh')
else
  mapfile -t files < <(find core runner plugins analysis tests bench examples sdk -type f \
    \( -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)
fi
bad=0
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || { echo "not formatted: $f (run: clang-format -i $f)"; bad=$((bad + 1)); }
done
echo "$(clang-format --version | head -1): ${#files[@]} files, $bad not formatted"
[ "$bad" -eq 0 ]
