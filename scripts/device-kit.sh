#!/usr/bin/env bash
# The device kit: builds and tests dsrt's GPU parts on a CUDA machine that has
# no package registry and no network. Two commands:
#
#   scripts/device-kit.sh pack [DIR]   here, on a Debian 12 machine with apt:
#       fetches (apt-get download, into DIR, default device/kit) the Debian
#       packages of dsrt's dependencies that such a machine lacks: the -dev
#       packages of libjpeg-turbo, libspng, liburing, hwloc, oneDNN and zlib,
#       their libraries, and the libraries those need (resolved recursively,
#       less what every machine that runs nvcc has: glibc, libstdc++, the
#       toolchain). With DSRT_KIT_TOOLS=1 it adds cmake and ninja (for a
#       machine without them). With DSRT_KIT_WHEELS=1 it also fetches the nvidia-cudnn-cu13
#       and nvidia-nccl-cu13 wheels for Python DSRT_KIT_PYTHON (default 3.12;
#       DSRT_KIT_CUDNN / DSRT_KIT_NCCL pin versions, e.g. "==9.19.0.56"). They
#       are large (about 520 MB and 300 MB): a machine that already has them
#       (PyTorch's own copies) should use those, see run.
#   scripts/device-kit.sh run [OUT]    there, in a copy of this working tree
#       with the kit folder: unpacks the packages with dpkg -x into
#       device/prefix (never into /), builds dsrt with CUDA into build-device
#       against that prefix, runs the GPU tests (ctest -L gpu, which must not
#       skip), test_gpu_backend under compute-sanitizer (memcheck, and
#       racecheck over a subset), the GPU benchmarks against PyTorch's, and
#       the end-to-end run (dstrain train from a folder of JPEGs made there
#       with make_photos.py, against torch_gpu_train_folder.py, with the GPU's
#       busy share sampled by nvidia-smi), and writes everything to OUT
#       (default $OUT, else device/out): env.txt, build.log, tests.log,
#       sanitizer.log, bench.log, e2e.log, summary.txt. Exits non-zero when
#       the build, a test or the sanitizer fails.
#
# cuDNN and NCCL come from, in order: CUDNN_ROOT / NCCL_ROOT (a prefix, or a
# Python package's nvidia/cudnn, nvidia/nccl folder), the nvidia.cudnn and
# nvidia.nccl packages of the machine's python3, wheels in the kit, or the
# CUDA toolkit's folders. The machine needs nvcc, cmake (>= 3.22), ninja,
# gcc and python3. Variables: DSRT_KIT_DIR (the kit folder for run),
# DSRT_KIT_REQUIRE_GPU=0 (let GPU tests skip, for a dry run without a GPU),
# DSRT_KIT_BENCH=0 (no benchmarks), DSRT_KIT_SANITIZE=0 (no compute-sanitizer),
# DSRT_KIT_E2E=0 (no end-to-end run), DSRT_KIT_PHOTOS (JPEGs it makes, default
# 20000), DSRT_KIT_EPOCHS (of the end-to-end runs, default 3),
# DSRT_KIT_BASELINES (pack: a folder whose torch_*.py baselines and
# make_photos.py travel in the kit), DSRT_KIT_PHOTO_PACKAGES (pack: the Debian
# wallpaper packages make_photos.py crops, default lomiri-wallpapers-20.04;
# fetched only with DSRT_KIT_BASELINES).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# The Debian packages dsrt builds against (CMake's cmake/dsrtDependencies.cmake).
dev_packages=(libturbojpeg0-dev libspng-dev liburing-dev libhwloc-dev libdnnl-dev zlib1g-dev)
# The build tools, when asked for (DSRT_KIT_TOOLS=1).
tool_packages=(cmake cmake-data ninja-build)
# What any machine with nvcc has: glibc, the compiler's runtime and headers,
# the base system's tools.
baseline=(libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev libgcc-s1
  libstdc++6 gcc-12-base procps)

die() {
  echo "device-kit: $*" >&2
  exit 1
}

