#!/usr/bin/env python3
"""PyTorch trains the 'digits' network on the Fashion-MNIST folder, fed by
dsrt.Pipeline on one side and by torch.utils.data.DataLoader (as
torch_train_folder.py feeds it) on the other, with the same threads: images/s
and test accuracy of each.

    train_fmnist.py ROOT [--epochs 3] [--segment 100] [--workers 1] [--threads 2]
                    [--batch 128] [--lr 0.01] [--peer-dir ../shared/bench]

ROOT holds train/ and test/ class folders (dsbench convert writes them). Each
side has its own network (digits_net from torch_train_bench.py, seeded
alike), SGD with momentum 0.9 and L2 1e-4, shuffling every epoch and random
left-right reflection; torch uses `threads` threads for compute on both
sides, and the loader `workers` workers (DataLoader processes, dsrt
threads). On a shared machine the two sides run alternately, `segment`
training steps at a time, so both see the same load; each segment's time
covers the steps and the waits for data. With --loaders-only, no training:
each loader's own rate, whole epochs alternately. Prints a JSON line per epoch and a
summary with each side's images/s, their ratio (overall and the median of the
per-segment ratios), test accuracy, and the load average.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
from torchvision import datasets, transforms

import dsrt


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--segment", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--peer-dir", default=os.path.join(here, "..", "..", "..", "shared", "bench"))
    ap.add_argument("--loaders-only", action="store_true",
                    help="no training: each loader's own images/s (alternate epochs)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.peer_dir))
    from torch_train_bench import digits_net

    torch.set_num_threads(a.threads)

    # PyTorch's side, as torch_train_folder.py.
    gray = [transforms.Grayscale(), transforms.ToTensor()]
    t_train = datasets.ImageFolder(a.root + "/train",
                                   transforms.Compose([transforms.RandomHorizontalFlip()] + gray))
    t_test = datasets.ImageFolder(a.root + "/test", transforms.Compose(gray))
    kw = dict(num_workers=a.workers, persistent_workers=a.workers > 0)
    t_dl = torch.utils.data.DataLoader(t_train, batch_size=a.batch, shuffle=True, **kw)
    t_test_dl = torch.utils.data.DataLoader(t_test, batch_size=512, **kw)

    # dsrt's side: the same work per image.
    gray28 = dict(output_size=(28, 28), output_channels=1)
    d_train = dsrt.Datastore(a.root + "/train")
    d_test = dsrt.Datastore(a.root + "/test")
    assert d_train.classes == tuple(t_train.classes)
    p = dsrt.Pipeline(d_train, batch=a.batch, epochs=a.epochs, seed=1, workers=a.workers,
                      augment=dict(gray28, rand_x_reflection=True))
    v = dsrt.Pipeline(d_test, batch=512, epochs=a.epochs, shuffle="never", workers=a.workers,
                      augment=gray28)

    def dsrt_batches():
        for b in p:
            yield torch.from_dlpack(b.images), torch.from_dlpack(b.labels).long()

    if a.loaders_only:
        rates = {"dsrt": [], "torch": []}
        for epoch in range(a.epochs):
            for side in ("dsrt", "torch") if epoch % 2 == 0 else ("torch", "dsrt"):
                t0 = time.perf_counter()
                n = 0
                for x, y in (dsrt_batches() if side == "dsrt" else t_dl):
                    n += len(y)
                rates[side].append(n / (time.perf_counter() - t0))
        print(json.dumps({"loaders_only": True, "workers": a.workers, "epochs": a.epochs,
                          "dsrt_images_per_s": round(statistics.median(rates["dsrt"]), 1),
                          "torch_images_per_s": round(statistics.median(rates["torch"]), 1),
                          "load_average": round(os.getloadavg()[0], 2)}))
        return

    def setup():
        torch.manual_seed(0)
        net = digits_net()
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
        return net, opt

    sides = {"dsrt": setup(), "torch": setup()}
    loss_fn = nn.CrossEntropyLoss()

    def step(side, x, y):
        net, opt = sides[side]
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    def accuracy(side, batches, n):
        net = sides[side][0]
        net.eval()
        correct = 0
        with torch.no_grad():
            for x, y in batches:
                correct += (net(x).argmax(1) == y).sum().item()
        net.train()
        return correct / n

    seconds = {"dsrt": 0.0, "torch": 0.0}
    images = {"dsrt": 0, "torch": 0}
    ratios = []
    loads = []
    for epoch in range(1, a.epochs + 1):
        its = {"dsrt": iter(dsrt_batches()), "torch": iter(t_dl)}
        done = {"dsrt": False, "torch": False}
        ep_s = {"dsrt": 0.0, "torch": 0.0}
        while not all(done.values()):
            seg = {}
            for side in ("dsrt", "torch") if len(ratios) % 2 == 0 else ("torch", "dsrt"):
                if done[side]:
                    continue
                t0 = time.perf_counter()
                n = 0
                for _ in range(a.segment):
                    try:
                        x, y = next(its[side])
                    except StopIteration:
                        done[side] = True
                        break
                    step(side, x, y)
                    n += len(y)
                    del x, y
                dt = time.perf_counter() - t0
                seconds[side] += dt
                ep_s[side] += dt
                images[side] += n
                if n:
                    seg[side] = n / dt
            if len(seg) == 2:
                ratios.append(seg["dsrt"] / seg["torch"])
            loads.append(os.getloadavg()[0])
        acc = {"dsrt": accuracy("dsrt", dsrt.TorchLoader(v), len(d_test)),
               "torch": accuracy("torch", t_test_dl, len(t_test))}
        print(json.dumps({"epoch": epoch,
                          "dsrt_images_per_s": round(len(d_train) / ep_s["dsrt"], 1),
                          "torch_images_per_s": round(len(t_train) / ep_s["torch"], 1),
                          "dsrt_test_accuracy": round(acc["dsrt"], 4),
                          "torch_test_accuracy": round(acc["torch"], 4)}), flush=True)
    rate = {s: images[s] / seconds[s] for s in seconds}
    print(json.dumps({
        "net": "digits", "epochs": a.epochs, "batch": a.batch, "threads": a.threads,
        "workers": a.workers, "segment": a.segment, "torch": torch.__version__,
        "dsrt_images_per_s": round(rate["dsrt"], 1), "torch_images_per_s": round(rate["torch"], 1),
        "ratio": round(rate["dsrt"] / rate["torch"], 3),
        "median_segment_ratio": round(statistics.median(ratios), 3),
        "dsrt_test_accuracy": round(acc["dsrt"], 4), "torch_test_accuracy": round(acc["torch"], 4),
        "dsrt_stats": {k: round(v, 2) for k, v in p.stats().items()
                       if k in ("read_s", "decode_s", "augment_s", "consumer_wait_s")},
        "load_average": [round(min(loads), 2), round(statistics.median(loads), 2),
                         round(max(loads), 2)],
    }))
    p.close()
    v.close()


if __name__ == "__main__":
    main()
