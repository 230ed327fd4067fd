#!/usr/bin/env bash
# The device kit: builds and tests dsrt's GPU parts on a CUDA machine that has
# no package registry and no network, in parts short enough for a GPU lent
# for minutes. Commands:
#
#   scripts/device-kit.sh pack [DIR]   here, on a Debian 12 machine with apt:
#       fetches (apt-get download, into DIR, default device/kit) the Debian
#       packages of dsrt's dependencies that such a machine lacks: the -dev
#       packages of libjpeg-turbo, libspng, libwebp, liburing, hwloc, oneDNN, zlib,
#       libcurl and OpenSSL (libcrypto),
#       their libraries, and the libraries those need (resolved recursively,
#       less what every machine that runs nvcc has: glibc, libstdc++, the
#       toolchain). The PyTorch baselines and make_photos.py travel too, with
#       the Debian wallpaper package make_photos.py crops photographs from
#       (DSRT_KIT_BASELINES: the folder holding them, default ../shared/bench
#       when it exists). With DSRT_KIT_TOOLS=1 it adds cmake and ninja (for a
#       machine without them). With DSRT_KIT_WHEELS=1 it also fetches the
#       nvidia-cudnn-cu13 and nvidia-nccl-cu13 wheels for Python
#       DSRT_KIT_PYTHON (default 3.12; DSRT_KIT_CUDNN / DSRT_KIT_NCCL pin
#       versions, e.g. "==9.19.0.56"); they are large (about 520 MB and
#       300 MB): a machine with PyTorch has them already.
#
#   scripts/device-kit.sh run PART [OUT]   there, in a copy of this working
#       tree with the kit folder; each part ends within its time budget
#       (DSRT_KIT_PART_S; by default build 420 s, sanitize 300, bench 330,
#       bench-cifar 210, photos 180, e2e 240: each well inside a 10-minute
#       command, 28 minutes for all) and writes env.txt, its logs and
#       summary.txt (one
#       line an item, "PASS item: figure" or "FAIL item: why", written as
#       each item ends, so a loan cut short still reports) to OUT (default
#       $OUT, else device/out/PART). The parts:
#         build     checks the machine (driver R580 or newer for CUDA 13,
#                   nvcc, gcc, where the GPU libraries are), unpacks the kit
#                   with dpkg -x into device/prefix (never into /), builds
#                   dsrt with CUDA into build-device against it without
#                   -Werror (warnings listed in the summary), runs ctest -L
#                   gpu and test_comm_nccl, listed first, each under its own
#                   timeout; a skip, a timeout and a test with no result are
#                   failures: build.log, tests.log
#         sanitize  compute-sanitizer over a bounded subset: memcheck over
#                   the kernels' tests and one small net in each precision,
#                   the optimizer and staging, racecheck over the kernels'
#                   tests, each capped; counts the
#                   errors of dsrt's own calls and kernels apart from those
#                   inside cuDNN, cuBLAS and NCCL (their own probes):
#                   sanitizer.log. DSRT_KIT_SANITIZE_FULL=1 runs memcheck
#                   over every GPU test instead (give it DSRT_KIT_PART_S and
#                   DSRT_KIT_SANITIZE_TIMEOUT of a longer loan).
#         bench     dstrain bench of AlexNet at batch 128 and 256 in fp32,
#                   tf32 and bf16, each beside torch_train_bench.py --device
#                   cuda without and with --channels-last (interleaved), the
#                   ratio to PyTorch's best against the target 1.2x; then
#                   --profile of AlexNet bf16 at batch 256: bench.log,
#                   bench-profile.txt
#         bench-cifar  the same for the cifar net at batch 256 and 1024,
#                   target 1.5x: bench.log
#         photos    DSRT_KIT_PHOTOS JPEGs (default 20000) in device/photos,
#                   made by make_photos.py from the kit's wallpaper package,
#                   a process a core (about two minutes on 16 cores; no GPU
#                   work, but the photos must be made there): photos.log
#         e2e       dstrain train of AlexNet on those photos (made first when
#                   missing), beside torch_gpu_train_folder.py with 16
#                   workers and channels-last, nvidia-smi sampling how busy
#                   the GPU is; targets: 2x the DataLoader's images/s, the
#                   GPU idle between steps (waiting for data) under 10%:
#                   e2e.log
#         all       the six, one after another
#       A part that needs the build makes it first when build-device lacks
#       it. Exits non-zero when an item failed.
#
#   scripts/device-kit.sh sanitizer-count LOG   counts a compute-sanitizer
#       log's errors: those of dsrt's own calls and kernels, and those inside
#       the libraries; exits 1 when dsrt has any.
#
# Where the GPU libraries come from (env.txt says what was found where):
# cuDNN and NCCL from CUDNN_ROOT / NCCL_ROOT (a prefix, or a Python package's
# nvidia/cudnn, nvidia/nccl folder), else the nvidia.cudnn and nvidia.nccl
# packages of the Python that holds PyTorch, else wheels in the kit, else the
# CUDA toolkit's folders; cuBLAS from CUBLAS_ROOT, else the CUDA toolkit,
# else that Python's nvidia/cu13 folder (the pip layout of CUDA 13:
# lib/libcublas.so.13 only). The Python that holds PyTorch is
# DSRT_KIT_TORCH_PYTHON, else the first of python3 on PATH, python,
# /usr/bin/python3, /usr/local/bin/python3, /opt/conda/bin/python3 and the
# python3.N found on PATH that imports torch. The machine needs nvcc, cmake
# (>= 3.22), ninja, gcc and python3. Other variables: DSRT_KIT_DIR (the kit
# folder for run), DSRT_KIT_REQUIRE_GPU=0 (a dry run without a GPU: GPU tests
# may skip, and items that need a GPU say SKIP), DSRT_KIT_SANITIZE_TIMEOUT
# (seconds a sanitizer run may take, default 150), DSRT_KIT_TEST_TIMEOUT (a GPU
# test's own timeout, default 120 s), DSRT_KIT_TEST_JOBS (tests at once,
# default 4), DSRT_KIT_PRECISIONS, DSRT_KIT_ALEXNET_BATCHES and
# DSRT_KIT_CIFAR_BATCHES (the benchmarks' configurations, for a short loan:
# default "fp32 tf32 bf16", "128 256", "256 1024"), DSRT_KIT_EPOCHS (of the
# end-to-end runs, default 3), DSRT_KIT_PHOTO_PACKAGES (pack: the wallpaper
# packages, default lomiri-wallpapers-20.04).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# The Debian packages dsrt builds against (CMake's cmake/dsrtDependencies.cmake).
dev_packages=(libturbojpeg0-dev libspng-dev libwebp-dev liburing-dev libhwloc-dev libdnnl-dev zlib1g-dev
  libcurl4-openssl-dev libssl-dev)