# The names in a Depends field, first alternative of each, versions dropped.
depends_of() {
  apt-cache show --no-all-versions "$1" 2>/dev/null |
    sed -n 's/^\(Pre-\)\?Depends: //p' | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/:any//; s/ //g' |
    grep -v '^$' || true
}

in_list() {
  local x=$1
  shift
  for y in "$@"; do [ "$x" = "$y" ] && return 0; done
  return 1
}

# ----------------------------------------------------------------------------
# pack

pack() {
  local kit=${1:-device/kit}
  command -v apt-get >/dev/null || die "pack needs apt-get (a Debian 12 machine)"
  mkdir -p "$kit"
  kit=$(cd "$kit" && pwd)
  rm -f "$kit"/*.deb "$kit"/manifest.txt
  # The -dev packages, the libraries they ship headers for ("own": same
  # source, exact version), then every library those need, recursively
  # ("support": the target's own copy is used when it has one). Other -dev
  # packages that -dev packages pull in (libltdl-dev, libnuma-dev) are not
  # needed to compile against these headers and are left out.
  local -a own=() support=() queue=() tools=()
  [ "${DSRT_KIT_TOOLS:-0}" = 0 ] || tools=("${tool_packages[@]}")
  queue=("${tools[@]}")
  for d in "${dev_packages[@]}"; do
    for p in $(depends_of "$d"); do
      case $p in *-dev) continue ;; esac
      in_list "$p" "${baseline[@]}" "${own[@]}" && continue
      own+=("$p")
      queue+=("$p")
    done
  done
  while [ ${#queue[@]} -gt 0 ]; do
    local p=${queue[0]}
    queue=("${queue[@]:1}")
    for q in $(depends_of "$p"); do
      case $q in *-dev) continue ;; esac
      in_list "$q" "${baseline[@]}" "${own[@]}" "${tools[@]}" "${support[@]}" && continue
      support+=("$q")
      queue+=("$q")
    done
  done
  echo "device-kit: dev: ${dev_packages[*]}"
  echo "device-kit: their libraries: ${own[*]}"
  [ ${#tools[@]} = 0 ] || echo "device-kit: tools: ${tools[*]}"
  echo "device-kit: libraries those need: ${support[*]}"
  (cd "$kit" && apt-get download -q "${dev_packages[@]}" "${own[@]}" "${tools[@]}" \
    "${support[@]}" >/dev/null)
  {
    for p in "${dev_packages[@]}"; do echo "dev $p"; done
    for p in "${own[@]}"; do echo "own $p"; done
    for p in "${tools[@]}"; do echo "tool $p"; done
    for p in "${support[@]}"; do echo "support $p"; done
  } >"$kit/manifest.txt"
  if [ -n "${DSRT_KIT_BASELINES:-}" ]; then
    cp "$DSRT_KIT_BASELINES"/torch_*.py "$kit"/ 2>/dev/null || die "no torch_*.py in $DSRT_KIT_BASELINES"
    # The end-to-end run's images are made there, from photographs in
    # Debian wallpaper packages that travel here (the machine has no apt).
    if [ -f "$DSRT_KIT_BASELINES/make_photos.py" ]; then
      cp "$DSRT_KIT_BASELINES/make_photos.py" "$kit"/
      rm -rf "$kit/photo-src"
      mkdir -p "$kit/photo-src"
      # shellcheck disable=SC2086
      (cd "$kit/photo-src" && apt-get download -q ${DSRT_KIT_PHOTO_PACKAGES:-lomiri-wallpapers-20.04} \
        >/dev/null) || die "cannot fetch the wallpaper packages for make_photos.py"
    fi
  fi
  if [ "${DSRT_KIT_WHEELS:-0}" = 1 ]; then
    local py=${DSRT_KIT_PYTHON:-3.12}
    mkdir -p "$kit/wheels"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
      --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$kit/wheels" \
      "nvidia-cudnn-cu13${DSRT_KIT_CUDNN:-}" "nvidia-nccl-cu13${DSRT_KIT_NCCL:-}"
  fi
  echo "device-kit: $(ls "$kit"/*.deb | wc -l) packages in $kit, $(du -sh "$kit" | cut -f1) in all"
}

# ----------------------------------------------------------------------------
# run

# The folder of a Python package of python3 (nvidia.cudnn), or nothing.
python_package_dir() {
  python3 -c "import $1 as m; print(list(m.__path__)[0])" 2>/dev/null || true
}

# Whether the machine's loader already knows every shared library (soname)
# that the unpacked package in $1 ships; $2 is the output of ldconfig -p.
system_has_libs() {
  local found=0
  while IFS= read -r f; do
    local so
    so=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ -n "$so" ] || continue
    found=1
    grep -q "^[[:space:]]*$so " <<<"$2" || return 1
  done < <(find "$1" -type f -name 'lib*.so*')
  [ $found = 1 ]
}

# dpkg -x, or the same with ar and tar where dpkg is missing.
extract_deb() {
  if command -v dpkg >/dev/null; then
    dpkg -x "$1" "$2"
    return
  fi
  local member
  member=$(ar t "$1" | grep '^data\.tar') || return 1
  mkdir -p "$2"
  case $member in
  *.xz) ar p "$1" "$member" | tar -xJ -C "$2" ;;
  *.zst) ar p "$1" "$member" | tar --zstd -x -C "$2" ;;
  *.gz) ar p "$1" "$member" | tar -xz -C "$2" ;;
  *) ar p "$1" "$member" | tar -x -C "$2" ;;
  esac
}

# Unpacks the kit into $prefix: -dev packages and their own libraries
# always, support libraries only when the machine lacks them. The prefix is
# laid out as merged /usr (lib/ folded into usr/lib/), and absolute links
# are pointed into it.
unpack() {
  local kit=$1 prefix=$2 known
  known=$(ldconfig -p)
  rm -rf "${prefix:?}" "$prefix.stage"
  mkdir -p "$prefix/usr" "$prefix.stage"
  while read -r kind pkg; do
    local debs=("$kit"/"${pkg}"_*.deb) deb
    deb=${debs[0]}
    [ -f "$deb" ] || die "$kit has no package $pkg (run pack again)"
    extract_deb "$deb" "$prefix.stage/$pkg" || die "cannot unpack $deb"
    if [ "$kind" = support ] && system_has_libs "$prefix.stage/$pkg" "$known"; then
      echo "  $pkg: the machine's own copy"
      continue
    fi
    echo "  $pkg: $(basename "$deb")"
    cp -a "$prefix.stage/$pkg/." "$prefix/"
  done <"$kit/manifest.txt"
  rm -rf "$prefix.stage"
  if [ -d "$prefix/lib" ] && [ ! -L "$prefix/lib" ]; then
    cp -a "$prefix/lib/." "$prefix/usr/lib/"
    rm -rf "${prefix:?}/lib"
  fi
  while IFS= read -r link; do
    local target
    target=$(readlink "$link")
    case $target in
    /*)
      local inside=$prefix$target
      [ -e "$inside" ] || inside=$prefix/usr${target#/usr}
      [ -e "$inside" ] && ln -sfn "$inside" "$link"
      ;;
    esac
  done < <(find "$prefix" -type l)
}

# Whether command $1 exists at version $2 or later.
tool_ok() {
  local v
  v=$("$1" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?') || return 1
  v=${v%%$'\n'*}
  [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$2" "$v" | sort -V | head -1)" = "$2" ]
}

run() {
  local out=${1:-${OUT:-device/out}}
  local kit=${DSRT_KIT_DIR:-device/kit}
  [ -f "$kit/manifest.txt" ] || die "no kit in $kit: run 'scripts/device-kit.sh pack' first"
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  kit=$(cd "$kit" && pwd)
  local prefix=$root/device/prefix build=$root/build-device
  local summary=$out/summary.txt status=0
  : >"$summary"
  note() { echo "$*" | tee -a "$summary"; }

  {
    echo "== $(date -u) on $(hostname)"
    uname -a
    nvidia-smi
    command -v nvcc && nvcc --version
    command -v cmake && cmake --version | head -1
    command -v ninja && ninja --version
    gcc --version | head -1
    python3 --version
    ldconfig -p | grep -E 'libcud(nn|art)|libnccl|libcublas'
  } >"$out/env.txt" 2>&1 || true

  local nvcc=${CUDACXX:-}
  [ -n "$nvcc" ] || nvcc=$(command -v nvcc || true)
  [ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
  [ -n "$nvcc" ] || die "no nvcc (set CUDACXX)"

  # cuDNN and NCCL.
  local cudnn=${CUDNN_ROOT:-} nccl=${NCCL_ROOT:-}
  [ -n "$cudnn" ] || cudnn=$(python_package_dir nvidia.cudnn)
  [ -n "$nccl" ] || nccl=$(python_package_dir nvidia.nccl)
  if { [ -z "$cudnn" ] || [ -z "$nccl" ]; } && ls "$kit"/wheels/*.whl >/dev/null 2>&1; then
    mkdir -p "$root/device/wheels"
    for w in "$kit"/wheels/*.whl; do unzip -qo "$w" 'nvidia/*' -d "$root/device/wheels"; done
    [ -n "$cudnn" ] || [ ! -d "$root/device/wheels/nvidia/cudnn" ] || cudnn=$root/device/wheels/nvidia/cudnn
    [ -n "$nccl" ] || [ ! -d "$root/device/wheels/nvidia/nccl" ] || nccl=$root/device/wheels/nvidia/nccl
  fi
  note "cuDNN from: ${cudnn:-the CUDA toolkit folders}"
  note "NCCL from: ${nccl:-the CUDA toolkit folders}"

  echo "== unpacking $kit into $prefix" >"$out/build.log"
  unpack "$kit" "$prefix" >>"$out/build.log" 2>&1 || {
    note "unpack failed: see build.log"
    return 1
  }
  local arch libdir
  arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  libdir=$prefix/usr/lib/$arch
  # The machine's cmake and ninja when it has them, else the kit's (which
  # then run with the kit's libraries).
  if ! tool_ok cmake 3.22 || ! tool_ok ninja 1.10; then
    [ -x "$prefix/usr/bin/cmake" ] ||
      die "cmake >= 3.22 and ninja are needed: install them, or pack with DSRT_KIT_TOOLS=1"
    export PATH=$prefix/usr/bin:$PATH
    export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    note "cmake and ninja from the kit"
  fi
  local -a cfg=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_CUDA_COMPILER="$nvcc" -DDSRT_WITH_CUDA=ON -DDSRT_WITH_CUDNN=ON -DDSRT_WITH_NCCL=ON
    -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_LIBRARY_PATH="$libdir"
    -DCMAKE_INCLUDE_PATH="$prefix/usr/include")
  [ -z "$cudnn" ] || cfg+=(-DCUDNN_ROOT="$cudnn")
  [ -z "$nccl" ] || cfg+=(-DNCCL_ROOT="$nccl")
  echo "== cmake ${cfg[*]}" >>"$out/build.log"
  local t0=$SECONDS
  if ! cmake "${cfg[@]}" >>"$out/build.log" 2>&1 ||
    ! cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1; then
    note "build failed after $((SECONDS - t0)) s: see build.log"
    tail -40 "$out/build.log"
    return 1
  fi
  note "built in $((SECONDS - t0)) s ($build)"
  grep -E '^(CUDNN|NCCL|TURBOJPEG|SPNG|URING|HWLOC|DNNL|ZLIB)_(LIBRARY|INCLUDE_DIR):' \
    "$build/CMakeCache.txt" | tee -a "$summary" || true

  # Tests and benchmarks find the kit's and the GPU libraries first.
  local libs=$libdir
  for d in "$cudnn" "$nccl"; do
    [ -n "$d" ] || continue
    [ ! -d "$d/lib" ] || libs=$libs:$d/lib
    [ ! -d "$d/lib64" ] || libs=$libs:$d/lib64
  done
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [ "${DSRT_KIT_REQUIRE_GPU:-1}" = 0 ] || export DSRT_REQUIRE_GPU=1
  t0=$SECONDS
  if ctest --test-dir "$build" -L gpu --output-on-failure -j 4 >"$out/tests.log" 2>&1; then
    note "GPU tests passed in $((SECONDS - t0)) s: $(grep -E 'tests passed' "$out/tests.log")"
  else
    note "GPU tests FAILED: see tests.log"
    status=1
  fi
  grep -E 'Skipped|Not Run' "$out/tests.log" | tee -a "$summary" || true

  if [ "${DSRT_KIT_SANITIZE:-1}" != 0 ]; then
    sanitize "$build" "$nvcc" "$out/sanitizer.log" || status=1
  fi
  [ "${DSRT_KIT_BENCH:-1}" = 0 ] || bench "$build" "$kit" "$out/bench.log"
  [ "${DSRT_KIT_E2E:-1}" = 0 ] || e2e "$build" "$kit" "$out/e2e.log"
  return $status
}

# test_gpu_backend under compute-sanitizer: memcheck over every test,
# racecheck (much slower) over the layers, the optimizer and staging.
sanitize() {
  local build=$1 nvcc=$2 log=$3 cs
  cs=$(dirname "$nvcc")/compute-sanitizer
  [ -x "$cs" ] || cs=$(dirname "$nvcc")/../compute-sanitizer/compute-sanitizer
  [ -x "$cs" ] || cs=$(command -v compute-sanitizer || true)
  : >"$log"
  if [ -z "$cs" ]; then
    note "compute-sanitizer: not found next to nvcc or on PATH: skipped"
    return 0
  fi
  local rc=0 tool only
  for tool in memcheck racecheck; do
    only=""
    [ $tool = memcheck ] || only=test_layers_fp32,test_optimizer,test_staging
    echo "== compute-sanitizer --tool $tool test_gpu_backend ${only:+(DSRT_TEST_ONLY=$only)}" >>"$log"
    local t0=$SECONDS
    if DSRT_TEST_ONLY=$only DSRT_TEST_TMP=$build/tests/tmp DSRT_MODULE_PATH=$build/dsrt timeout "${DSRT_KIT_SANITIZE_TIMEOUT:-1800}" \
      "$cs" --tool "$tool" --error-exitcode 99 "$build/tests/test_gpu_backend" >>"$log" 2>&1; then
      note "compute-sanitizer $tool: clean in $((SECONDS - t0)) s"
    else
      note "compute-sanitizer $tool: FAILED (status $?): see sanitizer.log"
      rc=1
    fi
  done
  return $rc
}

# Each GPU benchmark that exists in this build; one that this build refuses
# is reported as skipped with its message.
bench() {
  local build=$1 kit=$2 log=$3
  local dstrain=$build/tools/dstrain
  : >"$log"
  local -a runs=()
  local shape prec
  for shape in "--net alexnet --batch 128" "--net alexnet --batch 256" "--net cifar --batch 256"; do
    for prec in tf32 bf16; do runs+=("$shape --precision $prec"); done
  done
  for args in "${runs[@]}"; do
    echo "== dstrain bench --execution-environment gpu $args --json" >>"$log"
    # shellcheck disable=SC2086
    if timeout 300 "$dstrain" bench --execution-environment gpu $args --json >>"$log" 2>&1; then
      note "bench dstrain $args: $(tail -1 "$log")"
    else
      note "bench dstrain $args: skipped or failed: $(tail -1 "$log")"
    fi
    local torch_bench=$kit/torch_train_bench.py layout
    if [ -f "$torch_bench" ] && python3 -c 'import torch' 2>/dev/null; then
      for layout in "" --channels-last; do
        echo "== torch_train_bench.py --device cuda $args $layout" >>"$log"
        # shellcheck disable=SC2086
        if timeout 300 python3 "$torch_bench" --device cuda $args $layout >>"$log" 2>&1; then
          note "bench torch $args $layout: $(tail -1 "$log")"
        else
          note "bench torch $args $layout: failed: $(tail -1 "$log")"
        fi
      done
    fi
  done
}

# Runs "$@" while nvidia-smi samples the GPU's utilisation; notes the mean.
with_gpu_busy() {
  local what=$1 log=$2
  shift 2
  local smi=$root/device/smi.$$ rc=0 pid=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --id="${DSRT_KIT_GPU:-0}" --query-gpu=utilization.gpu --format=csv,noheader,nounits \
      -lms 250 >"$smi" 2>/dev/null &
    pid=$!
  fi
  "$@" >>"$log" 2>&1 || rc=$?
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    note "$what: GPU busy $(awk '$1 ~ /^[0-9]+$/ { s += $1; n++ } END { if (n) printf "%.1f%% (mean of %d nvidia-smi samples)", s / n, n; else print "not sampled" }' "$smi")"
    rm -f "$smi"
  fi
  return $rc
}

# End to end from JPEGs: a folder made with make_photos.py (from the kit's
# wallpaper packages), dstrain train on the GPU against PyTorch's DataLoader
# with 16 workers and pinned memory, AlexNet at 227 with the same recipe.
e2e() {
  local build=$1 kit=$2 log=$3
  local photos=$root/device/photos count=${DSRT_KIT_PHOTOS:-20000} epochs=${DSRT_KIT_EPOCHS:-3}
  : >"$log"
  if [ ! -f "$kit/make_photos.py" ] || ! ls "$kit"/photo-src/*.deb >/dev/null 2>&1; then
    note "e2e: no make_photos.py and wallpaper packages in the kit (pack with DSRT_KIT_BASELINES): skipped"
    return 0
  fi
  if [ "$(find "$photos" -name '*.jpg' 2>/dev/null | wc -l)" != "$count" ]; then
    rm -rf "$photos" "$root/device/photo-src"
    for deb in "$kit"/photo-src/*.deb; do extract_deb "$deb" "$root/device/photo-src" || return 1; done
    echo "== make_photos.py $photos --count $count" >>"$log"
    if ! python3 - "$kit" "$root/device/photo-src" "$photos" "$count" >>"$log" 2>&1 <<'PY'; then
import glob, os, sys
sys.path.insert(0, sys.argv[1])
import make_photos
src = sys.argv[2]
# The packages are unpacked already: take their photographs as make_photos
# would after downloading them.
make_photos.fetch_sources = lambda packages, workdir: sorted(
    p for p in glob.glob(os.path.join(src, "**", "*"), recursive=True)
    if p.lower().endswith((".jpg", ".jpeg")) and "screenshot" not in p)
sys.argv = ["make_photos.py", sys.argv[3], "--count", sys.argv[4]]
make_photos.main()
PY
      note "e2e: make_photos.py failed: see e2e.log"
      return 0
    fi
  fi
  local args=(--net alexnet --batch 128 --epochs "$epochs")
  echo "== dstrain train --execution-environment gpu ${args[*]} --resize-shorter 256 --size-mode randcrop" >>"$log"
  if with_gpu_busy "e2e dstrain" "$log" timeout 1800 "$build/tools/dstrain" train --data "$photos" \
    --execution-environment gpu "${args[@]}" --resize-shorter 256 --size-mode randcrop --json; then
    note "e2e dstrain: $(grep '"images_per_s"' "$log" | tail -1)"
  else
    note "e2e dstrain: failed: $(tail -1 "$log")"
  fi
  if [ -f "$kit/torch_gpu_train_folder.py" ] && python3 -c 'import torch, torchvision' 2>/dev/null; then
    echo "== torch_gpu_train_folder.py ${args[*]} --workers 16" >>"$log"
    if with_gpu_busy "e2e torch" "$log" timeout 1800 python3 "$kit/torch_gpu_train_folder.py" \
      "$photos" "${args[@]}" --workers 16; then
      note "e2e torch: $(tail -1 "$log")"
    else
      note "e2e torch: failed: $(tail -1 "$log")"
    fi
  fi
}

case ${1:-} in
pack)
  shift
  pack "$@"
  ;;
run)
  shift
  run "$@"
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
  ;;
esac
