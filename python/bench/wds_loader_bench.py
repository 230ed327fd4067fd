#!/usr/bin/env python3
"""Peer baseline: images/s of WebDataset's own loader over tar shards.

    wds_loader_bench.py SHARDS [--pipeline 227|32|none] [--workers 2] [--batch 128]
                        [--epochs 3] [--shuffle-buffer 1000] [--cold]

SHARDS is a folder of .tar shards (as `dsbench convert SRC OUT --shards SIZE`
writes them) or a brace pattern such as "dir/shard-{000000..000009}.tar".
The loader is WebDataset's (PyPI `webdataset`) in a PyTorch DataLoader with
`--workers` worker processes, each taking whole shards: shards shuffled,
samples mixed in a shuffle buffer, images decoded with PIL and transformed
with torchvision as torch_loader_bench.py does:

  227  shorter side to 256, random 227x227 crop, random horizontal reflection
  32   resize to 32x32, random horizontal reflection, random translation of
       up to 4 pixels (zero fill)
  none decode only, native size, batch of 1

Each batch ends as a float32 NCHW tensor in [0, 1], the work of
`dsbench SHARDS --order shard --pipeline 227`. With --cold the page cache is
dropped before each epoch as `dsbench --cold` drops it: the whole cache
(/proc/sys/vm/drop_caches) when this process may write it, else
posix_fadvise(DONTNEED) on every shard; the output says which. The first epoch
is a warm-up; the figure is the median of the rest. Prints one JSON line.

Set-up (Debian's python3-torch stays visible):
    /usr/bin/python3 -m venv --system-site-packages ~/wds-env
    ~/wds-env/bin/pip install webdataset
    ~/wds-env/bin/python python/bench/wds_loader_bench.py SHARDS --cold
"""
import argparse
import glob
import json
import os
import statistics
import time

import torch
import webdataset as wds
from torchvision import transforms


def pipeline(name):
    if name == "227":
        return transforms.Compose([transforms.Resize(256), transforms.RandomCrop(227),
                                   transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    if name == "32":
        return transforms.Compose([transforms.Resize((32, 32)), transforms.RandomHorizontalFlip(),
                                   transforms.RandomCrop(32, padding=4), transforms.ToTensor()])
    return transforms.ToTensor()


def shard_list(spec):
    if os.path.isdir(spec):
        urls = sorted(glob.glob(os.path.join(spec, "*.tar")))
    else:
        urls = list(wds.shardlists.expand_urls(spec))
    if not urls:
        raise SystemExit(f"{spec}: no .tar shards")
    return urls


def drop_cache(urls):
    """Drops the shards from the page cache; returns the method used."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop-caches"
    except OSError:
        for u in urls:
            fd = os.open(u, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return "fadvise"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("--pipeline", default="227", choices=["227", "32", "none"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--shuffle-buffer", type=int, default=1000)
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    urls = shard_list(a.shards)
    batch = 1 if a.pipeline == "none" else a.batch
    tf = pipeline(a.pipeline)
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.single_node_only,
                         workersplitter=wds.split_by_worker, empty_check=False)
          .shuffle(a.shuffle_buffer)
          .decode("pil")
          .to_tuple("jpg;png", "cls")
          .map_tuple(tf, int)
          .batched(batch, partial=True))
    dl = wds.WebLoader(ds, batch_size=None, num_workers=a.workers,
                       persistent_workers=a.workers > 0)
    rates, cold = [], None
    for epoch in range(a.epochs):
        if a.cold:
            cold = drop_cache(urls)
        t0, n = time.perf_counter(), 0
        for x, _ in dl:
            n += x.shape[0]
        rates.append(n / (time.perf_counter() - t0))
    print(json.dumps({"peer": "webdataset.WebLoader", "webdataset": wds.__version__,
                      "torch": torch.__version__, "pipeline": a.pipeline, "workers": a.workers,
                      "shards": len(urls), "shuffle_buffer": a.shuffle_buffer, "images": n,
                      "cold": cold or False,
                      "images_per_s": round(statistics.median(rates[1:] or rates), 1),
                      "epochs_images_per_s": [round(r, 1) for r in rates]}))


if __name__ == "__main__":
    main()
