"""Tests of the dsrt Python package (run by CTest as test_python).

Batches are compared with what the C library delivers for the same options
(dsbench --checksum, the same hash computed here); tensors made with
torch.from_dlpack and numpy.from_dlpack view the pipeline's memory without a
copy and stay unchanged while referenced; holding batches bounds the prefetch
(and holding too many raises dsrt.Error) without ever deadlocking; memory
stays flat over 10 000 batches; bad files are skipped and named (or raise with
fail_on_error); bad options raise ValueError before any thread starts; Ctrl-C
while waiting for a batch raises KeyboardInterrupt and closing stops every
worker. No outcome depends on how long anything takes: a wait the test needs
is forced (a file held back with a lease until the test lets it go).

Images are made on the spot with Pillow under $DSRT_TEST_TMP (or pytest's
temporary folder).
"""
import collections
import fcntl
import gc
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import dsrt

BIN_DIR = os.environ.get("DSRT_BIN_DIR", "")
DSBENCH = os.path.join(BIN_DIR, "tools", "dsbench")


# ----------------------------------------------------------------------------
# Datasets


def _base(tmp_path_factory, name):
    root = os.environ.get("DSRT_TEST_TMP")
    if root:
        path = os.path.join(root, "python", name)
        os.makedirs(path, exist_ok=True)
        return path
    return str(tmp_path_factory.mktemp(name))


