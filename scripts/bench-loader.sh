#!/usr/bin/env bash
# The loader's figures, all of them, in interleaved rounds: dsbench on the
# 2000 shared photos and on the held-out set (progressive, 4:4:4 and gray
# JPEGs among them), pipelines 227 and 32, float32 NCHW and uint8 NHWC, one
# and two worker threads, each run with its own --limit (one core's full-size
# TurboJPEG decode of the same files) and checksum; optionally the same runs
# of an older dsrt (BASE), and the peers doing the same work: NVIDIA DALI's
# CPU pipeline, Meta's SPDL and PyTorch's DataLoader. Every run records the
# load average before it. Writes OUT/runs.jsonl (one JSON object a run) and
# OUT/table.md (medians over the rounds, ratios, load), and prints the table.
# Besides wall-clock rates, each figure is also given in CPU time (dsbench's
# images per second of its process's CPU, its limit's in the decoding
# thread's CPU; the older dsrt against this one in CPU seconds a delivered
# image), which other work on the machine moves little.
#
#   scripts/bench-loader.sh                       # build/, 3 rounds, peers if found
#   ROUNDS=5 PEERS=0 scripts/bench-loader.sh      # dsrt alone
#   BASE_REV=704a99b scripts/bench-loader.sh      # also an older dsrt, built here
#   BASE=/path/to/dsbench scripts/bench-loader.sh # also this dsbench (needs --layout)
#
# Environment: DATA (folder for the photo sets, default data/bench: made with
# ../shared/bench/make_photos.py when missing), ROUNDS (3), THREADS ("1 2"),
# PIPELINES ("227 32"), LAYOUTS ("nchw nhwc"), SETS ("photos heldout"),
# EPOCHS (3, the first a warm-up), PEERS (1: run those installed), DALI_PY
# and SPDL_PY (the Pythons of their venvs, default data/venv-dali/bin/python
# and data/venv-spdl/bin/python: `pip install nvidia-dali-cuda130`, `pip
# install spdl-io spdl-core` with Debian's libavcodec59 libavformat59
# libavfilter8 libavdevice59 libswscale6), TORCH_PY (/usr/bin/python3, with
# python3-torch python3-torchvision), BENCH (../shared/bench), OUT
# (out/bench-loader). BASE_REV builds that revision's library with the
# dsbench of BASE_TOOL_REV (default d7e2b48, the first with --layout) into
# data/base-REV. The machine should be quiet: the figures are wall-clock
# rates, and each row shows the load they were taken under.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
DATA=${DATA:-data/bench}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-"1 2"}
PIPELINES=${PIPELINES:-"227 32"}
LAYOUTS=${LAYOUTS:-"nchw nhwc"}
SETS=${SETS:-"photos heldout"}
EPOCHS=${EPOCHS:-3}
PEERS=${PEERS:-1}
BENCH=${BENCH:-../shared/bench}
DALI_PY=${DALI_PY:-data/venv-dali/bin/python}
SPDL_PY=${SPDL_PY:-data/venv-spdl/bin/python}
TORCH_PY=${TORCH_PY:-/usr/bin/python3}
OUT=${OUT:-out/bench-loader}
NEW=build/tools/dsbench

[ -x "$NEW" ] || bash scripts/build.sh build
mkdir -p "$OUT" "$DATA"
runs=$OUT/runs.jsonl
: > "$runs"

# The photo sets.
for set in $SETS; do
  [ -d "$DATA/$set" ] && continue
  case $set in
    photos) /usr/bin/python3 "$BENCH/make_photos.py" "$DATA/photos" --count 2000 ;;
    heldout) /usr/bin/python3 "$BENCH/make_photos.py" "$DATA/heldout" --count 2000 --seed 7 --variety ;;
    *) echo "bench-loader: unknown set '$set' (photos, heldout)" >&2; exit 2 ;;
  esac
done

