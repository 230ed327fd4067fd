#!/usr/bin/env bash
# WebP decode throughput: dsrt against Pillow on the same files, and WebP
# against JPEG of the same pixels. Makes OUT/{jpeg,webp,webp-lossless} from
# the first N photos of PHOTOS (make_photos.py's folder; JPEG and lossy WebP
# at quality 90: python/bench/webp_bench.py make), then runs ROUNDS rounds,
# each dsrt's decode (tests/test_slow_webp_bench: one core in CPU time, two
# threads in wall time) then Pillow's (one process in CPU time, two
# processes in wall time), side by side so that the machine's load hits
# both alike. Needs a build with tests (BUILD, default build).
#
#   scripts/bench-webp.sh PHOTOS OUT [N] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
photos=${1:?usage: scripts/bench-webp.sh PHOTOS OUT [N] [ROUNDS]}
out=${2:?usage: scripts/bench-webp.sh PHOTOS OUT [N] [ROUNDS]}
n=${3:-500}
rounds=${4:-3}
build=${BUILD:-build}
[ -d "$out/webp-lossless" ] || /usr/bin/python3 python/bench/webp_bench.py make "$photos" "$out" "$n"
for s in jpeg webp webp-lossless; do
  echo "$s: $(find "$out/$s" -type f | wc -l) files, $(du -sh "$out/$s" | cut -f1)"
done
for r in $(seq 1 "$rounds"); do
  echo "-- round $r (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  DSRT_BENCH_WEBP=$out DSRT_BENCH_PASSES=3 "$build/tests/test_slow_webp_bench"
  /usr/bin/python3 python/bench/webp_bench.py pil "$out" 3
done