# The build tools, when asked for (DSRT_KIT_TOOLS=1).
tool_packages=(cmake cmake-data ninja-build)
# What any machine with nvcc has: glibc, the compiler's runtime and headers,
# the base system's tools.
baseline=(libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev libgcc-s1
  libstdc++6 gcc-12-base procps)
# Libraries whose failing calls inside them are their own business (cuDNN
# probing what a device supports), not dsrt's.
third_party='libcudnn|libcublas|libnccl|libnvrtc|libnvJitLink|libnvblas|libcufft'

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
  local baselines=${DSRT_KIT_BASELINES-}
  [ -n "$baselines" ] || [ ! -d "$root/../shared/bench" ] || baselines=$root/../shared/bench
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
    "${support[@]}" >/dev/null) || die "apt-get download failed (run apt-get update first?)"
  {
    for p in "${dev_packages[@]}"; do echo "dev $p"; done
    for p in "${own[@]}"; do echo "own $p"; done
    for p in "${tools[@]}"; do echo "tool $p"; done
    for p in "${support[@]}"; do echo "support $p"; done
  } >"$kit/manifest.txt"
  rm -rf "$kit/photo-src"
  rm -f "$kit"/torch_*.py "$kit"/make_photos.py
  if [ -n "$baselines" ]; then
    cp "$baselines"/torch_*.py "$kit"/ 2>/dev/null || die "no torch_*.py in $baselines"
    echo "device-kit: baselines from $baselines: $(cd "$kit" && ls torch_*.py | tr '\n' ' ')"
    # The end-to-end run's images are made there, from photographs in
    # Debian wallpaper packages that travel here (the machine has no apt).
    if [ -f "$baselines/make_photos.py" ]; then
      cp "$baselines/make_photos.py" "$kit"/
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
  local tree_kib kit_kib
  kit_kib=$(du -sk "$kit" | cut -f1)
  tree_kib=$(git -C "$root" ls-files -z 2>/dev/null | (cd "$root" && xargs -0 du -ck 2>/dev/null) |
    tail -1 | cut -f1)
  echo "device-kit: $(ls "$kit"/*.deb | wc -l) packages in $kit: $((kit_kib / 1024)) MiB;" \
    "with the tree's tracked files ($((tree_kib / 1024)) MiB): $(((kit_kib + tree_kib) / 1024)) MiB"
}

# ----------------------------------------------------------------------------
# Finding things on the GPU machine

# The Python that holds PyTorch, or nothing.
torch_python() {
  local -a cands=()
  [ -z "${DSRT_KIT_TORCH_PYTHON:-}" ] || cands+=("$DSRT_KIT_TORCH_PYTHON")
  cands+=(python3 python /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python3)
  local d
  local IFS=:
  for d in $PATH; do
    for p in "$d"/python3.[0-9]*; do [ -x "$p" ] && cands+=("$p"); done
  done
  unset IFS
  for p in "${cands[@]}"; do
    p=$(command -v "$p" 2>/dev/null) || continue
    if "$p" -c 'import torch' >/dev/null 2>&1; then
      echo "$p"
      return 0
    fi
  done
  return 0
}

# The site-packages folders of Python $1.
site_dirs() {
  [ -n "$1" ] || return 0
  "$1" -c 'import site, sys
print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null |
    awk 'NF && !seen[$0]++' || true
}

# The first of the site folders of Python $1 that holds path $2, or nothing.
site_find() {
  local d
  while IFS= read -r d; do
    [ -e "$d/$2" ] && {
      echo "$d/$2"
      return 0
    }
  done < <(site_dirs "$1")
  return 0
}

# Prints "LIBRARY LT_LIBRARY INCLUDE_DIR" of cuBLAS, where found: CUBLAS_ROOT,
# the toolkit next to nvcc, the pip layout of Python $2.
find_cublas() {
  local nvcc=$1 py=$2 tk dir
  tk=$(cd "$(dirname "$nvcc")/.." && pwd)
  local -a dirs=()
  [ -z "${CUBLAS_ROOT:-}" ] || dirs+=("$CUBLAS_ROOT")
  dirs+=("$tk" "$tk/targets/x86_64-linux")
  local cu13
  cu13=$(site_find "$py" nvidia/cu13)
  [ -z "$cu13" ] || dirs+=("$cu13")
  local cublas12
  cublas12=$(site_find "$py" nvidia/cublas)
  [ -z "$cublas12" ] || dirs+=("$cublas12")
  for dir in "${dirs[@]}"; do
    for lib in lib64 lib; do
      for name in libcublas.so libcublas.so.13; do
        if [ -e "$dir/$lib/$name" ]; then
          local lt=$dir/$lib/libcublasLt.so
          [ -e "$lt" ] || lt=$dir/$lib/libcublasLt.so.13
          echo "$dir/$lib/$name $lt $dir/include"
          return 0
        fi
      done
    done
  done
  return 0
}

