#!/usr/bin/env bash
# The device kit's count of compute-sanitizer reports, on recorded logs of
# both shapes a frame's module takes (on the frame's line, or on the line
# after it): cuDNN's and NCCL's own failing calls are the libraries', a call
# dsrt made and a device fault in dsrt's kernel are dsrt's.
set -u
here=$(cd "$(dirname "$0")" && pwd)
kit=$here/../../scripts/device-kit.sh
fail=0
expect() {
  local log=$1 want=$2 rc_want=$3 got rc=0
  got=$(bash "$kit" sanitizer-count "$here/$log") || rc=$?
  if [ "$(tail -1 <<<"$got")" != "$want" ] || [ "$rc" != "$rc_want" ]; then
    echo "FAIL $log: got '$(tail -1 <<<"$got")' (exit $rc), want '$want' (exit $rc_want)"
    fail=1
  else
    echo "ok   $log: $want"
  fi
}
expect clean.log "dsrt 0, libraries 0" 0
expect frame-inline.log "dsrt 2, libraries 1" 1
expect frame-next-line.log "dsrt 1, libraries 2" 1
exit $fail
