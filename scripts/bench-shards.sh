#!/usr/bin/env bash
# Folder against tar shards and a ZIP archive, page cache dropped before each
# epoch: images/s of `dsbench` on a folder of photos, on the same photos as
# shards (the shard order and the exact order) and as one ZIP archive (the
# same two orders), the shards and the archive with a warm cache, and,
# when WDS_PYTHON names a Python with PyPI's webdataset, WebDataset's own
# loader on the same shards. The runs are interleaved, round after round, so
# that a change in the machine's load touches every kind alike; each line
# gives the load average before the run, and the summary the median of each
# kind and the ratios the targets are stated in.
#
#   scripts/bench-shards.sh PHOTOS [ROUNDS] [SHARD_SIZE]
#
# PHOTOS is a folder of class folders (make_photos.py OUT --count 20000);
# its shards are written once to PHOTOS-shards (dsbench convert --shards,
# default 64M), its archive to PHOTOS.zip (`zip -0 -r`, stored as the
# shards store; ZIP=0 leaves the archive out). Environment: DSBENCH (default build/tools/dsbench), THREADS
# (2), EPOCHS (3: one warm-up, the median of the rest), PIPELINE (227),
# WDS_PYTHON (e.g. ~/wds-env/bin/python; see python/bench/wds_loader_bench.py).
# Dropping the cache with /proc/sys/vm/drop_caches needs root; otherwise
# dsbench and the baseline drop each file with posix_fadvise, and say so.
#
# STORAGE_IOPS=N runs every command in a blkio cgroup (v1, root) that lets
# it read at most N requests a second from the disk holding PHOTOS: storage
# that seeks like a spinning disk or answers like a network file system (a
# virtual disk served from the host's cache is not I/O-bound at all).
set -euo pipefail
photos=${1:?"usage: scripts/bench-shards.sh PHOTOS [ROUNDS] [SHARD_SIZE]"}
rounds=${2:-3}
size=${3:-64M}
root=$(cd "$(dirname "$0")/.." && pwd)
dsbench=${DSBENCH:-$root/build/tools/dsbench}
threads=${THREADS:-2}
epochs=${EPOCHS:-3}
pipe=${PIPELINE:-227}
shards=${photos%/}-shards
[ -x "$dsbench" ] || { echo "no $dsbench: build first (bash scripts/build.sh build)"; exit 1; }
if [ ! -f "$shards/dsrt-shards.index" ]; then
  "$dsbench" convert "$photos" "$shards" --shards "$size"
fi
archive=""
if [ "${ZIP:-1}" != 0 ]; then
  archive=${photos%/}.zip
  if [ ! -f "$archive" ]; then
    command -v zip > /dev/null || { echo "no zip: apt-get install zip, or ZIP=0"; exit 1; }
    (cd "$photos" && zip -q -0 -r "$archive" .)
  fi
