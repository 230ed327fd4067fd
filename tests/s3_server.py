#!/usr/bin/env python3
"""A real S3-compatible server on 127.0.0.1 for dsrt's object-storage tests
and benchmarks: moto's S3 (moto[server], installed into a virtual
environment by scripts/s3-venv.sh) served by waitress, with a proxy in front of it that can add
latency and inject faults.

    s3_server.py [--upload DIR BUCKET/PREFIX]... [--public BUCKET]...
                 [--fill BUCKET/PREFIX N] [--latency-ms MS] [--nginx-cache]

Both listen on ports the kernel picks. Set-up runs unauthenticated (an IAM
user with an S3 policy and its access key, a role assumed for temporary
credentials with a session token, buckets, objects, public-read policies);
then moto is told to check every request's signature, so a wrong key is
refused as AWS refuses it. When ready the server prints one JSON line:

    {"endpoint": "http://127.0.0.1:P", "proxy": "http://127.0.0.1:Q",
     "key": ..., "secret": ..., "session_key": ..., "session_secret": ...,
     "session_token": ..., "session2_key": ..., ...}

(two sets of temporary credentials, session and session2).

and then takes commands on standard input, one a line, answering "ok":

    latency MS    the proxy holds each request MS milliseconds
    fail CODE N   the proxy answers the next N requests itself with CODE
                  (429, 500, 503: an S3 XML error, as a throttled store does)
    reset N       the proxy resets the connection of the next N requests
    stall N       the proxy never answers the next N requests
    requests      answers "requests N signed S connections C most_open M
                  busy_ms B refused R": requests forwarded (S of them signed),
                  connections accepted, most open at once of those accepted
                  since the last clear, and the milliseconds since the last
                  clear during which moto had a request to answer (its own
                  time, without the latency added here), and the requests
                  refused for an expired token
    hold-after N  forward N more requests, then hold every later one unanswered
    expire-token T  the proxy answers every request signed with session token
                  T itself: 400 ExpiredToken, as a store does once it expired
    clear         drops the faults not yet used and any hold, and starts
                  counting open connections afresh
    auth on|off   moto checks signatures (the default after set-up), or not
                  (moto answers unsigned requests with 500 while it checks)
    put B K TEXT  stores TEXT as key K of bucket B straight into moto's backend
                  (keys no client would send as they are: "a/../b")
    copy B K B2 K2  stores the bytes of key K of bucket B as key K2 of bucket
                  B2 (an object re-uploaded with other bytes: a new ETag)

It exits when standard input closes, so a test that dies takes it along.

--nginx-cache (benchmarks only, never the tests) puts nginx (Debian's
nginx-light) between the proxy and moto, caching every answer moto gave
once: a store whose front end keeps up with the client (moto spends about
1 ms of CPU a request, which caps it near 1000 requests/s a core). A cached
answer is served without its signature being checked again.
"""
import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

REGION = "us-east-1"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upload", nargs=2, action="append", default=[], metavar=("DIR", "DEST"))
    ap.add_argument("--public", action="append", default=[], metavar="BUCKET")
    ap.add_argument("--fill", nargs=2, action="append", default=[], metavar=("DEST", "N"))
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--nginx-cache", action="store_true")
    return ap.parse_args()


# ----------------------------------------------------------------------------
# Set-up, through boto3 against the server itself


def client(endpoint, service, **creds):
    import boto3

    from botocore.config import Config

    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        config=Config(retries={"max_attempts": 1}, read_timeout=30),
                        aws_access_key_id=creds.get("key", "setup"),
                        aws_secret_access_key=creds.get("secret", "setup"),
                        aws_session_token=creds.get("token"))


def split_dest(dest):
    bucket, _, prefix = dest.partition("/")
    return bucket, prefix.strip("/")


def ensure_bucket(s3, bucket, made):
    if bucket not in made:
        s3.create_bucket(Bucket=bucket)
        made.add(bucket)