# The folder of a Python package of Python $1 (nvidia/cudnn), or nothing.
python_package_dir() {
  site_find "$1" "$2"
}

# ----------------------------------------------------------------------------
# Summaries

# One line of summary.txt, written at once: STATUS item: figure.
item() {
  local status=$1 name=$2
  shift 2
  echo "$status $name: $*" | tee -a "$summary"
  [ "$status" != FAIL ] || status_all=1
}

# A PASS or FAIL line for NUM / DEN against TARGET: NAME NUM DEN TARGET WHAT.
ratio_item() {
  local name=$1 num=$2 den=$3 target=$4 what=$5 ratio
  ratio=$(awk "BEGIN{printf \"%.2f\", $num / $den}")
  if awk "BEGIN{exit !($ratio >= $target)}"; then
    item PASS "$name" "${ratio}x $what; target ${target}x"
  else
    item FAIL "$name" "${ratio}x $what; target ${target}x"
  fi
}

# Seconds left of the part's budget.
left() {
  echo $((part_budget - (SECONDS - part_t0)))
}

# The time a step may take: its own cap, within what the part has left.
cap() {
  local l
  l=$(($(left) - 15))
  [ "$l" -lt "$1" ] && echo $((l > 0 ? l : 0)) || echo "$1"
}

dry() {
  [ "${DSRT_KIT_REQUIRE_GPU:-1}" = 0 ]
}

# ----------------------------------------------------------------------------
# Unpacking and building

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

