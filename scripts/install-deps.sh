#!/usr/bin/env bash
# Installs every Debian package dsrt needs to build, test and run its default
# job. Idempotent: packages already present are left alone, and apt is only
# consulted when something is missing. Run as root (or with sudo available).
#
#   scripts/install-deps.sh          # build + run + test dependencies
#   scripts/install-deps.sh --bench  # also the PyTorch baselines used by benchmarks
#                                    # and nginx (the object-storage benchmark's cache)
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config ninja-build clang clang-format libclang-rt-14-dev
  zlib1g-dev libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev libwebp-dev liburing-dev libhwloc-dev
  libdnnl-dev libopenmpi-dev openmpi-bin libcurl4-openssl-dev libssl-dev ca-certificates
  python3-venv
  dataset-fashion-mnist
  python3-dev python3-numpy python3-pytest python3-pil python3-torch python3-torchvision
)
if [ "${1:-}" = "--bench" ]; then
  pkgs+=(python3-boto3 nginx-light)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# The S3-compatible server of the object-storage tests (moto, from PyPI, in a
# virtual environment), and onnx and onnxruntime for the ONNX tests (another
# one): where PyPI cannot be reached those tests skip.
s3_venv() {
  bash "$(dirname "$0")/s3-venv.sh" >/dev/null ||
    echo "install-deps: the S3 test server could not be installed (PyPI?): its tests will skip" >&2
  bash "$(dirname "$0")/onnx-venv.sh" >/dev/null ||
    echo "install-deps: onnx and onnxruntime could not be installed (PyPI?): the ONNX reference tests will skip" >&2
}

if [ ${#missing[@]} -eq 0 ]; then
  s3_venv
  exit 0
fi

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: installed ${missing[*]}"
s3_venv