def upload_dir(s3, local, dest, made, public):
    bucket, prefix = split_dest(dest)
    ensure_bucket(s3, bucket, made)
    acl = {"ACL": "public-read"} if bucket in public else {}
    for root, dirs, files in os.walk(local):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, local).replace(os.sep, "/")
            key = f"{prefix}/{rel}" if prefix else rel
            with open(path, "rb") as f:
                s3.put_object(Bucket=bucket, Key=key, Body=f.read(), **acl)
        # An empty folder becomes a folder marker, as consoles make them
        # (straight into the backend: waitress and moto disagree on empty PUTs).
        for d in dirs:
            sub = os.path.join(root, d)
            if not os.listdir(sub):
                rel = os.path.relpath(sub, local).replace(os.sep, "/")
                backend().put_object(bucket, f"{prefix}/{rel}/" if prefix else rel + "/", b"")


def backend():
    from moto.s3.models import s3_backends

    return s3_backends["123456789012"]["aws"]


def fill_keys(dest, count, made, s3):
    """Many small objects straight into moto's backend: a listing benchmark
    needs 100 000 keys, which would take minutes through the HTTP API."""
    bucket, prefix = split_dest(dest)
    ensure_bucket(s3, bucket, made)
    b = backend()
    for i in range(count):
        cls = i * 100 // count
        b.put_object(bucket, f"{prefix}/c{cls:03d}/{i:08d}.jpg", b"x")


def make_public(s3, bucket):
    """Anyone may list the bucket and read the objects uploaded to it."""
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")


def make_credentials(endpoint):
    iam = client(endpoint, "iam")
    iam.create_user(UserName="dsrt-reader")
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:*", "sts:AssumeRole"], "Resource": "*"}]}
    iam.put_user_policy(UserName="dsrt-reader", PolicyName="read",
                        PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="dsrt-reader")["AccessKey"]
    trust = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
        "Action": "sts:AssumeRole"}]}
    role = iam.create_role(RoleName="dsrt-role", AssumeRolePolicyDocument=json.dumps(trust))
    iam.put_role_policy(RoleName="dsrt-role", PolicyName="read",
                        PolicyDocument=json.dumps(policy))
    sts = client(endpoint, "sts", key=key["AccessKeyId"], secret=key["SecretAccessKey"])
    out = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    # Two sessions: a test expires the first and renews with the second.
    for n, name in ((1, "session"), (2, "session2")):
        temp = sts.assume_role(RoleArn=role["Role"]["Arn"],
                               RoleSessionName=f"dsrt{n}")["Credentials"]
        out.update({f"{name}_key": temp["AccessKeyId"], f"{name}_secret": temp["SecretAccessKey"],
                    f"{name}_token": temp["SessionToken"]})
    return out


# ----------------------------------------------------------------------------
# The proxy: latency and faults between the client and moto


ERRORS = {
    "fail": (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b'<Message>Please reduce your request rate.</Message></Error>'),
    "expired": (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ExpiredToken</Code>'
                b'<Message>The provided token has expired.</Message></Error>'),
}


class Proxy:
    def __init__(self, upstream_port, latency_ms):
        self.upstream_port = upstream_port
        self.latency = latency_ms / 1000.0
        self.faults = []  # (kind, code) for the next requests, in order
        self.forwarded = 0
        self.signed = 0
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.hold_after = None  # forward this many more requests, then hold the rest
        self.expired = []  # session tokens refused as expired (bytes)
        self.refused = 0  # requests refused for them
        self.gen = 0  # clears so far
        # The store's own time: while at least one forwarded request has no
        # answer yet (latency added here is not in it), since the last clear.
        self.waiting = 0
        self.busy_since = 0.0
        self.busy = 0.0

    def take_fault(self):
        return self.faults.pop(0) if self.faults else None

    async def handle(self, creader, cwriter):
        # Connections are counted from the last clear: one accepted before it
        # is not counted as open after it, however late its close is seen.
        gen = self.gen
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await self.serve(creader, cwriter)
        finally:
            if gen == self.gen:
                self.open -= 1

    def answer_started(self, conn):
        if conn["waiting"] > 0:
            conn["waiting"] -= 1
            self.waiting -= 1
            if self.waiting == 0:
                self.busy += time.monotonic() - self.busy_since

    async def serve(self, creader, cwriter):
        try:
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cwriter.close()
            return
        conn = {"waiting": 0, "gen": self.gen}  # requests forwarded, not yet answered
        pump = asyncio.ensure_future(self.pump(ureader, cwriter, lambda: self.answer_started(conn)))
        try:
            while True:
                data = await creader.read(1 << 16)
                if not data:
                    break
                if self.latency > 0:
                    await asyncio.sleep(self.latency)
                if self.hold_after is not None:
                    if self.hold_after == 0:
                        while await creader.read(1 << 16):
                            pass
                        break
                    self.hold_after -= 1
                fault = self.take_fault()
                if fault is None and any(t in data for t in self.expired):
                    fault = ("expired", 400)
                    self.refused += 1
                if fault is None:
                    self.forwarded += 1
                    self.signed += b"\nauthorization:" in data.lower()
                    if self.waiting == 0:
                        self.busy_since = time.monotonic()
                    self.waiting += 1
                    conn["waiting"] += 1
                    uwriter.write(data)
                    await uwriter.drain()
                elif fault[0] in ("fail", "expired"):
                    body = ERRORS[fault[0]]
                    head = (f"HTTP/1.1 {fault[1]} Injected\r\nContent-Type: application/xml\r\n"
                            f"Content-Length: {len(body)}\r\n\r\n").encode()
                    cwriter.write(head + body)
                    await cwriter.drain()
                elif fault[0] == "reset":
                    sock = cwriter.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                    cwriter.transport.abort()
                    break
                else:  # stall: swallow this request and every later byte of the connection
                    while await creader.read(1 << 16):
                        pass
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            pump.cancel()
            while conn["waiting"] > 0:  # never answered
                self.answer_started(conn)
            uwriter.close()
            cwriter.close()

    @staticmethod
    async def pump(src, dst, started):
        try:
            while True:
                data = await src.read(1 << 16)
                if not data:
                    break
                started()
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            dst.close()


