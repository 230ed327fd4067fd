#!/usr/bin/env bash
# Installs dsrt's dependencies, builds dsrt and its tests, and runs the tests
# with CTest (the default set; slow benchmarks carry the label "slow" and run
# with `ctest -L slow`).
#
#   scripts/test.sh                      # build/ , Release
#   scripts/test.sh --sanitize address   # build-asan/, ASan + UBSan
#   scripts/test.sh --sanitize thread    # build-tsan/, TSan
#   scripts/test.sh ... -R pipeline      # further arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
san=""
if [ "${1:-}" = "--sanitize" ]; then
  san=${2:?"--sanitize needs address or thread"}
  shift 2
fi
if [ -z "$san" ]; then
  build=build
  bash scripts/build.sh "$build"
else
  build=build-${san/address/asan}
  build=${build/thread/tsan}
  DSRT_BUILD_TYPE=RelWithDebInfo bash scripts/build.sh "$build" -DDSRT_SANITIZE="$san"
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
# Open MPI's own leaks in the communicator tests: tests/lsan.supp says which.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# oneDNN's OpenMP runtime is not instrumented: tests/tsan.supp names what TSan
# cannot see through there.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp}
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -LE slow "$@"
