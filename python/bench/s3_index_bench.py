#!/usr/bin/env python3
"""Index time of a large prefix in object storage: what dsrt adds to the store.

    python/bench/s3_index_bench.py [--keys 100000] [--small 10000] [--rounds 3]
                                   [--latency-ms 0,20] [--build build]

Runs tests/s3_server.py (moto's S3 under waitress, signatures checked, behind
its proxy) with a bucket of --keys objects in 100 class folders
(s3://big/keys/cNNN/...) and one of --small (s3://small/keys/...). For each
latency the proxy adds to every request, and in each round, interleaved:

  dsrt        dsbench s3://big/keys --index (the concurrent listing: the
              prefix with delimiter '/', then the 100 class folders at once)
  boto3       boto3's list_objects_v2 paginator over the same prefix, as a
              boto3 user lists it (one page after the other)
  boto3-split the requests dsrt makes, made by boto3 one after the other

Each line gives the wall time, the requests, and store_s: the time moto
itself had a request to answer (measured by the proxy, without the added
latency), so that wall - store_s is what the client and the latency add;
for dsrt also cpu_s, the CPU time of the dsbench process. Then moto's own
cost of one page of 100 keys of one class folder, in the small bucket and
in the big one (moto scans a bucket's every key for each page and sorts the
folder's, so a page costs more in a larger bucket). Prints JSON lines, with the load before each
round.

Needs the environment of scripts/s3-venv.sh (run it with that python) and a
built dsbench.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class Server:
    def __init__(self, args):
        cmd = [sys.executable, os.path.join(SOURCE, "tests", "s3_server.py"),
               "--fill", "big/keys", str(args.keys), "--fill", "small/keys", str(args.small)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.proc.stdout.readline())

    def command(self, words):
        self.proc.stdin.write(words + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def counters(self):
        words = self.command("requests").split()
        return {words[i]: float(words[i + 1]) for i in range(0, len(words) - 1, 2)}

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def measured(server, fn):
    """Runs fn() and returns (its result, wall s, requests, store s)."""
    assert server.command("clear") == "ok"
    before = server.counters()
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    after = server.counters()
    return out, wall, int(after["requests"] - before["requests"]), after["busy_ms"] / 1e3


def run_dsbench(dsbench, url):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([dsbench, url, "--index", "--json"], capture_output=True, text=True,
                         check=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return d["images"], d["scan_s"], cpu


def boto3_flat(s3, bucket, prefix):
    n = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        n += len(page.get("Contents", []))
    return n


def boto3_split(s3, bucket, prefix):
    """The requests of dsrt's listing, one after the other."""
    first = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/")
    n = len(first.get("Contents", []))
    for cp in first.get("CommonPrefixes", []):
        n += boto3_flat(s3, bucket, cp["Prefix"])
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=100000)
    ap.add_argument("--small", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", default="0,20")
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))
    args = ap.parse_args()
    dsbench = os.path.join(args.build, "tools", "dsbench")
    import boto3
    from botocore.config import Config

    t0 = time.perf_counter()
    server = Server(args)
    info = server.info
    os.environ.update(AWS_ACCESS_KEY_ID=info["key"], AWS_SECRET_ACCESS_KEY=info["secret"],
                      AWS_REGION="us-east-1", AWS_ENDPOINT_URL=info["proxy"],
                      AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")
    s3 = boto3.client("s3", endpoint_url=info["proxy"], region_name="us-east-1",
                      aws_access_key_id=info["key"], aws_secret_access_key=info["secret"],
                      config=Config(retries={"max_attempts": 1}))
    print(json.dumps({"store": "moto S3 under waitress, signatures checked, behind the proxy",
                      "keys": args.keys, "classes": 100, "setup_s": round(time.perf_counter() - t0, 1)}),
          flush=True)
    try:
        for latency in [float(x) for x in args.latency_ms.split(",")]:
            assert server.command(f"latency {latency}") == "ok"
            for r in range(args.rounds):
                print(json.dumps({"round": r, "latency_ms": latency, "load": load()}), flush=True)
                (n, scan, cpu), wall, req, store = measured(
                    server, lambda: run_dsbench(dsbench, "s3://big/keys"))
                print(json.dumps({"client": "dsrt", "latency_ms": latency, "keys": n,
                                  "index_s": round(scan, 3), "wall_s": round(wall, 3),
                                  "requests": req, "store_s": round(store, 3),
                                  "cpu_s": round(cpu, 3)}), flush=True)
                for name, fn in (("boto3", boto3_flat), ("boto3-split", boto3_split)):
                    n, wall, req, store = measured(server, lambda: fn(s3, "big", "keys/"))
                    print(json.dumps({"client": name, "latency_ms": latency, "keys": n,
                                      "wall_s": round(wall, 3), "requests": req,
                                      "store_s": round(store, 3)}), flush=True)
        # moto's own cost of a page, against the bucket's size.
        assert server.command("latency 0") == "ok"
        for bucket, size in (("small", args.small), ("big", args.keys)):
            costs = []
            for c in range(5):
                _, _, _, store = measured(server, lambda: s3.list_objects_v2(
                    Bucket=bucket, Prefix=f"keys/c{c:03d}/", MaxKeys=100))
                costs.append(store)
            costs.sort()
            print(json.dumps({"page_keys": 100, "class_keys": size // 100, "bucket_keys": size,
                              "store_ms_median": round(costs[len(costs) // 2] * 1e3, 1)}),
                  flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