fi
out=$(mktemp -d)
cg=""
cleanup() {
  rm -rf "$out"
  [ -n "$cg" ] && rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
wrap=()
if [ -n "${STORAGE_IOPS:-}" ]; then
  dev=$(stat -c '%d' "$photos")
  majmin="$((dev >> 8)):$((dev & 255))"
  base=$(lsblk -no PKNAME "/dev/block/$majmin" 2>/dev/null || true)
  [ -n "$base" ] && majmin=$(lsblk -dno MAJ:MIN "/dev/$base" | tr -d ' ')
  cg=/sys/fs/cgroup/blkio/dsrt-bench-$$
  mkdir "$cg"
  echo "$majmin $STORAGE_IOPS" > "$cg/blkio.throttle.read_iops_device"
  wrap=(sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg")
  echo "reads throttled to $STORAGE_IOPS requests/s on device $majmin"
fi

run() { # kind, command...
  local kind=$1
  shift
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  local line
  line=$("${wrap[@]}" "$@" 2>/dev/null | tail -1)
  local rate wait
  rate=$(printf '%s' "$line" | sed -n 's/.*"images_per_s":\s*\([0-9.]*\).*/\1/p')
  # dsbench: the workers' wait for reads, per image (summed over workers).
  wait=$(printf '%s' "$line" | awk -F'"read_s":' 'NF > 1 {split($2, a, ","); r = a[1]}
    {n = split($0, b, "\"delivered\":"); if (n > 1) {split(b[2], c, ","); d = c[1]}}
    END {if (r != "" && d > 0) printf "%.3f", 1000 * r / d}')
  printf '%-14s %9s images/s  %s(load %s before)\n' "$kind" "${rate:-failed}" \
    "${wait:+read wait $wait ms/image  }" "$load"
  echo "$rate" >> "$out/$kind"
}

common=(--threads "$threads" --epochs "$epochs" --pipeline "$pipe" --json)
for r in $(seq 1 "$rounds"); do
  echo "round $r"
  run folder-cold "$dsbench" "$photos" --cold "${common[@]}"
  run shard-cold "$dsbench" "$shards" --order shard --cold "${common[@]}"
  run exact-cold "$dsbench" "$shards" --order exact --cold "${common[@]}"
  run shard-warm "$dsbench" "$shards" --order shard "${common[@]}"
  run folder-warm "$dsbench" "$photos" "${common[@]}"
  if [ -n "$archive" ]; then
    run zip-cold "$dsbench" "$archive" --order shard --cold "${common[@]}"
    run zip-exact-cold "$dsbench" "$archive" --order exact --cold "${common[@]}"
    run zip-warm "$dsbench" "$archive" --order shard "${common[@]}"
  fi
  if [ -n "${WDS_PYTHON:-}" ]; then
    run wds-cold "$WDS_PYTHON" "$root/python/bench/wds_loader_bench.py" "$shards" --cold \
      --workers "$threads" --epochs "$epochs" --pipeline "$pipe"
  fi
done

med() { sort -g "$out/$1" | awk '{v[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
echo
echo "medians over $rounds rounds ($threads threads, pipeline $pipe, $(nproc) cores${STORAGE_IOPS:+, reads throttled to $STORAGE_IOPS/s}, load now: $(cut -d' ' -f1-3 /proc/loadavg)):"
for k in folder-cold shard-cold exact-cold shard-warm folder-warm zip-cold zip-exact-cold \
  zip-warm wds-cold; do
  [ -f "$out/$k" ] && printf '  %-14s %9.1f images/s\n' "$k" "$(med "$k")"
done
fc=$(med folder-cold); sc=$(med shard-cold); ec=$(med exact-cold); sw=$(med shard-warm)
awk -v fc="$fc" -v sc="$sc" -v ec="$ec" -v sw="$sw" 'BEGIN {
  printf "  shard order cold / folder cold: %.2fx (target 1.5x)\n", sc / fc
  printf "  shard order cold / warm:        %.0f%% (target 90%%)\n", 100 * sc / sw
  printf "  exact order cold / folder cold: %.2fx (target 1x)\n", ec / fc }'
if [ -f "$out/zip-cold" ]; then
  awk -v sc="$sc" -v ec="$ec" -v sw="$sw" -v zc="$(med zip-cold)" -v zec="$(med zip-exact-cold)" \
    -v zw="$(med zip-warm)" 'BEGIN {
    printf "  ZIP shard order cold / shards: %.3fx (target within 5%%)\n", zc / sc
    printf "  ZIP exact order cold / shards: %.3fx (target within 5%%)\n", zec / ec
    printf "  ZIP warm / shards warm:        %.3fx (target within 5%%)\n", zw / sw }'
fi
if [ -f "$out/wds-cold" ]; then
  awk -v sc="$sc" -v w="$(med wds-cold)" 'BEGIN {
    printf "  shard order cold / WebDataset cold: %.1fx (target 3x)\n", sc / w }'
fi
