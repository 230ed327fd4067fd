#!/usr/bin/env bash
# Builds dsrt's libFuzzer targets (tests/fuzz/fuzz_*.c) with clang, ASan and
# UBSan, and runs each for SECONDS (default 60) from an empty corpus in a
# temporary folder. Any crash fails the script and leaves the input in
# build-fuzz/findings/.
#
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
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
  if ! "$f" -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix=build-fuzz/findings/"$name"- "$corpus" 2> build-fuzz/"$name".log; then
    echo "$name: FAILED (see build-fuzz/$name.log)"; tail -30 build-fuzz/"$name".log; status=1
  else
    echo "$name: $(grep -E 'stat::number_of_executed_units' build-fuzz/"$name".log | awk '{print $2}') runs, no finding"
  fi
  rm -rf "$corpus"
done
exit $status