def _write_images(folder, n, classes, seed):
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        c = i * classes // n
        d = os.path.join(folder, f"class{c}")
        os.makedirs(d, exist_ok=True)
        w, h = (int(rng.integers(40, 110)), int(rng.integers(36, 96)))
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([(xx * 255 // w), (yy * 255 // h), (xx + yy) % 256], axis=-1)
        img = (img + rng.integers(0, 40, img.shape)).clip(0, 255).astype(np.uint8)
        if i % 7 == 3:
            Image.fromarray(img).save(os.path.join(d, f"img{i:03d}.png"))
        elif i % 5 == 2:
            Image.fromarray(img[..., 0]).save(os.path.join(d, f"img{i:03d}.jpg"), quality=85)
        else:
            Image.fromarray(img).save(os.path.join(d, f"img{i:03d}.jpg"), quality=90)


def _dataset(tmp_path_factory, name, make):
    """The folder `name`/data, made by make(folder) once (kept between runs)."""
    path = os.path.join(_base(tmp_path_factory, name), "data")
    if not os.path.isdir(path):
        shutil.rmtree(path + ".part", ignore_errors=True)
        make(path + ".part")
        os.rename(path + ".part", path)
    return path


@pytest.fixture(scope="session")
def folder(tmp_path_factory):
    return _dataset(tmp_path_factory, "good", lambda d: _write_images(d, 48, 3, seed=1))


def _write_bad(folder):
    _write_images(folder, 20, 2, seed=3)
    open(os.path.join(folder, "class0", "empty.jpg"), "wb").close()
    with open(os.path.join(folder, "class1", "img011.jpg"), "rb") as f:
        data = f.read()
    with open(os.path.join(folder, "class1", "truncated.jpg"), "wb") as f:
        f.write(data[: len(data) // 3])
    with open(os.path.join(folder, "class1", "text.png"), "w") as f:
        f.write("this is not an image\n")


@pytest.fixture(scope="session")
def bad_folder(tmp_path_factory):
    """Good images and three bad ones: empty, truncated, not an image."""
    return _dataset(tmp_path_factory, "bad", _write_bad)


@pytest.fixture(scope="session")
def idx_file(tmp_path_factory):
    """A small IDX image file (8 x 8 gray, 64 samples) and its labels: pixels in memory."""
    base = _base(tmp_path_factory, "idx")
    images = os.path.join(base, "train-images-idx3-ubyte")
    labels = os.path.join(base, "train-labels-idx1-ubyte")
    rng = np.random.default_rng(4)
    n = 64
    with open(images, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 8, 8))
        f.write(rng.integers(0, 256, (n, 8, 8), dtype=np.uint8).tobytes())
    with open(labels, "wb") as f:
        f.write(struct.pack(">II", 0x801, n))
        f.write((np.arange(n) % 10).astype(np.uint8).tobytes())
    return images


# ----------------------------------------------------------------------------
# dsbench's --checksum hash: FNV-1a over 64-bit words in 4 lanes, the tail
# bytes and each buffer's length into lanes 0 and 1, folded byte-wise.

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1


class Checksum:
    def __init__(self):
        self.lane = [FNV_OFFSET ^ i for i in range(4)]

    def add(self, data):
        data = bytes(data)
        n = len(data)
        words = np.frombuffer(data[: n - n % 32], dtype="<u8").tolist()
        l0, l1, l2, l3 = self.lane
        for i in range(0, len(words), 4):
            l0 = ((l0 ^ words[i]) * FNV_PRIME) & MASK
            l1 = ((l1 ^ words[i + 1]) * FNV_PRIME) & MASK
            l2 = ((l2 ^ words[i + 2]) * FNV_PRIME) & MASK
            l3 = ((l3 ^ words[i + 3]) * FNV_PRIME) & MASK
        for b in data[n - n % 32 :]:
            l0 = ((l0 ^ b) * FNV_PRIME) & MASK
        l1 = ((l1 ^ n) * FNV_PRIME) & MASK
        self.lane = [l0, l1, l2, l3]

    def batch(self, b):
        images = b.images
        if isinstance(images, tuple):  # native: one tensor a sample
            for t in images:
                self.add(np.from_dlpack(t).tobytes())
        else:
            x = np.from_dlpack(images)
            for i in range(len(b)):
                self.add(x[i].tobytes())
        self.add(np.from_dlpack(b.labels).tobytes())

    def final(self):
        h = FNV_OFFSET
        for lane in self.lane:
            for k in range(8):
                h = ((h ^ ((lane >> (8 * k)) & 0xFF)) * FNV_PRIME) & MASK
        return f"{h:016x}"


def dsbench_checksum(data, *args):
    if not os.access(DSBENCH, os.X_OK):
        pytest.fail(f"{DSBENCH} is not built")
    out = subprocess.run(
        [DSBENCH, data, "--checksum", "--json", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])["checksum"]


def python_checksum(p):
    c = Checksum()
    while (b := p.next()) is not None:
        c.batch(b)
        del b
    return c.final()


# ----------------------------------------------------------------------------
# Same bytes as the C library


@pytest.mark.parametrize("workers", [1, 2])
def test_batches_equal_c_api(folder, workers):
    ds = dsrt.Datastore(folder)
    c_sum = dsbench_checksum(
        folder, "--pipeline", "32", "--batch", "10", "--epochs", "2", "--seed", "5",
        "--threads", str(workers),
    )
    with dsrt.Pipeline(ds, preset="32", batch=10, epochs=2, seed=5, workers=workers) as p:
        assert python_checksum(p) == c_sum
    # Native size (dsbench --pipeline none): each image at its own size.
    c_sum = dsbench_checksum(folder, "--pipeline", "none", "--epochs", "1", "--threads", str(workers))
    with dsrt.Pipeline(ds, native=True, batch=1, epochs=1, workers=workers) as p:
        assert python_checksum(p) == c_sum
    # The 227 preset on a few images.
    sub = ds.subset(range(6))
    ref = None
    for w in (1, workers):
        with dsrt.Pipeline(sub, preset="227", batch=3, epochs=1, seed=9, workers=w) as p:
            s = python_checksum(p)
        ref = ref or s
        assert s == ref


def test_imagenet_presets_match_dsbench(folder):
    # The ImageNet recipe and its evaluation transform: the bytes of
    # dsbench --pipeline imagenet / imagenet-val, whatever the worker count.
    ds = dsrt.Datastore(folder)
    for preset in ("imagenet", "imagenet-val"):
        c_sum = dsbench_checksum(
            folder, "--pipeline", preset, "--batch", "10", "--epochs", "2", "--seed", "5",
            "--threads", "2",
        )
        for w in (1, 2):
            with dsrt.Pipeline(ds, preset=preset, batch=10, epochs=2, seed=5, workers=w) as p:
                assert python_checksum(p) == c_sum


def test_recipe_keywords(folder):
    # The recipe's options as augment keywords: the random-resized crop,
    # colour, grayscale and erasing, the same for any worker count, and
    # different from the preset without them.
    ds = dsrt.Datastore(folder)
    aug = dict(
        output_size=(24, 20), size_mode="randresizedcrop", crop_scale=(0.2, 0.9),
        crop_ratio=(0.5, 2.0), brightness=(0.5, 1.5), contrast=(0.7, 1.3),
        saturation=(0.0, 2.0), hue=(-0.1, 0.1), grayscale_probability=0.3,
        erase_probability=0.5, erase_scale=(0.05, 0.2), erase_ratio=(0.5, 2.0),
        erase_random=True, norm="zscore", mean=(120, 110, 100), std=(60, 61, 62),
    )
    sums = []
    for w in (1, 2):
        with dsrt.Pipeline(ds, augment=aug, batch=7, epochs=1, seed=3, workers=w) as p:
            sums.append(python_checksum(p))
    assert sums[0] == sums[1]
    plain = dict(aug, erase_probability=0.0, grayscale_probability=0.0)
    with dsrt.Pipeline(ds, augment=plain, batch=7, epochs=1, seed=3, workers=1) as p:
        assert python_checksum(p) != sums[0]


def test_same_for_any_worker_count_with_augmentation(folder):
    ds = dsrt.Datastore(folder)
    aug = dict(
        output_size=(24, 20), rand_rotation=(-20, 20), rand_x_scale=(0.9, 1.2),
        rand_y_shear=(-5, 5), rand_x_translation=(-3, 3), rand_x_reflection=True,
        fill_value=(10, 20, 30), norm="zscore", mean=(120, 110, 100), std=(60, 61, 62),
    )
    sums = []
    for w in (1, 2):
        with dsrt.Pipeline(ds, augment=aug, batch=7, epochs=2, seed=3, workers=w) as p:
            sums.append(python_checksum(p))
    assert sums[0] == sums[1]


# ----------------------------------------------------------------------------
# Zero copy, lifetime, holding


def test_zero_copy_numpy_and_torch(folder):
    ds = dsrt.Datastore(folder)
    with dsrt.Pipeline(ds, preset="32", batch=8, epochs=1, seed=1, workers=1) as p:
        b = p.next()
        x = torch.from_dlpack(b.images)
        a = np.from_dlpack(b.images)
        m = np.asarray(b.images)  # the buffer protocol
        y = torch.from_dlpack(b.labels)
        assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32
        assert a.shape == (8, 3, 32, 32) and a.dtype == np.float32
        assert y.dtype == torch.int32 and y.shape == (8,)
        assert x.data_ptr() == a.ctypes.data == m.ctypes.data
        mv = memoryview(b.labels)
        assert mv.format == "i" and mv.shape == (8,) and mv.tolist() == y.tolist()
        assert len(bytes(memoryview(b.images))) == 8 * 3 * 32 * 32 * 4
        assert b.images.__dlpack_device__() == (1, 0)
        assert [ds.label(0)] * 0 == [] and 0 <= int(y.min()) and int(y.max()) < 3
        ids = np.from_dlpack(b.ids)
        assert list(np.from_dlpack(b.labels)) == [ds.label(int(i)) for i in ids]
        assert float(x.min()) >= 0 and float(x.max()) <= 1
        sizes = np.from_dlpack(b.sizes)
        assert (sizes == 32).all()


def test_tensors_valid_while_referenced(folder):
    ds = dsrt.Datastore(folder)
    with dsrt.Pipeline(ds, preset="32", batch=4, prefetch=3, epochs=3, seed=2, workers=2) as p:
        assert p.slots == 4
        b = p.next()
        x = torch.from_dlpack(b.images)
        y = np.from_dlpack(b.labels)
        ptr = x.data_ptr()
        copy_x, copy_y = x.clone(), y.copy()
        del b  # the tensors alone keep the slot
        kept = []
        for _ in range(p.slots - 1):  # every other slot cycles...
            nb = p.next()
            kept.append(torch.from_dlpack(nb.images))
            del nb
            time.sleep(0.01)  # ... while the workers fill the free ones
        kept.clear()  # the workers fill the slots given back...
        time.sleep(0.1)
        assert torch.equal(x, copy_x) and (y == copy_y).all()  # ... never batch 0's
        with pytest.raises(dsrt.Error, match="needs the slot of batch 0"):
            p.next()
        # Once dropped, the slot is used again, for batch 4.
        del x, y
        nb = p.next()
        assert nb.global_index == 4 and torch.from_dlpack(nb.images).data_ptr() == ptr


def test_many_epochs_holding_prefetch_batches(folder):
    ds = dsrt.Datastore(folder)
    with dsrt.Pipeline(ds, preset="32", batch=4, prefetch=2, epochs=25, workers=2) as p:
        held = collections.deque(maxlen=2)  # prefetch batches held while taking the next
        n = 0
        for epoch in range(25):
            for b in p:
                held.append((torch.from_dlpack(b.images), np.from_dlpack(b.labels)))
                n += 1
            del b
            assert p.position == (epoch + 1, 0)
        assert n == 25 * len(p) == 25 * 12
        assert list(p) == [] and p.next() is None


def test_holding_every_slot_raises(folder):
    ds = dsrt.Datastore(folder)
    with dsrt.Pipeline(ds, preset="32", batch=4, prefetch=2, epochs=2, workers=2) as p:
        held = [p.next() for _ in range(p.slots)]
        waited = p.stats()["consumer_wait_s"]
        with pytest.raises(dsrt.Error, match=r"batch 3 needs the slot of batch 0.*prefetch"):
            p.next()
        assert p.stats()["consumer_wait_s"] == waited  # refused at once, without waiting
        # Holding the newest ones is fine once the oldest is gone; batches
        # held only by a reference cycle are collected first.
        x = torch.from_dlpack(held[0].images)
        cycle = [x]
        cycle.append(cycle)
        del held[0], x, cycle
        b = p.next()
        assert b.global_index == 3
        with pytest.raises(dsrt.Error, match="batch 4 needs the slot of batch 1"):
            p.next()
        del held[0]
        assert p.next().global_index == 4


def test_no_leak_over_10000_batches(idx_file):
    ds = dsrt.Datastore(idx_file)
    aug = dict(output_size=(4, 4), output_channels=1)

    def rss_kib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024

    with dsrt.Pipeline(ds, augment=aug, batch=4, prefetch=4, epochs=0, workers=2) as p:
        def run(n):
            for _ in range(n):
                b = p.next()
                x = torch.from_dlpack(b.images)
                y = np.from_dlpack(b.labels)
                z = np.asarray(b.ids)
                del b, x, y, z

        run(1000)
        gc.collect()
        before = rss_kib()
        run(9000)
        gc.collect()
        grown = rss_kib() - before
        assert p.stats()["batches"] == 10000
    assert grown < 1024, f"RSS grew by {grown} KiB over 9000 batches"


def test_close_with_live_tensors(folder):
    ds = dsrt.Datastore(folder)
    p = dsrt.Pipeline(ds, preset="32", batch=4, epochs=1, workers=2)
    b = p.next()
    x = torch.from_dlpack(b.images)
    ref = x.clone()
    del b
    p.close()
    assert p.closed
    with pytest.raises(ValueError, match="closed"):
        p.next()
    with pytest.raises(ValueError, match="closed"):
        iter(p)
    gc.collect()
    assert torch.equal(x, ref)  # the slots live until the last view is freed
    del x
    p.close()


# ----------------------------------------------------------------------------
# Epochs, len, reset


def test_len_epochs_reset(folder):
    ds = dsrt.Datastore(folder)
    opts = dict(preset="32", batch=5, epochs=3, seed=11, workers=2)
    with dsrt.Pipeline(ds, **opts) as p:
        assert len(p) == p.batches_per_epoch == 10
        full = {}
        for e in range(3):
            got = []
            for b in p:
                c = Checksum()
                c.batch(b)
                full[b.global_index] = c.final()
                got.append((b.epoch, b.index, len(b)))
            del b
            assert got == [(e, i, 5 if i < 9 else 3) for i in range(10)]
        assert list(p) == []
    with dsrt.Pipeline(ds, **opts) as p:
        next(iter(p))  # a batch or so, then resume elsewhere
        gc.collect()
        p.reset(1, 4)
        assert p.position == (1, 4)
        resumed = {}
        for _ in range(2):
            for b in p:
                c = Checksum()
                c.batch(b)
                resumed[b.global_index] = c.final()
            del b
        assert sorted(resumed) == list(range(14, 30))
        assert all(resumed[g] == full[g] for g in resumed)
        b = (p.reset(0), p.next())[1]
        with pytest.raises(dsrt.Error, match="still referenced"):
            p.reset(2)
        del b
        with pytest.raises(ValueError, match="past the end"):
            p.reset(5)
        with pytest.raises(ValueError, match="an epoch has 10"):
            p.reset(0, 10)


def test_drop_last_and_shuffle(folder):
    ds = dsrt.Datastore(folder)
    with dsrt.Pipeline(ds, preset="32", batch=10, epochs=2, drop_last=True, shuffle="never") as p:
        assert len(p) == 4
        ids = [list(np.from_dlpack(b.ids)) for b in p]
        assert sum(ids, []) == list(range(40))


# ----------------------------------------------------------------------------
# The drop-in loader


def test_torch_loader(folder):
    ds = dsrt.Datastore(folder)
    with dsrt.Pipeline(ds, preset="32", batch=16, epochs=2, seed=1, workers=2) as p:
        loader = dsrt.TorchLoader(p)
        assert len(loader) == 3
        for epoch in range(2):
            n = 0
            for x, y in loader:
                assert x.shape[1:] == (3, 32, 32) and y.dtype == torch.int64
                assert x.shape[0] == y.shape[0]
                n += len(y)
            assert n == 48
    with dsrt.Pipeline(ds, preset="32", batch=16, epochs=1, seed=1, workers=2) as p:
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 3))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, y in dsrt.TorchLoader(p, device="cpu"):
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert torch.isfinite(loss)


# ----------------------------------------------------------------------------
# Datastore


def test_datastore(folder, idx_file, tmp_path):
    ds = dsrt.Datastore(folder)
    assert len(ds) == 48 and ds.classes == ("class0", "class1", "class2")
    assert ds.source == "folder" and ds.class_counts() == [16, 16, 16]
    assert ds.path(0).endswith("class0/img000.jpg") and ds.path(-1).endswith("img047.jpg")
    train, val = ds.split_each_label(0.75, randomized=True, seed=1)
    assert (len(train), len(val)) == (36, 12)
    assert sorted(map(train.id, range(36)) ) + [] != [] and set(map(train.id, range(36))).isdisjoint(
        map(val.id, range(12))
    )
    first, rest = ds.split_each_label(2)
    assert first.class_counts() == [2, 2, 2] and len(rest) == 42
    assert len(ds.partition(3, 1)) == 16 and len(ds.subset([5, 5, 1])) == 3
    assert sorted(ds.shuffle(3).labels()) == sorted(ds.labels())
    with pytest.raises(IndexError):
        ds.label(48)
    idx = dsrt.Datastore(idx_file)
    assert idx.source == "idx" and len(idx) == 64 and idx.path(0) is None
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label\n" + "".join(f"{ds.path(i)},c{i % 2}\n" for i in range(10)))
    m = dsrt.Datastore(str(manifest))
    assert m.source == "manifest" and len(m) == 10 and m.classes == ("c0", "c1")
    none = dsrt.Datastore(folder, labels="none")
    assert none.classes == ("",)
    with pytest.raises(FileNotFoundError, match="/nonexistent"):
        dsrt.Datastore("/nonexistent/data")
    with pytest.raises(ValueError, match="source: 'jpeg'"):
        dsrt.Datastore(folder, source="jpeg")


def test_shards(folder, tmp_path):
    ds = dsrt.Datastore(folder)
    out = str(tmp_path / "shards")
    assert ds.write_shards(out, shard_bytes=64 << 10) > 1
    exact = dsrt.Datastore(out, order="exact")
    assert exact.source == "shards" and len(exact) == len(ds) and exact.classes == ds.classes
    assert exact.order == "exact" and exact.labels() == ds.labels()
    assert len(exact.shards) > 1 and exact.shards[0].endswith("shard-000000.tar")
    shard, offset, size, member = exact.location(5)
    assert shard == exact.shards[0] and member == "000005_img005.jpg"
    with open(ds.path(5), "rb") as f:
        want = f.read()
    with open(shard, "rb") as f:
        f.seek(offset)
        assert f.read(size) == want
    assert exact.path(5) == f"{shard}:{member}"
    # The exact order gives the folder's batches; the shard order its own,
    # every sample once an epoch, and the same as dsbench's.
    with dsrt.Pipeline(exact, preset="32", batch=10, epochs=2, seed=5, workers=2) as p:
        assert python_checksum(p) == dsbench_checksum(
            folder, "--pipeline", "32", "--batch", "10", "--epochs", "2", "--seed", "5"
        )
    sh = dsrt.Datastore(out, order="shard", shuffle_buffer=8)
    assert sh.order == "shard" and sh.shuffle_buffer == 8
    with dsrt.Pipeline(sh, preset="32", batch=10, epochs=1, seed=5, workers=2) as p:
        ids = [i for b in p for i in np.asarray(b.ids).tolist()]
        assert sorted(ids) == list(range(len(ds)))
        assert p.stats()["stream_samples"] == len(ds)
    with dsrt.Pipeline(sh, preset="32", batch=10, epochs=2, seed=5, workers=1) as p:
        assert python_checksum(p) == dsbench_checksum(
            out, "--order", "shard", "--shuffle-buffer", "8", "--pipeline", "32", "--batch",
            "10", "--epochs", "2", "--seed", "5",
        )
    with pytest.raises(ValueError, match="order: 'random'"):
        dsrt.Datastore(out, order="random")
    with pytest.raises(ValueError, match="shuffle_buffer"):
        dsrt.Datastore(out, shuffle_buffer=0)
    with pytest.raises(dsrt.Error, match="a folder datastore has no shards"):
        ds.location(0)
    assert exact.location(-1)[3].startswith(f"{len(ds) - 1:06d}_")
    # Never into the folder it is read from: refused, and the set stays.
    with pytest.raises(ValueError, match="is the source's folder"):
        exact.write_shards(out)
    with pytest.raises(ValueError, match="lies inside the source's folder"):
        exact.write_shards(os.path.join(out, "again"))
    assert len(dsrt.Datastore(out)) == len(ds)
    # Only what dsrt wrote is ever replaced: a file of the user's is refused.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "classes.json").write_text('["x"]')
    with pytest.raises(ValueError, match="which dsrt did not write there"):
        ds.write_shards(str(mine))
    assert (mine / "classes.json").read_text() == '["x"]'
    assert ds.write_shards(out, shard_bytes=1 << 20) == 1


# ----------------------------------------------------------------------------
# Bad files, bad options


def test_bad_files_skipped_and_named(bad_folder):
    ds = dsrt.Datastore(bad_folder)
    assert len(ds) == 23
    with dsrt.Pipeline(ds, preset="32", batch=8, epochs=1, workers=2) as p:
        counts = [len(b) for b in p]
        s = p.stats()
    assert counts == [8, 8, 7]  # places of bad files are filled by the next good ones
    bad = dict(s["bad_files"])
    assert s["bad_samples"] == 3 and s["skipped"] >= 3
    names = sorted(os.path.basename(k) for k in bad)
    assert names == ["empty.jpg", "text.png", "truncated.jpg"]
    assert all(os.path.isabs(k) and v for k, v in bad.items())
    with dsrt.Pipeline(ds, preset="32", batch=8, epochs=1, workers=2, drop_bad=True) as p:
        assert sum(len(b) for b in p) == 20
    with dsrt.Pipeline(ds, preset="32", batch=8, epochs=1, workers=1, fail_on_error=True,
                       shuffle="never") as p:
        with pytest.raises((dsrt.Error, OSError)) as e:
            for b in p:
                pass
        assert "empty.jpg" in str(e.value) or "truncated.jpg" in str(e.value) or "text.png" in str(
            e.value
        )


def _threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch=0), "batch: 0"),
        (dict(prefetch=0), "prefetch: 0"),
        (dict(workers=5000), "threads: 5000"),
        (dict(cpus="0-zz"), "cpus"),
        (dict(augment=dict(rand_rotation=(30, -30))), r"rand_rotation: \[30, -30\]"),
        (dict(augment=dict(output_size=(0, 32))), "output"),
        (dict(augment=dict(reflection_probability=1.5)), "reflection_probability"),
        (dict(augment=dict(no_such=1)), "unknown option 'no_such'"),
        (dict(augment=dict(rand_scale=3)), r"rand_scale: 3: expected \(low, high\)"),
        (dict(augment=dict(rand_x_scale=(1e-9, 1e-9))), r"rand_x_scale: \[1e-09, 1e-09\]: outside"),
        (dict(augment=dict(rand_scale=(1e-300, 1e-300))), r"rand_scale: .*: outside \[0.001, 1000\]"),
        (dict(augment=dict(rand_y_shear=(-89.5, 0))), r"rand_y_shear: \[-89.5, 0\]: outside"),
        (dict(augment=dict(norm="zscore", std=(0, 1, 1))), "std"),
        (dict(augment=dict(size_mode="stretch")), "size_mode: 'stretch'"),
        (dict(layout="NHWC", dtype="float32"), "float32 NCHW or uint8 NHWC"),
        (dict(dtype="float16"), "dtype: 'float16'"),
        (dict(preset="64"), "preset: '64'"),
        (dict(augment=dict(crop_scale=(0, 1))), r"crop_scale: \[0, 1\]: low is not above 0"),
        (dict(augment=dict(crop_ratio=(2, 1))), r"crop_ratio: \[2, 1\]: low is above high"),
        (dict(augment=dict(brightness=(-1, 1))), r"brightness: \[-1, 1\]: outside"),
        (dict(augment=dict(hue=(0, 0.7))), r"hue: \[0, 0.7\]: outside \[-0.5, 0.5\]"),
        (dict(augment=dict(grayscale_probability=2)), "grayscale_probability: 2"),
        (dict(augment=dict(erase_probability=0.5), dtype="uint8"), "erase_probability: 0.5"),
        (dict(augment=dict(erase_scale=(0.5, 0.1))), r"erase_scale: \[0.5, 0.1\]"),
        (dict(shuffle="always"), "shuffle: 'always'"),
        (dict(io="aio"), "io: 'aio'"),
        (dict(io_depth=0), "depth"),
        (dict(seed=-1), "seed: -1: must not be negative"),
        (dict(seed=2**64), "seed: 18446744073709551616: at most 18446744073709551615"),
        (dict(epochs=2**70), "epochs: .*: at most"),
    ],
)
def test_bad_options_raise_before_work(folder, kwargs, message):
    ds = dsrt.Datastore(folder)
    before = _threads()
    with pytest.raises(ValueError, match=message):
        dsrt.Pipeline(ds, **kwargs)
    assert _threads() == before


