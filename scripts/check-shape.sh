#!/usr/bin/env bash
# The shape of dsrt's code, as CI keeps it, on a built tree:
#   - formatting: every tracked C, header and CUDA file as .clang-format has
#     it (clang-format --dry-run --Werror; `clang-format -i FILE` fixes one);
#   - layers: no circle of files or folders, no call or #include going up
#     the layers (scripts/layers.py cycles BUILD_DIR);
#   - no function over 120 lines outside tests (scripts/function_lengths.py).
# Each check runs whatever the others found, and each failure is named; exit 1
# when any failed. The C code is built with warnings as errors by .ci/run.
#
#   scripts/check-shape.sh [BUILD_DIR]   (default build)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
failed=()

echo "-- formatting (clang-format --dry-run --Werror)"
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu')
if ! clang-format --dry-run --Werror "${files[@]}"; then
  failed+=("formatting: the files above differ from .clang-format (clang-format -i FILE)")
fi

echo "-- layers (scripts/layers.py cycles $build)"
if ! python3 scripts/layers.py cycles "$build"; then
  failed+=("layers: a circle or a call going up, above")
fi

echo "-- functions over 120 lines (scripts/function_lengths.py)"
if ! python3 scripts/function_lengths.py --max 120; then
  failed+=("function lengths: split the functions named above")
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf 'check-shape: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "check-shape: formatting, layers and function lengths as they should be"
