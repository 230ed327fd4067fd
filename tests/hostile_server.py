#!/usr/bin/env python3
"""A badly behaved HTTP server on 127.0.0.1 for dsrt's object-storage tests:
the answers a real store never gives but a network may (a captive portal, a
proxy, a server that drips or never ends), each from a bucket of its own, so
that s3://BUCKET/... (with AWS_ENDPOINT_URL pointing here, path-style) and
http://127.0.0.1:PORT/BUCKET/... reach it. Only the standard library.

    hostile_server.py [--root DIR]

Buckets (the first component of the path):

    files     the files under --root, with Range (206, 416), the query ignored
    html      200 text/html: a captive portal's sign-in page, for anything
    mixed     listings: prefix "x/" holds x/a/1.jpg, x/b/2.jpg and x/t.tar (and
              the sub-prefixes x/a/ and x/b/ with delimiter '/'); the listing
              of x/b/ is the portal's page
    loop      listings: one key, truncated, and the same continuation token
              every time
    walk      listings: one key, truncated, a new continuation token every time
    stall     never answers (the connection is held until the client leaves)
    drip      200 with a Content-Length of 1000, one byte every half second
    echo      403 AccessDenied whose message repeats the request's headers
              and its session token
    nobucket  404 NoSuchBucket
    endless   listings: set/shard-000000.tar of 10240 bytes; its GET is a 200
              without a length that never ends (the Range ignored); any other
              key 404 NoSuchKey
    endlessindex  the same with set/dsrt-shards.index of 100 bytes, whose GET
              never ends either

When ready it prints {"port": P} on a line, then takes commands on standard
input, one a line: "count" answers "requests N sent B" (requests since the
last clear, bytes of bodies sent); "clear" zeroes them and answers "ok". It
exits when standard input closes.
"""
import argparse
import http.server
import json
import os
import sys
import threading
import time
import urllib.parse

PORTAL = (b"<!DOCTYPE html>\n<html><head><title>Wi-Fi sign-in</title></head>\n"
          b"<body><h1>Welcome to Hotel Wi-Fi</h1><form action='/login?X-Amz-Security-Token="
          b"portalsecret123'>Room number <input name=room></form></body></html>\n")
NS = "http://s3.amazonaws.com/doc/2006-03-01/"

state = {"requests": 0, "sent": 0}
lock = threading.Lock()


def listing(keys, prefixes=(), token=None):
    parts = [f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{NS}">',
             "<EncodingType>url</EncodingType>",
             f"<IsTruncated>{'true' if token else 'false'}</IsTruncated>"]
    for key, size in keys:
        parts.append(f"<Contents><Key>{urllib.parse.quote(key)}</Key><Size>{size}</Size></Contents>")
    for p in prefixes:
        parts.append(f"<CommonPrefixes><Prefix>{urllib.parse.quote(p)}</Prefix></CommonPrefixes>")
    if token:
        parts.append(f"<NextContinuationToken>{token}</NextContinuationToken>")
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


