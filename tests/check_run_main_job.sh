#!/bin/bash
# `scripts/normlab.sh run` builds normlab and only the plugins of the main job's schemes before the
# main job (the others after its report, issue 70.3). This checks that those plugins suffice: an
# installed-like tree (bin/, lib/, lib/normlab/plugins/) holding only them validates every run of the
# quickstart sweep (`sweep --dry-run` looks up each run's scheme); one plugin fewer fails (the
# control). A manifest whose schemes cannot be read gives no targets (then `run` builds everything).
# usage: check_run_main_job.sh SOURCE_DIR BUILD_DIR WORKDIR
set -u
src=$1 build=$2 work=$3 n=0
rm -rf "$work"
mkdir -p "$work"
fail=0
manifest=$src/experiments/quickstart-sweep.toml
eval "$(sed -n '/^manifest_plugin_targets()/,/^}/p; /^is_plugin_target()/,/^}/p' "$src/scripts/normlab.sh")"

targets=$(manifest_plugin_targets "$manifest")
echo "main job's plugin targets: ${targets:-(none)}"
[ -n "$targets" ] || { echo "FAIL: no plugin targets for $manifest"; exit 1; }

# The tree: the executable, its libraries, and each target's plugin file (ninja's own record).
tree() {  # tree DIR TARGET...
  local dir=$1 t so
  shift
  mkdir -p "$dir/bin" "$dir/lib/normlab/plugins"
  cp "$build/bin/normlab" "$dir/bin/"
  cp "$build"/lib/*.so "$dir/lib/"
  for t in "$@"; do
    so=$(ninja -C "$build" -t query "$t" | sed -n 's/^ *\(plugins\/[^ ]*\.so\)$/\1/p' | head -1)
    [ -n "$so" ] || { echo "FAIL: '$t' is not a plugin target of $build"; fail=1; continue; }
    cp "$build/$so" "$dir/lib/normlab/plugins/"
  done
}

# shellcheck disable=SC2086  # one target per word
tree "$work/all" $targets
if env -u NORMLAB_PLUGIN_PATH "$work/all/bin/normlab" sweep "$manifest" --dry-run \
     --set run.out_dir="\"$work/runs\"" >"$work/all.out" 2>&1; then
  echo "ok: the quickstart sweep's runs validate with only $(ls "$work/all/lib/normlab/plugins" | tr '\n' ' ')"
else
  echo "FAIL: the quickstart sweep does not validate with only its targets' plugins:"
  cat "$work/all.out"
  fail=1
fi

set -- $targets
tree "$work/fewer" "${@:2}"
if env -u NORMLAB_PLUGIN_PATH "$work/fewer/bin/normlab" sweep "$manifest" --dry-run \
     --set run.out_dir="\"$work/runs\"" >"$work/fewer.out" 2>&1; then
  echo "FAIL: the control validated without $1's plugin (the check cannot fail)"
  fail=1
elif grep -q "scheme" "$work/fewer.out"; then
  echo "ok: without $1's plugin the sweep is refused: $(grep -m1 scheme "$work/fewer.out" | cut -c1-120)"
else
  echo "FAIL: without $1's plugin the sweep failed for another reason:"
  cat "$work/fewer.out"
  fail=1
fi

# Unreadable manifests, unnamed schemes and names no scheme has (words that would be further
# targets of the build command: install, clean): no targets, so `run` falls back to the whole build.
printf '[scheme\nname = "post-ln"\n' >"$work/broken.toml"
printf '[model]\nd_model = 32\n' >"$work/unnamed.toml"
for bad in 'deepnorm install' 'deepnorm\nclean' 'Pre-LN' 'pre_ln' '-x' 'a--b' '$(touch x)'; do
  printf '[scheme]\nname = "post-ln"\n[sweep]\nname = "s"\n[[sweep.axis]]\nkey = "scheme.name"\nvalues = ["%s"]\n' \
    "$bad" >"$work/bad$((++n)).toml"
done
for m in "$work/broken.toml" "$work/unnamed.toml" "$work/missing.toml" "$work"/bad*.toml; do
  got=$(manifest_plugin_targets "$m")
  if [ -n "$got" ]; then
    echo "FAIL: $(basename "$m") gave targets '$got' (expected none)"
    fail=1
  else
    echo "ok: $(basename "$m") gives no targets"
  fi
done

# Only a plugin's own target is one: ninja also knows normlab_plugin_pch (the precompiled header).
for t in $targets; do
  is_plugin_target "$build" "$t" || { echo "FAIL: is_plugin_target refuses $t"; fail=1; }
done
for t in normlab_plugin_pch normlab_plugin_nonexistent install; do
  if is_plugin_target "$build" "$t"; then
    echo "FAIL: is_plugin_target takes $t"
    fail=1
  else
    echo "ok: $t is not a plugin target"
  fi
done

[ $fail -eq 0 ] && echo "run main job OK"
exit $fail
