#!/usr/bin/env bash
# README.md's "A scheme in 15 lines", built as it says: this build installed into a temporary prefix,
# the cpp block between <!-- readme-plugin:begin --> and <!-- readme-plugin:end --> compiled out of
# tree with find_package(normlab) + normlab_add_plugin, listed from NORMLAB_PLUGIN_PATH, and the
# README's manifest trained with it for a few updates.
# Usage: check_readme_plugin.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 source=$2 work=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work/my-pre-ln"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"

block() {  # block NAME LANG: the lines strictly inside the ```LANG fences between the NAME markers
  awk -v b="<!-- $1:begin -->" -v e="<!-- $1:end -->" '$0 == b {on = 1; next} $0 == e {on = 0} on' \
      "$source/README.md" > "$work/$1.md"
  [ "$(head -n 1 "$work/$1.md")" = "\`\`\`$2" ] && [ "$(tail -n 1 "$work/$1.md")" = '```' ] ||
    fail "README.md: no \`\`\`$2 block between the $1 markers"
  sed '1d;$d' "$work/$1.md"
}
block readme-plugin cpp > "$work/my-pre-ln/my_pre_ln.cpp"
lines=$(grep -c . "$work/my-pre-ln/my_pre_ln.cpp")
echo "the README's plugin: $lines non-empty lines"
[ "$lines" -le 25 ] || fail "the README's plugin has $lines non-empty lines (a short one: at most 25)"
cat > "$work/my-pre-ln/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(my_pre_ln LANGUAGES CXX)
find_package(normlab REQUIRED)
normlab_add_plugin(my-pre-ln my_pre_ln.cpp)
CMAKE
cmake -S "$work/my-pre-ln" -B "$work/my-pre-ln/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configuring the README's plugin"; }
cmake --build "$work/my-pre-ln/build" > "$work/build.log" 2>&1 ||
  { tail -n 40 "$work/build.log"; fail "the README's plugin does not compile"; }

export NORMLAB_PLUGIN_PATH="$work/my-pre-ln/build"
normlab=$work/prefix/bin/normlab
"$normlab" plugins list | tee "$work/list.log"
grep -Eq "^my-pre-ln +1\.0\.0 .*normlab_my_pre_ln\.so" "$work/list.log" ||
  fail "normlab plugins list does not show my-pre-ln from its build folder"

block readme-manifest toml > "$work/my.toml"
(cd "$work" && "$normlab" train my.toml --set scheme.name=my-pre-ln --set optim.max_updates=4 \
   --set run.log_interval=1 --set run.threads=1 --set eval.test_beam=0 --set run.out_dir=runs/my) | tee "$work/train.log"
grep -q '"status": *"completed"' "$work/runs/my/status.json" ||
  fail "training the README's manifest with my-pre-ln did not complete: $(cat "$work/runs/my/status.json")"
echo "README plugin OK"
