#!/usr/bin/env bash
# Sets up normlab on a fresh Debian 12 machine and runs it.
#   scripts/normlab.sh run    install what running needs, build normlab and its plugins (no tests), run the
#                             main job: the quickstart sweep and its report
#   scripts/normlab.sh test   install packages (and the venv: torch wheel, sacrebleu, tensorboard,
#                             sentencepiece), build with both LibTorch sources, run every ctest suite
#   scripts/normlab.sh build  install the packages running needs and build normlab and its plugins only
#   scripts/normlab.sh install [PREFIX]  build, then install normlab, its plugins, the SDK headers and
#                             its CMake package into PREFIX (default ~/.local): what out-of-tree
#                             plugins build against (find_package(normlab), CMAKE_PREFIX_PATH=PREFIX)
#   scripts/normlab.sh reproduce  install packages, build, then run every scripts/reproduce/*.sh in name order
#                             (the paper figures; docs/reproducing.md)
#   scripts/normlab.sh data NAME [DIR]  put corpus NAME (e.g. multi30k) into data/NAME, SHA-256 checked
#   scripts/normlab.sh eval-venv  make (or reuse) the venv of `test`, which holds lm-evaluation-harness
#                             (lm_eval[hf], torch, transformers, sentencepiece): prints its path last
#                             (docs/downstream.md, "The evaluation venv")
# Large downloads (the PyPI torch wheel, ~5 GB with its CUDA libraries) are cached under
# ${NORMLAB_CACHE:-~/.cache/normlab}, outside the clone, so a repeat run reuses them.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${NORMLAB_CACHE:-$HOME/.cache/normlab}
JOBS=${NORMLAB_JOBS:-$(nproc)}
TORCH2_SPEC=${NORMLAB_TORCH2_SPEC:-torch==2.15.0}  # the PyPI wheel (CUDA 13.2 build)
# lm-evaluation-harness (with HF datasets): the downstream tasks' parity test and their conversion.
LM_EVAL_SPEC=${NORMLAB_LM_EVAL_SPEC:-lm_eval[hf]==0.4.13}  # [hf]: accelerate, which its HF model imports
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

# What building and running normlab needs (`run`, `build`, `reproduce`) ...
RUN_PACKAGES=(
  cmake ninja-build g++ python3
  libtorch-dev libgloo-dev libopenblas0-openmp
  libboost-dev libboost-filesystem-dev libcli11-dev libfmt-dev libtomlplusplus-dev
  libsentencepiece-dev nlohmann-json3-dev libssl-dev libcurl4-openssl-dev libarchive-dev
  python3-matplotlib python3-sentencepiece
)
# ... and what only the tests need (`test`): the test framework, the eager PyTorch and venv of the
# comparisons, a headless browser for the report's rendering, a local Slurm, the fuzzer's clang,
# the formatter, the docs site, and strace (which counts normlab's re-executions).
TEST_PACKAGES=(
  python3-venv python3-torch doctest-dev chromium slurm-wlm munge
  clang libclang-rt-14-dev clang-format zstd strace
  mkdocs mkdocs-material
)

log() { printf '\n== %s\n' "$*"; }

install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Debian's LibTorch 1.13 (CPU): everything, tests included.
build_debian() {
  log "building with Debian's LibTorch into build/"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DNORMLAB_BUILD_TESTS=ON
  cmake --build build -j "$JOBS"
}

# What running needs: the normlab binary and the built-in plugins, no tests.
configure_debian_run() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DNORMLAB_BUILD_TESTS=OFF
}
build_debian_run() {
  log "building normlab and its plugins with Debian's LibTorch into build/"
  configure_debian_run
  cmake --build build -j "$JOBS"
}

