#!/usr/bin/env bash
# Installs dsrt's dependencies (scripts/install-deps.sh), then configures and
# builds dsrt in a build folder (default: build/, Release).
#
#   scripts/build.sh [BUILD_DIR] [extra cmake -D options...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build=${1:-build}
shift || true
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${DSRT_BUILD_TYPE:-Release}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
