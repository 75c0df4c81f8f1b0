#!/usr/bin/env bash
# Every std::filesystem symbol normlab uses binds to libstdc++, never to the copy that the PyPI
# wheel's LibTorch exports (pytorch#133437; torch 2.11's remove_all crashed through it).
#   check_libstdcxx_binding.sh NORMLAB WORK_DIR NORMLAB_CLI_LIBRARY
# (the executable loads LibTorch through libnormlab_cli: runner/main.cpp)
set -euo pipefail
normlab=$1 work=$2 cli_library=$3
rm -rf "$work" && mkdir -p "$work"
torch_libs=$(ldd "$cli_library" | awk '/libtorch|libc10/ {print $3}')
exported=0
for lib in $torch_libs; do
  n=$(nm -D --defined-only "$lib" | grep -c ' _ZN[K]*St10filesystem' || true)
  exported=$((exported + n))
done
if [ "$exported" -eq 0 ]; then
  echo "SKIP: this LibTorch exports no std::filesystem symbols (nothing can bind to it)"
  exit 0
fi
# Bind every symbol at load (LD_BIND_NOW), so the check does not depend on which code runs.
LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$work/ld" "$normlab" --version >/dev/null
wrong=$(cat "$work"/ld.* | grep "St10filesystem" | grep -E "to [^ ]*(libtorch|libc10)[^ ]* " || true)
total=$(cat "$work"/ld.* | grep -c "St10filesystem" || true)
if [ -n "$wrong" ]; then
  echo "FAIL: $(echo "$wrong" | wc -l) of $total std::filesystem bindings go to LibTorch's copy ($exported symbols exported), e.g.:"
  echo "$wrong" | head -3
  exit 1
fi
echo "libstdc++ binding OK: $total std::filesystem bindings, none to LibTorch's $exported exported copies"