def s3_error(code, message):
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>").encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = "."

    def log_message(self, *args):
        pass

    def send(self, status, body, ctype="application/xml", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
        with lock:
            state["sent"] += len(body)

    def do_GET(self):
        with lock:
            state["requests"] += 1
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        parts = url.path.lstrip("/").split("/", 1)
        bucket, key = parts[0], urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
        listing_asked = "list-type" in query
        prefix = query.get("prefix", [""])[0]
        delimited = "delimiter" in query
        try:
            getattr(self, "bucket_" + bucket, self.bucket_unknown)(key, listing_asked, prefix,
                                                                    delimited, query)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def bucket_unknown(self, key, *_):
        self.send(404, s3_error("NoSuchBucket", "The specified bucket does not exist"))

    def bucket_nobucket(self, key, *_):
        self.bucket_unknown(key)

    def bucket_files(self, key, *_):
        path = os.path.join(self.root, key)
        if not key or not os.path.isfile(path):
            self.send(404, s3_error("NoSuchKey", "The specified key does not exist."))
            return
        with open(path, "rb") as f:
            data = f.read()
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            a = int(a)
            b = int(b) if b else len(data) - 1
            if a >= len(data):
                self.send(416, s3_error("InvalidRange", "The requested range is not satisfiable"),
                          headers=[("Content-Range", f"bytes */{len(data)}")])
                return
            b = min(b, len(data) - 1)
            self.send(206, data[a:b + 1], "application/octet-stream",
                      headers=[("Content-Range", f"bytes {a}-{b}/{len(data)}")])
            return
        self.send(200, data, "application/octet-stream")

    def bucket_html(self, *_):
        self.send(200, PORTAL, "text/html; charset=utf-8")

    def bucket_mixed(self, key, listing_asked, prefix, delimited, query):
        if not listing_asked:
            self.send(404, s3_error("NoSuchKey", "The specified key does not exist."))
        elif prefix == "x/b/":
            self.bucket_html()
        elif delimited:
            self.send(200, listing([("x/t.tar", 10)], ["x/a/", "x/b/"]))
        elif prefix == "x/a/":
            self.send(200, listing([("x/a/1.jpg", 10)]))
        else:
            self.send(200, listing([("x/a/1.jpg", 10), ("x/b/2.jpg", 10), ("x/t.tar", 10)]))

    def bucket_loop(self, key, listing_asked, prefix, *_):
        if not listing_asked:
            self.send(404, s3_error("NoSuchKey", "The specified key does not exist."))
            return
        self.send(200, listing([(prefix + "a/1.jpg", 10), (prefix + "t.tar", 10)],
                               token="c2FtZS10b2tlbg=="))

    def bucket_walk(self, key, listing_asked, prefix, delimited, query):
        if not listing_asked:
            self.send(404, s3_error("NoSuchKey", "The specified key does not exist."))
            return
        n = int(query.get("continuation-token", ["t0"])[0][1:]) + 1
        self.send(200, listing([(f"{prefix}a/{n:08d}.jpg", 10), (prefix + "t.tar", 10)],
                               token=f"t{n}"))

    def bucket_stall(self, *_):
        # Until the client closes the connection (or ten minutes).
        self.connection.settimeout(600)
        try:
            while self.connection.recv(1 << 16):
                pass
        except OSError:
            pass
        self.close_connection = True

    def bucket_drip(self, *_):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(1000):
            self.wfile.write(b"x")
            self.wfile.flush()
            with lock:
                state["sent"] += 1
            time.sleep(0.5)

    def bucket_echo(self, key, *_):
        headers = "; ".join(f"{k}: {v}" for k, v in self.headers.items())
        token = self.headers.get("x-amz-security-token", "")
        auth = self.headers.get("Authorization", "")
        key = auth.partition("Credential=")[2].partition("/")[0]
        message = (f"Token {token} of key {key} is not allowed here; {self.command} {self.path} "
                   f"with {headers}")
        message = message.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.send(403, s3_error("AccessDenied", message))

    def bucket_endless(self, key, listing_asked, prefix, *_, index=False):
        endless = ["set/shard-000000.tar"] + (["set/dsrt-shards.index"] if index else [])
        if listing_asked:
            keys = [("set/shard-000000.tar", 10240)] + ([("set/dsrt-shards.index", 100)]
                                                       if index else [])
            self.send(200, listing(keys if "set/".startswith(prefix) or prefix.startswith("set/")
                                   else []))
            return
        if key not in endless:
            self.send(404, s3_error("NoSuchKey", "The specified key does not exist."))
            return
        # HTTP/1.0-style: no length, the body ends when the connection does.
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        block = bytes(1 << 16)
        while True:
            self.wfile.write(block)
            with lock:
                state["sent"] += len(block)

    def bucket_endlessindex(self, key, listing_asked, prefix, *rest):
        self.bucket_endless(key, listing_asked, prefix, *rest, index=True)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that drops its connection (dsrt stops a body it does not
        # want) is no news.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=".")
    args = ap.parse_args()
    Handler.root = args.root
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        with lock:
            if words[0] == "count":
                reply = f"requests {state['requests']} sent {state['sent']}"
            elif words[0] == "clear":
                state["requests"] = state["sent"] = 0
                reply = "ok"
            else:
                reply = f"error: unknown command {line.strip()!r}"
        print(reply, flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