def test_wrong_types(folder):
    ds = dsrt.Datastore(folder)
    with pytest.raises(TypeError):
        dsrt.Pipeline(ds, batch="128")
    with pytest.raises(TypeError):
        dsrt.Pipeline(ds, no_such_option=1)
    with pytest.raises(TypeError):
        dsrt.Pipeline("not a datastore")


# ----------------------------------------------------------------------------
# Waiting: the GIL is released, Ctrl-C interrupts


class HeldFile:
    """Holds back every open of a file until release(): a write lease (fcntl
    F_SETLEASE). Any other open of the file, by this process or another, fails
    with EAGAIN (dsrt's reader opens with O_NONBLOCK) while the lease is held;
    dsrt takes that for a refusal of the moment and tries again, so the batch
    carrying the file cannot be ready before the test lets it go. The kernel
    tells the lease holder with SIGIO, ignored while held."""

    def __init__(self, path):
        self.old_sigio = signal.signal(signal.SIGIO, signal.SIG_IGN)
        self.fd = os.open(path, os.O_RDONLY)
        self.held = False
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except OSError as e:
            self.close()
            pytest.skip(f"no file leases here ({path}: {e})")
        self.held = True

    def release(self):
        """Lets opens of the file through (once); callable from any thread."""
        if self.held:
            self.held = False
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        signal.signal(signal.SIGIO, self.old_sigio)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture(scope="session")
def held_folder(tmp_path_factory):
    """Six small images (two batches of three), one of which a test holds back."""
    return _dataset(tmp_path_factory, "held", lambda d: _write_images(d, 6, 2, seed=6))


