#!/usr/bin/env bash
# The default job on a fresh machine: installs dsrt's dependencies, builds it,
# writes Debian's Fashion-MNIST (package dataset-fashion-mnist) as an image
# folder with dsrt's own converter, trains the built-in `digits` network on it
# for a few epochs with the batches made in the background, and prints the
# test accuracy.
#
#   scripts/run-default.sh [DATA_DIR]   (default data/fashion-mnist)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build
data=${1:-data/fashion-mnist}
mkdir -p out
if [ ! -f "$data/.complete" ]; then
  ./build/tools/dsbench convert /usr/share/datasets/fashion-mnist "$data"
  touch "$data/.complete"
fi
./build/tools/dstrain train --data "$data/train" --val "$data/test" --net digits \
  --epochs "${EPOCHS:-3}" --batch 128 --lr 0.01 --rand-x-reflection \
  --save out/digits.dsrt --plot out/digits-progress.svg --log out/digits-log.csv
./build/tools/dstrain eval --model out/digits.dsrt --data "$data/test"