# What every part needs: the kit, the tools and libraries, env.txt. Sets
# kit, prefix, build, nvcc, cudnn, nccl, cublas, tpy, libdir, cfg.
setup() {
  kit=${DSRT_KIT_DIR:-device/kit}
  [ -f "$kit/manifest.txt" ] || die "no kit in $kit: run 'scripts/device-kit.sh pack' first"
  kit=$(cd "$kit" && pwd)
  prefix=$root/device/prefix
  build=$root/build-device
  nvcc=${CUDACXX:-}
  [ -n "$nvcc" ] || nvcc=$(command -v nvcc || true)
  [ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
  [ -n "$nvcc" ] || die "no nvcc (set CUDACXX)"
  tpy=$(torch_python)
  cudnn=${CUDNN_ROOT:-}
  nccl=${NCCL_ROOT:-}
  [ -n "$cudnn" ] || cudnn=$(python_package_dir "$tpy" nvidia/cudnn)
  [ -n "$nccl" ] || nccl=$(python_package_dir "$tpy" nvidia/nccl)
  if { [ -z "$cudnn" ] || [ -z "$nccl" ]; } && ls "$kit"/wheels/*.whl >/dev/null 2>&1; then
    mkdir -p "$root/device/wheels"
    for w in "$kit"/wheels/*.whl; do unzip -qo "$w" 'nvidia/*' -d "$root/device/wheels"; done
    [ -n "$cudnn" ] || [ ! -d "$root/device/wheels/nvidia/cudnn" ] || cudnn=$root/device/wheels/nvidia/cudnn
    [ -n "$nccl" ] || [ ! -d "$root/device/wheels/nvidia/nccl" ] || nccl=$root/device/wheels/nvidia/nccl
  fi
  read -r cublas cublas_lt cublas_inc <<<"$(find_cublas "$nvcc" "$tpy")" || true
  local arch
  arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  libdir=$prefix/usr/lib/$arch
  sanitizer=$(dirname "$nvcc")/compute-sanitizer
  [ -x "$sanitizer" ] || sanitizer=$(dirname "$nvcc")/../compute-sanitizer/compute-sanitizer
  [ -x "$sanitizer" ] || sanitizer=$(command -v compute-sanitizer || true)
  write_env
}

write_env() {
  {
    echo "== $(date -u) on $(hostname), part $part"
    uname -a
    nvidia-smi || echo "nvidia-smi: none"
    echo "== tools"
    echo "nvcc: $nvcc"
    "$nvcc" --version | tail -2
    echo "cmake: $(command -v cmake || echo none) $(cmake --version 2>/dev/null | head -1)"
    echo "ninja: $(command -v ninja || echo none) $(ninja --version 2>/dev/null)"
    echo "gcc: $(gcc --version | head -1)"
    echo "compute-sanitizer: ${sanitizer:-none} $("${sanitizer:-false}" --version 2>/dev/null | tail -1)"
    echo "== Python"
    echo "python3 on PATH: $(command -v python3 || echo none) ($(python3 --version 2>&1))"
    if [ -n "$tpy" ]; then
      echo "Python with PyTorch: $tpy"
      "$tpy" -c 'import sys, torch
print("  python", sys.version.split()[0], "torch", torch.__version__, "built for CUDA",
      torch.version.cuda, "cuDNN", torch.backends.cudnn.version(),
      "GPU visible:", torch.cuda.is_available())' 2>&1
      echo "  site folders: $(site_dirs "$tpy" | tr '\n' ' ')"
    else
      echo "Python with PyTorch: none found (baselines skipped)"
    fi
    echo "== GPU libraries"
    echo "cuDNN: ${cudnn:-the CUDA toolkit folders} $(ls "${cudnn:-/nonexistent}"/lib/libcudnn.so* 2>/dev/null | head -1)"
    echo "NCCL: ${nccl:-the CUDA toolkit folders} $(ls "${nccl:-/nonexistent}"/lib/libnccl.so* 2>/dev/null | head -1)"
    echo "cuBLAS: ${cublas:-not found} (cublasLt: ${cublas_lt:-?}, headers: ${cublas_inc:-?})"
    echo "== loader"
    ldconfig -p | grep -E 'libcud(nn|art)|libnccl|libcublas' || echo "(none of cuDNN, cudart, NCCL, cuBLAS known to ldconfig)"
  } >"$out/env.txt" 2>&1 || true
}

# What the build and the tests rely on, checked before any work: the
# driver (CUDA 13 needs R580 or newer), nvcc, gcc, the GPU libraries. Items
# in the summary; returns non-zero when the build cannot work.
check_machine() {
  local drv major ok=0
  drv=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
  major=${drv%%.*}
  if [ -z "$drv" ]; then
    if dry; then item SKIP driver "no nvidia-smi answer (dry run)"; else item FAIL driver "nvidia-smi gives no driver version"; ok=1; fi
  elif [ "${major:-0}" -ge 580 ] 2>/dev/null; then
    item PASS driver "$drv, $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)"
  else
    item FAIL driver "$drv: CUDA 13 needs R580 or newer"
    ok=1
  fi
  item INFO tools "nvcc $("$nvcc" --version | grep -oE 'release [0-9.]+' | head -1), $(gcc --version | head -1), cmake $(cmake --version 2>/dev/null | head -1 | grep -oE '[0-9.]+$' || echo none), ninja $(ninja --version 2>/dev/null || echo none)"
  item INFO libraries "cuDNN ${cudnn:-toolkit}, NCCL ${nccl:-toolkit}, cuBLAS ${cublas:-not found}, Python with PyTorch ${tpy:-none}"
  return $ok
}

# Configures and builds build-device unless it is built already; with
# `fresh`, always. Returns non-zero (and says why) when it could not.
ensure_built() {
  if [ "${1:-}" != fresh ] && [ -f "$build/.kit-built" ] && [ -x "$build/tools/dstrain" ]; then
    return 0
  fi
  local t0=$SECONDS log=$out/build.log
  check_machine || return 1
  echo "== unpacking $kit into $prefix" >"$log"
  if ! unpack "$kit" "$prefix" >>"$log" 2>&1; then
    item FAIL unpack "see build.log"
    return 1
  fi
  # The machine's cmake and ninja when it has them, else the kit's (which
  # then run with the kit's libraries).
  if ! tool_ok cmake 3.22 || ! tool_ok ninja 1.10; then
    if [ ! -x "$prefix/usr/bin/cmake" ]; then
      item FAIL tools "cmake >= 3.22 and ninja are needed: install them, or pack with DSRT_KIT_TOOLS=1"
      return 1
    fi
    export PATH=$prefix/usr/bin:$PATH
    export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "cmake and ninja from the kit" >>"$log"
  fi
  local -a cfg=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_CUDA_COMPILER="$nvcc" -DDSRT_WITH_CUDA=ON -DDSRT_WITH_CUDNN=ON -DDSRT_WITH_NCCL=ON
    -DDSRT_WERROR=OFF -DDSRT_BUILD_PYTHON=OFF -DDSRT_BUILD_EXAMPLES=OFF
    -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_LIBRARY_PATH="$libdir"
    -DCMAKE_INCLUDE_PATH="$prefix/usr/include"
    # The kit's libraries need others of the kit (libcurl: libssh2,
    # libldap) that the linker finds only when told where.
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$libdir"
    -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$libdir"
    -DCMAKE_MODULE_LINKER_FLAGS="-Wl,-rpath-link,$libdir")
  [ -z "$cudnn" ] || cfg+=(-DCUDNN_ROOT="$cudnn")
  [ -z "$nccl" ] || cfg+=(-DNCCL_ROOT="$nccl")
  # cuBLAS outside the toolkit (the pip layout: versioned names only): given
  # to FindCUDAToolkit as found, its headers to the C compiler.
  local tk
  tk=$(cd "$(dirname "$nvcc")/.." && pwd)
  case $cublas in
  "" | "$tk"/*) ;;
  *)
    cfg+=(-DCUDA_cublas_LIBRARY="$cublas" -DCUDA_cublasLt_LIBRARY="$cublas_lt")
    [ -f "$tk/include/cublas_v2.h" ] || cfg+=(-DCMAKE_C_FLAGS="-isystem $cublas_inc")
    ;;
  esac
  echo "== cmake ${cfg[*]}" >>"$log"
  rm -f "$build/.kit-built"
  if ! timeout "$(cap 300)" cmake "${cfg[@]}" >>"$log" 2>&1 ||
    ! timeout "$(cap 420)" cmake --build "$build" -j "$(nproc)" >>"$log" 2>&1; then
    item FAIL build "after $((SECONDS - t0)) s: $(grep -m1 -E 'error|Error' "$log" || tail -1 "$log")"
    return 1
  fi
  touch "$build/.kit-built"
  # Built without -Werror: the warnings are listed, not fatal.
  local warns
  warns=$(grep -E 'warning' "$log" | grep -vE '^(CMake|--)' | sort -u || true)
  item PASS build "$((SECONDS - t0)) s, $(grep -cE '^\[[0-9]+/' "$log" || true) steps ($build)," \
    "$(grep -c . <<<"$warns" || true) distinct warning lines"
  [ -z "$warns" ] || head -20 <<<"$warns" | sed 's/^/  warning: /' | tee -a "$summary"
  grep -E '^(CUDNN|NCCL|CUDA_cublas|TURBOJPEG|SPNG|WEBP|URING|HWLOC|DNNL|ZLIB|CURL|CRYPTO)_(LIBRARY|INCLUDE_DIR):' \
    "$build/CMakeCache.txt" | sed 's/^/  /' | tee -a "$summary" || true
}

# Tests and benchmarks find the kit's and the GPU libraries first.
library_path() {
  local libs=$libdir
  for d in "$cudnn" "$nccl"; do
    [ -n "$d" ] || continue
    [ ! -d "$d/lib" ] || libs=$libs:$d/lib
    [ ! -d "$d/lib64" ] || libs=$libs:$d/lib64
  done
  [ -z "$cublas" ] || libs=$libs:$(dirname "$cublas")
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # The test programs load the build's modules (the tools find them beside
  # the library).
  export DSRT_MODULE_PATH=$build/dsrt
  dry || export DSRT_REQUIRE_GPU=1
}

# ----------------------------------------------------------------------------
# Parts

# The GPU tests: listed first (ctest -N), each run under a per-test timeout
# (DSRT_KIT_TEST_TIMEOUT, default 120 s), every one given a line: a test that
# printed no result (the part's cap hit it) is a FAIL, never a silent pass.
part_build() {
  ensure_built fresh || return 0
  library_path
  local log=$out/tests.log t0=$SECONDS per=${DSRT_KIT_TEST_TIMEOUT:-120}
  local select=(-R '^(test_gpu_.*|test_comm_nccl)$' -E self_check)
  local -a listed=()
  mapfile -t listed < <(ctest --test-dir "$build" -N "${select[@]}" 2>/dev/null |
    sed -n 's/^ *Test *#[0-9]*: *\([^ ]*\).*/\1/p')
  echo "== ${#listed[@]} tests: ${listed[*]}" >"$log"
  local c
  c=$(cap 360)
  timeout "$c" ctest --test-dir "$build" "${select[@]}" --timeout "$per" \
    --output-on-failure -j "${DSRT_KIT_TEST_JOBS:-4}" >>"$log" 2>&1 || true
  local -A seen=()
  while read -r _ _ _ name result rest; do
    seen[$name]=1
    local secs
    secs=$(grep -oE '[0-9.]+ sec' <<<"$rest" | head -1)
    case $result in
    Passed) item PASS "test $name" "${secs:-?}" ;;
    *Skipped*|*Not*) if dry; then item SKIP "test $name" "no GPU (dry run)"; else item FAIL "test $name" "skipped: no usable GPU"; fi ;;
    Timeout) item FAIL "test $name" "killed at its ${per} s timeout (see tests.log)" ;;
    *) item FAIL "test $name" "$result $rest (see tests.log)" ;;
    esac
  done < <(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+:' "$log" | sed 's/\.\.\.*/ /; s/\*\*\*/ /')
  local t
  for t in "${listed[@]}"; do
    [ -n "${seen[$t]:-}" ] || item FAIL "test $t" "no result: killed when the part's cap of $c s hit (see tests.log)"
  done
  [ "${#listed[@]}" -gt 0 ] || item FAIL "gpu tests" "ctest -N lists none in $build (see tests.log)"
}

