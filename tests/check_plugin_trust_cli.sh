#!/bin/bash
# The plugin trust rules through the CLI: listing runs no plugin code, a plugin throwing 42 is one
# error line for itself alone, unsafe folders are refused in one line unless
# --allow-unsafe-plugin-path (which warns).
# Usage: check_plugin_trust_cli.sh NORMLAB_EXECUTABLE BAD_PLUGIN_DIR BUILTIN_PLUGIN_DIR
set -u
normlab=$1 bad=$2 builtin=$3
work=$(mktemp -d /tmp/normlab_trust_cli.XXXXXX)
trap 'rm -rf "$work"' EXIT
export NORMLAB_TEST_PLUGIN_TRACE=$work/trace
unset NORMLAB_PLUGIN_PATH NORMLAB_ALLOW_UNSAFE_PLUGIN_PATH
fail() { echo "FAIL: $*"; for f in "$work"/out "$work"/err; do echo "--- $f"; cat "$f"; done; exit 1; }

# 1. `plugins list` shows the tracing plugin and the throwing ones next to the built-ins, runs none.
"$normlab" plugins list --plugin-path "$bad/init_marker" --plugin-path "$bad/throws_42" \
  --plugin-path "$bad/init_throws" > "$work/out" 2> "$work/err"
rc=$?
[ $rc -eq 0 ] || fail "plugins list exited $rc"
for name in init-marker throws-42 init-throws deepnorm rezero; do
  grep -q "^$name " "$work/out" || fail "plugins list does not show $name"
done
[ ! -e "$work/trace" ] || fail "plugins list ran plugin code: $(cat "$work/trace")"

# 2. Using the plugin that throws 42: exactly one error line naming it, exit code 2.
"$normlab" plugins show throws-42 --plugin-path "$bad/throws_42" > "$work/out" 2> "$work/err"
rc=$?
[ $rc -eq 2 ] || fail "plugins show throws-42 exited $rc, expected 2"
[ "$(wc -l < "$work/err")" -eq 1 ] || fail "expected one error line"
grep -q "^normlab: error: plugin $bad/throws_42/normlab_throws_42.so: scheme 'throws-42' could not be created" "$work/err" \
  || fail "unexpected error line"
"$normlab" plugins show throws-42 --param fail=derive --plugin-path "$bad/throws_42" > "$work/out" 2> "$work/err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l < "$work/err")" -eq 1 ] && grep -q "derive() threw" "$work/err" \
  || fail "derive() throwing 42: exit $rc"
# ...and the tracing plugin does run once it is used (the fixture works).
"$normlab" plugins show init-marker --plugin-path "$bad/init_marker" > "$work/out" 2> "$work/err" \
  || fail "plugins show init-marker failed"
grep -q "init_marker: static initializer ran" "$work/trace" || fail "the tracing fixture left no trace when used"

# 3. A world-writable folder: one line naming it and why; the override warns and uses it.
mkdir "$work/ww" && cp "$builtin/normlab_post_ln.so" "$work/ww/normlab_ww_post_ln.so" && chmod 0777 "$work/ww"
"$normlab" plugins list --plugin-path "$work/ww" > "$work/out" 2> "$work/err"
rc=$?
[ $rc -eq 1 ] || fail "plugins list with a world-writable folder exited $rc, expected 1"
grep -q "plugin folder $work/ww: refused, it is world-writable (mode 0777)" "$work/err" || fail "no refusal line"
[ "$(grep -c "$work/ww" "$work/err")" -eq 1 ] || fail "expected one line about $work/ww"
"$normlab" plugins list --plugin-path "$work/ww" --allow-unsafe-plugin-path > "$work/out" 2> "$work/err"
grep -q "^normlab: warning: plugin folder $work/ww: it is world-writable (mode 0777); used anyway (--allow-unsafe-plugin-path)" "$work/err" \
  || fail "no warning with --allow-unsafe-plugin-path"
grep -q "$work/ww/normlab_ww_post_ln.so" "$work/out" || fail "the override did not list the plugin"
echo "OK: plugin trust rules hold through the CLI"
