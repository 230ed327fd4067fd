#!/usr/bin/env python3
"""The cache of remote bytes (--cache-dir): dsbench's epoch rate over
s3://bench/photos read through a cache, against the same photos in a local
folder and against the store without a cache, with the cache's limit at
25%, 100% and 200% of the data. The limit counts the entries' files, each
an object's bytes plus 168 bytes, its URL and 8 bytes every 64 KiB; 100%
is the data plus that margin (the README's advice), the others plain
fractions of the data.

    /usr/bin/python3 python/bench/s3_cache_bench.py [--photos DIR] [--rounds 2]
        [--latency-ms 20] [--pipeline 227] [--epochs 3] [--threads 2]

The store is tests/s3_server.py behind its proxy, which holds every request
--latency-ms milliseconds (s3_bench.py's Server). Each cached run starts on
an empty cache folder: a first dsbench run fills it (one epoch), a second
one is measured (its epochs read what the cache kept, the rest from the
store). images/s is dsbench's (the median of the epochs after the first).
Each run prints one JSON line with the store's requests, the cache's
counters and the client's CPU time an image; a summary gives the median
ratios cached/local and cached/uncached for each limit (the median of
the rounds' ratios), of the rates and of the CPU an image. The load average is printed with each run: the
machine may be shared. DIR (default /tmp/dsrt-photos) is made with
/work/shared/bench/make_photos.py --count 2000 when missing.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s3_bench import Server, load, run_json, store_args, store_env, store_ready  # noqa: E402


ENTRY_BYTES = 168  # cache.h's DSRT_CACHE_ENTRY_BYTES


def folder_bytes(path, url):
    """The bytes of the files under path, and what their cache entries
    take besides (as objects under url)."""
    data = margin = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            size = os.path.getsize(os.path.join(d, f))
            key = os.path.relpath(os.path.join(d, f), path)
            data += size
            margin += ENTRY_BYTES + len(f"{url}/{key}") + 8 * -(-size // 65536)
    return data, margin


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    store_args(ap, 2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    dsbench = store_ready(args, "s3_cache_bench")
    data, margin = folder_bytes(args.photos, "s3://bench/photos")
    server = Server(args.photos, args.latency_ms, set(range(os.cpu_count())), False)
    info = server.info
    store_env(info)
    common = ["--pipeline", args.pipeline, "--threads", str(args.threads), "--json"]
    epochs = ["--epochs", str(args.epochs)]
    print(json.dumps({"latency_ms": args.latency_ms, "photos": args.photos, "data_bytes": data,
                      "entry_margin_bytes": margin, "epochs": args.epochs,
                      "threads": args.threads}), flush=True)
    rates, cpus = {}, {}
    work = tempfile.mkdtemp(prefix="dsrt-cache-bench-")
    try:
        for r in range(args.rounds):
            runs = [("local", [dsbench, args.photos] + common + epochs, None),
                    ("s3", [dsbench, "s3://bench/photos"] + common + epochs, None)]
            for pct in (25, 100, 200):
                limit = data * pct // 100 + (margin if pct == 100 else 0)
                runs.append((f"cache{pct}", [dsbench, "s3://bench/photos"] + common + epochs,
                             limit))
            for name, cmd, limit in runs:
                if limit is not None:
                    cache = os.path.join(work, name)
                    shutil.rmtree(cache, ignore_errors=True)
                    extra = ["--cache-dir", cache, "--cache-limit", str(limit)]
                    run_json([dsbench, "s3://bench/photos"] + common + ["--epochs", "1"] + extra,
                             None)
                    cmd = cmd + extra
                before = load()
                req0 = server.requests()
                d, cpu = run_json(cmd, None)
                images = d.get("delivered") or d["images"] * args.epochs
                line = {"round": r, "run": name, "load": before,
                        "images_per_s": d["images_per_s"], "requests": server.requests() - req0,
                        "client_cpu_ms_per_image": round(1e3 * cpu / images, 3)}
                if "cache" in d:
                    line["cache"] = d["cache"]
                print(json.dumps(line), flush=True)
                rates.setdefault(name, []).append(d["images_per_s"])
                cpus.setdefault(name, []).append(cpu / images)
        med = {k: statistics.median(v) for k, v in rates.items()}
        summary = {"local_images_per_s": med["local"], "s3_images_per_s": med["s3"]}

        def ratio(a, b, per):
            # The median of the rounds' ratios: each round's runs are
            # neighbours in time, so a load that drifts cancels out.
            return round(statistics.median(x / y for x, y in zip(per[a], per[b])), 3)

        for pct in (25, 100, 200):
            c = f"cache{pct}"
            summary[f"{c}_images_per_s"] = med[c]
            summary[f"{c}_over_local"] = ratio(c, "local", rates)
            summary[f"{c}_over_s3"] = ratio(c, "s3", rates)
            # The client's CPU an image, local over cached: what the rate
            # ratio is where the cores are the client's alone; and the
            # store's over cached: a cache that holds part of the data
            # should cost no more an image than reading it all from there.
            summary[f"{c}_cpu_local_over_cached"] = ratio("local", c, cpus)
            summary[f"{c}_cpu_s3_over_cached"] = ratio("s3", c, cpus)
        summary["load"] = load()
        print(json.dumps(summary), flush=True)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
