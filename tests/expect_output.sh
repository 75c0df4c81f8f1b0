#!/bin/sh
# Runs a command, shows its output, and passes only when it exits 0 and its output matches REGEX
# (grep -E over the whole output): ctest's PASS_REGULAR_EXPRESSION alone ignores the exit code.
# usage: expect_output.sh REGEX COMMAND [ARG…]
regex=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit code $rc"; exit 1; }
printf '%s\n' "$out" | grep -Ezq -- "$regex" || { echo "FAIL: the output does not match: $regex"; exit 1; }
