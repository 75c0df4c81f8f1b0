#!/bin/sh
# Runs a command, shows its output, and passes only when it exits as expected (0 unless --exit N)
# and its output matches REGEX (grep -E over the whole output): ctest's PASS_REGULAR_EXPRESSION alone
# ignores the exit code. A command that prints a line starting "SKIP: " and exits 0 is passed through
# unchanged, for the test's SKIP_REGULAR_EXPRESSION to report it as skipped.
# usage: expect_output.sh [--exit N] REGEX COMMAND [ARG…]
want=0
if [ "$1" = "--exit" ]; then
  want=$2
  shift 2
fi
regex=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -q '^SKIP: '; then
  exit 0
fi
[ "$rc" -eq "$want" ] || { echo "FAIL: exit code $rc, expected $want"; exit 1; }
printf '%s\n' "$out" | grep -Ezq -- "$regex" || { echo "FAIL: the output does not match: $regex"; exit 1; }
