#!/usr/bin/env python3
"""Meta's SPDL (spdl-io / spdl-core, thread-based, FFmpeg decoding) doing
what `dsbench --pipeline imagenet|imagenet-val` does, for the comparison:
images/s over an image folder of class sub-folders.

    spdl_imagenet_bench.py FOLDER [--pipeline imagenet|imagenet-val]
                           [--threads 2] [--batch 128] [--epochs 3] [--seed 0]

  imagenet      torchvision's RandomResizedCrop box (area 0.08-1, aspect
                3/4-4/3, 10 tries, then the centre crop), drawn from the
                file's size; one FFmpeg filter graph a file: crop to the box,
                scale to 224x224 (bilinear), hflip half the time, rgb24; then
                on the batch in numpy, float32: brightness, contrast (about
                each image's mean gray) and saturation, each factor uniform in
                [0.6, 1.4] in this fixed order (FFmpeg's eq and lut filters
                doing the same were 2.6-5.8 times slower: a graph is built per
                file), and ImageNet's mean and std into float32 NCHW
  imagenet-val  shorter side to 256 (bilinear), centre 224x224 crop, the
                same normalisation

SPDL's decoder has no region decode: FFmpeg decodes the whole file and the
graph crops it. One spdl.pipeline: a continuous source (each pass an epoch
in a new order), aggregate(--batch), one stage with concurrency --threads
that decodes a batch's files and collates them (the faster layout in SPDL's
examples), a sink of 3 batches. The first epoch warms up; the figure is the
median images/s of the others. One JSON line on stdout. Needs `pip install
spdl-io spdl-core` (a venv with --system-site-packages for numpy) and
FFmpeg's shared libraries (Debian 12: libavcodec59 libavdevice59
libavformat59 libavfilter8 libavutil57 libswscale6).
"""
import argparse
import json
import math
import os
import random
import statistics
import time
from importlib.metadata import version

import numpy as np
import spdl.io
from spdl.pipeline import PipelineBuilder

EXTENSIONS = (".jpg", ".jpeg", ".png")
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1) * 255
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1) * 255


def scan(folder):
    """(path, label) for every image under FOLDER/<class>/, classes sorted as ImageFolder."""
    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir())
    samples = []
    for label, name in enumerate(classes):
        for root, _, files in sorted(os.walk(os.path.join(folder, name), followlinks=True)):
            samples += [(os.path.join(root, f), label) for f in sorted(files)
                        if f.lower().endswith(EXTENSIONS)]
    return samples


def crop_box(rng, w, h, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params: (x, y, width, height)."""
    area = w * h
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, w - cw), rng.randint(0, h - ch), cw, ch
    aspect = w / h
    if aspect < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif aspect > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        cw, ch = w, h
    return (w - cw) // 2, (h - ch) // 2, cw, ch


class Epochs:
    """The source: each pass is one epoch in a new order, each item with its own generator."""

    def __init__(self, samples, seed):
        self.samples, self.seed, self.epoch = samples, seed, 0

    def __iter__(self):
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        self.epoch += 1
        order = list(range(len(self.samples)))
        rng.shuffle(order)
        for i in order:
            path, label = self.samples[i]
            yield path, label, rng.getrandbits(64)


def decode_train(item):
    path, label, seed = item
    rng = random.Random(seed)
    packets = spdl.io.demux_image(path)
    x, y, cw, ch = crop_box(rng, packets.codec.width, packets.codec.height)
    graph = (f"crop=w={cw}:h={ch}:x={x}:y={y},scale=w=224:h=224:flags=bilinear," +
             ("hflip," if rng.random() < 0.5 else "") + "format=pix_fmts=rgb24")
    return spdl.io.decode_packets(packets, filter_desc=graph), label, rng


def jitter(x, rngs):
    """Brightness, contrast and saturation (each factor uniform in [0.6, 1.4], this fixed
    order) on a float32 NHWC batch, as torchvision's tensor ops compute them."""
    f = np.array([[r.uniform(0.6, 1.4) for _ in range(3)] for r in rngs], dtype=np.float32)
    gray = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    x *= f[:, 0, None, None, None]
    np.clip(x, 0, 255, out=x)
    m = (x @ gray).mean(axis=(1, 2))[:, None, None, None]
    x -= m
    x *= f[:, 1, None, None, None]
    x += m
    np.clip(x, 0, 255, out=x)
    g = (x @ gray)[..., None]
    x -= g
    x *= f[:, 2, None, None, None]
    x += g
    np.clip(x, 0, 255, out=x)
    return x


def decode_val(item):
    path, label, _ = item
    packets = spdl.io.demux_image(path)
    w, h = packets.codec.width, packets.codec.height
    sw, sh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    graph = (f"scale=w={sw}:h={sh}:flags=bilinear,"
             f"crop=w=224:h=224:x={(sw - 224) // 2}:y={(sh - 224) // 2},format=pix_fmts=rgb24")
    return spdl.io.decode_packets(packets, filter_desc=graph), label, None


def collate(items):
    frames = [f for f, _, _ in items]
    labels = np.fromiter((lab for _, lab, _ in items), dtype=np.int64, count=len(items))
    nhwc = spdl.io.to_numpy(spdl.io.convert_frames(frames))  # (N, H, W, 3) uint8
    x = nhwc.astype(np.float32)
    if items[0][2] is not None:
        x = jitter(x, [r for _, _, r in items])
    out = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    out -= MEAN
    out /= STD
    return out, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--pipeline", default="imagenet", choices=["imagenet", "imagenet-val"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    samples = scan(a.folder)
    decode = decode_train if a.pipeline == "imagenet" else decode_val
    p = (PipelineBuilder().add_source(Epochs(samples, a.seed), continuous=True)
         .aggregate(a.batch)
         .pipe(lambda items: collate([decode(i) for i in items]), concurrency=a.threads,
               name="decode_batch")
         .add_sink(3).build(num_threads=a.threads))
    rates, shape = [], None
    with p.auto_stop():
        for _ in range(a.epochs):
            t0, n = time.perf_counter(), 0
            for x, _ in p.get_iterator():
                n += x.shape[0]
                shape = shape or list(x.shape)
            if n == 0:
                raise SystemExit("spdl_imagenet_bench: the pipeline delivered nothing "
                                 "(its stage failed: see the log above)")
            rates.append(n / (time.perf_counter() - t0))
    print(json.dumps({"peer": "spdl", "spdl": version("spdl-io"), "pipeline": a.pipeline,
                      "threads": a.threads, "batch": a.batch, "images": len(samples),
                      "batch_shape": shape,
                      "images_per_s": round(statistics.median(rates[1:] or rates), 1),
                      "epochs_images_per_s": [round(r, 1) for r in rates]}))


if __name__ == "__main__":
    main()
