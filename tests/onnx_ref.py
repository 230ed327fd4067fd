#!/usr/bin/env python3
"""Reference models, images and answers for dsrt's ONNX tests.

Made here, never downloaded. Two interpreters run this file:

  the system's Python (Debian's python3-torch, python3-torchvision, numpy, PIL):
    torch-small OUT          a small net of every operator dsrt imports that
                             PyTorch exports (seeded weights), as OUT.onnx
    torchvision NAME OUT     torchvision's NAME (alexnet, resnet18, resnet50,
                             squeezenet1_1) with seeded random weights
    modern NAME SIZE OUT     torchvision's NAME (mobilenet_v2, mobilenet_v3_*,
                             efficientnet_b0, regnet_y_400mf, densenet121,
                             convnext_tiny) with seeded random weights,
                             batchnorm statistics, LayerNorm and layer-scale
                             values, taking SIZE x SIZE, as OUT-13.onnx and
                             OUT-17.onnx
    torch-functions OUT      a net whose residual blocks PyTorch writes as
                             ONNX local functions (attributes by reference)
    torch-shapes OUT         TensorFlow's "same" padding computed from the
                             input's shape (EfficientNet-Lite's), a view to
                             (N, -1) from the shape, a channels-last LayerNorm
                             + Linear + GELU pair: shape arithmetic to fold
    images DIR SIZE N        N PNG images of SIZE x SIZE in class folders
                             c0, c1, ... of DIR, their pixels (N, 3, SIZE,
                             SIZE) in DIR/pixels.npy, their paths in
                             DIR/paths.txt (in that order)

  the environment of scripts/onnx-venv.sh (onnx, onnxruntime):
    helper-models DIR        hand-made models (onnx.helper) of what PyTorch
                             does not write: Dropout, Identity, Constant,
                             MatMul + Add, Gemm with transB=0, alpha and
                             beta, LRN, AveragePool counting its padding,
                             auto_pad, opsets 7 and 21, external data;
                             squeeze-and-excitation's Mul, layer scales,
                             LayerNormalization, Pad, ceil_mode pooling
                             (opsets 9, 11 and 17); a
                             channels-last model as tf2onnx writes them (its
                             normalisation, then a Transpose to NCHW); models
                             dsrt refuses, each for one construct
    modern-helper-models DIR the channels-last model and the refused ones
    fuzz-seeds DIR           small models for fuzz_onnx's corpus (its seeds)
    ort PIXELS [--scale S | --torchvision] MODEL OUT [MODEL OUT ...]
                             onnx.checker, then onnxruntime (2 threads) on
                             the pixels (times S, or normalised as
                             torchvision's models take them); softmax
                             probabilities to each OUT (.npy)
    compare TOL JSONL NPY [JSONL NPY ...]
                             dstrain classify --json's scores against the
                             runtime's: every probability within TOL and the
                             same top-1 on every image; prints the figures
    eval-compare JSON NPY DIR  dstrain eval --json's confusion matrix against
                             the runtime's predictions for DIR/paths.txt
"""
import json
import os
import sys

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def fail(msg):
    print("onnx_ref: " + msg, file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------
# PyTorch (system Python)


def peaked(model, x, out_layer, spread):
    """Scales the last layer so that the logits spread over `spread` units:
    random weights give nearly uniform probabilities, which would hide a
    wrong layer behind a tolerance."""
    import torch
    with torch.no_grad():
        logits = model(x)
        s = float(logits.std())
        if s > 0:
            out_layer.weight.mul_(spread / s)
            if getattr(out_layer, "bias", None) is not None:
                out_layer.bias.mul_(spread / s)


def torch_small(out):
    import torch
    import torch.nn as nn

    torch.manual_seed(1)

    class Small(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1 = nn.Conv2d(3, 8, 3, padding=1)
            s.c2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2, bias=False)
            s.bn = nn.BatchNorm2d(16)
            s.mp = nn.MaxPool2d(3, stride=2, ceil_mode=True)
            s.ap = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
            s.c3 = nn.Conv2d(16, 16, 1, stride=1)
            s.c4 = nn.Conv2d(16, 12, 3, stride=2, padding=(1, 0))
            s.fc = nn.Linear(12 * 8 * 7, 24)
            s.fg = nn.Linear(16, 24)
            s.w = nn.Parameter(torch.randn(24, 10) * 0.2)
            s.b = nn.Parameter(torch.randn(10) * 0.1)
            s.drop = nn.Dropout(0.3)

        def forward(s, x):
            a = torch.relu(s.c1(x))
            b = nn.functional.leaky_relu(s.c2(a), 0.1)
            x = torch.relu(s.bn(torch.cat([a, b], 1)))  # batchnorm after a join: kept
            y = s.mp(x)  # ceil_mode: 32 -> 16
            z = torch.relu(s.ap(y) + s.c3(y))  # Add, then Relu: add relu=1
            g = nn.functional.adaptive_avg_pool2d(z, 1)  # GlobalAveragePool
            g = g.reshape(g.size(0), -1)  # Reshape to 2-D
            f = s.fc(s.drop(torch.flatten(s.c4(z), 1)))  # Flatten, Gemm
            h = torch.relu(f + s.fg(g))  # Add of two (N, K)
            return torch.softmax(h @ s.w + s.b, dim=1)  # MatMul + Add, Softmax

    m = Small()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
        m.bn.weight.uniform_(0.5, 1.5)
        m.bn.bias.uniform_(-0.3, 0.3)
    m.eval()
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        logits = m(x).log()
        s = float(logits.std())
        if s > 0:
            m.w.mul_(3.0 / s)
            m.b.mul_(3.0 / s)
    for opset in (9, 13, 17):
        torch.onnx.export(m, x[:1], "%s-opset%d.onnx" % (out, opset), opset_version=opset,
                          input_names=["image"], output_names=["scores"])


def seeded_torchvision(name, affine):
    """torchvision's NAME with seeded weights and random batchnorm
    statistics (and, with affine, random batchnorm and LayerNorm scales and
    shifts and ConvNeXt's layer scales), in eval mode."""
    import torch
    import torchvision

    torch.manual_seed(0)
    m = getattr(torchvision.models, name)()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
            if not affine:
                continue
            if isinstance(mod, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)):
                mod.weight.uniform_(0.7, 1.3)
                mod.bias.uniform_(-0.2, 0.2)
            if hasattr(mod, "layer_scale"):  # ConvNeXt's, 1e-6 at first: blocks would vanish
                mod.layer_scale.uniform_(0.2, 0.6)
    return m.eval()