def run_proxy(upstream_port, latency_ms, conn):
    """The proxy's own process (moto's requests hold the GIL long enough to
    add their own latency to the proxy's): takes commands on conn."""
    # Ends with the server, however the server ends (a test may SIGKILL it).
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(0)
    proxy = Proxy(upstream_port, latency_ms)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(asyncio.start_server(proxy.handle, "127.0.0.1", 0))
    conn.send(server.sockets[0].getsockname()[1])

    def command():
        try:
            words = conn.recv()
        except EOFError:
            loop.stop()
            return
        reply = "ok"
        if words[0] == "latency":
            proxy.latency = float(words[1]) / 1000.0
        elif words[0] == "fail":
            proxy.faults.extend([("fail", int(words[1]))] * int(words[2]))
        elif words[0] in ("reset", "stall"):
            proxy.faults.extend([(words[0], 0)] * int(words[1]))
        elif words[0] == "requests":
            busy = proxy.busy + (time.monotonic() - proxy.busy_since if proxy.waiting else 0)
            reply = (f"requests {proxy.forwarded} signed {proxy.signed} connections "
                     f"{proxy.connections} most_open {proxy.most_open} busy_ms {busy * 1e3:.1f} "
                     f"refused {proxy.refused}")
        elif words[0] == "clear":
            proxy.faults.clear()
            proxy.expired.clear()
            proxy.hold_after = None
            proxy.gen += 1
            proxy.open = proxy.most_open = 0
            proxy.busy = 0.0
            proxy.busy_since = time.monotonic()
        elif words[0] == "hold-after":
            proxy.hold_after = int(words[1])
        elif words[0] == "expire-token":
            proxy.expired.append(words[1].encode())
        conn.send(reply)

    loop.add_reader(conn.fileno(), command)
    loop.run_forever()
    os._exit(0)


# ----------------------------------------------------------------------------
# nginx caching moto's answers (--nginx-cache)

NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid nginx.pid;
error_log stderr warn;
events { worker_connections 8192; }
http {
    access_log off;
    proxy_cache_path cache levels=1:2 keys_zone=s3:32m max_size=8g inactive=1d use_temp_path=off;
    upstream moto { server 127.0.0.1:%(upstream)d; keepalive 64; }
    server {
        listen 127.0.0.1:%(port)d backlog=4096;
        keepalive_requests 10000000;
        keepalive_timeout 600s;
        location / {
            proxy_pass http://moto;
            proxy_http_version 1.1;
            # What the client signed reaches moto unchanged.
            proxy_set_header Host $http_host;
            proxy_set_header Connection "";
            proxy_set_header Range $http_range;
            proxy_cache s3;
            proxy_cache_key "$request_method $request_uri $http_range";
            proxy_cache_methods GET HEAD;
            proxy_cache_valid 200 206 1d;
            proxy_ignore_headers Cache-Control Expires Set-Cookie Vary X-Accel-Expires;
        }
    }
}
"""


def start_nginx_cache(upstream_port):
    """Starts nginx in front of moto's port; returns (process, its port, its folder)."""
    import tempfile

    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(exe, os.X_OK):
        sys.exit("s3_server: --nginx-cache needs nginx "
                 "(scripts/install-deps.sh --bench installs nginx-light)")
    home = tempfile.mkdtemp(prefix="dsrt-s3-nginx-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(os.path.join(home, "nginx.conf"), "w") as f:
        f.write(NGINX_CONF % {"upstream": int(upstream_port), "port": port})

    def die_with_us():
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    proc = subprocess.Popen([exe, "-p", home + "/", "-c", "nginx.conf", "-e", "stderr"],
                            preexec_fn=die_with_us)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port, home
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"s3_server: nginx did not start (folder {home})")
            time.sleep(0.05)