def test_gil_released_while_waiting(held_folder):
    # The first batch carries a file held back until another Python thread
    # lets it go; that thread can only run while next() has released the GIL
    # (the interpreter's switch interval, which would otherwise hand the GIL
    # over between bytecodes, is made too long to matter). Should next() keep
    # the GIL, the file is never let go and the pipeline gives up on it
    # (a read refused for a few seconds): the test fails, it does not hang.
    ds = dsrt.Datastore(held_folder)
    seen = {}
    go = threading.Event()
    with HeldFile(ds.path(0)) as held:
        p = dsrt.Pipeline(ds, preset="32", batch=6, prefetch=1, epochs=1, workers=1,
                          shuffle="never")

        def let_go():
            go.wait()
            seen["inside_next"] = "returned" not in seen
            held.release()

        t = threading.Thread(target=let_go)
        t.start()
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1000.0)
        try:
            go.set()
            b = p.next()
            seen["returned"] = True
        finally:
            sys.setswitchinterval(interval)
            held.release()
            t.join()
    assert seen["inside_next"], "the other thread ran only after next() returned"
    assert list(np.from_dlpack(b.ids)) == list(range(6))
    assert p.stats()["bad_files"] == [] and p.stats()["consumer_wait_s"] > 0
    del b
    p.close()


