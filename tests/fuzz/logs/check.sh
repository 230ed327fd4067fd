#!/usr/bin/env bash
# scripts/fuzz.sh's reading of a fuzzer's log, on logs recorded from small
# libFuzzer targets built as scripts/fuzz.sh builds dsrt's (ASan and UBSan):
# a clean run passes; a UBSan report fails the run even where the fuzzer
# went on and exited 0 (a build whose UBSan recovers), and so do UBSan made
# fatal, an AddressSanitizer crash and a leak.
set -u
here=$(cd "$(dirname "$0")" && pwd)
fuzz=$here/../../../scripts/fuzz.sh
fail=0
expect() {
  local log=$1 want=$2 rc=0
  bash "$fuzz" --check-log "$here/$log" >/dev/null || rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAIL $log: --check-log exits $rc, want $want"
    fail=1
  else
    echo "ok   $log: $rc"
  fi
}
expect clean.log 0
expect ubsan-recovered.log 1
expect ubsan-fatal.log 1
expect asan-crash.log 1
expect lsan-leak.log 1
exit $fail
