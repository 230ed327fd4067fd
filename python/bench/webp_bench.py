#!/usr/bin/env python3
"""The files and Pillow's side of scripts/bench-webp.sh.

  webp_bench.py make PHOTOS OUT [N]   the first N (500) photos of PHOTOS (class
                                      sub-folders) as OUT/jpeg (quality 90,
                                      4:2:0), OUT/webp (lossy, quality 90) and
                                      OUT/webp-lossless, the same pixels each
  webp_bench.py pil OUT [PASSES]      Pillow decoding each set whole to RGB,
                                      files in memory, sets interleaved in each
                                      pass, best pass: one process's rate in its
                                      CPU time, and two processes' in wall time

Pillow reads JPEG with libjpeg-turbo (the accurate DCT, as dsrt) and WebP with
libwebp, as dsrt does.
"""
import io
import multiprocessing
import os
import sys
import time

from PIL import Image

SETS = ("jpeg", "webp", "webp-lossless")


def make(photos, out, n):
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(photos) for f in fs)[:n]
    for k, path in enumerate(files):
        cls = os.path.basename(os.path.dirname(path))
        img = Image.open(path).convert("RGB")
        for s in SETS:
            os.makedirs(os.path.join(out, s, cls), exist_ok=True)
        stem = os.path.join(out, "%s", cls, "%05d" % k)
        img.save(stem % "jpeg" + ".jpg", "JPEG", quality=90)
        img.save(stem % "webp" + ".webp", "WEBP", quality=90)
        img.save(stem % "webp-lossless" + ".webp", "WEBP", lossless=True)
    print("webp_bench: %d photos as %s in %s" % (len(files), ", ".join(SETS), out))


def load(out, s):
    d = os.path.join(out, s)
    paths = sorted(os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs)
    return [open(p, "rb").read() for p in paths]


def decode_all(blobs):
    for b in blobs:
        img = Image.open(io.BytesIO(b))
        if img.mode == "RGB":
            img.load()
        else:
            img.convert("RGB")


def pil(out, passes):
    data = {s: load(out, s) for s in SETS}
    one = {s: None for s in SETS}
    two = {s: None for s in SETS}
    ctx = multiprocessing.get_context("fork")
    for _ in range(passes):
        for s in SETS:
            blobs = data[s]
            t0 = time.monotonic()
            ps = [ctx.Process(target=decode_all, args=(blobs[k::2],)) for k in range(2)]
            for p in ps:
                p.start()
            for p in ps:
                p.join()
            wall = time.monotonic() - t0
            two[s] = wall if two[s] is None else min(two[s], wall)
            c0 = time.process_time()
            decode_all(blobs)
            cpu = time.process_time() - c0
            one[s] = cpu if one[s] is None else min(one[s], cpu)
    for s in SETS:
        n = len(data[s])
        print("pillow %s: %d files, one core %.1f images/s, 2 processes %.1f images/s"
              % (s, n, n / one[s], n / two[s]))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 500)
    elif sys.argv[1] == "pil":
        pil(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3)
    else:
        sys.exit("webp_bench.py: make PHOTOS OUT [N] | pil OUT [PASSES]")