CHILD = textwrap.dedent(
    """
    import fcntl, os, signal, sys, threading
    sys.path[:0] = [{pythonpath!r}]
    import dsrt
    signal.signal(signal.SIGIO, signal.SIG_IGN)
    ds = dsrt.Datastore({data!r})
    # The second batch's first file is held back (a write lease) until the
    # main thread has been interrupted: it is certainly waiting for that batch
    # when the signal comes.
    fd = os.open(ds.path(3), os.O_RDONLY)
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    p = dsrt.Pipeline(ds, preset="32", batch=3, prefetch=1, epochs=0, workers=1, shuffle="never")
    n = 0

    def interrupt():
        # Runs only while the main thread has released the GIL: inside next()
        # (the switch interval is too long for any other hand-over).
        while n < 1:
            threading.Event().wait(0.001)
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt)
    sys.setswitchinterval(1000.0)
    t.start()
    try:
        for epoch in range(1000):
            for b in p:
                n += 1
    except KeyboardInterrupt:
        sys.setswitchinterval(0.005)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        t.join()
        print("interrupted after", n, "waited", p.stats()["consumer_wait_s"] > 0, flush=True)
        threads = len(os.listdir("/proc/self/task"))
        b = None
        p.close()
        print("threads", threads, "->", len(os.listdir("/proc/self/task")), flush=True)
        sys.exit(0)
    """
)