# An older dsrt to compare with.
BASE=${BASE:-}
if [ -n "${BASE_REV:-}" ]; then
  src=data/base-$BASE_REV
  if [ ! -x "$src/build/tools/dsbench" ]; then
    rm -rf "$src" && mkdir -p "$src"
    git archive "$BASE_REV" | tar -x -C "$src"
    # The older tool is one file: it replaces the base's, a file or a folder.
    rm -rf "$src/tools/dsbench" "$src/tools/dsbench.c"
    git show "${BASE_TOOL_REV:-d7e2b48}:tools/dsbench.c" > "$src/tools/dsbench.c"
    cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSRT_WITH_CUDA=OFF \
      -DDSRT_BUILD_PYTHON=OFF -DDSRT_BUILD_TESTS=OFF >/dev/null
    cmake --build "$src/build" -j "$(nproc)" --target dsbench >/dev/null
  fi
  BASE=$src/build/tools/dsbench
fi

load() { cut -d' ' -f1 /proc/loadavg; }

# A dsbench run's JSON with the process's CPU seconds (user + system, every
# epoch and the start included) added as "cpu_s".
timed() {
  local t; t=$(mktemp)
  /usr/bin/time -f "%U %S" -o "$t" "$@" | tail -1 |
    /usr/bin/python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); u,s=open(sys.argv[1]).read().split()[-2:]; j["cpu_s"]=float(u)+float(s); print(json.dumps(j))' "$t" || true
  rm -f "$t"
}

# One run: appends {"who":..., "set":..., "load":..., <the tool's JSON>} to runs.
record() { # who set load json
  [ -n "$4" ] || { echo "bench-loader: $1 on $2 gave nothing" >&2; return; }
  /usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[4]); j.update(who=sys.argv[1], set=sys.argv[2], load=float(sys.argv[3])); print(json.dumps(j))' \
    "$1" "$2" "$3" "$4" >> "$runs"
}

peer() { # who python script set pipeline threads args...
  local who=$1 py=$2 script=$3 set=$4 pipe=$5 t=$6; shift 6
  [ "$PEERS" = 1 ] && [ -x "$py" ] || return 0
  local l; l=$(load)
  record "$who" "$set" "$l" "$("$py" "$BENCH/$script" "$DATA/$set" --pipeline "$pipe" "$@" \
    --epochs "$EPOCHS" 2>/dev/null | tail -1 || true)"
}

for round in $(seq "$ROUNDS"); do
  for set in $SETS; do
    for pipe in $PIPELINES; do
      for t in $THREADS; do
        for layout in $LAYOUTS; do
          l=$(load)
          record dsrt "$set" "$l" "$("$NEW" "$DATA/$set" --pipeline "$pipe" --layout "$layout" \
            --threads "$t" --epochs "$EPOCHS" --limit --json | tail -1)"
          if [ -n "$BASE" ]; then
            # The older dsrt and this one, the same runs without --limit,
            # each with its CPU time: a comparison other load moves little.
            for who in base dsrt-cpu; do
              b=$BASE; [ $who = dsrt-cpu ] && b=$NEW
              l=$(load)
              record $who "$set" "$l" "$(timed "$b" "$DATA/$set" --pipeline "$pipe" \
                --layout "$layout" --threads "$t" --epochs "$EPOCHS" --json)"
            done
          fi
          if [ "$round" = 1 ]; then
            # Checksums apart from the timed runs (hashing takes a core's time).
            for who in dsrt base; do
              b=$NEW; [ $who = base ] && b=$BASE
              [ -n "$b" ] || continue
              l=$(load)
              record "$who-checksum" "$set" "$l" "$("$b" "$DATA/$set" --pipeline "$pipe" \
                --layout "$layout" --threads "$t" --epochs 2 --checksum --json | tail -1)"
            done
            for isa in scalar avx2; do
              l=$(load)
              record "dsrt-checksum-$isa" "$set" "$l" "$(DSRT_MAX_CPU_ISA=$isa "$NEW" "$DATA/$set" \
                --pipeline "$pipe" --layout "$layout" --threads "$t" --epochs 2 --checksum --json |
                tail -1)"
            done
          fi
        done
        peer dali "$DALI_PY" dali_loader_bench.py "$set" "$pipe" "$t" --threads "$t"
        peer spdl "$SPDL_PY" spdl_loader_bench.py "$set" "$pipe" "$t" --threads "$t"
        peer torch "$TORCH_PY" torch_loader_bench.py "$set" "$pipe" "$t" --workers "$t"
      done
    done
  done
  echo "bench-loader: round $round of $ROUNDS done (load $(load))" >&2
