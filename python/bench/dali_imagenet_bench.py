#!/usr/bin/env python3
"""NVIDIA DALI on the CPU alone (device_id=None) doing what `dsbench
--pipeline imagenet|imagenet-val` does, for the comparison: images/s over an
image folder of class sub-folders.

    dali_imagenet_bench.py FOLDER [--pipeline imagenet|imagenet-val]
                           [--threads 2] [--batch 128] [--epochs 3] [--seed 0]

  imagenet      fn.decoders.image_random_crop (area 0.08-1, aspect 3/4-4/3,
                10 attempts: only the window is decoded), fn.resize to
                224x224 (linear, antialiased), fn.color_twist (brightness,
                contrast and saturation each uniform in [0.6, 1.4]; DALI
                applies them in one fixed order, where torchvision draws one),
                fn.crop_mirror_normalize (random horizontal flip, ImageNet's
                mean and std, float32 CHW)
  imagenet-val  fn.decoders.image, fn.resize with resize_shorter=256,
                fn.crop_mirror_normalize (centre 224x224, the same
                normalisation)

An epoch is as many batches as cover the folder once (the reader wraps, so
every batch is full); the first warms up, the figure is the median images/s
of the others. One JSON line on stdout. Needs nvidia-dali (a venv:
`python3 -m venv data/venv-dali && data/venv-dali/bin/pip install
nvidia-dali-cuda130`).
"""
import argparse
import json
import math
import statistics
import time

import nvidia.dali as dali
import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali import pipeline_def

MEAN = [255 * m for m in (0.485, 0.456, 0.406)]
STD = [255 * s for s in (0.229, 0.224, 0.225)]


def make(folder, name, batch, threads, seed):
    """The DALI pipeline of a pipeline name, built."""

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=seed,
                  prefetch_queue_depth=2)
    def imagenet():
        files, labels = fn.readers.file(file_root=folder, random_shuffle=True, name="files")
        if name == "imagenet":
            images = fn.decoders.image_random_crop(
                files, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
            images = fn.resize(images, resize_x=224, resize_y=224,
                               interp_type=types.INTERP_LINEAR, antialias=True)
            images = fn.color_twist(images,
                                    brightness=fn.random.uniform(range=[0.6, 1.4]),
                                    contrast=fn.random.uniform(range=[0.6, 1.4]),
                                    saturation=fn.random.uniform(range=[0.6, 1.4]))
            images = fn.crop_mirror_normalize(
                images, mirror=fn.random.coin_flip(probability=0.5), mean=MEAN, std=STD,
                dtype=types.FLOAT, output_layout="CHW")
        else:
            images = fn.decoders.image(files, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=256, interp_type=types.INTERP_LINEAR,
                               antialias=True)
            images = fn.crop_mirror_normalize(images, crop=(224, 224), mean=MEAN, std=STD,
                                              dtype=types.FLOAT, output_layout="CHW")
        return images, labels

    p = imagenet()
    p.build()
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--pipeline", default="imagenet", choices=["imagenet", "imagenet-val"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    p = make(args.folder, args.pipeline, args.batch, args.threads, args.seed)
    images = p.epoch_size("files")
    batches = math.ceil(images / args.batch)
    per_epoch = []
    for _ in range(args.epochs):
        start, seen = time.perf_counter(), 0
        for _ in range(batches):
            out, _labels = p.run()
            seen += len(out)
        per_epoch.append(seen / (time.perf_counter() - start))
    print(json.dumps({
        "peer": "nvidia.dali (CPU, device_id=None)", "dali": dali.__version__,
        "pipeline": args.pipeline, "threads": args.threads, "batch": args.batch,
        "images": images,
        "images_per_s": round(statistics.median(per_epoch[1:] or per_epoch), 1),
        "epochs_images_per_s": [round(r, 1) for r in per_epoch],
    }))


if __name__ == "__main__":
    main()