# The plugin targets of the schemes manifest $1 names ([scheme] name, and sweep axes, zipped or not,
# over "scheme" or "scheme.name"); empty when it cannot tell (then `run` builds everything first).
manifest_plugin_targets() {
  python3 - "$1" <<'PY' 2>/dev/null || true
import re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    m = tomllib.load(f)
names = {m.get("scheme", {}).get("name", "")}
for axis in m.get("sweep", {}).get("axis", []):
    zipped = "zip" in axis
    keys = axis["zip"] if zipped else [axis.get("key")]
    for i, key in enumerate(keys):
        if key not in ("scheme", "scheme.name"):
            continue
        for v in axis["values"]:
            v = v[i] if zipped else v
            names.add(v.get("name", "") if key == "scheme" else v)
if all(isinstance(n, str) and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", n) for n in names):
    print(" ".join(sorted("normlab_plugin_" + n.replace("-", "_") for n in names)))
PY
}

# Whether build dir $1 has plugin target $2: ninja's input of it is its plugin file (ninja knows
# other targets by such names too, normlab_plugin_pch).
is_plugin_target() {
  ninja -C "$1" -t query "$2" 2>/dev/null | sed -n '/^  input:/,/^  outputs:/p' |
    grep -qxF "    plugins/normlab_${2#normlab_plugin_}.so"
}

# `run`: first what the main job needs (normlab and the plugins of its schemes), so that its result
# comes ~30 % sooner; the other plugins after its report (issue 70.3).
build_debian_main_job() {
  local plugins
  plugins=$(manifest_plugin_targets "$1")
  if [ -z "$plugins" ]; then
    build_debian_run
    return
  fi
  configure_debian_run
  local t
  for t in $plugins; do  # a scheme of no built-in plugin (one from NORMLAB_PLUGIN_PATH): build all
    if ! is_plugin_target build "$t"; then
      log "building normlab and its plugins with Debian's LibTorch into build/ ($t: no such target)"
      cmake --build build -j "$JOBS"
      return
    fi
  done
  log "building normlab and the main job's plugins ($plugins) with Debian's LibTorch into build/"
  # shellcheck disable=SC2086  # one target per word
  cmake --build build -j "$JOBS" --target normlab_cli $plugins
}

# LibTorch 2.x with CUDA from the PyPI torch wheel, compiled with the machine's CUDA toolkit; the
# same venv has sacrebleu, which the BLEU test (cli_bleu_sacrebleu) compares normlab with, and
# tensorboard, which reads normlab's event files back (tensorboard_read), and sentencepiece, with
# which python/normlab_torch.py reads an exported tokenizer (export_torch_venv), and transformers,
# whose LlamaForCausalLM loads a llama-family pre-ln export (export_torch_venv), and lm_eval, the
# harness that normlab's downstream tasks are checked against (docs/downstream.md).
# Prints the venv's path as its last line (progress goes to stderr).
torch2_venv() {
  local venv=$CACHE/venv
  # Everything there already (every run after the first): one interpreter imports it all.
  if "$venv/bin/python" -c 'import torch, sacrebleu, tensorboard, safetensors, sentencepiece, transformers
import lm_eval.models.huggingface, datasets' 2>/dev/null; then
    echo "$venv"
    return 0
  fi
  if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    log "creating $venv with $TORCH2_SPEC, sacrebleu and tensorboard from PyPI" >&2
    mkdir -p "$CACHE"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "$TORCH2_SPEC" sacrebleu tensorboard safetensors sentencepiece transformers \
      "$LM_EVAL_SPEC"
  fi
  if ! "$venv/bin/python" -c 'import sacrebleu' 2>/dev/null; then
    log "installing sacrebleu into $venv" >&2
    "$venv/bin/pip" install -q sacrebleu
  fi
  if ! "$venv/bin/python" -c 'import tensorboard' 2>/dev/null; then
    log "installing tensorboard into $venv" >&2
    "$venv/bin/pip" install -q tensorboard
  fi
  if ! "$venv/bin/python" -c 'import safetensors' 2>/dev/null; then
    log "installing safetensors into $venv" >&2
    "$venv/bin/pip" install -q safetensors
  fi
  if ! "$venv/bin/python" -c 'import sentencepiece' 2>/dev/null; then
    log "installing sentencepiece into $venv" >&2
    "$venv/bin/pip" install -q sentencepiece
  fi
  if ! "$venv/bin/python" -c 'import transformers' 2>/dev/null; then
    log "installing transformers into $venv" >&2
    "$venv/bin/pip" install -q transformers
  fi
  if ! "$venv/bin/python" -c 'import lm_eval.models.huggingface, datasets' 2>/dev/null; then
    log "installing $LM_EVAL_SPEC into $venv" >&2
    "$venv/bin/pip" install -q "$LM_EVAL_SPEC"
  fi
  echo "$venv"
}

build_torch2() {
  local venv prefix
  venv=$(torch2_venv | tail -n 1)
  prefix=$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  log "building with LibTorch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') into build-torch2/"
  # The wheel's CMake config compiles its CUDA checks with the machine's toolkit (nvcc 13).
  if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
    echo "error: LibTorch 2.x with CUDA needs the CUDA toolkit: no nvcc in $CUDA_HOME/bin (set CUDA_HOME)" >&2
    exit 1
  fi
  export PATH=$CUDA_HOME/bin:$PATH
  # Only the tests whose result can differ between LibTorch versions, and what they need
  # (NORMLAB_TESTS=both_builds, tests/CMakeLists.txt); no manifest fuzzer (it links no LibTorch).
  cmake -S . -B build-torch2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DNORMLAB_FUZZ=OFF \
    -DNORMLAB_TESTS=both_builds
  cmake --build build-torch2 -j "$JOBS"
}

# ctest in build dir $1; further arguments go to ctest.
run_tests() {
  local dir=$1
  shift
  log "ctest in $dir $*"
  ctest --test-dir "$dir" -j "$JOBS" --output-on-failure "$@"
}

# Puts a corpus the manifests in experiments/ read into data/NAME/ of this checkout: copies the
# files from DIR (default $NORMLAB_DATA_MIRROR/NAME), checks each SHA-256 against
# scripts/datasets/NAME.sha256, and renames the folder into place only when all match.
install_dataset() {
  local name=${1:-} sums src dest tmp
  sums=scripts/datasets/$name.sha256
  if [ -z "$name" ] || [ ! -f "$sums" ]; then
    echo "error: dataset '${name}': expected one of: $(cd scripts/datasets && ls ./*.sha256 | sed 's#^./##; s#\.sha256$##' | tr '\n' ' ')" >&2
    exit 2
  fi
  src=${2:-${NORMLAB_DATA_MIRROR:+$NORMLAB_DATA_MIRROR/$name}}
  if [ -z "$src" ] || [ ! -d "$src" ]; then
    echo "error: dataset $name: expected a folder with its files (argument DIR or \$NORMLAB_DATA_MIRROR/$name), got '${src}'" >&2
    exit 2
  fi
  dest=data/$name
  tmp=$(mktemp -d "data/.$name.XXXXXX" 2>/dev/null || { mkdir -p data && mktemp -d "data/.$name.XXXXXX"; })
  while read -r _ file; do
    if [ ! -f "$src/$file" ]; then
      rm -rf "$tmp"; echo "error: dataset $name: $src/$file: no such file" >&2; exit 2
    fi
    cp "$src/$file" "$tmp/$file"
  done <"$sums"
  if ! (cd "$tmp" && sha256sum --quiet -c "$OLDPWD/$sums" >&2); then
    rm -rf "$tmp"; echo "error: dataset $name: SHA-256 mismatch against $sums (files in $src)" >&2; exit 2
  fi
  rm -rf "$dest" && mv "$tmp" "$dest"
  echo "dataset $name in $dest (SHA-256 verified)"
}

case "${1:-}" in
  data)
    install_dataset "${2:-}" "${3:-}"
    ;;
  run)
    install_packages "${RUN_PACKAGES[@]}"
    manifest=experiments/quickstart-sweep.toml
    build_debian_main_job "$manifest"
    log "main job: the quickstart sweep (Post-LN and DeepNorm at 2 and 6 layers, built-in reverse task, every analysis probe), then its report"
    out=${NORMLAB_RUN_DIR:-runs/quickstart-sweep}
    rm -rf "$out"  # a fresh sweep each time
    ./build/bin/normlab sweep "$manifest" --jobs 2 --set run.out_dir="\"$out\""
    ./build/bin/normlab sweep "$manifest" --status --set run.out_dir="\"$out\""
    ./build/bin/normlab report "$out"
    log "building the other plugins (normlab plugins list: every scheme this build has)"
    cmake --build build -j "$JOBS"
    ./build/bin/normlab plugins list
    echo "the main job's report: $out/report/report.html"
    ;;
  build)
    install_packages "${RUN_PACKAGES[@]}"
    build_debian_run
    ;;
  install)
    install_packages "${RUN_PACKAGES[@]}"
    build_debian_run
    prefix=${2:-$HOME/.local}
    cmake --install build --prefix "$prefix"
    echo "normlab installed in $prefix: run $prefix/bin/normlab; build plugins with -DCMAKE_PREFIX_PATH=$prefix"
    ;;
  reproduce)
    install_packages "${RUN_PACKAGES[@]}"
    build_debian_run
    shopt -s nullglob
    LC_COLLATE=C  # name order, whatever the locale
    for script in scripts/reproduce/*.sh; do
      log "reproduce: $script"
      NORMLAB=${NORMLAB:-./build/bin/normlab} bash "$script"
    done
    ;;
  eval-venv)
    # The test command's venv, alone: `lm_eval --model hf` and python/normlab_lm_eval.py run in it.
    install_packages python3 python3-venv
    mkdir -p "$CACHE"
    torch2_venv
    ;;
  test)
    install_packages "${RUN_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    # The venv (a ~5 GB download on a fresh machine) while the first build compiles; the tests that
    # use its python are registered by configuring again once it is there.
    mkdir -p "$CACHE"
    torch2_venv >"$CACHE/venv.log" 2>&1 &
    venv_job=$!
    build_debian
    if ! wait "$venv_job"; then
      cat "$CACHE/venv.log" >&2
      echo "error: creating the venv failed (log above)" >&2
      exit 1
    fi
    cmake -S . -B build >/dev/null
    run_tests build
    build_torch2
    # Every test ran above; label both_builds (tests/CMakeLists.txt): those whose result can differ
    # between LibTorch versions, again with LibTorch 2.x.
    run_tests build-torch2 -L both_builds
    ;;
  *)
    echo "usage: $0 run|test|build|install [PREFIX]|reproduce|data NAME [DIR]|eval-venv" >&2
    exit 2
    ;;
esac
