#!/usr/bin/env bash
# Makes the Python virtual environment that checks dsrt's ONNX import and
# export against the reference runtime: onnxruntime (inference on the CPU)
# and onnx (its checker, and the helpers the tests write hand-made models
# with: typed initialiser fields, float16 and bfloat16, external data).
# Idempotent: an environment that already imports them is left alone.
#
#   scripts/onnx-venv.sh            # prints the environment's python
#
# The folder is $DSRT_ONNX_VENV, by default ~/.cache/dsrt/onnx-venv. The
# reference models themselves are exported by the system's Python (Debian's
# python3-torch and python3-torchvision), which this environment does not
# see: PyPI's numpy is newer than the one Debian's torch is built against.
# Needs Debian's python3-venv (scripts/install-deps.sh) and PyPI.
set -euo pipefail
venv=${DSRT_ONNX_VENV:-${HOME:-/root}/.cache/dsrt/onnx-venv}
py=$venv/bin/python
check='import onnx, onnx.checker, onnx.helper, onnx.numpy_helper, onnxruntime, numpy'
if [ -x "$py" ] && "$py" -c "$check" 2>/dev/null; then
  echo "$py"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
[ -x "$py" ] || /usr/bin/python3 -m venv "$venv" >&2
"$py" -m pip install -q --disable-pip-version-check 'onnxruntime>=1.16' 'onnx>=1.15' >&2
"$py" -c "$check"
echo "$py"