def torchvision_model(name, out):
    import torch

    m = seeded_torchvision(name, False)
    last = {"alexnet": lambda: m.classifier[6], "resnet18": lambda: m.fc,
            "resnet50": lambda: m.fc, "squeezenet1_1": lambda: m.classifier[1]}[name]()
    x = torch.rand(2, 3, 224, 224)
    x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    peaked(m, x, last, 6.0)
    torch.onnx.export(m, x[:1], out, opset_version=13, input_names=["image"],
                      output_names=["logits"])


def modern_model(name, size, out):
    import torch

    m = seeded_torchvision(name, True)
    last = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear)][-1]
    x = torch.rand(2, 3, size, size)
    x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    peaked(m, x, last, 6.0)
    for opset in (13, 17):
        torch.onnx.export(m, x[:1], "%s-%d.onnx" % (out, opset), opset_version=opset,
                          input_names=["image"], output_names=["logits"])


def torch_functions(out):
    import torch
    import torch.nn as nn

    torch.manual_seed(2)

    class Block(nn.Module):
        def __init__(s, c, k):
            super().__init__()
            s.conv = nn.Conv2d(c, c, k, padding=k // 2)
            s.bn = nn.BatchNorm2d(c)

        def forward(s, x):
            return torch.relu(s.bn(s.conv(x))) + x

    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.stem = nn.Conv2d(3, 8, 3, stride=2)
            s.b1 = Block(8, 3)
            s.b2 = Block(8, 5)
            s.fc = nn.Linear(8, 5)

        def forward(s, x):
            x = s.b2(s.b1(s.stem(x)))
            return s.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    m = Net()
    with torch.no_grad():
        for b in (m.b1.bn, m.b2.bn):
            b.running_mean.uniform_(-0.5, 0.5)
            b.running_var.uniform_(0.5, 2.0)
    m.eval()
    x = torch.rand(2, 3, 32, 32)
    peaked(m, x, m.fc, 6.0)
    torch.onnx.export(m, x[:1], out + ".onnx", opset_version=15, input_names=["image"],
                      output_names=["logits"], export_modules_as_functions={Block})


def torch_shapes(out):
    import math
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(3)

    class SameConv(nn.Conv2d):
        """TensorFlow's "same" padding from the input's size, as
        EfficientNet-Lite ports compute it (the exporter writes it as
        Shape, Gather, arithmetic and Pad)."""

        def forward(s, x):
            ih, iw = (torch.as_tensor(v) for v in x.size()[-2:])
            kh, kw = s.weight.size()[-2:]
            sh, sw = s.stride
            ph = torch.clamp((torch.div(ih + sh - 1, sh, rounding_mode="floor") - 1) * sh + kh - ih,
                             min=0)
            pw = torch.clamp((torch.div(iw + sw - 1, sw, rounding_mode="floor") - 1) * sw + kw - iw,
                             min=0)
            pads = [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2]
            if not torch.jit.is_tracing():
                pads = [int(v) for v in pads]
            x = F.pad(x, pads)
            return F.conv2d(x, s.weight, s.bias, s.stride)

    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1 = SameConv(3, 8, 3, stride=2)
            s.c2 = SameConv(8, 16, 4, stride=2)
            s.ln = nn.LayerNorm(16)
            s.lin = nn.Linear(16, 16)
            s.fc = nn.Linear(16 * 8 * 8, 5)

        def forward(s, x):
            x = torch.relu(s.c1(x))
            x = s.c2(x)
            y = s.lin(s.ln(x.permute(0, 2, 3, 1)))  # channels-last work
            x = x + F.gelu(y).permute(0, 3, 1, 2)
            return s.fc(x.view(x.size(0), -1))  # Shape, Gather, Unsqueeze, Concat, Reshape

    m = Net()
    with torch.no_grad():
        m.ln.weight.uniform_(0.5, 1.5)
        m.ln.bias.uniform_(-0.3, 0.3)
    m.eval()
    x = torch.rand(2, 3, 32, 32)
    peaked(m, x, m.fc, 6.0)
    for opset in (13, 17):
        torch.onnx.export(m, x[:1], "%s-%d.onnx" % (out, opset), opset_version=opset,
                          input_names=["image"], output_names=["logits"])


def images(d, size, n):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(7)
    classes = 3
    pixels, paths = [], []
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for i in range(n):
        c = i % classes
        # Smooth colour fields with a little noise: each class its own hue.
        base = np.stack([np.sin(6.3 * (xx * (1 + c) + rng.random())),
                         np.cos(6.3 * (yy * (2 - c * 0.5) + rng.random())),
                         np.sin(6.3 * (xx + yy) * (0.5 + rng.random()))], 2)
        base[..., c] += 0.8
        img = np.clip(96 + 80 * base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        folder = os.path.join(d, "c%d" % c)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "%03d.png" % i)
        Image.fromarray(img).save(path)
        paths.append(path)
        pixels.append(img.transpose(2, 0, 1).astype(np.float32))
    np.save(os.path.join(d, "pixels.npy"), np.stack(pixels))
    with open(os.path.join(d, "paths.txt"), "w") as f:
        f.write("\n".join(paths) + "\n")


# ---------------------------------------------------------------------------
# onnx and onnxruntime (the test environment)


def helper_models(d):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def model(nodes, inits, opset, name, out_shape, in_shape=(1, 3, 32, 32)):
        g = helper.make_graph(
            nodes, name,
            [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N"] + list(in_shape[1:]))],
            [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N"] + list(out_shape))],
            [numpy_helper.from_array(v, k) for k, v in inits.items()])
        ir = {7: 3, 9: 4, 11: 6, 13: 7, 17: 8, 21: 10}[opset]
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="onnx_ref", ir_version=ir)
        if ir < 4:  # IR 3: initializers are graph inputs too
            for k, v in inits.items():
                m.graph.input.append(helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape))
        onnx.checker.check_model(m)
        return m

    # Every operator of the hand-made kind, at opsets 21 and 11; 32x32x3 in.
    for opset in (11, 21):
        inits = {
            "c1.w": w(6, 3, 3, 3), "c1.b": w(6),
            "c2.w": w(6, 3, 2, 2),  # groups 2, SAME_LOWER
            "bn.s": (1 + w(6)).astype(np.float32), "bn.b": w(6),
            "bn.m": w(6), "bn.v": (1 + np.abs(w(6))).astype(np.float32),
            "fc.w": w(6 * 8 * 8, 20, scale=0.1), "fc.b": w(20),
            "g.w": w(20, 10), "g.b": w(1, 10),
            "shape": np.array([0, -1], np.int64),
        }
        nodes = [
            helper.make_node("Conv", ["image", "c1.w", "c1.b"], ["c1"], auto_pad="SAME_UPPER",
                             strides=[2, 2]),
            helper.make_node("LeakyRelu", ["c1"], ["r1"], alpha=0.05),
            helper.make_node("Identity", ["r1"], ["r1b"]),
            helper.make_node("Conv", ["r1b", "c2.w"], ["c2"], auto_pad="SAME_LOWER", group=2),
            helper.make_node("Relu", ["c2"], ["r2"]),
            helper.make_node("LRN", ["r2"], ["l2"], size=3, alpha=1e-3, beta=0.6, bias=1.5),
            helper.make_node("AveragePool", ["l2"], ["p2"], kernel_shape=[3, 3], strides=[2, 2],
                             pads=[1, 1, 1, 1], count_include_pad=1),
            helper.make_node("BatchNormalization", ["p2", "bn.s", "bn.b", "bn.m", "bn.v"], ["bn"],
                             epsilon=1e-3),
            helper.make_node("Reshape", ["bn", "shape"], ["flat"]),
        ]
        if opset >= 12:
            inits["ratio"] = np.array(0.25, np.float32)
            nodes.append(helper.make_node("Dropout", ["flat", "ratio"], ["drop"]))
        else:
            nodes.append(helper.make_node("Dropout", ["flat"], ["drop"], ratio=0.25))
        nodes += [
            helper.make_node("MatMul", ["drop", "fc.w"], ["mm"]),
            helper.make_node("Add", ["mm", "fc.b"], ["fc"]),
            helper.make_node("Relu", ["fc"], ["rf"]),
            helper.make_node("Gemm", ["rf", "g.w", "g.b"], ["scores"], alpha=0.7, beta=1.3),
        ]
        onnx.save(model(nodes, inits, opset, "ops", [10]), os.path.join(d, "ops%d.onnx" % opset))

    # Opset 7 (IR 3): Dropout's ratio attribute, BatchNormalization's
    # spatial, Gemm needing C, Softmax at the end, a Constant's shape.
    inits = {"c.w": w(4, 3, 5, 5), "bn.s": (1 + w(4)).astype(np.float32), "bn.b": w(4),
             "bn.m": w(4), "bn.v": (1 + np.abs(w(4))).astype(np.float32),
             "g.w": w(5, 4 * 7 * 8, scale=0.1), "g.b": w(5)}
    nodes = [
        helper.make_node("Conv", ["image", "c.w"], ["c"], pads=[2, 1, 0, 2], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c", "bn.s", "bn.b", "bn.m", "bn.v"], ["bn"],
                         spatial=1),
        helper.make_node("MaxPool", ["bn"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Dropout", ["p"], ["d"], ratio=0.5),
        helper.make_node("Flatten", ["d"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "g.w", "g.b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["scores"], axis=1),
    ]
    onnx.save(model(nodes, inits, 7, "opset7", [5]), os.path.join(d, "ops7.onnx"))

    # The activations dsrt maps, each on a convolution's output: Clip's
    # bounds as attributes (opset 9) and as constant inputs (13, 21; one of
    # them left out; 0 and 6 as relu6), Sigmoid, HardSigmoid (ONNX's
    # default alpha, and others), HardSwish and Gelu (both forms) at 21.
    acts = {
        9: [("Clip", {"min": -0.5, "max": 0.8}, None), ("Sigmoid", {}, None),
            ("HardSigmoid", {"alpha": 0.3, "beta": 0.55}, None),
            ("Clip", {"min": 0.0, "max": 6.0}, None), ("HardSigmoid", {}, None)],
        13: [("Clip", {}, (-0.4, 0.9)), ("Clip", {}, (None, 0.5)), ("Clip", {}, (0.0, 6.0)),
             ("Sigmoid", {}, None), ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, None)],
        21: [("HardSwish", {}, None), ("Gelu", {}, None), ("Gelu", {"approximate": "tanh"}, None),
             ("Clip", {}, (-0.3, None)), ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}, None)],
    }
    ra = np.random.default_rng(5)  # a generator of their own: the other models' weights stay

    def wa(*shape, scale=0.3):
        return (ra.standard_normal(shape) * scale).astype(np.float32)

    for opset, ops in acts.items():
        inits = {"c0.w": wa(6, 3, 3, 3), "c0.b": wa(6), "g.w": wa(6, 10), "g.b": wa(10)}
        nodes = [helper.make_node("Conv", ["image", "c0.w", "c0.b"], ["c0"], pads=[1, 1, 1, 1],
                                  strides=[2, 2])]
        x = "c0"
        for k, (op, attrs, bounds) in enumerate(ops):
            ins = [x]
            if bounds is not None:
                for side, v in zip(("lo", "hi"), bounds):
                    if v is None:
                        ins.append("")
                    else:
                        inits["a%d.%s" % (k, side)] = np.array(v, np.float32)
                        ins.append("a%d.%s" % (k, side))
                while ins[-1] == "":
                    ins.pop()
            nodes.append(helper.make_node(op, ins, ["a%d" % k], **attrs))
            inits["c%d.w" % (k + 1)] = wa(6, 6, 3, 3, scale=0.5)
            inits["c%d.b" % (k + 1)] = wa(6)
            nodes.append(helper.make_node("Conv", ["a%d" % k, "c%d.w" % (k + 1),
                                                   "c%d.b" % (k + 1)], ["c%d" % (k + 1)],
                                          pads=[1, 1, 1, 1]))
            x = "c%d" % (k + 1)
        nodes += [
            helper.make_node("GlobalAveragePool", [x], ["p"]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("Gemm", ["f", "g.w", "g.b"], ["scores"], alpha=4.0),
        ]
        onnx.save(model(nodes, inits, opset, "acts", [10]), os.path.join(d, "acts%d.onnx" % opset))

    # The layers of squeeze-and-excitation and ConvNeXt blocks, padding and
    # partial pooling windows: a gate (GlobalAveragePool, two 1x1 Conv) on
    # Mul, Mul by a constant a channel (a layer scale) and by one value,
    # LayerNormalization between Transposes (ConvNeXt's LayerNorm2d) and
    # on (N, C), Pad (constant), AveragePool and MaxPool with ceil_mode and
    # a partial last window; opset 17, 11 (Pad's inputs, AveragePool's
    # ceil_mode without the padding counted) and 9 (Pad's attributes).
    for opset in (9, 11, 17):
        inits = {
            "c1.w": w(8, 3, 3, 3), "c1.b": w(8),
            "g1.w": w(4, 8, 1, 1), "g1.b": w(4), "g2.w": w(8, 4, 1, 1), "g2.b": w(8),
            "ls": (0.5 + np.abs(w(8, 1, 1))).astype(np.float32),
            "half": np.array(0.5, np.float32),
            "fc.w": w(16, 8 * 9 * 9, scale=0.05), "fc.b": w(16),
            "g.w": w(10, 16), "g.b": w(10),
        }
        pads = [0, 0, 1, 0, 0, 0, 1, 2]  # 32x32 -> 34x34
        nodes = [
            helper.make_node("Conv", ["image", "c1.w", "c1.b"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["x"]),
            helper.make_node("GlobalAveragePool", ["x"], ["p"]),
            helper.make_node("Conv", ["p", "g1.w", "g1.b"], ["g1"]),
            helper.make_node("Relu", ["g1"], ["g1r"]),
            helper.make_node("Conv", ["g1r", "g2.w", "g2.b"], ["g2"]),
            helper.make_node("Relu", ["g2"], ["gate"]),
            helper.make_node("Mul", ["gate", "x"], ["se"]),
            helper.make_node("Mul", ["se", "ls"], ["scaled"]),
            helper.make_node("Mul", ["half", "scaled"], ["m"]),
        ]
        if opset >= 17:
            inits["ln.s"] = (1 + w(8)).astype(np.float32)
            inits["ln.b"] = w(8)
            nodes += [
                helper.make_node("Transpose", ["m"], ["mt"], perm=[0, 2, 3, 1]),
                helper.make_node("LayerNormalization", ["mt", "ln.s", "ln.b"], ["nt"],
                                 epsilon=1e-6),
                helper.make_node("Transpose", ["nt"], ["n"], perm=[0, 3, 1, 2]),
            ]
        else:
            nodes.append(helper.make_node("Identity", ["m"], ["n"]))
        if opset >= 11:
            inits["pads"] = np.array(pads, np.int64)
            inits["pv"] = np.array(0.25, np.float32)
            nodes.append(helper.make_node("Pad", ["n", "pads", "pv"], ["pd"]))
        else:
            nodes.append(helper.make_node("Pad", ["n"], ["pd"], pads=pads, value=0.25))
        # 34x34: 3x3 windows, stride 2, padding 1 -> 18x18 (the floor 17);
        # then 3x3, stride 2 -> 9x9 (the floor 8).
        if opset >= 10:
            nodes += [
                helper.make_node("AveragePool", ["pd"], ["a"], kernel_shape=[3, 3],
                                 strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                                 count_include_pad=1 if opset >= 17 else 0),
                helper.make_node("MaxPool", ["a"], ["mp"], kernel_shape=[3, 3], strides=[2, 2],
                                 ceil_mode=1),
            ]
        else:
            nodes += [
                helper.make_node("AveragePool", ["pd"], ["a"], kernel_shape=[3, 3],
                                 strides=[2, 2], pads=[1, 1, 2, 2], count_include_pad=0),
                helper.make_node("MaxPool", ["a"], ["mp"], kernel_shape=[3, 3], strides=[2, 2],
                                 pads=[0, 0, 1, 1]),
            ]
        nodes += [
            helper.make_node("Flatten", ["mp"], ["f"]),
            helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["fc"], transB=1),
        ]
        if opset >= 17:
            inits["ln2.s"] = (1 + w(16)).astype(np.float32)
            inits["ln2.b"] = w(16)
            nodes.append(helper.make_node("LayerNormalization", ["fc", "ln2.s", "ln2.b"], ["fn"],
                                          axis=-1, epsilon=1e-5))
        else:
            nodes.append(helper.make_node("Identity", ["fc"], ["fn"]))
        nodes.append(helper.make_node("Gemm", ["fn", "g.w", "g.b"], ["scores"], transB=1))
        onnx.save(model(nodes, inits, opset, "layers", [10]),
                  os.path.join(d, "layers%d.onnx" % opset))

    # External data: the weights in a file beside the model.
    inits = {"c.w": w(8, 3, 3, 3), "c.b": w(8), "g.w": w(8, 4), "g.b": w(4)}
    nodes = [
        helper.make_node("Conv", ["image", "c.w", "c.b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "g.w"], ["mm"]),
        helper.make_node("Add", ["mm", "g.b"], ["scores"]),
    ]
    m = model(nodes, inits, 13, "external", [4])
    if os.path.exists(os.path.join(d, "external.weights")):
        os.remove(os.path.join(d, "external.weights"))
    onnx.save(m, os.path.join(d, "external.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="external.weights", size_threshold=0)

    # Folding's corners: a divisor of 255 in one channel only (a
    # normalisation, not the pixels' scale) and pads from Mod with fmod=1
    # (the dividend's sign: -7 fmod 3 is -1, pads of 1).
    inits = {"div": np.array([255, 128, 64], np.float32).reshape(1, 3, 1, 1),
             "a": np.full(8, -7, np.int64), "b": np.full(8, 3, np.int64),
             "two": np.array([2], np.int64), "mask": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
             "c.w": w(6, 3, 3, 3), "g.w": w(4, 6, scale=1)}
    nodes = [
        helper.make_node("Div", ["image", "div"], ["x"]),
        helper.make_node("Mod", ["a", "b"], ["md"], fmod=1),
        helper.make_node("Add", ["md", "two"], ["ps"]),
        helper.make_node("Mul", ["ps", "mask"], ["pads"]),
        helper.make_node("Pad", ["x", "pads"], ["xp"]),
        helper.make_node("Conv", ["xp", "c.w"], ["c"]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "g.w"], ["scores"], transB=1),
    ]
    onnx.save(model(nodes, inits, 13, "folds", [4]), os.path.join(d, "folds13.onnx"))


def nhwc_model(d):
    """A channels-last model as tf2onnx writes one from Keras: (N, H, W, 3)
    in, its normalisation by constants of (3,) (the channels, last), a
    Transpose to NCHW, then NCHW layers; opsets 13 and 17."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    inits = {"mean": np.array([0.4, 0.5, 0.6], np.float32),
             "istd": np.array([4.0, 5.0, 3.0], np.float32),
             "c1.w": w(8, 3, 3, 3), "c1.b": w(8), "c2.w": w(8, 8, 3, 3), "c2.b": w(8),
             "d.w": w(8, 5, scale=1.0), "d.b": w(5)}
    nodes = [
        helper.make_node("Sub", ["image", "mean"], ["centred"]),
        helper.make_node("Mul", ["centred", "istd"], ["scaled"]),
        helper.make_node("Transpose", ["scaled"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["nchw", "c1.w", "c1.b"], ["c1"], pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2.w", "c2.b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "d.w"], ["mm"]),
        helper.make_node("Add", ["mm", "d.b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["scores"], axis=-1),
    ]
    for opset in (13, 17):
        g = helper.make_graph(
            nodes, "nhwc",
            [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 32, 32, 3])],
            [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 5])],
            [numpy_helper.from_array(v, k) for k, v in inits.items()])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="tf2onnx", ir_version=8)
        onnx.checker.check_model(m)
        onnx.save(m, os.path.join(d, "nhwc-%d.onnx" % opset))


def refused_models(d):
    """One model a construct dsrt does not compute, each named by its node:
    refused.NAME.onnx."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(6)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    def save(name, nodes, inits, in_shape=(1, 3, 8, 8), out_shape=None, functions=(),
             opset=17, extra_opsets=()):
        out_shape = out_shape or [1, 4]
        g = helper.make_graph(
            nodes, name, [helper.make_tensor_value_info("image", TensorProto.FLOAT, in_shape)],
            [helper.make_tensor_value_info("scores", TensorProto.FLOAT, out_shape)],
            [numpy_helper.from_array(v, k) for k, v in inits.items()])
        ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(x, 1) for x in extra_opsets]
        m = helper.make_model(g, opset_imports=ops, functions=list(functions), ir_version=8)
        onnx.save(m, os.path.join(d, "refused.%s.onnx" % name))

    head = [helper.make_node("GlobalAveragePool", ["y"], ["g"]),
            helper.make_node("Flatten", ["g"], ["f"]),
            helper.make_node("Gemm", ["f", "fc.w"], ["scores"], transB=1)]
    fc = {"fc.w": w(4, 3)}
    # A Transpose that swaps height and width.
    save("transpose", [helper.make_node("Transpose", ["image"], ["y"], perm=[0, 1, 3, 2],
                                        name="swap_hw")] + head, fc)
    # LayerNormalization over the width of an NCHW value.
    save("layernorm_width", [helper.make_node("LayerNormalization", ["image", "s", "b"], ["y"],
                                              axis=-1, name="ln_w")] + head,
         dict(fc, s=w(8), b=w(8)))
    # A product that broadcasts over the channels (spatial attention).
    save("mul_spatial", [
        helper.make_node("Conv", ["image", "a.w"], ["m"], name="attention"),
        helper.make_node("Mul", ["image", "m"], ["y"], name="attend")] + head,
        dict(fc, **{"a.w": w(1, 3, 1, 1)}))
    # A channels-last value flattened with more than one pixel (its order
    # is not NCHW's).
    save("flatten_nhwc", [
        helper.make_node("Transpose", ["image"], ["t"], perm=[0, 2, 3, 1], name="to_nhwc"),
        helper.make_node("Flatten", ["t"], ["f"], name="flat_nhwc"),
        helper.make_node("Gemm", ["f", "fc.w"], ["scores"], transB=1)], {"fc.w": w(4, 192)})
    # A shape that depends on the batch used as anything but a Reshape's
    # leading dimension.
    save("batch_shape", [
        helper.make_node("Shape", ["image"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT, name="batch_as_float"),
        helper.make_node("Mul", ["image", "nf"], ["y"])] + head,
        dict(fc, zero=np.array(0, np.int64)), in_shape=["N", 3, 8, 8], out_shape=["N", 4])
    # Shape arithmetic past 64 bits (a padding computed as h * 2^62).
    save("shape_overflow", [
        helper.make_node("Shape", ["image"], ["s"]),
        helper.make_node("Gather", ["s", "two"], ["h"], axis=0),
        helper.make_node("Mul", ["h", "big"], ["p"], name="too_big"),
        helper.make_node("Concat", ["zeros", "p", "p", "zeros", "p", "p"], ["pads"], axis=0),
        helper.make_node("Pad", ["image", "pads"], ["y"])] + head,
        dict(fc, two=np.array([2], np.int64), big=np.array([1 << 62], np.int64),
             zeros=np.zeros(2, np.int64)))
    # A comparison with the batch size: a padding that depends on it.
    save("batch_compare", [
        helper.make_node("Shape", ["image"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Greater", ["n", "three"], ["big"], name="batch_gt"),
        helper.make_node("Where", ["big", "p2", "p0"], ["pads"]),
        helper.make_node("Pad", ["image", "pads"], ["y"])] + head,
        dict(fc, zero=np.array(0, np.int64), three=np.array(3, np.int64),
             p2=np.array([0, 0, 2, 2, 0, 0, 2, 2], np.int64), p0=np.zeros(8, np.int64)),
        in_shape=["N", 3, 8, 8], out_shape=["N", 4])
    # A bias of one value in three dimensions: the sum has rank 3, and the
    # softmax after it runs across the batch.
    save("bias_rank", [
        helper.make_node("GlobalAveragePool", ["image"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "m.w"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "m.b"], ["l"]),
        helper.make_node("Softmax", ["l"], ["scores"], axis=-1)],
        {"m.w": w(3, 4), "m.b": w(1, 1, 1)}, out_shape=[1, 1, 4])
    # A LayerNormalization scale of shape (C, 1) on a channels-last value:
    # ONNX multiplies along the width.
    save("layernorm_scale_2d", [
        helper.make_node("Transpose", ["image"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Conv", ["image", "c.w"], ["c"]),
        helper.make_node("Transpose", ["c"], ["ct"], perm=[0, 2, 3, 1]),
        helper.make_node("LayerNormalization", ["ct", "s", "b"], ["ln"], axis=-1,
                         name="ln_2d"),
        helper.make_node("Transpose", ["ln"], ["y"], perm=[0, 3, 1, 2])] + head,
        dict(fc, **{"c.w": w(8, 3, 1, 1)}, s=w(8, 1), b=w(8)))
    # Average pooling with "same" padding and a stride past its window:
    # where its windows lie is not defined.
    save("pool_same_stride", [
        helper.make_node("AveragePool", ["image"], ["y"], kernel_shape=[1, 2], strides=[3, 2],
                         auto_pad="SAME_UPPER", name="pool_s3")] + head, fc)
    # A local function that calls itself.
    loop = helper.make_function("local", "Loop", ["x"], ["y"],
                                [helper.make_node("Loop", ["x"], ["y"], domain="local")],
                                [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    save("function_loop", [helper.make_node("Loop", ["image"], ["y"], domain="local",
                                            name="call_loop")] + head, fc, functions=[loop],
         extra_opsets=["local"])


def fuzz_seeds(d):
    """Small models for fuzz_onnx's corpus (tests/fuzz/seeds/fuzz_onnx):
    a local function with attributes by reference, shape arithmetic to fold
    into a Pad, the expansions the import puts back together (GELU's Erf
    formula, LayerNorm's arithmetic on a channels-last value, x *
    Sigmoid(x), x * HardSigmoid(x)), and a channels-last input."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    def const(name, v):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(v, name))

    def save(name, nodes, inits, opset=13, in_shape=(1, 3, 8, 8), functions=(), domains=()):
        g = helper.make_graph(
            nodes, name, [helper.make_tensor_value_info("image", TensorProto.FLOAT, in_shape)],
            [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4])],
            [numpy_helper.from_array(v, k) for k, v in inits.items()])
        ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(x, 1) for x in domains]
        m = helper.make_model(g, opset_imports=ops, functions=list(functions), ir_version=8)
        onnx.checker.check_model(m)
        onnx.save(m, os.path.join(d, name + ".onnx"))

    head = [helper.make_node("GlobalAveragePool", ["y"], ["g"]),
            helper.make_node("Flatten", ["g"], ["f"]),
            helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["scores"], transB=1)]
    fc = {"fc.w": w(4, 4), "fc.b": w(4)}

    # A function whose Conv takes its kernel and pads from the caller.
    body = [helper.make_node("Conv", ["x", "k"], ["c"]),
            helper.make_node("Relu", ["c"], ["y"])]
    for n, a in ((body[0], "kernel_shape"), (body[0], "pads")):
        at = helper.make_attribute(a, [1])
        at.ClearField("ints")
        at.ref_attr_name = "the_" + a
        n.attribute.append(at)
    fn = helper.make_function("local", "ConvRelu", ["x", "k"], ["y"], body,
                              [helper.make_opsetid("", 13)], ["the_kernel_shape", "the_pads"])
    save("function", [helper.make_node("ConvRelu", ["image", "k"], ["y"], domain="local",
                                       the_kernel_shape=[3, 3], the_pads=[1, 1, 1, 1])] + head,
         dict(fc, k=w(4, 3, 3, 3)), functions=[fn], domains=["local"])

    # "Same" padding computed from the input's shape: Shape, Gather, Div,
    # Mul, Sub, Clip, Xor, Where, Concat, then Pad.
    nodes = [helper.make_node("Shape", ["image"], ["s"]),
             const("two", np.array([2], np.int64)), const("one", np.array(1, np.int64)),
             const("zero", np.array(0, np.int64)), const("k", np.array(3, np.int64)),
             helper.make_node("Gather", ["s", "two"], ["h"], axis=0),
             helper.make_node("Add", ["h", "one"], ["h1"]),
             helper.make_node("Div", ["h1", "two"], ["oh"]),
             helper.make_node("Sub", ["oh", "one"], ["oh1"]),
             helper.make_node("Mul", ["oh1", "two"], ["span"]),
             helper.make_node("Add", ["span", "k"], ["need"]),
             helper.make_node("Sub", ["need", "h"], ["pad"]),
             helper.make_node("Clip", ["pad", "zero"], ["padc"]),
             helper.make_node("Div", ["padc", "two"], ["lo"]),
             helper.make_node("Sub", ["padc", "lo"], ["hi"]),
             helper.make_node("Equal", ["lo", "hi"], ["eq"]),
             helper.make_node("Xor", ["eq", "eq"], ["no"]),
             helper.make_node("Where", ["no", "hi", "lo"], ["top"]),
             const("z2", np.array([0, 0], np.int64)),
             helper.make_node("Concat", ["z2", "top", "lo", "z2", "hi", "hi"], ["pads"], axis=0),
             helper.make_node("Pad", ["image", "pads"], ["p"]),
             helper.make_node("Conv", ["p", "c.w"], ["y"], strides=[2, 2])] + head
    save("shapes", nodes, dict(fc, **{"c.w": w(4, 3, 3, 3)}))

    # The expansions, at opset 13, on a channels-last value.
    nodes = [helper.make_node("Conv", ["image", "c.w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["sg"]),
             helper.make_node("Mul", ["c", "sg"], ["silu"]),
             helper.make_node("HardSigmoid", ["silu"], ["hs"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["silu", "hs"], ["hsw"]),
             helper.make_node("Transpose", ["hsw"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("ReduceMean", ["t"], ["m"], axes=[-1]),
             helper.make_node("Sub", ["t", "m"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["d2"]),
             helper.make_node("ReduceMean", ["d2"], ["v"], axes=[-1]),
             const("eps", np.array(1e-6, np.float32)),
             helper.make_node("Add", ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]),
             helper.make_node("Mul", ["n", "ln.s"], ["ns"]),
             helper.make_node("Add", ["ns", "ln.b"], ["ln"]),
             const("sqrt2", np.array(2 ** 0.5, np.float32)),
             const("one_f", np.array(1, np.float32)), const("half", np.array(0.5, np.float32)),
             helper.make_node("Div", ["ln", "sqrt2"], ["e0"]),
             helper.make_node("Erf", ["e0"], ["e1"]),
             helper.make_node("Add", ["e1", "one_f"], ["e2"]),
             helper.make_node("Mul", ["ln", "e2"], ["e3"]),
             helper.make_node("Mul", ["e3", "half"], ["gelu"]),
             helper.make_node("Transpose", ["gelu"], ["y"], perm=[0, 3, 1, 2])] + head
    save("expansions", nodes, dict(fc, **{"c.w": w(4, 3, 3, 3), "ln.s": w(4), "ln.b": w(4)}))

    # A channels-last input.
    nodes = [helper.make_node("Sub", ["image", "mean"], ["x"]),
             helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t", "c.w"], ["y"], pads=[1, 1, 1, 1])] + head
    save("nhwc", nodes, dict(fc, **{"c.w": w(4, 3, 3, 3), "mean": w(3)}), in_shape=(1, 8, 8, 3))


def unsupported(d):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Tanh", ["image"], ["t"], name="squash"),
         helper.make_node("Flatten", ["t"], ["scores"])], "tanh",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 48])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
              os.path.join(d, "unsupported.onnx"))


def ort(model_path, pixels_path, out, scale, torchvision):
    import numpy as np
    import onnx
    import onnxruntime as rt

    onnx.checker.check_model(onnx.load(model_path), full_check=True)
    x = np.load(pixels_path).astype(np.float32)
    if torchvision:
        x = x / np.float32(255.0)
        x = (x - np.array(MEAN, np.float32).reshape(1, 3, 1, 1)) / np.array(
            STD, np.float32).reshape(1, 3, 1, 1)
    elif scale is not None:
        x = x * np.float32(scale)
    shape = onnx.load(model_path, load_external_data=False).graph.input[0].type.tensor_type.shape
    if len(shape.dim) == 4 and shape.dim[3].dim_value == 3 and shape.dim[1].dim_value != 3:
        x = x.transpose(0, 2, 3, 1)  # a channels-last model
    so = rt.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    s = rt.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    probs = []
    fixed = s.get_inputs()[0].shape[0] == 1
    batches = [x[i:i + 1] for i in range(len(x))] if fixed else [x]
    for b in batches:
        y = s.run(None, {name: b.astype(np.float32)})[0].astype(np.float64)
        y = y.reshape(y.shape[0], -1)
        if not (np.all(y >= 0) and np.allclose(y.sum(1), 1, atol=1e-4)):
            y = np.exp(y - y.max(1, keepdims=True))
            y /= y.sum(1, keepdims=True)
        probs.append(y)
    np.save(out, np.concatenate(probs))


def compare(jsonl, npy, tol):
    import numpy as np

    ref = np.load(npy)
    rows = [json.loads(line) for line in open(jsonl) if line.strip()]
    if len(rows) != len(ref):
        fail("%d images scored by dstrain, %d by the runtime" % (len(rows), len(ref)))
    worst, differ = 0.0, 0
    for i, r in enumerate(rows):
        s = np.array(r["scores"], np.float64)
        if s.shape != ref[i].shape:
            fail("image %d: %d scores, the runtime %d" % (i, s.size, ref[i].size))
        worst = max(worst, float(np.abs(s - ref[i]).max()))
        if int(np.argmax(s)) != int(np.argmax(ref[i])) or r["class"] != int(np.argmax(ref[i])):
            differ += 1
    top = float(np.mean(ref.max(1)))
    print("images %d max_abs_diff %.3g top1_differ %d mean_top_probability %.3f" %
          (len(rows), worst, differ, top))
    if worst > tol or differ:
        fail("probabilities %.3g apart (tolerance %g), top-1 differs on %d images" %
             (worst, tol, differ))


def eval_compare(eval_json, npy, d):
    import numpy as np

    ev = json.load(open(eval_json))
    ref = np.load(npy)
    paths = [p for p in open(os.path.join(d, "paths.txt")).read().split("\n") if p]
    names = ev["classes"]
    conf = np.zeros((len(names), len(names)), np.int64)
    for p, y in zip(paths, ref):
        truth = names.index(os.path.basename(os.path.dirname(p)))
        conf[truth, int(np.argmax(y))] += 1
    got = np.array(ev["confusion"], np.int64)
    correct = int(np.trace(conf))
    print("images %d eval_correct %d runtime_correct %d confusion_equal %s" %
          (len(paths), ev["correct"], correct, bool((got == conf).all())))
    if ev["images"] != len(paths) or ev["correct"] != correct or not (got == conf).all():
        fail("dstrain eval and the runtime disagree")


def main():
    a = sys.argv[1:]
    if not a:
        fail("usage: see the top of this file")
    cmd = a[0]
    if cmd == "torch-small":
        torch_small(a[1])
    elif cmd == "torchvision":
        torchvision_model(a[1], a[2])
    elif cmd == "modern":
        modern_model(a[1], int(a[2]), a[3])
    elif cmd == "torch-functions":
        torch_functions(a[1])
    elif cmd == "torch-shapes":
        torch_shapes(a[1])
    elif cmd == "images":
        images(a[1], int(a[2]), int(a[3]))
    elif cmd == "helper-models":
        helper_models(a[1])
        unsupported(a[1])
    elif cmd == "fuzz-seeds":
        fuzz_seeds(a[1])
    elif cmd == "modern-helper-models":
        nhwc_model(a[1])
        refused_models(a[1])
    elif cmd == "ort":
        pixels, rest, scale, tv = a[1], a[2:], None, False
        if rest and rest[0] == "--scale":
            scale, rest = float(rest[1]), rest[2:]
        elif rest and rest[0] == "--torchvision":
            tv, rest = True, rest[1:]
        for i in range(0, len(rest) - 1, 2):
            ort(rest[i], pixels, rest[i + 1], scale, tv)
    elif cmd == "compare":
        status = 0
        for i in range(2, len(a) - 1, 2):
            print(os.path.basename(a[i]) + ": ", end="")
            try:
                compare(a[i], a[i + 1], float(a[1]))
            except SystemExit:
                status = 1
        sys.exit(status)
    elif cmd == "eval-compare":
        eval_compare(a[1], a[2], a[3])
    else:
        fail("unknown command " + cmd)


if __name__ == "__main__":
    main()
