#!/usr/bin/env bash
# Object-storage benchmark: dsbench over s3://bench/photos against the same
# folder read locally and against a PyTorch DataLoader whose dataset fetches
# each object with boto3 (s3_loader_boto3.py), 2 workers each, the runs
# interleaved; then the listing (index) time of a prefix of 100 000 keys.
#
#   python/bench/s3_bench.sh [PHOTOS_DIR] [ROUNDS]
#
# The store is tests/s3_server.py (moto's S3 under waitress, signatures
# checked) on 127.0.0.1, reached through its proxy, which holds every request
# LATENCY_MS milliseconds (default 20). PHOTOS_DIR (default /tmp/dsrt-photos)
# is made with /work/shared/bench/make_photos.py --count 2000 when missing.
# With SPLIT_CORES=1 the server gets CPU 1 to itself and every client runs
# on CPU 0, as if the store were another machine; by default all share the
# machine's cores. Prints one JSON line a run and the load before each.
set -euo pipefail
cd "$(dirname "$0")/../.."
photos=${1:-/tmp/dsrt-photos}
rounds=${2:-3}
latency=${LATENCY_MS:-20}
build=${BUILD:-build}
dsbench=$build/tools/dsbench
[ -x "$dsbench" ] || { echo "s3_bench: build dsbench first ($dsbench)" >&2; exit 1; }
if [ ! -d "$photos" ]; then
  /usr/bin/python3 /work/shared/bench/make_photos.py "$photos" --count 2000 >&2
fi
py=$(bash scripts/s3-venv.sh)

server_cpu="" client_cpu=""
if [ "${SPLIT_CORES:-0}" = 1 ]; then
  server_cpu="taskset -c 1"
  client_cpu="taskset -c 0"
fi

work=$(mktemp -d)
mkfifo "$work/in"
$server_cpu "$py" tests/s3_server.py --upload "$photos" bench/photos --fill bench/keys100k 100000 \
  --latency-ms "$latency" < "$work/in" > "$work/out" 2> "$work/err" &
server=$!
exec 3> "$work/in"
cleanup() {
  exec 3>&-
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 600); do
  [ -s "$work/out" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$work/err" >&2; exit 1; }
  sleep 0.5
done
info=$(head -1 "$work/out")
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.argv[1])['$1'])" "$info"; }
export AWS_ACCESS_KEY_ID=$(field key) AWS_SECRET_ACCESS_KEY=$(field secret)
export AWS_REGION=us-east-1 AWS_ENDPOINT_URL=$(field proxy)
export AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_CONFIG_FILE=/nonexistent
echo "{\"store\":\"moto S3 under waitress, signatures checked\",\"latency_ms\":$latency,\"split_cores\":${SPLIT_CORES:-0}}"

load() { echo "{\"uptime\":\"$(uptime | sed 's/.*load average: //')\"}"; }
for r in $(seq "$rounds"); do
  load
  $client_cpu "$dsbench" "$photos" --pipeline 227 --threads 2 --epochs 3 --json | tail -1
  load
  $client_cpu "$dsbench" s3://bench/photos --pipeline 227 --threads 2 --epochs 3 --json | tail -1
  load
  $client_cpu /usr/bin/python3 python/bench/s3_loader_boto3.py s3://bench/photos --pipeline 227 \
    --workers 2 --epochs 3
done
load
"$dsbench" s3://bench/keys100k --index --json | /usr/bin/python3 -c \
  'import json,sys; d=json.loads(sys.stdin.read()); print(json.dumps({"index":"s3://bench/keys100k","images":d["images"],"classes":len(d["classes"]),"scan_s":d["scan_s"]}))'
