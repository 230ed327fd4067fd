#!/usr/bin/env bash
# Installs a built dsrt into a temporary prefix and checks what an embedding
# or training program gets from it:
#   - both libraries (shared and static), both .pc files, the CMake package
#     and the modules this build made (lib/dsrt/dsrt_*.so, each finding its
#     libraries from where it lies);
#   - libdsrt.so, dsbench and an example that embeds the datastore need none
#     of oneDNN, MPI, CUDA, cuBLAS, cuDNN or NCCL;
#   - the examples build and run through the CMake package, through dsrt.pc
#     alone (embed_datastore, pipeline: shared and static) and dsrt-train.pc
#     (train: shared and static);
#   - the installed tools load the installed modules: dstrain asks for a GPU
#     (the CUDA host module loads; without a GPU the message says so), and
#     trains data-parallel under mpirun (the MPI module).
# Everything runs on a small generated folder.
#
#   scripts/check-install.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
lib=$prefix/lib
fail() {
  echo "install check: $*" >&2
  exit 1
}
heavy='libdnnl|libmpi|libopen-pal|libopen-rte|libcudart|libcublas|libcudnn|libnccl|libcuda\.so'

echo "-- files"
for f in libdsrt.so libdsrt.a libdsrt_train.so libdsrt_train.a pkgconfig/dsrt.pc \
  pkgconfig/dsrt-train.pc cmake/dsrt/dsrtConfig.cmake cmake/dsrt/dsrtTargets.cmake; do
  [ -e "$lib/$f" ] || fail "lib/$f is not installed"
done
modules=$(cd "$build/dsrt" 2>/dev/null && ls dsrt_*.so 2>/dev/null | tr "\n" " " || true)
for m in $modules; do
  [ -f "$lib/dsrt/$m" ] || fail "module lib/dsrt/$m is not installed"
  # $ORIGIN/.. finds the dsrt libraries; the rest from where they were found.
  if ldd "$lib/dsrt/$m" | grep -q "not found"; then
    ldd "$lib/dsrt/$m"
    fail "module lib/dsrt/$m does not find its libraries"
  fi
  echo "lib/dsrt/$m: $(readelf -d "$lib/dsrt/$m" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
done
echo "modules: ${modules:-none}"

echo "-- the data library needs none of the training libraries"
for f in "$lib/libdsrt.so" "$prefix/bin/dsbench"; do
  needed=$(LD_LIBRARY_PATH=$lib ldd "$f")
  if grep -Eq "$heavy" <<<"$needed"; then
    echo "$needed"
    fail "$f needs a training library"
  fi
done
if pkg-config --libs --static "$lib/pkgconfig/dsrt.pc" | grep -Eq 'dnnl|mpi|cuda|cudnn|nccl'; then
  fail "dsrt.pc names a training library"
fi

# A tiny dataset: Fashion-MNIST's test images as a folder would be big; the
# converter makes a small one from a generated IDX pair instead.
python3 - "$tmp/idx" <<'PY'
import gzip, os, struct, sys
d = sys.argv[1]; os.makedirs(d)
n, h, w = 40, 28, 28
with gzip.open(os.path.join(d, "t10k-images-idx3-ubyte.gz"), "wb") as f:
    f.write(struct.pack(">IIII", 0x803, n, h, w) + bytes((i * 7 + j) % 256 for i in range(n) for j in range(h * w)))
with gzip.open(os.path.join(d, "t10k-labels-idx1-ubyte.gz"), "wb") as f:
    f.write(struct.pack(">II", 0x801, n) + bytes(i % 4 for i in range(n)))
PY
LD_LIBRARY_PATH=$lib "$prefix/bin/dsbench" convert --split test "$tmp/idx" "$tmp/folder"

echo "-- CMake package (dsrt::dsrt, dsrt::train)"
cmake -S examples -B "$tmp/ex-cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/ex-cmake" >/dev/null
if readelf -d "$tmp/ex-cmake/pipeline" | grep -q 'libdsrt_train'; then
  fail "pipeline, linked with dsrt::dsrt, needs libdsrt_train"
