#!/bin/bash
# A library planted in the working directory is never loaded: a fake libtomlplusplus.so.3 (a
# dependency of libnormlab) whose constructor writes a marker file, in a temporary CWD, while
# `normlab --help` runs there. A control run with LD_LIBRARY_PATH=. shows the fake would run if
# the loader looked there.
# Usage: check_planted_library.sh NORMLAB_EXECUTABLE LIBNORMLAB
set -u
normlab=$1 libnormlab=$2
cc=$(command -v cc || command -v gcc) || { echo "SKIP: no C compiler"; exit 0; }
work=$(mktemp -d /tmp/normlab_planted.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The fake defines every toml++ symbol libnormlab imports (as plain data: nothing calls them
# during --help), so the loader gets as far as running its constructor once it loads it.
{
  echo '#include <stdio.h>'
  nm -D --undefined-only "$libnormlab" | awk '$2 ~ /toml/ {print "char " $2 "[64];"}'
  cat <<C
__attribute__((constructor)) static void planted(void) {
  FILE* f = fopen("$work/marker", "w");
  if (f) { fputs("planted library ran\n", f); fclose(f); }
}
C
} > "$work/fake.c"
"$cc" -shared -fPIC -o "$work/libtomlplusplus.so.3" "$work/fake.c" || { echo "FAIL: cannot build the fake library"; exit 1; }

cd "$work" || exit 1
"$normlab" --help > help.txt 2>&1
if [ -e marker ]; then
  echo "FAIL: $normlab loaded ./libtomlplusplus.so.3 from the working directory"
  exit 1
fi
grep -q "normlab" help.txt || { echo "FAIL: normlab --help did not run:"; cat help.txt; exit 1; }
# Control: the fake is loadable and its constructor writes the marker when asked for explicitly.
LD_LIBRARY_PATH=. "$normlab" --help > /dev/null 2>&1
if [ ! -e marker ]; then
  echo "FAIL: control run: the planted library did not run even with LD_LIBRARY_PATH=. (test is broken)"
  exit 1
fi
# The executable loads libnormlab_cli by its full path beside it (runner/main.cpp): a file of that
# name in the working directory, with an empty LD_LIBRARY_PATH entry (the working directory), is
# not what runs (hostile review: it was loaded by name).
echo "not an ELF file" > libnormlab_cli.so
if ! LD_LIBRARY_PATH=/nonexistent: "$normlab" --help > help2.txt 2>&1 || ! grep -q "normlab" help2.txt; then
  echo "FAIL: with LD_LIBRARY_PATH=/nonexistent: normlab loaded ./libnormlab_cli.so:"; cat help2.txt; exit 1
fi
echo "OK: the planted libtomlplusplus.so.3 and libnormlab_cli.so in the working directory were not loaded"
