#!/usr/bin/env python3
"""Object-storage benchmark: dsbench over s3://bench/photos against the same
folder read locally, and against a PyTorch DataLoader whose dataset fetches
each object with boto3 (s3_loader_boto3.py), 2 workers each, interleaved.

    /usr/bin/python3 python/bench/s3_bench.py [--photos DIR] [--rounds 3]
        [--latency-ms 20] [--cores split,shared] [--pipeline 227] [--epochs 3]
        [--nginx-cache] [--runs dsrt-local,dsrt-s3,torch-boto3]

The store is tests/s3_server.py (moto's S3 under waitress, signatures
checked) on 127.0.0.1, reached through its proxy, which holds every request
--latency-ms milliseconds. DIR (default /tmp/dsrt-photos) is made with
/work/shared/bench/make_photos.py --count 2000 when missing. With
--nginx-cache, nginx sits between the proxy and moto and serves every answer
moto gave once (the first epoch, a warm-up, fills it): a store that keeps up
with one client core, latency still added by the proxy; its CPU is counted
in the store's.

Two core budgets, each run in every round:
  split   the store (moto and its proxy) on CPU 1 alone, every client on
          CPU 0 alone, the local folder run included: as if the store were
          another machine, the client getting the same one core whether it
          reads the folder or the bucket
  shared  everything on every core (the store's CPU competes with the
          client's: moto spends about 1 ms of CPU a GET, more than dsrt's
          decode and augmentation of the image it serves)

Each run prints one JSON line: images/s (the median over the epochs after
the first, a warm-up), and for runs on the store the mean requests in
flight, bytes/s, the client's CPU time an image, the store's CPU time a
request (moto's process and the proxy's, from /proc) and the cores the
store kept busy. The load average is printed before each run: the machine
may be shared. A summary line a budget gives the median ratios, and
client_cpu_local_over_s3: the client's CPU an image reading the folder over
reading the bucket, the ratio dsrt would reach on a store that keeps up
(moto on one core does not: about 1 ms of CPU a GET caps it near 900
GET/s, below the rate of one client core). Needs Debian's python3-torch,
python3-torchvision, python3-boto3 (and nginx for --nginx-cache: all from
scripts/install-deps.sh --bench) and a built dsbench.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_s(pid):
    """User + system CPU seconds of a process (and 0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


class Server:
    def __init__(self, photos, latency_ms, cpus, nginx_cache):
        venv = subprocess.run(["bash", os.path.join(SOURCE, "scripts", "s3-venv.sh")],
                              capture_output=True, text=True, check=True)
        python = venv.stdout.strip().splitlines()[-1]
        cmd = [python, os.path.join(SOURCE, "tests", "s3_server.py"), "--upload", photos,
               "bench/photos", "--latency-ms", str(latency_ms)]
        if nginx_cache:
            cmd.append("--nginx-cache")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        self.info = json.loads(self.proc.stdout.readline())
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
            self.pids = [self.proc.pid] + [int(p) for p in f.read().split()]

    def command(self, words):
        self.proc.stdin.write(words + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def requests(self):
        return int(self.command("requests").split()[1])

    def cpu(self):
        return sum(cpu_s(p) for p in self.pids)

    def place(self, cpus):
        """Every thread of moto's process and of the proxy's onto cpus."""
        for pid in self.pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), cpus)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_json(cmd, cpus):
    """Runs cmd on cpus; its last JSON line, and its CPU seconds."""
    c0 = child_cpu()
    out = subprocess.run(cmd, capture_output=True, text=True,
                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    cpu = child_cpu() - c0
    if out.returncode != 0:
        sys.exit(f"s3_bench: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1]), cpu


def store_env(info):
    """The environment of a client of the server: its keys, its proxy."""
    os.environ.update(AWS_ACCESS_KEY_ID=info["key"], AWS_SECRET_ACCESS_KEY=info["secret"],
                      AWS_REGION="us-east-1", AWS_ENDPOINT_URL=info["proxy"],
                      AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")


def store_ready(args, who):
    """dsbench's path (exits when it is not built), the photos made when
    missing."""
    dsbench = os.path.join(args.build, "tools", "dsbench")
    if not os.access(dsbench, os.X_OK):
        sys.exit(f"{who}: build dsbench first ({dsbench})")
    if not os.path.isdir(args.photos):
        subprocess.run([sys.executable, "/work/shared/bench/make_photos.py", args.photos,
                        "--count", "2000"], check=True)
    return dsbench


def store_args(ap, rounds):
    """The options of the benchmarks on the store: the photos, rounds, the
    proxy's latency, dsbench's pipeline and epochs, the build."""
    ap.add_argument("--photos", default="/tmp/dsrt-photos")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--pipeline", default="227")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    store_args(ap, 3)
    ap.add_argument("--cores", default="split,shared")
    ap.add_argument("--nginx-cache", action="store_true")
    ap.add_argument("--runs", default="dsrt-local,dsrt-s3,torch-boto3")
    args = ap.parse_args()
    wanted = args.runs.split(",")
    dsbench = store_ready(args, "s3_bench")
    budgets = args.cores.split(",")
    everything = set(range(os.cpu_count()))
    if "split" in budgets and len(everything) < 2:
        sys.exit("s3_bench: the split budget needs 2 CPUs")
    server = Server(args.photos, args.latency_ms, everything, args.nginx_cache)
    info = server.info
    store_env(info)
    common = ["--pipeline", args.pipeline, "--threads", "2", "--epochs", str(args.epochs), "--json"]
    store = "moto S3 under waitress, signatures checked"
    if args.nginx_cache:
        store = "nginx caching moto's answers (moto under waitress, signatures checked)"
    print(json.dumps({"store": store,
                      "latency_ms": args.latency_ms, "photos": args.photos, "budgets": budgets}),
          flush=True)
    rates, cpus = {}, {}
    try:
        for r in range(args.rounds):
            for budget in budgets:
                # dsbench pins its workers inside the cores it is given.
                server.place({1} if budget == "split" else everything)
                client = {0} if budget == "split" else None
                runs = [("dsrt-local", [dsbench, args.photos] + common),
                        ("dsrt-s3", [dsbench, "s3://bench/photos"] + common),
                        ("torch-boto3", ["/usr/bin/python3",
                                         os.path.join(SOURCE, "python", "bench",
                                                      "s3_loader_boto3.py"), "s3://bench/photos",
                                         "--pipeline", args.pipeline, "--workers", "2",
                                         "--epochs", str(args.epochs)])]
                for name, cmd in [run for run in runs if run[0] in wanted]:
                    before = load()
                    req0, scpu0 = server.requests(), server.cpu()
                    t0 = time.perf_counter()
                    d, cpu = run_json(cmd, client)
                    wall = time.perf_counter() - t0
                    req, scpu = server.requests() - req0, server.cpu() - scpu0
                    images = d.get("delivered") or d["images"] * args.epochs
                    line = {"round": r, "budget": budget, "run": name, "load": before,
                            "images_per_s": d["images_per_s"], "wall_s": round(wall, 2),
                            "client_cpu_ms_per_image": round(1e3 * cpu / images, 3)}
                    if req:
                        # Near 1 on the split budget: the store's core is the limit.
                        line["store_cpu_ms_per_request"] = round(1e3 * scpu / req, 3)
                        line["store_cores_busy"] = round(scpu / wall, 2)
                    if "remote" in d:
                        line["in_flight"] = d["remote"]["in_flight"]
                        line["bytes_per_s"] = d.get("bytes_per_s")
                    print(json.dumps(line), flush=True)
                    rates.setdefault((budget, name), []).append(d["images_per_s"])
                    cpus.setdefault((budget, name), []).append(cpu / images)
        for budget in budgets:
            med = {name: statistics.median(rates[(budget, name)])
                   for name in wanted if (budget, name) in rates}
            summary = {"budget": budget}
            for name, key in (("dsrt-s3", "dsrt_s3_images_per_s"),
                              ("dsrt-local", "dsrt_local_images_per_s"),
                              ("torch-boto3", "torch_boto3_images_per_s")):
                if name in med:
                    summary[key] = med[name]
            if "dsrt-s3" in med and "dsrt-local" in med:
                # What dsrt's client adds, apart from the store: its CPU an
                # image reading the bucket against reading the folder (the
                # ratio the s3 run would reach on a store that keeps up).
                cpu_local = statistics.median(cpus[(budget, "dsrt-local")])
                cpu_s3 = statistics.median(cpus[(budget, "dsrt-s3")])
                summary["client_cpu_local_over_s3"] = round(cpu_local / cpu_s3, 3)
                summary["s3_over_local"] = round(med["dsrt-s3"] / med["dsrt-local"], 3)
            if "dsrt-s3" in med and "torch-boto3" in med:
                summary["s3_over_torch_boto3"] = round(med["dsrt-s3"] / med["torch-boto3"], 2)
            summary["load"] = load()
            print(json.dumps(summary), flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