def test_ctrl_c_stops_cleanly(held_folder, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(
        CHILD.format(pythonpath=os.path.dirname(os.path.dirname(dsrt.__file__)), data=held_folder)
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "interrupted after 1 waited True", proc.stdout
    before, after = int(lines[1].split()[1]), int(lines[1].split()[3])
    assert before >= 2 and after == 1  # the worker is gone, only the main thread is left


# ----------------------------------------------------------------------------
# Misuse: fork, re-initialisation, objects never initialised, DLPack devices

FORK_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path[:0] = [{pythonpath!r}]
    import numpy as np
    import dsrt
    signal.alarm(60)  # a hang is a failure, not a stuck test
    ds = dsrt.Datastore({data!r})
    p = dsrt.Pipeline(ds, preset="32", batch=4, epochs=0, workers=2)
    b = p.next()

    def child(what):
        pid = os.fork()
        if pid:
            _, st = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(st)
            print(what, "exit", code, flush=True)
            return
        if what == "exit":  # leave with the pipeline and a batch alive
            sys.exit(0)
        try:
            if what == "use":
                for use in (p.next, lambda: iter(p), p.stats, lambda: p.reset(0)):
                    try:
                        use()
                        print("use: no error", flush=True)
                    except RuntimeError as e:
                        assert "fork" in str(e), e
                try:
                    np.from_dlpack(b.images)
                    print("use: exported", flush=True)
                except BufferError:
                    pass
                del b_child[:]
            p.close()
            # The datastore serves a pipeline of the child's own.
            with dsrt.Pipeline(ds, preset="32", batch=4, epochs=1, workers=1) as q:
                n = sum(len(x) for x in q)
            print(what, "own pipeline", n, flush=True)
        except BaseException as e:
            print(what, "failed:", repr(e), flush=True)
            os._exit(1)
        os._exit(0)

    b_child = [b]
    for what in ("close", "use", "exit"):
        child(what)
    # The parent's pipeline is untouched.
    print("parent", p.next().global_index, flush=True)
    """
)


def test_fork_child_pipeline_is_dead(folder, tmp_path):
    script = tmp_path / "fork_child.py"
    script.write_text(
        FORK_CHILD.format(pythonpath=os.path.dirname(os.path.dirname(dsrt.__file__)), data=folder)
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        "close own pipeline 48",
        "close exit 0",
        "use own pipeline 48",
        "use exit 0",
        "exit exit 0",
        "parent 1",
    ], proc.stdout + proc.stderr


def test_reinit_in_use_refused(folder, idx_file):
    ds = dsrt.Datastore(folder)
    p = dsrt.Pipeline(ds, preset="32", batch=4, epochs=1, workers=1)
    with pytest.raises(RuntimeError, match="in use"):
        ds.__init__(idx_file)
    with pytest.raises(RuntimeError, match="already open"):
        p.__init__(ds, preset="32", batch=8)
    b = p.next()
    p.close()  # the batch keeps it open
    with pytest.raises(RuntimeError, match="in use"):
        ds.__init__(idx_file)
    with pytest.raises(RuntimeError, match="already open"):
        p.__init__(ds, preset="32", batch=8)
    assert len(ds) == 48 and b.count == 4
    del b
    # Closed and free: both may be opened again.
    p.__init__(ds, preset="32", batch=8, epochs=1, workers=1)
    assert not p.closed and p.next().count == 8
    p.close()
    ds.__init__(idx_file)
    assert len(ds) == 64 and ds.source == "idx"


def test_uninitialised_objects_raise():
    p = dsrt.Pipeline.__new__(dsrt.Pipeline)
    uses = [
        lambda: p.position, lambda: p.batches_per_epoch, lambda: p.slots, lambda: p.closed,
        lambda: len(p), p.stats, p.next, lambda: iter(p), lambda: p.reset(0),
        lambda: p.__enter__(),
    ]
    for use in uses:
        with pytest.raises(ValueError, match="not opened"):
            use()
    p.close()  # nothing to close
    d = dsrt.Datastore.__new__(dsrt.Datastore)
    uses = [
        lambda: d.classes, lambda: d.source, lambda: d.warnings, lambda: len(d),
        lambda: d.label(0), d.labels, d.class_counts, lambda: d.shuffle(1),
        lambda: d.split_each_label(0.5), lambda: d.subset([0]), lambda: d.partition(2, 0),
        lambda: dsrt.Pipeline(d),
    ]
    for use in uses:
        with pytest.raises(ValueError, match="not opened"):
            use()
    assert "not opened" in repr(d)


def test_dlpack_device_argument(folder):
    ds = dsrt.Datastore(folder)
    with dsrt.Pipeline(ds, preset="32", batch=4, epochs=1, workers=1) as p:
        t = p.next().images
        for bad in ("x", (1,), (1, 0, 0), (1.5, 0), ("1", 0), [1, 0]):
            with pytest.raises(TypeError, match="dl_device"):
                t.__dlpack__(dl_device=bad)
        for other in ((2, 0), (1, 3)):
            with pytest.raises(BufferError, match="host memory"):
                t.__dlpack__(dl_device=other)
        x = torch.from_dlpack(t)
        assert x.shape == (4, 3, 32, 32)
        assert t.__dlpack__(dl_device=(1, 0)) is not None


def test_messages_name_what_was_given(folder):
    ds = dsrt.Datastore(folder)
    with pytest.raises(IndexError, match=r"sample -401: the datastore has 48 \(from -48 to 47\)"):
        ds.label(-401)
    with pytest.raises(IndexError, match="sample 48: "):
        ds.path(48)
    # One range, named one way, whatever is wrong.
    for bad in (1.5, -0.5, 0.0, float("nan")):
        with pytest.raises(ValueError, match=r"give a fraction in \(0, 1\] or a count > 0"):
            ds.split_each_label(bad)
    with pytest.raises(ValueError, match=r"give a fraction in \(0, 1\] or a count > 0"):
        ds.split_each_label(0)
    with pytest.raises(TypeError, match=r"give a fraction in \(0, 1\] or a count > 0"):
        ds.split_each_label()
    first, rest = ds.split_each_label(1.0)
    assert len(first) == 48 and len(rest) == 0


def test_augment_limits_hold(folder):
    # At the ends of every range dsrt_augment_check allows, every sample is
    # made: nothing accepted at construction fails while iterating.
    ds = dsrt.Datastore(folder)
    aug = dict(
        output_size=(16, 16), rand_x_scale=(1e-3, 1e3), rand_y_scale=(1e-3, 1e-3),
        rand_x_shear=(-89, 89), rand_y_shear=(89, 89), rand_rotation=(-360, 360),
        rand_x_translation=(-1e6, 1e6), decode_oversample=64,
    )
    with dsrt.Pipeline(ds, augment=aug, batch=8, epochs=2, workers=2, fail_on_error=True) as p:
        assert sum(len(b) for b in p) + sum(len(b) for b in p) == 96
        assert p.stats()["bad_files"] == []
    with dsrt.Pipeline(ds, augment=dict(output_size=(8, 8), rand_scale=(1e-3, 1e-3),
                                        resize_shorter=65535, size_mode="randcrop"),
                       batch=16, epochs=1, workers=1, fail_on_error=True) as p:
        assert sum(len(b) for b in p) == 48


def test_max_file_bytes_to_the_byte(folder):
    # The cap is the option's to the byte, not a page: every image is larger
    # than 10 bytes.
    ds = dsrt.Datastore(folder)
    with dsrt.Pipeline(ds, preset="32", batch=8, epochs=1, workers=1, max_file_bytes=10,
                       drop_bad=True) as p:
        assert sum(len(b) for b in p) == 0
        bad = p.stats()["bad_files"]
    assert len(bad) == 48
    assert all("more than max_file_bytes (10)" in why for _, why in bad)


# ----------------------------------------------------------------------------
# Batch mixing (mixup, cutmix, label smoothing) and soft labels


def _epoch(p):
    """One epoch of a pipeline: images, labels, soft labels, lambda, box, ids."""
    out = []
    for b in p:
        soft = b.soft_labels
        out.append(
            (
                np.from_dlpack(b.images).copy(),
                np.from_dlpack(b.labels).copy(),
                None if soft is None else np.from_dlpack(soft).copy(),
                b.mix_lambda,
                b.mix_box,
                np.from_dlpack(b.ids).copy(),
            )
        )
    return out


def test_mixing_soft_labels(folder):
    ds = dsrt.Datastore(folder)
    common = dict(preset="32", batch=16, epochs=1, seed=3, workers=1)
    with dsrt.Pipeline(ds, **common) as p:
        plain = _epoch(p)
    mix = dict(mixup_alpha=0.8, cutmix_alpha=1.0, mix_prob=1.0, mix_switch_prob=0.5, label_smoothing=0.1)
    with dsrt.Pipeline(ds, **common, **mix) as p:
        mixed = _epoch(p)
    assert plain[0][2] is None and plain[0][3] == 1.0
    kinds = set()
    for (x0, y0, _, _, _, _), (x, y, t, lam, box, _) in zip(plain, mixed):
        n = len(y)
        assert (y == y0).all()
        assert t.shape == (n, 3) and t.dtype == np.float32
        assert np.allclose(t.sum(axis=1), 1.0, atol=1e-6)
        partner = x0[::-1]
        for i in range(n):
            want = np.full(3, 0.1 / 3)
            want[y[i]] += 0.9 * lam
            want[y[n - 1 - i]] += 0.9 * (1 - lam)
            assert np.allclose(t[i], want, atol=1e-6)
        if box is None:
            kinds.add("mixup")
            assert np.allclose(x, lam * x0 + (1 - lam) * partner, atol=1e-5)
        else:
            kinds.add("cutmix")
            y0_, y1_, x0_, x1_ = box
            assert lam == pytest.approx(1 - (y1_ - y0_) * (x1_ - x0_) / (32 * 32))
            inside = np.zeros((32, 32), bool)
            inside[y0_:y1_, x0_:x1_] = True
            assert (x[:, :, inside] == partner[:, :, inside]).all()
            assert (x[:, :, ~inside] == x0[:, :, ~inside]).all()
    assert kinds == {"mixup", "cutmix"}
    # The same bytes with 3 workers.
    with dsrt.Pipeline(ds, **dict(common, workers=3, chunk=2), **mix) as p:
        again = _epoch(p)
    for a, b in zip(mixed, again):
        assert (a[0] == b[0]).all() and (a[2] == b[2]).all() and a[3] == b[3]


def test_mixing_refused(folder):
    ds = dsrt.Datastore(folder)
    with pytest.raises(ValueError, match="needs float NCHW"):
        dsrt.Pipeline(ds, preset="32", dtype="uint8", mixup_alpha=0.2)
    with pytest.raises(ValueError, match="label_smoothing: 1"):
        dsrt.Pipeline(ds, preset="32", label_smoothing=1.0)
    with pytest.raises(ValueError, match="mix_prob: -0.5"):
        dsrt.Pipeline(ds, preset="32", cutmix_alpha=1.0, mix_prob=-0.5)
    with pytest.raises(ValueError, match="classes: 2"):
        dsrt.Pipeline(ds, preset="32", label_smoothing=0.1, num_classes=2)


def test_torch_loader_soft_targets(folder):
    ds = dsrt.Datastore(folder)
    with dsrt.Pipeline(ds, preset="32", batch=16, epochs=1, seed=1, mixup_alpha=0.4,
                       label_smoothing=0.1, num_classes=5) as p:
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 5))
        for x, t in dsrt.TorchLoader(p):
            assert t.dtype == torch.float32 and t.shape == (x.shape[0], 5)
            loss = torch.nn.functional.cross_entropy(net(x), t)
            assert torch.isfinite(loss)
    with dsrt.Pipeline(ds, preset="32", batch=16, epochs=1, label_smoothing=0.2) as p:
        for x, y, t in dsrt.TorchLoader(p, with_labels=True):
            assert y.dtype == torch.int64
            assert torch.allclose(t.gather(1, y[:, None]), torch.tensor(0.8 + 0.2 / 3))


# ----------------------------------------------------------------------------
# Ranks: each process's share of every epoch


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_shares(folder, world, drop_last):
    """48 samples, 5 a rank a batch: the shares of a batch are disjoint, as
    large as each other, and together the batch of batch * world samples one
    pipeline makes; over an epoch they cover every sample, the last batch
    padded from the start of the order (or dropped with drop_last)."""
    ds = dsrt.Datastore(folder)
    common = dict(preset="32", epochs=1, seed=5, drop_last=drop_last)
    with dsrt.Pipeline(ds, batch=5 * world, **common) as p:
        whole = [np.from_dlpack(b.ids).copy() for b in p]
        bpe = len(p)
    shares = []
    for r in range(world):
        with dsrt.Pipeline(ds, batch=5, rank=r, world_size=world, workers=1 + r % 2, **common) as p:
            assert len(p) == bpe
            shares.append([np.from_dlpack(b.ids).copy() for b in p])
    for r in range(world):
        assert len(shares[r]) == len(whole)
    for k, ids in enumerate(whole):
        counts = {len(s[k]) for s in shares}
        assert len(counts) == 1
        got = np.concatenate([s[k] for s in shares])
        if len(got) == len(ids):
            assert (got == ids).all()
        else:
            # Padded: the batch's samples, then the first ones of the epoch.
            assert not drop_last and k % bpe == bpe - 1
            assert len(got) < len(ids) + world and len(got) % world == 0
            start = whole[k - k % bpe]
            assert (got[: len(ids)] == ids).all()
            assert (got[len(ids):] == start[: len(got) - len(ids)]).all()
    epoch = np.concatenate([s[k] for k in range(bpe) for s in shares])
    if drop_last:
        assert len(set(epoch)) == len(epoch) == bpe * 5 * world
    else:
        assert set(epoch) == set(range(48))
        assert len(epoch) == -(-48 // world) * world


def test_elastic_resume(folder, tmp_path):
    """2 ranks stopped after batch 2 of epoch 0 resume on 3 (and on 1) with
    the same global batch: the rest of the epoch is the batches the 2 would
    have made, striped over the new ranks, so each sample comes once; in the
    shard order too, where each rank streams whole shards."""
    plain = dsrt.Datastore(folder)
    out = str(tmp_path / "elastic_shards")
    plain.write_shards(out, shard_bytes=16 << 10)
    common = dict(preset="32", epochs=2, seed=7, drop_last=True)  # ranks streaming shards
    for ds in (plain, dsrt.Datastore(out, order="shard", shuffle_buffer=8)):

        def shares(world, start=None, from_world=None):
            got = []
            for r in range(world):
                with dsrt.Pipeline(ds, batch=12 // world, rank=r, world_size=world, **common) as p:
                    if start:
                        p.reset(*start, from_world_size=from_world)
                    got.append([(b.epoch, b.index, np.from_dlpack(b.ids).copy()) for b in p])
            # Batch by batch (one epoch's), the ranks' shares in rank order.
            return [(got[0][k][:2], np.concatenate([g[k][2] for g in got])) for k in range(len(got[0]))]

        whole = shares(2)
        for world in (3, 1):
            rest = shares(world, (0, 2), 2)
            assert [k for k, _ in rest] == [k for k, _ in whole[2:]]
            for (_, a), (_, b) in zip(rest[:2], whole[2:4]):
                assert (a == b).all()
            epoch0 = np.concatenate([ids for _, ids in whole[:2]] + [ids for _, ids in rest[:2]])
            assert sorted(epoch0) == list(range(48))
    with dsrt.Pipeline(plain, batch=6, rank=0, world_size=2, **common) as p:
        with pytest.raises(ValueError, match="from_world_size"):
            p.reset(0, 1, from_world_size=-1)


def test_rank_from_environment(folder, monkeypatch):
    ds = dsrt.Datastore(folder)
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="neither RANK and WORLD_SIZE"):
        dsrt.Pipeline(ds, batch=4, rank="env")
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    with dsrt.Pipeline(ds, batch=4, shuffle="never", epochs=1, rank="env") as p:
        assert list(np.from_dlpack(next(iter(p)).ids)) == [4, 5, 6, 7]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with dsrt.Pipeline(ds, batch=4, shuffle="never", epochs=1, rank="env") as p:
        assert list(np.from_dlpack(next(iter(p)).ids)) == [0, 1, 2, 3]
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ValueError, match="RANK=3 is not below WORLD_SIZE=3"):
        dsrt.Pipeline(ds, batch=4, rank="env")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE=two"):
        dsrt.Pipeline(ds, batch=4, rank="env")
    with pytest.raises(ValueError, match="go together"):
        dsrt.Pipeline(ds, batch=4, rank=1)
    with pytest.raises(ValueError, match="rank: 2: not below world_size 2"):
        dsrt.Pipeline(ds, batch=4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="'auto'"):
        dsrt.Pipeline(ds, batch=4, rank="auto")


# ----------------------------------------------------------------------------
# Mixes and weighted sampling


@pytest.fixture(scope="session")
def other_folder(tmp_path_factory):
    """A second folder whose classes overlap the first's: class1, class2, class3."""

    def make(d):
        _write_images(d, 30, 3, seed=5)
        for c in (2, 1, 0):
            os.rename(os.path.join(d, f"class{c}"), os.path.join(d, f"class{c + 1}"))

    return _dataset(tmp_path_factory, "other", make)


def _sources_and_ids(p):
    sources, ids = [], []
    for b in p:
        sources += np.from_dlpack(b.sources).tolist()
        ids += np.from_dlpack(b.ids).tolist()
    return sources, ids


def test_mix(folder, other_folder, tmp_path):
    ds = dsrt.Datastore([folder, other_folder], mix=[0.75, 0.25])
    assert ds.source == "mix" and len(ds) == 78
    assert ds.mix_weights == pytest.approx((0.75, 0.25))
    assert ds.classes == ("class0", "class1", "class2", "class3")  # merged by name
    assert ds.mix_source(0) == 0 and ds.mix_source(77) == 1
    assert ds.classes[ds.label(77)] == os.path.basename(os.path.dirname(ds.path(77)))
    apart = dsrt.Datastore([folder, other_folder], mix="1,1", mix_labels="separate")
    assert apart.classes[:4] == ("0:class0", "0:class1", "0:class2", "1:class1")
    p = dsrt.Pipeline(ds, preset="32", batch=16, epochs=1, seed=3, epoch_samples=200)
    sources, ids = _sources_and_ids(p)
    assert len(sources) == 200 and sources.count(0) == 150  # each source's share, exactly
    assert all((i >= 48) == (s == 1) for s, i in zip(sources, ids))
    # The same batches for any worker count, and over two parts.
    again = _sources_and_ids(
        dsrt.Pipeline(ds, preset="32", batch=16, epochs=1, seed=3, epoch_samples=200, workers=1)
    )
    assert again == (sources, ids)
    halves = [
        dsrt.Pipeline(ds, preset="32", batch=16, epochs=1, seed=3, epoch_samples=200,
                      rank=r, world_size=2)
        for r in (0, 1)
    ]
    joined = []
    for b0, b1 in zip(*halves):
        joined += np.from_dlpack(b0.ids).tolist() + np.from_dlpack(b1.ids).tolist()
    assert joined == ids
    # A mix file; with replacement.
    mixfile = tmp_path / "data.mix"
    mixfile.write_text(f"# path,weight\n{folder},3\n{other_folder},1\n")
    m = dsrt.Datastore(mix=str(mixfile), mix_replacement=True)
    assert len(m) == 78 and m.mix_weights == pytest.approx((0.75, 0.25))
    with pytest.raises(ValueError, match="mix: 1 weight"):
        dsrt.Datastore([folder, other_folder], mix=[1])
    with pytest.raises(ValueError, match="weight -1"):
        dsrt.Datastore([folder, other_folder], mix=[1, -1])
    with pytest.raises(ValueError, match="one source"):
        dsrt.Datastore([folder], mix=[1])
    with pytest.raises(ValueError, match="mix_labels: 'both'"):
        dsrt.Datastore([folder, other_folder], mix_labels="both")


def test_sample_weights(folder, tmp_path):
    ds = dsrt.Datastore(folder)
    labels = []
    for b in dsrt.Pipeline(ds, preset="32", batch=50, epochs=1, sample_weights="class-balanced",
                           epoch_samples=600):
        labels += np.from_dlpack(b.labels).tolist()
    counts = collections.Counter(labels)
    # Three classes equally often: chi-square with 2 degrees of freedom, 41.4 is p = 1e-9.
    assert sum((counts[c] - 200) ** 2 / 200 for c in range(3)) < 41.4
    w = [0.0] * 48
    w[5] = 1.0
    ids = _sources_and_ids(
        dsrt.Pipeline(ds, preset="32", batch=16, epochs=1, sample_weights=w, epoch_samples=32)
    )[1]
    assert ids == [5] * 32
    f = tmp_path / "w.txt"
    f.write_text("1\n" * 47)
    with pytest.raises(ValueError, match="w.txt: 47 weights for 48 samples"):
        dsrt.Pipeline(ds, sample_weights=str(f))
    with pytest.raises(ValueError, match="3 weights for 48 samples"):
        dsrt.Pipeline(ds, sample_weights=[1, 2, 3])
    with pytest.raises(ValueError, match="epoch_samples: 10: only with a mix or sample_weights"):
        dsrt.Pipeline(ds, epoch_samples=10)
