"""Tests of dsrt.Net and dsrt.onnx_import (run by CTest as part of test_python).

A small network (dstrain's built-in `cifar`) is trained for one epoch by the
built dstrain on images made here with Pillow, and exported by `dstrain
export`; what the Python side computes is compared with what `dstrain
classify --json` prints for the same images and models (within 1e-5: its
scores are printed to 6 significant digits): NumPy arrays of either layout
and dtype, torch tensors through DLPack, strided views, image files and
folders, the ONNX model, and the models Python writes. Bad arrays, paths and
class files raise with messages naming the fault. Loading is lazy: `import
dsrt` and a pipeline map neither oneDNN nor libdsrt_train; Net maps both (a
fresh interpreter, reading /proc/self/maps). predict releases the GIL:
another thread's counter advances during a call; nothing here depends on how
long anything takes.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

import dsrt

BIN_DIR = os.environ.get("DSRT_BIN_DIR", "")
DSTRAIN = os.path.join(BIN_DIR, "tools", "dstrain")
TOL = 1e-5


def _base(tmp_path_factory, name):
    root = os.environ.get("DSRT_TEST_TMP")
    if root:
        path = os.path.join(root, "python", name)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path
    return str(tmp_path_factory.mktemp(name))


def _picture(rng, h, w, c):
    """An image of class c: one strong colour channel over noise."""
    img = rng.integers(0, 90, (h, w, 3)).astype(np.int32)
    img[..., c % 3] += 100 + 40 * (c // 3)
    yy, xx = np.mgrid[0:h, 0:w]
    img[..., (c + 1) % 3] += (xx * 60 // w + yy * 40 // h).astype(np.int32)
    return img.clip(0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A trained model (.dsrt), its ONNX export, and test images: 32x32 PNGs
    (arrays read by Pillow equal dsrt's decode), larger PNGs and JPEGs."""
    if not os.access(DSTRAIN, os.X_OK):
        pytest.skip(f"no dstrain at {DSTRAIN} (DSRT_BIN_DIR)")
    from PIL import Image

    base = _base(tmp_path_factory, "net")
    rng = np.random.default_rng(7)
    data = os.path.join(base, "data")
    for c in range(4):
        os.makedirs(os.path.join(data, f"class{c}"))
        for i in range(16):
            Image.fromarray(_picture(rng, 32, 32, c)).save(
                os.path.join(data, f"class{c}", f"{i:02d}.png"))
    images = os.path.join(base, "images")
    os.makedirs(images)
    small, large = [], []
    for i in range(6):
        p = os.path.join(images, f"small{i}.png")
        Image.fromarray(_picture(rng, 32, 32, i % 4)).save(p)
        small.append(p)
    for i in range(3):
        p = os.path.join(images, f"large{i}.png")
        Image.fromarray(_picture(rng, 45 + 7 * i, 38 + 5 * i, i)).save(p)
        large.append(p)
        p = os.path.join(images, f"photo{i}.jpg")
        Image.fromarray(_picture(rng, 50, 61, i + 1)).save(p, quality=90)
        large.append(p)
    m = os.path.join(base, "m.dsrt")
    run = subprocess.run(
        [DSTRAIN, "train", "--data", data, "--net", "cifar", "--epochs", "1", "--batch", "16",
         "--threads", "2", "--seed", "3", "--save", m],
        capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    onnx = os.path.join(base, "m.onnx")
    run = subprocess.run([DSTRAIN, "export", m, "--output", onnx], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return dict(base=base, data=data, dsrt=m, onnx=onnx, small=small, large=large)


def dstrain_classify(model_path, paths, *extra):
    """dstrain classify --json: {path: scores} in its order."""
    run = subprocess.run([DSTRAIN, "classify", "--model", model_path, "--json", "--threads", "2",
                          *extra, *paths], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    return [d["path"] for d in lines], np.array([d["scores"] for d in lines], np.float32)


def pixels(paths):
    from PIL import Image

    return np.stack([np.asarray(Image.open(p).convert("RGB")) for p in paths])


# ----------------------------------------------------------------------------
# The same numbers as dstrain classify


def test_predict_matches_dstrain_classify(model):
    net = dsrt.Net.load(model["dsrt"])
    _, want = dstrain_classify(model["dsrt"], model["small"])
    assert want.shape == (6, 4)
    # The model is no constant: the comparison below tells images apart.
    assert np.ptp(want[:, 0]) > 1e-3
    x = pixels(model["small"])  # (6, 32, 32, 3) uint8 NHWC
    got = net.predict(x)
    assert got.dtype == np.float32 and got.shape == (6, 4)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    # float32 NCHW, values 0 to 1 (a Pipeline's float batch, ToTensor's).
    f = np.ascontiguousarray(x.transpose(0, 3, 1, 2)).astype(np.float32) / 255
    np.testing.assert_allclose(net.predict(f), want, atol=TOL, rtol=0)
    # One image (3-D), either layout.
    np.testing.assert_allclose(net.predict(x[2]), want[2:3], atol=TOL, rtol=0)
    np.testing.assert_allclose(net.predict(f[2]), want[2:3], atol=TOL, rtol=0)
    # Batches smaller than the array.
    np.testing.assert_allclose(net.predict(x, batch=4), want, atol=TOL, rtol=0)
    # uint8 images of other sizes are resized as image files are.
    png = [p for p in model["large"] if p.endswith(".png")]
    _, want_large = dstrain_classify(model["dsrt"], png)
    for i, p in enumerate(png):
        np.testing.assert_allclose(net.predict(pixels([p])), want_large[i:i + 1], atol=TOL,
                                   rtol=0)


def test_predict_torch_dlpack(model):
    try:
        import torch
    except ImportError as e:
        pytest.skip(f"torch cannot be imported ({e}): the DLPack case is not checked")
    net = dsrt.Net.load(model["dsrt"])
    _, want = dstrain_classify(model["dsrt"], model["small"])
    x = torch.from_numpy(pixels(model["small"]))
    assert not hasattr(x, "__buffer__") and not isinstance(x, np.ndarray)
    np.testing.assert_allclose(net.predict(x), want, atol=TOL, rtol=0)
    f = x.permute(0, 3, 1, 2).contiguous().float() / 255
    np.testing.assert_allclose(net.predict(f), want, atol=TOL, rtol=0)
    # A channels-last view of NCHW (strides, not a copy) reads the same.
    np.testing.assert_allclose(net.predict(f.to(memory_format=torch.channels_last)), want,
                               atol=TOL, rtol=0)
    with pytest.raises(TypeError, match="dtype int64"):
        net.predict(x.long())
    with pytest.raises(TypeError, match="dtype float64"):
        net.predict(f.double())


def test_strided_arrays(model):
    net = dsrt.Net.load(model["dsrt"])
    x = pixels(model["small"])
    want = net.predict(np.ascontiguousarray(x[::-1, :, ::-1]))
    np.testing.assert_allclose(net.predict(x[::-1, :, ::-1]), want, atol=TOL, rtol=0)
    f = x.astype(np.float32) / 255  # NHWC float: copied to NCHW
    np.testing.assert_allclose(net.predict(f), net.predict(x), atol=TOL, rtol=0)
    np.testing.assert_allclose(net.predict(f.transpose(0, 3, 1, 2)), net.predict(x), atol=TOL,
                               rtol=0)
    # Every other image of a batch, and a read-only array.
    ro = x.copy()
    ro.setflags(write=False)
    np.testing.assert_allclose(net.predict(ro[::2]), net.predict(x)[::2], atol=TOL, rtol=0)


def test_classify_matches_dstrain_classify(model):
    net = dsrt.Net.load(model["dsrt"])
    files = model["small"] + model["large"]
    paths, want = dstrain_classify(model["dsrt"], files)
    assert paths == files
    np.testing.assert_allclose(net.classify(files), want, atol=TOL, rtol=0)
    np.testing.assert_allclose(net.classify(files, batch=3), want, atol=TOL, rtol=0)
    # A folder stands for its images, in dstrain's order.
    folder = os.path.join(model["data"], "class2")
    paths, want = dstrain_classify(model["dsrt"], [folder])
    got_paths, got = net.classify(folder, with_paths=True)
    assert got_paths == paths and len(paths) == 16
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    # top() lists what dstrain's text output lists.
    run = subprocess.run([DSTRAIN, "classify", "--model", model["dsrt"], "--threads", "2", *files],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    top = net.top(net.classify(files))
    for line, row in zip(run.stdout.splitlines(), top):
        cols = line.split("\t")
        assert [name for name, _ in row] == cols[1::2]
        np.testing.assert_allclose([s for _, s in row], [float(s) for s in cols[2::2]], atol=1e-4)
    assert net.classes == ("class0", "class1", "class2", "class3")
    one = net.classify(files[0])
    assert one.shape == (1, 4)
    assert net.top(one, k=10)[0] == net.top(one[0], k=4)  # k beyond the classes: all of them
    assert len(net.top(want[0], k=2)) == 2
    with pytest.raises(ValueError, match="not finite"):
        net.top(np.full((1, 4), np.nan, np.float32))


def test_onnx_and_saved_models(model, tmp_path):
    net = dsrt.Net.load(model["dsrt"])
    want = net.classify(model["small"])
    onnx = dsrt.Net.load(model["onnx"])  # dstrain export's model, imported
    assert onnx.classes == net.classes and onnx.input_shape == (3, 32, 32)
    np.testing.assert_allclose(onnx.predict(pixels(model["small"])), want, atol=TOL, rtol=0)
    _, c_onnx = dstrain_classify(model["onnx"], model["small"])
    np.testing.assert_allclose(onnx.classify(model["small"]), c_onnx, atol=TOL, rtol=0)
    # onnx_import writes a model file as dstrain import does.
    dst = str(tmp_path / "imported.dsrt")
    imported = dsrt.onnx_import(model["onnx"], dst)
    assert imported.learnables == net.learnables
    _, c_imported = dstrain_classify(dst, model["small"])
    np.testing.assert_allclose(c_imported, want, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="is the model read"):
        dsrt.onnx_import(model["onnx"], model["onnx"])
    with pytest.raises(ValueError, match="not an ONNX model"):
        dsrt.onnx_import(model["dsrt"], dst)
    with pytest.raises(ValueError, match="writes a dsrt model file"):
        dsrt.onnx_import(model["onnx"], str(tmp_path / "imported.onnx"))
    # save and export: dstrain reads what Python writes.
    saved, exported = str(tmp_path / "saved.dsrt"), str(tmp_path / "exported.onnx")
    net.save(saved)
    net.export(exported, opset=17)
    for path in (saved, exported):
        _, got = dstrain_classify(path, model["small"])
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="opset"):
        net.export(exported, opset=3)
    # Properties.
    assert net.input_shape == (3, 32, 32) and net.num_classes == 4
    assert net.learnables > 0 and net.layers[0][1] == "input" and len(net.layers) > 3
    assert "cifar" in repr(net) or "layers" in repr(net)
    assert net.backend == "cpu-onednn" and net.threads >= 1
    assert dsrt.Net.load(model["dsrt"], threads=1).threads == 1
    # ONNX options: refused for a dsrt model, checked for an ONNX one.
    with pytest.raises(ValueError, match="go with an ONNX model"):
        dsrt.Net.load(model["dsrt"], preprocess="torchvision")
    with pytest.raises(ValueError, match="preprocess"):
        dsrt.Net.load(model["onnx"], preprocess="imagenet")
    with pytest.raises(ValueError, match="std"):
        dsrt.Net.load(model["onnx"], std=(0.2, 0, 0.2))
    with pytest.raises(ValueError, match="input_scale"):
        dsrt.Net.load(model["onnx"], input_scale=-1)
    with pytest.raises(ValueError, match="size_mode"):
        dsrt.Net.load(model["dsrt"], size_mode="stretch")
    # The model's normalisation: torchvision's differs from the export's own.
    tv = dsrt.Net.load(model["onnx"], preprocess="torchvision")
    assert np.abs(tv.classify(model["small"]) - want).max() > 1e-4
    _, c_tv = dstrain_classify(model["onnx"], model["small"], "--preprocess", "torchvision")
    np.testing.assert_allclose(tv.classify(model["small"]), c_tv, atol=TOL, rtol=0)


def test_unknown_normalisation_warns(model, tmp_path):
    """An ONNX model that says nothing of its input's normalisation is named
    by a UserWarning at load; one that says (dsrt's export, or preprocess=)
    loads silently."""
    try:
        import torch
    except ImportError as e:
        pytest.skip(f"torch cannot be imported ({e}): no model without metadata to make")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(4 * 30 * 30, 5)).eval()
    bare = str(tmp_path / "bare.onnx")
    torch.onnx.export(m, torch.zeros(1, 3, 32, 32), bare, opset_version=13,
                      input_names=["image"], output_names=["scores"])
    with pytest.warns(UserWarning, match=r"bare\.onnx says nothing of how its input is normalised"):
        net = dsrt.Net.load(bare)
    assert net.num_classes == 5 and net.input_shape == (3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dsrt.Net.load(bare, preprocess="torchvision")
        dsrt.Net.load(bare, input_scale=1 / 255.0)
        dsrt.Net.load(model["onnx"])
    # Warnings made errors stop the load with the same words.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="bare.onnx"):
            dsrt.Net.load(bare)


def test_preprocessing_sizes(model):
    """resize_shorter and centercrop size image files and uint8 arrays alike."""
    net = dsrt.Net.load(model["dsrt"], resize_shorter=40, size_mode="centercrop")
    png = [p for p in model["large"] if p.endswith(".png")]
    files = net.classify(png)
    for i, p in enumerate(png):
        np.testing.assert_allclose(net.predict(pixels([p])), files[i:i + 1], atol=TOL, rtol=0)
    plain = dsrt.Net.load(model["dsrt"])
    assert np.abs(plain.classify(png) - files).max() > 1e-5
    # dstrain classify takes the same options with the same meaning.
    _, tool = dstrain_classify(model["dsrt"], png, "--resize-shorter", "40", "--size-mode",
                               "centercrop")
    np.testing.assert_allclose(tool, files, atol=TOL, rtol=0)


# ----------------------------------------------------------------------------
# Refusals


def test_bad_arrays(model):
    net = dsrt.Net.load(model["dsrt"])
    x = pixels(model["small"])
    with pytest.raises(ValueError, match="2-D array"):
        net.predict(x[0, :, :, 0])
    with pytest.raises(ValueError, match="5-D array"):
        net.predict(x[None])
    with pytest.raises(ValueError, match="3 channels"):
        net.predict(x[..., :2])
    with pytest.raises(ValueError, match=r"as NCHW has 32 channels"):
        net.predict(x, layout="NCHW")
    with pytest.raises(ValueError, match="ambiguous"):
        net.predict(np.zeros((2, 3, 3, 3), np.uint8))
    ok = net.predict(np.zeros((2, 3, 3, 3), np.uint8), layout="NHWC")
    assert ok.shape == (2, 4)
    with pytest.raises(ValueError, match="layout"):
        net.predict(x, layout="HWNC")
    with pytest.raises(TypeError, match="dtype float64"):
        net.predict(x.astype(np.float64))
    with pytest.raises(TypeError, match="dtype int16"):
        net.predict(x.astype(np.int16))
    with pytest.raises(ValueError, match="must be 32x32"):
        net.predict(np.zeros((1, 3, 30, 30), np.float32))
    with pytest.raises(TypeError, match="NumPy array or a tensor"):
        net.predict(x.tolist())
    with pytest.raises(ValueError, match="batch"):
        net.predict(x, batch=0)
    assert net.predict(np.zeros((0, 32, 32, 3), np.uint8)).shape == (0, 4)
    # A broadcast array holds more images than memory holds their scores.
    huge = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (2**60, 1, 1, 3))
    with pytest.raises(ValueError, match="too many"):
        net.predict(huge)
    # One image whose pixels cannot be gathered: the binding's own message.
    with pytest.raises(MemoryError, match="predict: out of memory for an image's pixels"):
        net.predict(np.broadcast_to(np.zeros((1, 1, 1, 3), np.uint8), (1, 2**30, 2**30, 3)))

    class NotDLPack:
        def __dlpack__(self):
            return 5

    with pytest.raises(TypeError, match="DLPack capsule"):
        net.predict(NotDLPack())


def test_four_channel_model(tmp_path):
    """A model of 4 input channels (imported from ONNX) loads; uint8 arrays
    of its size are pixels / 255, as float arrays; others are refused."""
    try:
        import torch
    except ImportError:
        pytest.skip("no torch")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(4, 3, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 2))
    path = str(tmp_path / "c4.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m.eval(), torch.zeros(1, 4, 8, 8), path, input_names=["x"],
                          output_names=["y"], opset_version=13)
    net = dsrt.Net.load(path, input_scale=1 / 255)
    assert net.input_shape == (4, 8, 8)
    x = np.random.default_rng(3).integers(0, 256, (3, 8, 8, 4)).astype(np.uint8)
    got = net.predict(x, layout="NHWC")
    want = net.predict((x.transpose(0, 3, 1, 2) / 255).astype(np.float32))
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    with torch.no_grad():
        ref = torch.softmax(m(torch.from_numpy(x.transpose(0, 3, 1, 2) / 255).float()), 1)
    np.testing.assert_allclose(got, ref.numpy(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="4 channels cannot be resized"):
        net.predict(np.zeros((1, 9, 9, 4), np.uint8), layout="NHWC")


def test_bad_paths(model, tmp_path):
    net = dsrt.Net.load(model["dsrt"])
    missing = str(tmp_path / "missing.png")
    with pytest.raises(FileNotFoundError) as e:
        net.classify([model["small"][0], missing])
    assert e.value.filename == missing
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    with pytest.raises(dsrt.Error, match="bad.png"):
        net.classify([model["small"][0], str(bad)])
    text = tmp_path / "text.jpg"
    text.write_text("not an image")
    with pytest.raises(dsrt.Error, match="text.jpg"):
        net.classify(str(text))
    with pytest.raises(FileNotFoundError):
        dsrt.Net.load(str(tmp_path / "none.dsrt"))
    with pytest.raises(FileNotFoundError):
        dsrt.Net.load(str(tmp_path / "none.onnx"))
    garbage = tmp_path / "garbage.dsrt"
    garbage.write_bytes(b"DSRTMODL" + b"\x07" * 64)
    with pytest.raises(dsrt.Error, match="garbage.dsrt") as e:
        dsrt.Net.load(str(garbage))
    assert e.value.code < -1000
    not_onnx = tmp_path / "text.onnx"
    not_onnx.write_text("not a model")
    with pytest.raises(dsrt.Error, match="text.onnx"):
        dsrt.Net.load(str(not_onnx))
    with pytest.raises(TypeError, match="path"):
        net.classify(3)


def test_class_names(model, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("cat\r\ndog\nbird\nfish\n\n")
    net = dsrt.Net.load(model["onnx"], classes=str(names))
    assert net.classes == ("cat", "dog", "bird", "fish")
    assert net.top(net.classify(model["small"][0]))[0][0][0] in net.classes
    # A dsrt model named anew keeps its numbers and saves the names.
    renamed = dsrt.Net.load(model["dsrt"], classes=["a", "b", "c", "d"])
    np.testing.assert_array_equal(renamed.classify(model["small"]),
                                  dsrt.Net.load(model["dsrt"]).classify(model["small"]))
    saved = str(tmp_path / "renamed.dsrt")
    renamed.save(saved)
    assert dsrt.Net.load(saved).classes == ("a", "b", "c", "d")
    # The C parser's refusals, naming the line.
    names.write_text("cat\ndo\x01g\nbird\nfish\n")
    with pytest.raises(dsrt.Error, match=r"line 2: a control character"):
        dsrt.Net.load(model["onnx"], classes=str(names))
    names.write_text("\n\n")
    with pytest.raises(dsrt.Error, match="no names"):
        dsrt.Net.load(model["onnx"], classes=str(names))
    names.write_text("cat\ndog\n")
    with pytest.raises(ValueError, match="2 class names for a model of 4"):
        dsrt.Net.load(model["onnx"], classes=str(names))
    with pytest.raises(ValueError, match="2 names for a model of 4"):
        dsrt.Net.load(model["dsrt"], classes=["a", "b"])
    with pytest.raises(ValueError, match=r"line 3: a control character"):
        dsrt.Net.load(model["dsrt"], classes=["a", "b", "c\x02", "d"])
    with pytest.raises(ValueError, match=r"classes\[1\]"):
        dsrt.Net.load(model["dsrt"], classes=["a", "b\nc", "d", "e"])
    with pytest.raises(TypeError, match=r"classes\[0\]"):
        dsrt.Net.load(model["dsrt"], classes=[1, 2, 3, 4])
    with pytest.raises(FileNotFoundError):
        dsrt.Net.load(model["onnx"], classes=str(tmp_path / "none.txt"))
    with pytest.raises(IsADirectoryError):
        dsrt.Net.load(model["onnx"], classes=str(tmp_path))


# ----------------------------------------------------------------------------
# Loading on first use, and the GIL


MAPS_SCRIPT = textwrap.dedent("""
    import json, sys
    def mapped():
        maps = open("/proc/self/maps").read()
        return {"dnnl": "libdnnl" in maps, "train": "libdsrt_train" in maps}
    import dsrt
    out = {"import": mapped()}
    ds = dsrt.Datastore(sys.argv[1])
    with dsrt.Pipeline(ds, batch=8, epochs=1, workers=1,
                       augment=dict(output_size=(32, 32))) as p:
        batch = next(iter(p))
        assert len(batch) == 8
        del batch
    out["pipeline"] = mapped()
    try:
        net = dsrt.Net.load(sys.argv[2])
        out["scores"] = net.classify(sys.argv[3]).tolist()
    except ImportError as e:
        out["error"] = str(e)
    out["net"] = mapped()
    print(json.dumps(out))
""")


def run_maps(model, env=None):
    run = subprocess.run([sys.executable, "-c", MAPS_SCRIPT, model["data"], model["dsrt"],
                          model["small"][0]], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_network_library_loaded_on_first_use(model):
    out = run_maps(model)
    no = {"dnnl": False, "train": False}
    assert out["import"] == no and out["pipeline"] == no
    assert out["net"] == {"dnnl": True, "train": True}
    assert len(out["scores"][0]) == 4


def test_network_library_missing(model, tmp_path):
    """A package whose libdsrt_train cannot be found: the data side works,
    Net raises ImportError saying what is missing; with the libraries beside
    it (a pip install's layout) Net works."""
    src = os.path.dirname(dsrt.__file__)
    pkg = tmp_path / "site" / "dsrt"
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__", "dsrt_*.so"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    env.pop("LD_LIBRARY_PATH", None)
    out = run_maps(model, env)
    if "error" not in out:
        pytest.skip("libdsrt_train is installed where the loader finds it anyway")
    assert "libdsrt_train" in out["error"] and "Datastore" in out["error"]
    assert out["net"] == {"dnnl": False, "train": False}
    # The libraries beside the module, as a pip install lays them out.
    build = os.path.dirname(os.path.dirname(src))
    for name in ("libdsrt_train.so.0", "libdsrt.so.0"):
        shutil.copyfile(os.path.join(build, name), pkg / name)
    out = run_maps(model, env)
    assert "error" not in out and len(out["scores"][0]) == 4


def test_predict_releases_gil(model):
    """Another thread runs Python code while predict computes. The switch
    interval is made so long that the GIL changes hands only when a thread
    lets it go: the counter can advance during the call only if predict
    releases it."""
    net = dsrt.Net.load(model["dsrt"], threads=1)
    x = np.zeros((16, 3, 32, 32), np.float32)
    net.predict(x)  # plans this batch size
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1
            stop.wait(0.0005)  # lets the GIL go between increments

    old = sys.getswitchinterval()
    thread = threading.Thread(target=spin)
    advanced = False
    sys.setswitchinterval(1000.0)
    try:
        thread.start()
        for _ in range(100):
            before = count[0]
            net.predict(x)
            after = count[0]
            if after > before:
                advanced = True
                break
    finally:
        stop.set()
        sys.setswitchinterval(old)
        thread.join()
    assert advanced