# ----------------------------------------------------------------------------


def main():
    args = parse_args()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    logging.getLogger("waitress").setLevel(logging.ERROR)
    import requests
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from waitress.server import create_server

    # moto's application under waitress, which keeps connections alive
    # (moto's own werkzeug server closes each one after its answer).
    # Set-up (IAM, STS, moto's own API) goes through the dispatcher of every
    # service; the S3 endpoint serves moto's S3 application alone, which
    # spares each request the dispatcher's search. Both share moto's state.
    def serve(application):
        server = create_server(application, host="127.0.0.1", port=0, threads=4,
                               connection_limit=4096, backlog=1024, channel_timeout=600,
                               asyncore_use_poll=True)
        threading.Thread(target=server.run, daemon=True).start()
        return server.effective_port

    def raw_uri(application):
        """moto matches keys on the path as it arrived (RAW_URI, which
        werkzeug's server sets): waitress calls it REQUEST_URI."""
        def wrapped(environ, start_response):
            environ.setdefault("RAW_URI", environ.get("REQUEST_URI", ""))
            return application(environ, start_response)
        return wrapped

    setup = f"http://127.0.0.1:{serve(raw_uri(DomainDispatcherApplication(create_backend_app)))}"
    port = serve(raw_uri(create_backend_app("s3")))
    endpoint = f"http://127.0.0.1:{port}"

    creds = make_credentials(setup)
    s3 = client(endpoint, "s3")
    made = set()
    for bucket in args.public:
        ensure_bucket(s3, bucket, made)
    for local, dest in args.upload:
        upload_dir(s3, local, dest, made, args.public)
    for dest, n in args.fill:
        fill_keys(dest, int(n), made, s3)
    for bucket in args.public:
        make_public(s3, bucket)
    # From here on every request must be signed with a key moto knows.
    requests.post(f"{setup}/moto-api/reset-auth", data=b"0").raise_for_status()

    nginx, upstream = None, port
    if args.nginx_cache:
        nginx, upstream, nginx_home = start_nginx_cache(port)

    import multiprocessing

    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(
        target=run_proxy, args=(upstream, args.latency_ms, theirs), daemon=True)
    child.start()
    proxy_port = ours.recv()
    info = dict(creds, endpoint=endpoint, proxy=f"http://127.0.0.1:{proxy_port}", region=REGION,
                pid=os.getpid(), nginx_cache=bool(nginx))
    print(json.dumps(info), flush=True)

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "auth" and len(words) == 2:
            count = b"0" if words[1] == "on" else b"inf"
            requests.post(f"{setup}/moto-api/reset-auth", data=count).raise_for_status()
            reply = "ok"
        elif words[0] == "copy" and len(words) == 5:
            body = backend().get_object(words[1], words[2]).value
            backend().put_object(words[3], words[4], body)
            reply = "ok"
        elif words[0] == "put" and len(words) == 4:
            backend().put_object(words[1], words[2], words[3].encode())
            reply = "ok"
        elif words[0] in ("latency", "fail", "reset", "stall", "requests", "clear", "hold-after",
                          "expire-token"):
            ours.send(words)
            reply = ours.recv()
        else:
            reply = f"error: unknown command {line.strip()!r}"
        print(reply, flush=True)
    child.kill()
    if nginx:
        nginx.kill()
        nginx.wait()
        shutil.rmtree(nginx_home, ignore_errors=True)
    os._exit(0)


if __name__ == "__main__":
    main()
