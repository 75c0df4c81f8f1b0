#!/usr/bin/env bash
# Times `scripts/normlab.sh run` on a fresh Debian 12 (issue 28.8): a new root made by debootstrap
# (none of our packages, an empty apt cache), a clean clone of this checkout's HEAD, chroot, and
# the seconds each phase took (install, build, main job, the other plugins) from the script's own
# "==" lines, the seconds to the main job's report path, and the total.
#   sudo bench/fresh_machine_run.sh [WORKDIR] [--with-toolchain]
# --with-toolchain starts from a root that already has g++, cmake, git and python3, as this
# project's CI machines do; without it, from debootstrap's minbase alone. Needs root, debootstrap
# and a Debian mirror; WORKDIR (default /tmp/normlab-fresh, ~3 GB) is removed at the end.
set -euo pipefail
work=/tmp/normlab-fresh
include=""
for arg in "$@"; do
  case "$arg" in
    --with-toolchain) include="--include=g++,cmake,git,python3,ca-certificates" ;;
    -*) echo "usage: $0 [WORKDIR] [--with-toolchain]" >&2; exit 2 ;;
    *) work=$arg ;;
  esac
done
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
root=$work/root
cleanup() {
  for m in proc sys dev; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work"
debootstrap --variant=minbase $include bookworm "$root" "${NORMLAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/debootstrap.log"
cp /etc/resolv.conf "$root/etc/resolv.conf"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then  # the same mirror and suites as this machine
  rm -f "$root/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
fi
git clone -q "$repo" "$root/root/normlab"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
log=$work/run.log
start=$(date +%s.%N)
set +e
chroot "$root" /bin/bash -c 'cd /root/normlab && HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin bash scripts/normlab.sh run' 2>&1 |
  perl -MTime::HiRes=time -ne 'BEGIN { $t0 = time } printf "%7.1f %s", time - $t0, $_' | tee "$log"
rc=${PIPESTATUS[0]}
set -e
total=$(echo "$(date +%s.%N) - $start" | bc)
echo
echo "fresh machine ($(nproc) cores, $(git -C "$repo" rev-parse --short HEAD), ${include:-minbase}): rc $rc"
grep -E '^ *[0-9.]+ == ' "$log" | sed -E 's/^ *([0-9.]+) == (.{0,70}).*/  \1 s  \2/'
# `normlab report` prints the path as its last line; `run` then builds the other plugins.
report=$(sed -nE 's/^ *([0-9.]+) report: .*report\.html$/\1/p' "$log" | head -1)
if [ -n "$report" ]; then
  printf '  to the report path: %.0f s (%.1f min)\n' "$report" "$(echo "$report / 60" | bc -l)"
else
  echo "  to the report path: (no report line)"
fi
printf '  total, every plugin built: %.0f s (%.1f min)\n' "$total" "$(echo "$total / 60" | bc -l)"
exit "$rc"
