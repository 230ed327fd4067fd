#!/usr/bin/env bash
# The default job on a fresh machine: installs dsrt's dependencies, builds it,
# writes Debian's Fashion-MNIST (package dataset-fashion-mnist) as an image
# folder with dsrt's own converter, and profiles that folder with dsbench.
#
#   scripts/run-default.sh [DATA_DIR]   (default data/fashion-mnist)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build
data=${1:-data/fashion-mnist}
if [ ! -f "$data/.complete" ]; then
  ./build/tools/dsbench convert /usr/share/datasets/fashion-mnist "$data"
  touch "$data/.complete"
fi
./build/tools/dsbench "$data/train" --index
./build/tools/dsbench "$data/test" --index
