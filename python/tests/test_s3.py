"""Tests of the dsrt Python package on object storage (run by CTest as test_python).

A real S3-compatible server runs on 127.0.0.1 for the whole module: moto's S3
with signatures checked, behind a proxy that can inject faults
(tests/s3_server.py, from the virtual environment scripts/s3-venv.sh makes).
A local folder is uploaded to s3://bkt/data; Datastore and Pipeline on the
prefix must give what they give on the folder (classes, counts, paths,
batches, dsbench's --checksum), a wrong key must raise a clear error before
any batch with no credential in it, faults the proxy injects must be retried
without a bad sample, and the remote keywords of Pipeline must be refused
before any thread starts when out of range. No outcome depends on timing.

The module is skipped only when the server's packages cannot be installed.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dsrt

sys.path.insert(0, os.path.dirname(__file__))
from test_dsrt import DSBENCH, _base, _threads, _write_images, dsbench_checksum, python_checksum

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# ----------------------------------------------------------------------------
# The data and the server


def _make_data(folder):
    _write_images(folder, 30, 3, seed=11)
    # A sub-folder (taken with include_subfolders), an image in the root
    # (in no class), a bad file and a class folder holding no image.
    os.makedirs(os.path.join(folder, "class1", "more"))
    shutil.copy(os.path.join(folder, "class1", "img011.jpg"),
                os.path.join(folder, "class1", "more", "copy + plus %25.jpg"))
    shutil.copy(os.path.join(folder, "class0", "img000.jpg"), os.path.join(folder, "root.jpg"))
    with open(os.path.join(folder, "class2", "bad.jpg"), "w") as f:
        f.write("not an image\n")
    os.makedirs(os.path.join(folder, "notes"))
    with open(os.path.join(folder, "notes", "readme.txt"), "w") as f:
        f.write("hello\n")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    path = os.path.join(_base(tmp_path_factory, "s3"), "data")
    shutil.rmtree(path, ignore_errors=True)
    _make_data(path)
    return path


class Server:
    """tests/s3_server.py as a child process; commands go to its standard input."""

    def __init__(self, local):
        venv = subprocess.run(["bash", os.path.join(SOURCE, "scripts", "s3-venv.sh")],
                              capture_output=True, text=True)
        python = venv.stdout.strip().splitlines()[-1] if venv.stdout.strip() else ""
        if venv.returncode != 0 or not os.access(python, os.X_OK):
            pytest.skip("the S3 test server could not be installed: " + venv.stderr[-500:])
        self.proc = subprocess.Popen(
            [python, os.path.join(SOURCE, "tests", "s3_server.py"), "--upload", local, "bkt/data"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            pytest.fail("the S3 test server did not start")
        self.info = json.loads(line)

    def command(self, words):
        self.proc.stdin.write(words + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def secrets(self):
        return [self.info[k] for k in ("key", "secret", "session_key", "session_secret",
                                       "session_token")]


@pytest.fixture(scope="module")
def server(local):
    s = Server(local)
    yield s
    s.close()


@pytest.fixture
def s3(server, monkeypatch):
    """The environment of an ordinary run (keys, moto behind its proxy, no
    AWS file), restored after the test."""
    info = server.info
    for name, value in [("AWS_ACCESS_KEY_ID", info["key"]),
                        ("AWS_SECRET_ACCESS_KEY", info["secret"]),
                        ("AWS_REGION", "us-east-1"), ("AWS_ENDPOINT_URL", info["proxy"]),
                        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"),
                        ("AWS_CONFIG_FILE", "/nonexistent/config")]:
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_NO_SIGN_REQUEST",
                 "DSRT_S3_ADDRESSING", "DSRT_S3_MAX_CONNECTIONS"):
        monkeypatch.delenv(name, raising=False)
    assert server.command("clear") == "ok"
    yield server
    server.command("clear")


def _no_secret(server, text):
    for s in server.secrets():
        assert s not in text, "a credential appears in a message"


# ----------------------------------------------------------------------------
# Same as the folder


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(include_subfolders=False),
    dict(labels="none"),
    dict(labels="parent", extensions="jpg"),
    dict(drop_empty_classes=True),
])
def test_same_index_as_the_folder(local, s3, kwargs):
    a = dsrt.Datastore(local, **kwargs)
    b = dsrt.Datastore("s3://bkt/data/", **kwargs)
    assert b.classes == a.classes
    assert len(b) == len(a) and b.class_counts() == a.class_counts()
    assert b.labels() == a.labels()
    assert [b.path(i)[len("s3://bkt/data"):] for i in range(len(b))] == \
        [a.path(i)[len(local):] for i in range(len(a))]


@pytest.mark.parametrize("workers", [1, 2])
def test_same_batches_as_the_folder(local, s3, workers):
    a, b = dsrt.Datastore(local), dsrt.Datastore("s3://bkt/data")
    opts = dict(preset="32", batch=5, epochs=2, seed=3, workers=workers)
    with dsrt.Pipeline(a, **opts) as p:
        local_sum = python_checksum(p)
    with dsrt.Pipeline(b, remote_depth=8, **opts) as p:
        remote_sum = python_checksum(p)
        s = p.stats()
    assert remote_sum == local_sum
    # The C tool over the prefix gives the same bytes.
    assert dsbench_checksum("s3://bkt/data", "--pipeline", "32", "--batch", "5", "--epochs", "2",
                            "--seed", "3", "--threads", str(workers)) == local_sum
    # One bad object (class2/bad.jpg), named by its URL like a bad file.
    assert s["bad_samples"] == 1
    assert [k for k, _ in s["bad_files"]] == ["s3://bkt/data/class2/bad.jpg"]
    # Every object fetched once an epoch, the sample that takes the bad
    # one's place once more, the bad one not again once known; no retry.
    assert 2 * len(b) - 1 <= s["remote_requests"] <= 2 * len(b) + 2
    assert s["remote_retries"] == 0
    assert s["remote_connections"] >= 1 and s["remote_in_flight"] > 0


def test_subsets_and_torch_loader(local, s3):
    import torch

    a, b = dsrt.Datastore(local), dsrt.Datastore("s3://bkt/data")
    sa, sb = a.partition(2, 1), b.partition(2, 1)
    assert len(sb) == len(sa) and sb.labels() == sa.labels()
    with dsrt.Pipeline(sa, preset="32", batch=4, epochs=1, seed=1, workers=2) as pa, \
         dsrt.Pipeline(sb, preset="32", batch=4, epochs=1, seed=1, workers=2) as pb:
        for (xa, ya), (xb, yb) in zip(dsrt.TorchLoader(pa), dsrt.TorchLoader(pb)):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_faults_are_retried(local, s3):
    a, b = dsrt.Datastore(local), dsrt.Datastore("s3://bkt/data")
    with dsrt.Pipeline(a, preset="32", batch=6, epochs=1, workers=2) as p:
        local_sum = python_checksum(p)
    for words in ("fail 503 3", "reset 2", "fail 429 2"):
        assert s3.command(words) == "ok"
    with dsrt.Pipeline(b, preset="32", batch=6, epochs=1, workers=2) as p:
        assert python_checksum(p) == local_sum
        s = p.stats()
    assert s["remote_retries"] >= 7 and s["bad_samples"] == 1


def test_cache(local, s3, tmp_path):
    # A first Pipeline fills the cache in its first epoch and reads its
    # second from it; a second Pipeline reads every object from it, with the
    # batches read without one. A cache folder that is a file is refused.
    b = dsrt.Datastore("s3://bkt/data")
    opts = dict(preset="32", batch=5, epochs=2, seed=3, workers=2)
    with dsrt.Pipeline(b, **opts) as p:
        plain = python_checksum(p)
    cache = str(tmp_path / "cache")
    for run in range(2):
        with dsrt.Pipeline(b, cache_dir=cache, cache_limit=1 << 30, **opts) as p:
            assert python_checksum(p) == plain
            s = p.stats()
        # The bad object is no image: it is fetched, kept and found bad once.
        assert s["cache_misses"] == (len(b) if run == 0 else 0)
        assert s["cache_hits"] >= len(b) - 1 and s["cache_bytes"] > 0
        assert s["remote_requests"] == s["cache_misses"]
        assert s["cache_evictions"] == 0
    # A limit of a quarter of that: the same batches; a second Pipeline
    # evicts nothing and reads each entry the first kept in both epochs.
    entries = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f.endswith(".e")]
    limit = sum(os.path.getsize(e) for e in entries) // 4
    small = str(tmp_path / "small")
    for run in range(2):
        kept = len([f for _, _, fs in os.walk(small) for f in fs if f.endswith(".e")])
        with dsrt.Pipeline(b, cache_dir=small, cache_limit=limit, **opts) as p:
            assert python_checksum(p) == plain
            s = p.stats()
        # (less one when the bad object is among them: found bad in the
        # first epoch, it is not read in the second)
        assert s["cache_evictions"] == 0 and s["cache_hits"] >= 2 * kept - 1
        assert sum(os.path.getsize(os.path.join(d, f))
                   for d, _, fs in os.walk(small) for f in fs if f.endswith(".e")) <= limit
    assert kept > 0
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="cache_dir: .*file: not a folder"):
        dsrt.Pipeline(b, cache_dir=str(tmp_path / "file"))


# ----------------------------------------------------------------------------
# Wrong keys, missing things


def test_wrong_key_raises_before_any_batch(local, s3, monkeypatch):
    # At the listing: the Datastore is refused.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    with pytest.raises(dsrt.Error) as e:
        dsrt.Datastore("s3://bkt/data")
    msg = str(e.value)
    assert "SignatureDoesNotMatch" in msg and "AWS_SECRET_ACCESS_KEY" in msg
    assert "s3://bkt/data" in msg and "wrong-secret" not in msg
    _no_secret(s3, msg + repr(e.value.args))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY0000000")
    with pytest.raises(dsrt.Error, match="InvalidAccessKeyId") as e:
        dsrt.Datastore("s3://bkt/data")
    assert "AKIANOSUCHKEY" not in str(e.value)

    # Keys that go bad after the listing: the first next() raises, no batch.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.info["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.info["secret"])
    ds = dsrt.Datastore("s3://bkt/data")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    with dsrt.Pipeline(ds, preset="32", batch=4, epochs=1, workers=2) as p:
        with pytest.raises(dsrt.Error) as e:
            p.next()
        s = p.stats()
    msg = str(e.value)
    assert "SignatureDoesNotMatch" in msg and "s3://bkt/data/" in msg
    assert "wrong-secret" not in msg
    _no_secret(s3, msg)
    assert s["batches"] == 0 and s["bad_samples"] == 0


def test_missing_things(s3, monkeypatch):
    with pytest.raises(dsrt.Error, match="nosuchbucket.*does not exist"):
        dsrt.Datastore("s3://nosuchbucket/data")
    with pytest.raises(dsrt.Error, match="no object under this prefix"):
        dsrt.Datastore("s3://bkt/nothing-here")
    with pytest.raises(FileNotFoundError, match="s3://bkt/data/nosuch.csv"):
        dsrt.Datastore("s3://bkt/data/nosuch.csv")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY"):
        dsrt.Datastore("s3://bkt/data")


# ----------------------------------------------------------------------------
# Remote keywords


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(remote_depth=0), r"remote.depth: 0: not in \[1, 4096\]"),
        (dict(remote_depth=5000), r"remote.depth: 5000"),
        (dict(max_connections=5000), r"remote.max_connections: 5000"),
        (dict(retry_deadline=-1), r"remote.retry_deadline_s: -1"),
        (dict(retry_deadline=float("nan")), r"remote.retry_deadline_s: nan"),
        (dict(retry_deadline=1e9), r"remote.retry_deadline_s: 1e\+09"),
        (dict(request_timeout=0), r"remote.timeout_s: 0"),
        (dict(request_timeout=float("inf")), r"remote.timeout_s: inf"),
        (dict(remote_depth=-1), "remote_depth: -1: must not be negative"),
    ],
)
def test_remote_options_refused_before_work(local, s3, kwargs, message):
    ds = dsrt.Datastore("s3://bkt/data")
    before = _threads()
    with pytest.raises(ValueError, match=message):
        dsrt.Pipeline(ds, **kwargs)
    assert _threads() == before


def test_remote_options_types(local, s3):
    ds = dsrt.Datastore("s3://bkt/data")
    for kwargs in (dict(remote_depth="64"), dict(max_connections=2.0), dict(retry_deadline="1"),
                   dict(request_timeout=None)):
        with pytest.raises(TypeError):
            dsrt.Pipeline(ds, **kwargs)
    # In range: taken (a cap of 2 connections, 4 requests in flight).
    with dsrt.Pipeline(ds, preset="32", batch=8, epochs=1, workers=1, remote_depth=4,
                       max_connections=2, retry_deadline=5.5, request_timeout=10) as p:
        assert sum(len(b) for b in p) == len(ds)
        assert p.stats()["remote_connections"] <= 2


# ----------------------------------------------------------------------------
# A listing that never answers (tests/hostile_server.py, the standard
# library's HTTP server: no package needed)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    proc = subprocess.Popen(
        [sys.executable, os.path.join(SOURCE, "tests", "hostile_server.py"), "--root",
         str(tmp_path_factory.mktemp("hostile"))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = json.loads(proc.stdout.readline())["port"]
    env = dict(os.environ, AWS_ACCESS_KEY_ID="AKIAHOSTILETEST00001",
               AWS_SECRET_ACCESS_KEY="hostile-secret", AWS_REGION="us-east-1",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent/credentials",
               AWS_CONFIG_FILE="/nonexistent/config")
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        env.pop(name, None)
    yield env
    proc.stdin.close()
    proc.kill()
    proc.wait()


def test_listing_options(hostile, monkeypatch):
    """The keywords reach the listing: a stalled one ends at the deadline asked."""
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in hostile.items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    with pytest.raises(dsrt.Error, match=r"s3://stall/.*retry deadline 0\.5 s"):
        dsrt.Datastore("s3://stall/x", retry_deadline=0.5, request_timeout=0.5)
    with pytest.raises(ValueError, match="remote.timeout_s: -1"):
        dsrt.Datastore("s3://stall/x", request_timeout=-1)


INTERRUPT_CHILD = """
import os, signal, sys, threading, time
sys.path[:0] = [{pythonpath!r}]
import dsrt

def interrupt():
    time.sleep(0.5)  # the open is waiting on the store by then, or soon after
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt).start()
t0 = time.monotonic()
try:
    dsrt.Datastore("s3://stall/x")  # 30 s a request, 60 s of retries
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t0, 1), flush=True)
"""


def test_ctrl_c_interrupts_a_listing(hostile, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(
        INTERRUPT_CHILD.format(pythonpath=os.path.dirname(os.path.dirname(dsrt.__file__))))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=hostile)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    assert words[:2] == ["interrupted", "after"], proc.stdout + proc.stderr
    assert float(words[2]) < 20  # not the 90 s the store's deadlines take