# compute-sanitizer's tool $1 over test $2 (with DSRT_TEST_ONLY=$3); counts.
sanitize_one() {
  local tool=$1 test=$2 only=$3 log=$out/sanitizer.log t0=$SECONDS c
  c=$(cap "${DSRT_KIT_SANITIZE_TIMEOUT:-150}")
  local name="sanitizer $tool $test${only:+ ($only)}"
  if [ "$c" -lt 20 ]; then
    item FAIL "$name" "not run: the part's time is spent"
    return
  fi
  local part_log=$out/sanitizer-$tool-$test.log
  echo "== compute-sanitizer --tool $tool $test ${only:+(DSRT_TEST_ONLY=$only)}" >>"$log"
  local rc=0
  DSRT_TEST_ONLY=$only DSRT_TEST_DETERMINISTIC=1 DSRT_TEST_TMP=$build/tests/tmp \
    timeout "$c" "$sanitizer" --tool "$tool" \
    --show-backtrace host --print-limit 200 --error-exitcode 0 \
    "$build/tests/$test" >"$part_log" 2>&1 || rc=$?
  cat "$part_log" >>"$log"
  local counts
  counts=$(sanitizer_count "$part_log" | tail -1)
  local dsrt_n
  dsrt_n=$(sed -n 's/.*dsrt \([0-9]*\).*/\1/p' <<<"$counts")
  if [ "$rc" = 124 ]; then
    item FAIL "$name" "not done after $c s ($counts)"
  elif [ "${dsrt_n:-1}" != 0 ]; then
    item FAIL "$name" "$counts, in $((SECONDS - t0)) s (see sanitizer.log)"
  elif [ "$rc" = 77 ] && dry; then
    item SKIP "$name" "the test skipped: no GPU (dry run; $counts)"
  elif [ "$rc" != 0 ]; then
    item FAIL "$name" "the test failed under the tool (status $rc; $counts)"
  else
    item PASS "$name" "$counts, in $((SECONDS - t0)) s"
  fi
}

part_sanitize() {
  ensure_built || return 0
  library_path
  : >"$out/sanitizer.log"
  if [ -z "$sanitizer" ]; then
    if dry; then item SKIP sanitizer "no compute-sanitizer next to nvcc or on PATH (dry run)"; else
      item FAIL sanitizer "no compute-sanitizer next to nvcc or on PATH"; fi
    return 0
  fi
  if dry && ! nvidia-smi >/dev/null 2>&1; then
    item SKIP sanitizer "no GPU (dry run)"
    return 0
  fi
  if [ "${DSRT_KIT_SANITIZE_FULL:-0}" = 1 ]; then
    for t in test_gpu_kernels test_gpu_backend test_gpu_dp; do sanitize_one memcheck "$t" ""; done
    return 0
  fi
  # memcheck over dsrt's kernels (the optimizer's among them) and a small
  # net in each precision with staging, its algorithms from the heuristics
  # (DSRT_TEST_DETERMINISTIC: a timed search of every candidate under the
  # sanitizer alone outlasts the cap); racecheck over dsrt's kernels (the
  # ones with shared memory: sums, softmax, the bias gradient, the optimizer).
  sanitize_one memcheck test_gpu_kernels ""
  sanitize_one memcheck test_gpu_backend test_small_nets,test_staging
  sanitize_one racecheck test_gpu_kernels ""
}

# The images/s of the last JSON line of a log, or nothing.
rate_of() {
  grep -oE '"images_per_s": ?[0-9.]+' "$1" | tail -1 | grep -oE '[0-9.]+$' || true
}

