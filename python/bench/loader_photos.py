#!/usr/bin/env python3
"""The input pipeline alone, from Python and from C: dsrt.Pipeline taking
batches in a Python loop against `dsbench` (the same pipeline driven by a C
consumer), with the same settings, to show what the Python layer costs.

    loader_photos.py DATA [--pipeline 227] [--workers 2] [--batch 128]
                     [--epochs 3] [--rounds 3] [--dsbench build/tools/dsbench]
                     [--views]

Each round runs dsbench for `epochs` epochs, then the Python loop for as
many, alternately (the first epoch of each run is a warm-up; the figure is
the median of the others, as dsbench reports it), so both see the same load
on a shared machine. With --views the Python loop also makes
torch.from_dlpack views of every batch's images and labels. Prints one JSON
line per run and a summary: each side's median images/s, the ratio
python / dsbench per round and overall, and the load average.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import dsrt


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--pipeline", default="227", choices=["227", "32"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dsbench", default=os.path.join(here, "..", "..", "build", "tools", "dsbench"))
    ap.add_argument("--views", action="store_true")
    a = ap.parse_args()
    if a.views:
        import torch

    def run_dsbench():
        out = subprocess.run([a.dsbench, a.data, "--pipeline", a.pipeline, "--threads",
                              str(a.workers), "--batch", str(a.batch), "--epochs", str(a.epochs),
                              "--json"], capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]

    ds = dsrt.Datastore(a.data)

    def run_python():
        rates = []
        with dsrt.Pipeline(ds, preset=a.pipeline, batch=a.batch, epochs=a.epochs,
                           workers=a.workers) as p:
            for _ in range(a.epochs):
                t0 = time.perf_counter()
                n = 0
                for b in p:
                    if a.views:
                        x = torch.from_dlpack(b.images)
                        y = torch.from_dlpack(b.labels)
                        del x, y
                    n += len(b)
                del b
                rates.append(n / (time.perf_counter() - t0))
        return statistics.median(rates[1:] if len(rates) > 1 else rates)

    c, py, ratios, loads = [], [], [], []
    for r in range(a.rounds):
        first, second = (run_dsbench, run_python) if r % 2 == 0 else (run_python, run_dsbench)
        x = first()
        loads.append(os.getloadavg()[0])
        y = second()
        loads.append(os.getloadavg()[0])
        rc, rp = (x, y) if first is run_dsbench else (y, x)
        c.append(rc)
        py.append(rp)
        ratios.append(rp / rc)
        print(json.dumps({"round": r, "dsbench_images_per_s": round(rc, 1),
                          "python_images_per_s": round(rp, 1), "ratio": round(rp / rc, 3)}),
              flush=True)
    print(json.dumps({
        "pipeline": a.pipeline, "workers": a.workers, "batch": a.batch, "epochs": a.epochs,
        "images": len(ds), "views": a.views,
        "dsbench_images_per_s": round(statistics.median(c), 1),
        "python_images_per_s": round(statistics.median(py), 1),
        "ratio": round(statistics.median(py) / statistics.median(c), 3),
        "round_ratios": [round(x, 3) for x in ratios],
        "load_average": [round(min(loads), 2), round(max(loads), 2)],
    }))


if __name__ == "__main__":
    main()
