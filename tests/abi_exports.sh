#!/usr/bin/env bash
# The ABI of the shared libraries is their public headers: libdsrt.so and
# libdsrt_train.so export the functions include/dsrt/*.h declare with
# DSRT_API, and of dsrt's internals only those cmake/dsrt-internals.txt
# lists (what libdsrt_train and the modules call); every dsrt name that
# libdsrt_train and the modules need is exported; every public function is.
#
#   tests/abi_exports.sh LIBDSRT LIBDSRT_TRAIN SOURCE_DIR [MODULE_DIR]
set -euo pipefail
lib=$1 train=$2 src=$3 mods=${4:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# Public: "DSRT_API ... name(" in the headers (declarations span lines).
tr '\n' ' ' < <(cat "$src"/include/dsrt/*.h) |
  grep -oE 'DSRT_API[^;(]*[ *]dsrt_[A-Za-z0-9_]+ *\(' |
  grep -oE 'dsrt_[A-Za-z0-9_]+ *\($' | tr -d ' (' | sort -u > "$tmp/public"
grep -E '^dsrt__[A-Za-z0-9_]+$' "$src/cmake/dsrt-internals.txt" | sort -u > "$tmp/internal"
sort -u "$tmp/public" "$tmp/internal" > "$tmp/allowed"

exported() { nm -D --defined-only "$1" | awk '{print $3}' | sed 's/@.*//' | sort -u; }
needed() { nm -D --undefined-only "$1" | awk '{print $2}' | sed 's/@.*//' | grep '^dsrt' | sort -u || true; }

exported "$lib" > "$tmp/lib"
exported "$train" > "$tmp/train"
sort -u "$tmp/lib" "$tmp/train" > "$tmp/both"
echo "libdsrt.so exports $(wc -l < "$tmp/lib") names, libdsrt_train.so $(wc -l < "$tmp/train")" \
  "($(grep -c '^dsrt__' "$tmp/both" || true) of them internals the list names)"

for f in lib train; do
  extra=$(comm -23 "$tmp/$f" "$tmp/allowed")
  if [ -n "$extra" ]; then
    echo "FAIL: lib$([ $f = train ] && echo dsrt_train || echo dsrt).so exports names that are" \
      "neither public nor in cmake/dsrt-internals.txt:"; echo "$extra"; status=1
  fi
done
missing=$(comm -23 "$tmp/public" "$tmp/both")
if [ -n "$missing" ]; then
  echo "FAIL: public functions neither library exports:"; echo "$missing"; status=1
fi
lost=$(comm -23 <(needed "$train") "$tmp/lib")
if [ -n "$lost" ]; then
  echo "FAIL: libdsrt_train.so needs names libdsrt.so does not export:"; echo "$lost"; status=1
fi
if [ -n "$mods" ] && [ -d "$mods" ]; then
  for m in "$mods"/dsrt_*.so; do
    [ -e "$m" ] || continue
    lost=$(comm -23 <(needed "$m") "$tmp/both")
    if [ -n "$lost" ]; then
      echo "FAIL: $(basename "$m") needs names the libraries do not export:"; echo "$lost"; status=1
    else
      echo "$(basename "$m"): every dsrt name it needs is exported"
    fi
  done
fi
exit $status