# One benchmark configuration, "NET BATCH TARGET": for each precision
# (fp32, tf32, bf16) dstrain bench, then torch_train_bench.py --device cuda
# without and with --channels-last (interleaved: one after the other on the
# same GPU), then the ratio of dsrt's images/s to PyTorch's best, PASS when
# it reaches TARGET. Each run is capped at cap_s seconds.
bench_config() {
  local net=$1 batch=$2 target=$3 cap_s=$4 log=$5 prec
  local dstrain=$build/tools/dstrain tb=$kit/torch_train_bench.py
  local one=$out/bench-one.log
  for prec in ${DSRT_KIT_PRECISIONS:-fp32 tf32 bf16}; do
    local what="$net b$batch $prec" args=(--net "$net" --batch "$batch" --precision "$prec")
    local c rd="" best=""
    c=$(cap "$cap_s")
    if [ "$c" -lt 20 ]; then
      item FAIL "bench $what" "not run: the part's time is spent"
      continue
    fi
    echo "== dstrain bench --execution-environment gpu ${args[*]} --steps 10 --json" >>"$log"
    if timeout "$c" "$dstrain" bench --execution-environment gpu "${args[@]}" --steps 10 \
      --json >"$one" 2>&1; then
      rd=$(rate_of "$one")
      item PASS "bench dstrain $what" "${rd:-?} images/s"
    elif dry; then
      item SKIP "bench dstrain $what" "$(tail -1 "$one")"
    else
      item FAIL "bench dstrain $what" "$(tail -1 "$one")"
    fi
    cat "$one" >>"$log"
    [ "$torch" = 1 ] || continue
    local layout
    for layout in "" --channels-last; do
      c=$(cap "$cap_s")
      [ "$c" -ge 20 ] || break
      echo "== torch_train_bench.py --device cuda ${args[*]} --steps 10 $layout" >>"$log"
      # shellcheck disable=SC2086
      if timeout "$c" "$tpy" "$tb" --device cuda "${args[@]}" --steps 10 $layout >"$one" 2>&1; then
        local rt
        rt=$(rate_of "$one")
        item PASS "bench torch $what${layout:+ channels-last}" "${rt:-?} images/s"
        if [ -n "$rt" ] && { [ -z "$best" ] || awk "BEGIN{exit !($rt > $best)}"; }; then best=$rt; fi
      elif dry; then
        item SKIP "bench torch $what${layout:+ channels-last}" "$(tail -1 "$one")"
      else
        item FAIL "bench torch $what${layout:+ channels-last}" "$(tail -1 "$one")"
      fi
      cat "$one" >>"$log"
    done
    if [ -n "$rd" ] && [ -n "$best" ]; then
      ratio_item "bench ratio $what" "$rd" "$best" "$target" "PyTorch's best ($rd vs $best images/s)"
    fi
  done
  rm -f "$one"
}

# The benchmarks' common start: the build, the libraries, PyTorch.
bench_setup() {
  ensure_built || return 1
  library_path
  torch=1
  if [ ! -f "$kit/torch_train_bench.py" ] || [ -z "$tpy" ]; then
    torch=0
    item FAIL "bench torch" "no torch_train_bench.py in the kit or no Python with PyTorch: dsrt alone"
  fi
}

# AlexNet (227x227) at batch 128 and 256 in every precision beside
# PyTorch, target 1.2x its best; then the per-layer profile of AlexNet bf16
# at batch 256 (bench-profile.txt, and its line in the summary).
part_bench() {
  bench_setup || return 0
  local log=$out/bench.log
  : >"$log"
  local b
  for b in ${DSRT_KIT_ALEXNET_BATCHES:-128 256}; do bench_config alexnet "$b" 1.2 75 "$log"; done
  local c prof=$out/bench-profile.txt
  c=$(cap 90)
  if [ "$c" -lt 20 ]; then
    item FAIL "bench profile alexnet b256 bf16" "not run: the part's time is spent"
    return 0
  fi
  echo "== dstrain bench --net alexnet --batch 256 --precision bf16 --steps 10 --profile" >>"$log"
  if timeout "$c" "$build/tools/dstrain" bench --execution-environment gpu --net alexnet \
    --batch 256 --precision bf16 --steps 10 --profile >"$prof" 2>&1; then
    item PASS "bench profile alexnet b256 bf16" "$(grep -m1 'a step:' "$prof" | sed 's/^ *//') (table in bench-profile.txt)"
  elif dry; then
    item SKIP "bench profile alexnet b256 bf16" "$(tail -1 "$prof")"
  else
    item FAIL "bench profile alexnet b256 bf16" "$(tail -1 "$prof")"
  fi
  cat "$prof" >>"$log"
}

# The cifar net (32x32) at batch 256 and 1024 in every precision beside
# PyTorch, target 1.5x its best (small kernels: launch costs count).
part_bench_cifar() {
  bench_setup || return 0
  local log=$out/bench.log
  : >"$log"
  local b
  for b in ${DSRT_KIT_CIFAR_BATCHES:-256 1024}; do bench_config cifar "$b" 1.5 60 "$log"; done
}

# Runs "$@" while nvidia-smi samples the GPU's utilisation; sets busy.
with_gpu_busy() {
  local log=$1
  shift
  local smi=$root/device/smi.$$ rc=0 pid=""
  busy="not sampled"
  if command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --id="${DSRT_KIT_GPU:-0}" --query-gpu=utilization.gpu --format=csv,noheader,nounits \
      -lms 250 >"$smi" 2>/dev/null &
    pid=$!
  fi
  "$@" >>"$log" 2>&1 || rc=$?
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    busy=$(awk '$1 ~ /^[0-9]+$/ { s += $1; n++ } END { if (n) printf "GPU busy %.1f%% (%d samples)", s / n, n; else print "not sampled" }' "$smi")
    rm -f "$smi"
  fi
  return $rc
}

