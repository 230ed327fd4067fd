#!/usr/bin/env python3
"""Peer baseline: images/s of a PyTorch DataLoader whose dataset fetches each
object of an S3 prefix with boto3, as a PyTorch user without a dedicated
loader would write it.

    s3_loader_boto3.py s3://BUCKET/PREFIX [--pipeline 227|32|none]
                       [--workers 2] [--batch 128] [--epochs 3]

The index is an ImageFolder's over the keys (classes: the first sub-prefixes,
sorted; each class's keys sorted), listed with boto3's ListObjectsV2
paginator. Every sample is one GetObject, decoded with Pillow and given the
same transforms as /work/shared/bench/torch_loader_bench.py (227: shorter
side to 256, random 227x227 crop, random flip; 32: resize to 32x32, flip,
random shift of up to 4 pixels; none: decode only), into float32 NCHW in
[0, 1]. Each worker process has its own boto3 client (boto3 clients are not
shared across processes). Credentials, region and endpoint come from the
environment as for dsrt (AWS_ENDPOINT_URL is passed on explicitly, for
boto3 versions that do not read it). The first epoch is a warm-up; the
figure is the median images/s of the rest. Prints one JSON line.

Needs Debian's python3-torch, python3-torchvision and python3-boto3.
"""
import argparse
import io
import json
import os
import statistics
import time

import boto3
import torch
from PIL import Image
from torchvision import transforms

EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".jfif", ".png")


def pipeline(name):
    if name == "227":
        return transforms.Compose([transforms.Resize(256), transforms.RandomCrop(227),
                                   transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    if name == "32":
        return transforms.Compose([transforms.Resize((32, 32)), transforms.RandomHorizontalFlip(),
                                   transforms.RandomCrop(32, padding=4), transforms.ToTensor()])
    return transforms.ToTensor()


def make_client():
    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
                        region_name=os.environ.get("AWS_REGION") or None)


class S3ImageFolder(torch.utils.data.Dataset):
    def __init__(self, url, transform):
        assert url.startswith("s3://"), url
        self.bucket, _, prefix = url[5:].partition("/")
        prefix = prefix.strip("/")
        self.prefix = prefix + "/" if prefix else ""
        self.transform = transform
        self.client = None
        self.client_pid = None
        by_class = {}
        pages = make_client().get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(self.prefix):]
                if "/" not in rel or not rel.lower().endswith(EXTENSIONS):
                    continue
                by_class.setdefault(rel.split("/", 1)[0], []).append(obj["Key"])
        self.classes = sorted(by_class)
        self.samples = [(key, c) for c, name in enumerate(self.classes)
                        for key in sorted(by_class[name])]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        if self.client is None or self.client_pid != os.getpid():
            self.client, self.client_pid = make_client(), os.getpid()
        key, label = self.samples[i]
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        image = Image.open(io.BytesIO(body)).convert("RGB")
        return self.transform(image), label


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--pipeline", default="227", choices=["227", "32", "none"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ds = S3ImageFolder(a.url, pipeline(a.pipeline))
    index_s = time.perf_counter() - t0
    batch = 1 if a.pipeline == "none" else a.batch
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=a.workers,
                                     persistent_workers=a.workers > 0, drop_last=False)
    rates = []
    for _ in range(a.epochs):
        t0, n = time.perf_counter(), 0
        for x, _ in dl:
            n += x.shape[0]
        rates.append(n / (time.perf_counter() - t0))
    print(json.dumps({"peer": "torch DataLoader + boto3 get_object", "torch": torch.__version__,
                      "boto3": boto3.__version__, "pipeline": a.pipeline, "workers": a.workers,
                      "images": len(ds), "index_s": round(index_s, 3),
                      "images_per_s": round(statistics.median(rates[1:] or rates), 1),
                      "epochs_images_per_s": [round(r, 1) for r in rates]}))


if __name__ == "__main__":
    main()
