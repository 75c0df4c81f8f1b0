#!/bin/bash
# Every ELF file normlab builds or installs: no empty or relative RPATH/RUNPATH entry (ld.so reads
# an empty entry as the current directory, a relative one relative to it). Allowed: absolute
# directories and $ORIGIN-relative ones.
# Usage: check_rpath.sh BUILD_DIR CMAKE_COMMAND
set -u
build=$1 cmake=$2
prefix=$(mktemp -d /tmp/normlab_rpath_prefix.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
"$cmake" --install "$build" --prefix "$prefix" >/dev/null || { echo "FAIL: cmake --install failed"; exit 1; }

checked=0 bad=0
while IFS= read -r -d '' f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  checked=$((checked + 1))
  while IFS= read -r line; do
    paths=${line#*[}
    paths=${paths%]*}
    IFS=: read -r -a entries <<< "$paths:"
    # A trailing ':' in the original leaves an empty last element; the appended ':' makes every
    # element show, so count the separators instead of trusting read.
    n=$(( $(tr -cd ':' <<< "$paths" | wc -c) + 1 ))
    for ((i = 0; i < n; i++)); do
      e=${entries[i]:-}
      case "$e" in
        /*|'$ORIGIN'|'$ORIGIN/'*|'${ORIGIN}'|'${ORIGIN}/'*) ;;
        *) echo "FAIL: $f: ${line%%:*} has the entry '$e' (empty or relative): [$paths]"; bad=$((bad + 1)) ;;
      esac
    done
  done < <(readelf -d "$f" 2>/dev/null | grep -E '\((RPATH|RUNPATH)\)' | sed -E 's/.*\((RPATH|RUNPATH)\) +//')
done < <(find "$build/bin" "$build/lib" "$build/plugins" "$build/tests/bad_plugins" "$prefix" -type f -print0 2>/dev/null)

if [ "$checked" -lt 10 ]; then echo "FAIL: only $checked ELF files found under $build and $prefix"; exit 1; fi
if [ "$bad" -gt 0 ]; then echo "FAIL: $bad bad RPATH/RUNPATH entries"; exit 1; fi
echo "OK: $checked ELF files (build tree and an install), no empty or relative RPATH/RUNPATH entry"
