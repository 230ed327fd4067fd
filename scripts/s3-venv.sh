#!/usr/bin/env bash
# Makes the Python virtual environment that runs the S3-compatible server of
# dsrt's object-storage tests and benchmarks (tests/s3_server.py): moto's S3
# (moto[server]), waitress to serve it with kept-alive connections, and boto3
# (set-up, and the boto3 DataLoader baseline in python/bench/). Idempotent:
# an environment that already imports them is left alone.
#
#   scripts/s3-venv.sh            # prints the environment's python
#
# The folder is $DSRT_S3_VENV, by default ~/.cache/dsrt/s3-venv. Needs
# Debian's python3-venv (scripts/install-deps.sh) and PyPI.
set -euo pipefail
venv=${DSRT_S3_VENV:-${HOME:-/root}/.cache/dsrt/s3-venv}
py=$venv/bin/python
check='import moto, moto.s3, waitress, boto3, requests'
if [ -x "$py" ] && "$py" -c "$check" 2>/dev/null; then
  echo "$py"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
[ -x "$py" ] || /usr/bin/python3 -m venv "$venv" >&2
"$py" -m pip install -q --disable-pip-version-check 'moto[server]>=5.0,<6' 'waitress>=3.0' \
  'boto3>=1.34' >&2
"$py" -c "$check"
echo "$py"
