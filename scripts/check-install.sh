#!/usr/bin/env bash
# Installs a built dsrt into a temporary prefix and builds the example
# against it twice: through the CMake package (find_package(dsrt)) and through
# pkg-config (dsrt.pc, linking the static library). Both are run on a small
# generated folder.
#
#   scripts/check-install.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null

# A tiny dataset: Fashion-MNIST's test images as a folder would be big; the
# converter makes a small one from a generated IDX pair instead.
python3 - "$tmp/idx" <<'PY'
import gzip, os, struct, sys
d = sys.argv[1]; os.makedirs(d)
n, h, w = 20, 28, 28
with gzip.open(os.path.join(d, "t10k-images-idx3-ubyte.gz"), "wb") as f:
    f.write(struct.pack(">IIII", 0x803, n, h, w) + bytes((i * 7 + j) % 256 for i in range(n) for j in range(h * w)))
with gzip.open(os.path.join(d, "t10k-labels-idx1-ubyte.gz"), "wb") as f:
    f.write(struct.pack(">II", 0x801, n) + bytes(i % 4 for i in range(n)))
PY
"$build/tools/dsbench" convert --split test "$tmp/idx" "$tmp/folder"

echo "-- CMake package"
cmake -S examples -B "$tmp/ex-cmake" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/ex-cmake" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/ex-cmake/embed_datastore" "$tmp/folder" 3
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/ex-cmake/pipeline" "$tmp/folder" 8 2

echo "-- pkg-config (static)"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
libs_static=$(pkg-config --libs --static dsrt | sed 's/-ldsrt//')
for ex in embed_datastore pipeline; do
  cc -O2 -o "$tmp/${ex}_pc" examples/$ex.c $(pkg-config --cflags dsrt) "$tmp/prefix/lib/libdsrt.a" $libs_static
done
"$tmp/embed_datastore_pc" "$tmp/folder" 3
"$tmp/pipeline_pc" "$tmp/folder" 8 2
echo "install check passed"