done

/usr/bin/python3 - "$runs" "$OUT/table.md" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = lambda v: statistics.median(v) if v else float("nan")
def key(r):
    threads = r.get("threads") or r.get("workers")
    return (r["set"], str(r["pipeline"]), r.get("layout", "nchw"), int(threads))
groups = {}
for r in runs:
    groups.setdefault((r["who"],) + key(r), []).append(r)
out = []
out.append("| set | pipeline | layout | threads | dsrt images/s | per thread | limit images/s "
           "| of limit | of limit, CPU time | older dsrt | ratio | ratio, CPU time | checksums "
           "| load |")
out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for k in sorted(g for g in groups if g[0] == "dsrt"):
    rs = groups[k]
    rate = med([r["images_per_s"] for r in rs])
    per = med([r["per_thread_images_per_s"] for r in rs])
    lim = med([r["limit"]["images_per_s"] for r in rs])
    of = med([r["of_limit"] for r in rs])
    base = groups.get(("base",) + k[1:], [])
    brate = med([r["images_per_s"] for r in base])
    # Checksums: this dsrt's on every instruction set, and the older one's.
    sums = {w: {r["checksum"] for r in groups.get((w,) + k[1:], [])}
            for w in ("dsrt-checksum", "dsrt-checksum-scalar", "dsrt-checksum-avx2",
                      "base-checksum")}
    mine = sums["dsrt-checksum"] | sums["dsrt-checksum-scalar"] | sums["dsrt-checksum-avx2"]
    same = ("one across isas" if len(mine) == 1 else "DIFFER across isas") if mine else ""
    if sums["base-checksum"]:
        same += ", = older" if sums["base-checksum"] == mine else ", != older"
    ofc = med([r["of_limit_cpu"] for r in rs])
    # CPU time a delivered image, the older dsrt's over this one's.
    mine_cpu = groups.get(("dsrt-cpu",) + k[1:], [])
    cpu_per = lambda rr: med([r["cpu_s"] / r["delivered"] for r in rr if r.get("cpu_s")])
    cpu_ratio = cpu_per(base) / cpu_per(mine_cpu) if base and mine_cpu else float("nan")
    loads = [r["load"] for r in rs + base + mine_cpu]
    out.append(f"| {k[1]} | {k[2]} | {k[3]} | {k[4]} | {rate:.0f} | {per:.0f} | {lim:.0f} | "
               f"{100 * of:.0f}% | {100 * ofc:.0f}% | {brate:.0f} | "
               f"{rate / brate if base else float('nan'):.2f}x | {cpu_ratio:.2f}x | "
               f"{same} | {min(loads):.1f}-{max(loads):.1f} |")
peers = [p for p in ("dali", "spdl", "torch") if any(g[0] == p for g in groups)]
if peers:
    out.append("")
    out.append("| set | pipeline | threads | dsrt (float32 NCHW) | " +
               " | ".join(f"{p} images/s | dsrt / {p}" for p in peers) + " | load |")
    out.append("|---|---|---|---|" + "---|---|" * len(peers) + "---|")
    for k in sorted(g for g in groups if g[0] == "dsrt" and g[3] == "nchw"):
        d = med([r["images_per_s"] for r in groups[k]])
        cells, loads = [], [r["load"] for r in groups[k]]
        for p in peers:
            pr = groups.get((p, k[1], k[2], "nchw", k[4]), [])
            v = med([r["images_per_s"] for r in pr])
            loads += [r["load"] for r in pr]
            cells.append(f"{v:.0f} | {d / v if pr and v else float('nan'):.1f}x")
        out.append(f"| {k[1]} | {k[2]} | {k[4]} | {d:.0f} | " + " | ".join(cells) +
                   f" | {min(loads):.1f}-{max(loads):.1f} |")
text = "\n".join(out) + "\n"
open(sys.argv[2], "w").write(text)
print(text)
EOF
