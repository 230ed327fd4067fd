#!/usr/bin/env bash
# Builds dsrt's libFuzzer targets (tests/fuzz/fuzz_*.c) with clang, ASan and
# UBSan, every sanitizer report fatal (-fno-sanitize-recover=all), and runs
# each for SECONDS (default 60) from a corpus in a temporary folder: empty,
# or the target's seeds in tests/fuzz/seeds/NAME/.
# Any crash, and any sanitizer report in a fuzzer's log even where the
# fuzzer exited 0, fails the script; a crash leaves the input in
# build-fuzz/findings/.
#
#   scripts/fuzz.sh [SECONDS]
#   scripts/fuzz.sh --check-log LOG   # exit 1 when LOG holds a sanitizer report
set -euo pipefail

# A sanitizer's report in a libFuzzer log: UBSan's "runtime error", an
# AddressSanitizer, LeakSanitizer or libFuzzer error, any sanitizer's
# summary line.
findings() {
  grep -E 'runtime error:|ERROR: [A-Za-z]*Sanitizer|SUMMARY: [A-Za-z]*Sanitizer|ERROR: libFuzzer' "$1"
}
if [ "${1:-}" = "--check-log" ]; then
  [ -r "${2:-}" ] || { echo "fuzz.sh: --check-log: no log '${2:-}'" >&2; exit 2; }
  if findings "$2"; then exit 1; fi
  exit 0
fi

cd "$(dirname "$0")/.."
secs=${1:-60}
# The sanitizers stop at their first report (the build makes them fatal too).
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export ASAN_OPTIONS="halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
bash scripts/install-deps.sh
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSRT_FUZZ=ON \
  -DDSRT_WITH_CUDA=OFF -DDSRT_BUILD_TOOLS=OFF -DDSRT_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)"
mkdir -p build-fuzz/findings
status=0
for f in build-fuzz/tests/fuzz_*; do
  [ -x "$f" ] || continue
  name=$(basename "$f")
  corpus=$(mktemp -d)
  # A target's seeds (tests/fuzz/seeds/NAME/), where it has some, start its corpus.
  if [ -d tests/fuzz/seeds/"$name" ]; then cp tests/fuzz/seeds/"$name"/* "$corpus"/; fi
  if ! "$f" -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix=build-fuzz/findings/"$name"- "$corpus" 2> build-fuzz/"$name".log; then
    echo "$name: FAILED (see build-fuzz/$name.log)"; tail -30 build-fuzz/"$name".log; status=1
  elif findings build-fuzz/"$name".log >/dev/null; then
    echo "$name: FAILED: a sanitizer report though it exited 0 (see build-fuzz/$name.log)"
    findings build-fuzz/"$name".log | head -10; status=1
  else
    echo "$name: $(grep -E 'stat::number_of_executed_units' build-fuzz/"$name".log | awk '{print $2}') runs, no finding"
  fi
  rm -rf "$corpus"
done
exit $status
