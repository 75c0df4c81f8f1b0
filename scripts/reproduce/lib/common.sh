# Shared by scripts/reproduce/*.sh (sourced, not run).
#   NORMLAB           the normlab binary (default build/bin/normlab)
#   NORMLAB_REPRO_DIR where the runs go (default runs/reproduce)
NORMLAB=${NORMLAB:-build/bin/normlab}
NORMLAB_REPRO_DIR=${NORMLAB_REPRO_DIR:-runs/reproduce}
[ -x "$NORMLAB" ] || { echo "error: $NORMLAB not found: build first (bash scripts/normlab.sh build)" >&2; exit 2; }

# Multi30k into the data cache: downloaded (SHA-256 checked) on first use; on a machine without
# internet, from the checked-in copy in ../shared/data/multi30k through a gzip mirror.
ensure_multi30k() {
  "$NORMLAB" data path multi30k >/dev/null 2>&1 && return 0
  "$NORMLAB" data fetch multi30k && return 0
  local shared=../shared/data/multi30k mirror
  [ -f "$shared/train.en" ] || { echo "error: cannot fetch multi30k and $shared is absent" >&2; return 2; }
  mirror=$(mktemp -d)
  mkdir -p "$mirror/multi30k"
  for f in "$shared"/*; do gzip -c "$f" > "$mirror/multi30k/$(basename "$f").gz"; done
  NORMLAB_DATA_MIRROR=$mirror "$NORMLAB" data fetch multi30k
  rm -rf "$mirror"
}

# Prints "NAME: H:MM:SS wall" for the seconds since $1.
report_wall() {
  local s=$(( $(date +%s) - $1 ))
  printf '%s: %d:%02d:%02d wall on %s (%s cores)\n' "$2" $((s / 3600)) $((s % 3600 / 60)) $((s % 60)) \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(nproc)"
}