# DSRT_KIT_PHOTOS JPEGs in device/photos, made by make_photos.py from the
# kit's wallpaper packages, in parallel (one process a core, each a share,
# then gathered into the class folders).
make_photos() {
  local photos=$1 count=$2 log=$3 limit=$4 src=$root/device/photo-src
  rm -rf "$photos" "$src" "$photos.parts"
  for deb in "$kit"/photo-src/*.deb; do extract_deb "$deb" "$src" || return 1; done
  local jobs k
  jobs=$(nproc)
  [ "$jobs" -le 32 ] || jobs=32
  [ "$jobs" -le "$count" ] || jobs=$count
  local -a pids=()
  for ((k = 0; k < jobs; k++)); do
    local share=$((count * (k + 1) / jobs - count * k / jobs))
    timeout "$limit" "$tpy" - "$kit" "$src" "$photos.parts/$k" "$share" "$((k + 1))" >>"$log" 2>&1 <<'PY' &
import glob, os, sys
sys.path.insert(0, sys.argv[1])
import make_photos
src = sys.argv[2]
# The packages are unpacked already: take their photographs as make_photos
# would after downloading them.
make_photos.fetch_sources = lambda packages, workdir: sorted(
    p for p in glob.glob(os.path.join(src, "**", "*"), recursive=True)
    if p.lower().endswith((".jpg", ".jpeg")) and "screenshot" not in p)
sys.argv = ["make_photos.py", sys.argv[3], "--count", sys.argv[4], "--seed", sys.argv[5]]
make_photos.main()
PY
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc = 0 ] || return 1
  for ((k = 0; k < jobs; k++)); do
    for cdir in "$photos.parts/$k"/*/; do
      local cls
      cls=$(basename "$cdir")
      mkdir -p "$photos/$cls"
      for f in "$cdir"*.jpg; do [ -e "$f" ] && mv "$f" "$photos/$cls/p${k}_$(basename "$f")"; done
    done
  done
  rm -rf "$photos.parts" "$src"
}

