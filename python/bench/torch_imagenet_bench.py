#!/usr/bin/env python3
"""A PyTorch DataLoader doing what `dsbench --pipeline imagenet|imagenet-val`
does, for the comparison: images/s over an image folder.

    torch_imagenet_bench.py FOLDER [--pipeline imagenet|imagenet-val]
                            [--workers 2] [--batch 128] [--epochs 3]

  imagenet      torchvision's ImageNet training transform on the PIL images
                ImageFolder opens: RandomResizedCrop(224) (scale 0.08-1,
                ratio 3/4-4/3, bilinear), RandomHorizontalFlip(),
                ColorJitter(0.4, 0.4, 0.4), ToTensor(), Normalize with
                ImageNet's mean and std
  imagenet-val  its evaluation transform: Resize(256), CenterCrop(224),
                ToTensor(), the same Normalize

Batches are float32 (batch, 3, 224, 224). Epochs are whole passes over the
folder in a new random order; the first one warms the workers up and the
figure is the median images/s of the others. One JSON line on stdout.
Needs torch and torchvision (Debian's python3-torch, python3-torchvision).
"""
import argparse
import json
import statistics
import time

import torch
from torchvision import datasets, transforms

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def transform(name):
    """The torchvision transform of a pipeline name."""
    normalise = [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
    if name == "imagenet":
        steps = [
            transforms.RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
        ]
    else:
        steps = [transforms.Resize(256), transforms.CenterCrop(224)]
    return transforms.Compose(steps + normalise)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--pipeline", default="imagenet", choices=["imagenet", "imagenet-val"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)  # each worker one core, as dsrt's threads
    data = datasets.ImageFolder(args.folder, transform=transform(args.pipeline))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True,
                                         num_workers=args.workers,
                                         persistent_workers=args.workers > 0)
    per_epoch = []
    for _ in range(args.epochs):
        start, seen = time.perf_counter(), 0
        for images, _labels in loader:
            seen += images.shape[0]
        per_epoch.append(seen / (time.perf_counter() - start))
    print(json.dumps({
        "peer": "torch.utils.data.DataLoader", "torch": torch.__version__,
        "pipeline": args.pipeline, "workers": args.workers, "batch": args.batch,
        "images": len(data),
        "images_per_s": round(statistics.median(per_epoch[1:] or per_epoch), 1),
        "epochs_images_per_s": [round(r, 1) for r in per_epoch],
    }))


if __name__ == "__main__":
    main()