fi
LD_LIBRARY_PATH=$lib "$tmp/ex-cmake/embed_datastore" "$tmp/folder" 3
LD_LIBRARY_PATH=$lib "$tmp/ex-cmake/pipeline" "$tmp/folder" 8 2
LD_LIBRARY_PATH=$lib "$tmp/ex-cmake/train" "$tmp/folder" 1 cpu

echo "-- pkg-config: dsrt.pc alone (shared, then static)"
export PKG_CONFIG_PATH=$lib/pkgconfig
for ex in embed_datastore pipeline; do
  cc -O2 -o "$tmp/${ex}_pc" examples/$ex.c $(pkg-config --cflags --libs dsrt)
  if LD_LIBRARY_PATH=$lib ldd "$tmp/${ex}_pc" | grep -Eq "$heavy|libdsrt_train"; then
    fail "$ex built against dsrt.pc needs a training library"
  fi
  cc -O2 -o "$tmp/${ex}_pc_static" examples/$ex.c $(pkg-config --cflags dsrt) "$lib/libdsrt.a" \
    $(pkg-config --libs --static dsrt | sed 's/-ldsrt\b//')
done
LD_LIBRARY_PATH=$lib "$tmp/embed_datastore_pc" "$tmp/folder" 3
LD_LIBRARY_PATH=$lib "$tmp/pipeline_pc" "$tmp/folder" 8 2
"$tmp/embed_datastore_pc_static" "$tmp/folder" 3
"$tmp/pipeline_pc_static" "$tmp/folder" 8 2

echo "-- pkg-config: dsrt-train.pc (shared, then static)"
cc -O2 -o "$tmp/train_pc" examples/train.c $(pkg-config --cflags --libs dsrt-train)
LD_LIBRARY_PATH=$lib "$tmp/train_pc" "$tmp/folder" 1 cpu
cc -O2 -o "$tmp/train_pc_static" examples/train.c $(pkg-config --cflags dsrt-train) \
  "$lib/libdsrt_train.a" "$lib/libdsrt.a" \
  $(pkg-config --libs --static dsrt-train | sed 's/-ldsrt_train\b//; s/-ldsrt\b//')
"$tmp/train_pc_static" "$tmp/folder" 1 cpu

echo "-- the installed modules load from the install"
if [[ " $modules " == *" dsrt_cuda_host.so "* ]]; then
  # Found beside the installed libdsrt: with a GPU it trains, without one
  # the CUDA runtime itself says why (never "module not found").
  out=$(LD_LIBRARY_PATH=$lib "$tmp/train_pc" "$tmp/folder" 1 gpu 2>&1 || true)
  echo "$out"
  if grep -q "not found in\|cannot be loaded" <<<"$out"; then
    fail "the installed CUDA modules do not load"
  fi
  # A statically linked program finds them in the install's module folder,
  # or, installed elsewhere as here, where DSRT_MODULE_PATH says.
  out=$(DSRT_MODULE_PATH=$lib/dsrt "$tmp/train_pc_static" "$tmp/folder" 1 gpu 2>&1 || true)
  if grep -q "not found in\|cannot be loaded\|second copy" <<<"$out"; then
    echo "$out"
    fail "the static example does not load the installed modules"
  fi
fi
if [[ " $modules " == *" dsrt_mpi.so "* ]] && command -v mpirun >/dev/null; then
  LD_LIBRARY_PATH=$lib mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_LIBRARY_PATH \
    "$prefix/bin/dstrain" train --data "$tmp/folder" --execution-environment parallel \
    --epochs 1 --batch 16 --threads 1 --workers 1 --quiet
  echo "dstrain parallel (2 ranks) through lib/dsrt/dsrt_mpi.so: ok"
fi
echo "install check passed"