# The photos of the end-to-end run in device/photos, made unless there.
ensure_photos() {
  local log=$1 photos=$root/device/photos count=${DSRT_KIT_PHOTOS:-20000}
  if [ ! -f "$kit/make_photos.py" ] || ! ls "$kit"/photo-src/*.deb >/dev/null 2>&1; then
    item FAIL photos "no make_photos.py and wallpaper packages in the kit (pack with DSRT_KIT_BASELINES)"
    return 1
  fi
  if [ -z "$tpy" ] || ! "$tpy" -c 'import PIL' 2>/dev/null; then
    item FAIL photos "no Python with PyTorch and PIL to make the photos"
    return 1
  fi
  local have
  have=$(find "$photos" -name '*.jpg' 2>/dev/null | wc -l)
  if [ "$have" = "$count" ]; then
    item PASS photos "$count JPEGs there already"
    return 0
  fi
  local t0=$SECONDS
  echo "== make_photos.py $photos --count $count, $(nproc) processes" >>"$log"
  if ! make_photos "$photos" "$count" "$log" "$(cap 420)"; then
    item FAIL photos "make_photos.py failed or ran out of time after $((SECONDS - t0)) s (see the log)"
    return 1
  fi
  item PASS photos "$count JPEGs in $((SECONDS - t0)) s ($(du -sm "$photos" | cut -f1) MB)"
}

part_photos() {
  : >"$out/photos.log"
  ensure_photos "$out/photos.log" || true
}

part_e2e() {
  ensure_built || return 0
  library_path
  local log=$out/e2e.log photos=$root/device/photos epochs=${DSRT_KIT_EPOCHS:-3}
  : >"$log"
  ensure_photos "$log" || return 0
  local args=(--net alexnet --batch 128 --epochs "$epochs" --precision tf32)
  local c rd="" rt="" idle=""
  c=$(cap 200)
  echo "== dstrain train --execution-environment gpu ${args[*]} --resize-shorter 256 --size-mode randcrop" >>"$log"
  if [ "$c" -lt 30 ]; then
    item FAIL "e2e dstrain" "not run: the part's time is spent"
  elif with_gpu_busy "$log" timeout "$c" "$build/tools/dstrain" train --data "$photos" \
    --execution-environment gpu "${args[@]}" --resize-shorter 256 --size-mode randcrop --json; then
    rd=$(grep '"images_per_s"' "$log" | tail -1 | grep -oE '"images_per_s": ?[0-9.]+' | grep -oE '[0-9.]+$' || true)
    idle=$(grep -oE '"device_idle_share": ?[0-9.]+' "$log" | tail -1 | grep -oE '[0-9.]+$' || true)
    item PASS "e2e dstrain" "${rd:-?} images/s, $busy"
    if [ -n "$idle" ]; then
      local share
      share=$(awk "BEGIN{printf \"%.1f%%\", 100 * $idle}")
      if awk "BEGIN{exit !($idle < 0.10)}"; then
        item PASS "e2e GPU waiting for data" "$share of the device's time idle between steps (target < 10%)"
      else
        item FAIL "e2e GPU waiting for data" "$share of the device's time idle between steps (target < 10%)"
      fi
    fi
  else
    if dry; then item SKIP "e2e dstrain" "$(tail -1 "$log")"; else item FAIL "e2e dstrain" "$(tail -1 "$log")"; fi
  fi
  if [ -f "$kit/torch_gpu_train_folder.py" ] && "$tpy" -c 'import torchvision' 2>/dev/null; then
    c=$(cap 240)
    echo "== torch_gpu_train_folder.py ${args[*]} --workers 16 --channels-last" >>"$log"
    local one=$out/e2e-torch.log
    if [ "$c" -lt 30 ]; then
      item FAIL "e2e torch" "not run: the part's time is spent"
    elif with_gpu_busy "$one" timeout "$c" "$tpy" "$kit/torch_gpu_train_folder.py" "$photos" \
      "${args[@]}" --workers 16 --channels-last; then
      rt=$(rate_of "$one")
      item PASS "e2e torch" "${rt:-?} images/s, $busy"
      if [ -n "$rd" ] && [ -n "$rt" ]; then
        ratio_item "e2e ratio" "$rd" "$rt" 2 "the DataLoader's images/s ($rd vs $rt)"
      fi
    else
      if dry; then item SKIP "e2e torch" "$(tail -1 "$one")"; else item FAIL "e2e torch" "$(tail -1 "$one")"; fi
    fi
    cat "$one" >>"$log"
    rm -f "$one"
  else
    item FAIL "e2e torch" "no torch_gpu_train_folder.py or torchvision"
  fi
}

# A part's time budget in seconds: 28 minutes for the six together.
budget_of() {
  case $1 in
  build) echo 420 ;;
  sanitize) echo 300 ;;
  bench) echo 330 ;;
  bench-cifar) echo 210 ;;
  photos) echo 180 ;;
  *) echo 240 ;;
  esac
}

run() {
  local what=${1:-all}
  case $what in
  build | sanitize | bench | bench-cifar | photos | e2e | all) shift || true ;;
  *) what=all ;;
  esac
  local parts=("$what")
  [ "$what" != all ] || parts=(build sanitize bench bench-cifar photos e2e)
  status_all=0
  for part in "${parts[@]}"; do
    out=${1:-${OUT:-device/out/$part}}
    [ "$what" != all ] || [ -z "${1:-${OUT:-}}" ] || out=${1:-$OUT}/$part
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    summary=$out/summary.txt
    : >"$summary"
    part_t0=$SECONDS
    part_budget=${DSRT_KIT_PART_S:-$(budget_of "$part")}
    setup
    echo "device-kit: part $part into $out (budget $part_budget s)"
    "part_${part//-/_}"
    item "$([ "$status_all" = 0 ] && echo PASS || echo FAIL)" "part $part" "$((SECONDS - part_t0)) s"
  done
  return $status_all
}

# ----------------------------------------------------------------------------
# compute-sanitizer logs

# Counts the error reports of a compute-sanitizer log. A report is dsrt's
# when it names one of dsrt's kernels (nn/*.cu, nn/layers/*.cu); when it is
# a memory error on the device (in any kernel: dsrt gave it its pointers);
# or, for a failed CUDA API call, when the first host frame outside the CUDA
# runtime and driver is not in cuDNN, cuBLAS or NCCL (dsrt made the call).
# The others are the libraries' own: calls cuDNN makes to probe what a
# device supports, and races racecheck sees inside their kernels. Prints the
# first of dsrt's, then "dsrt N, libraries M".
sanitizer_count() {
  local kernels
  kernels=$(sed -n 's/^__global__ void \([A-Za-z0-9_]*\)(.*/\1/p' "$root"/nn/*.cu "$root"/nn/layers/*.cu |
    paste -sd'|' -)
  awk -v ours="^(${kernels:-none})$" -v third="$third_party" '
    function flush() {
      if (!inblock) return
      mine = 0
      n = split(text, words, /[^A-Za-z0-9_]+/)
      for (i = 1; i <= n; i++) if (words[i] ~ ours) mine = 1
      if (!mine && kind == "device") mine = 1
      if (!mine && kind == "api" && first_module !~ third) mine = 1
      if (mine) { dsrt++; if (dsrt <= 5) printf "dsrt error: %s\n", head } else lib++
      inblock = 0
    }
    /^========= [^ ]/ {
      line = substr($0, 11)
      if (line ~ /^(ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|COMPUTE-SANITIZER|Target application|This tool)/) { flush(); next }
      if (line ~ /^(Invalid |Program hit |Error|Race reported|Uninitialized|Barrier error|Misaligned|Out-of-range|Malloc|Free|Leaked|Warning: Race|Hardware exception|Cuda API error)/) {
        flush(); inblock = 1; head = line; text = line; first_module = ""; pending = 0
        kind = line ~ /^(Program hit|Cuda API error)/ ? "api" : line ~ /Race/ ? "race" : "device"
        next
      }
    }
    /^=========  / && inblock {
      text = text " " $0
      # A frame names its module on its own line ("Host Frame: f [0x..] in
      # /path/lib.so", older tools) or on the line after it ("Host Frame:
      # f [0x..]" then "in /path/lib.so", current ones).
      m = ""
      if ($0 ~ /Host Frame/) {
        pending = 1
        if (match($0, / in [^ ]+$/)) m = substr($0, RSTART + 4)
        else if ($0 !~ /\[0x[0-9a-fA-F]+\] *$/ && $0 !~ /Host Frame: *$/) {
          m = $0; sub(/ \[0x.*$/, "", m); sub(/.*Host Frame: */, "", m)
          if (m !~ /\.so/) m = ""
        }
      } else if (pending && match($0, /^=========[ \t]+in [^ ]+/)) {
        m = $0; sub(/^=========[ \t]+in /, "", m); sub(/ .*$/, "", m)
      }
      if (m != "") {
        pending = 0
        sub(/.*\//, "", m)
        if (first_module == "" && m !~ /^(libcuda\.so|libcudart|libcudadebugger|libsanitizer)/) first_module = m
      }
      next
    }
    { if (inblock && $0 !~ /^=========/) flush() }
    END { flush(); printf "dsrt %d, libraries %d\n", dsrt, lib }
  ' "$1"
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
sanitizer-count)
  shift
  [ -f "${1:-}" ] || die "sanitizer-count LOG: no such log"
  res=$(sanitizer_count "$1")
  echo "$res"
  grep -q "^dsrt 0," <<<"$(tail -1 <<<"$res")"
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
  ;;
esac
