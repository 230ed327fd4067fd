#!/usr/bin/python3
"""torchvision's side of test_augment_torchvision: its own random draws and
functional colour operations, on PIL images as an ImageFolder yields them.

    torchvision_ref.py rrc OUT W H N SCALE0 SCALE1 RATIO0 RATIO1 SEED
        N draws of RandomResizedCrop.get_params on a W x H image, written to
        OUT as int32 (top, left, height, width) each.
    torchvision_ref.py color IN W H C CASES OUT
        IN: H x W x C bytes. Each line of CASES, "b c s h o0 o1 o2 o3 gray"
        (a factor of 'x' is ColorJitter's None), runs adjust_brightness,
        adjust_contrast, adjust_saturation and adjust_hue in the order
        o0..o3, then rgb_to_grayscale when gray is 1, on the PIL image; the
        results go to OUT one after another, H x W x C bytes each.
    torchvision_ref.py crop IN W H OUT_W OUT_H CASES OUT
        Each line of CASES, "top left height width flip b c s h o0 o1 o2 o3",
        is resized_crop to OUT_H x OUT_W (bilinear), hflip when flip is 1,
        then the colour steps as above; H x W x 3 bytes in, results out.

Exits 77 when torch or torchvision cannot be imported.
"""
import struct
import sys

try:
    import numpy as np
    import torch
    import torchvision.transforms.functional as F
    from PIL import Image
    from torchvision import transforms as T
except ImportError as e:  # the caller skips
    print("torchvision_ref: %s" % e, file=sys.stderr)
    sys.exit(77)


def rrc(out, w, h, n, s0, s1, r0, r1, seed):
    torch.manual_seed(int(seed))
    img = torch.empty(1, int(h), int(w), dtype=torch.uint8)
    scale, ratio = (float(s0), float(s1)), (float(r0), float(r1))
    with open(out, "wb") as f:
        for _ in range(int(n)):
            f.write(struct.pack("<4i", *T.RandomResizedCrop.get_params(img, scale, ratio)))


def factor(v):
    return None if v == "x" else float(v)


def color_steps(img, fields):
    b, c, s, hue = (factor(v) for v in fields[0:4])
    order = [int(v) for v in fields[4:8]]
    for op in order:
        if op == 0 and b is not None:
            img = F.adjust_brightness(img, b)
        elif op == 1 and c is not None:
            img = F.adjust_contrast(img, c)
        elif op == 2 and s is not None:
            img = F.adjust_saturation(img, s)
        elif op == 3 and hue is not None:
            img = F.adjust_hue(img, hue)
    return img


def load(path, w, h, ch):
    a = np.fromfile(path, dtype=np.uint8).reshape(int(h), int(w), int(ch))
    return Image.fromarray(a[:, :, 0], "L") if int(ch) == 1 else Image.fromarray(a, "RGB")


def color(src, w, h, ch, cases, out):
    base = load(src, w, h, ch)
    with open(cases) as f, open(out, "wb") as o:
        for line in f:
            fields = line.split()
            img = color_steps(base.copy(), fields)
            if int(fields[8]):
                img = F.rgb_to_grayscale(img, num_output_channels=3)
            o.write(np.asarray(img, dtype=np.uint8).tobytes())


def crop(src, w, h, ow, oh, cases, out):
    base = load(src, w, h, 3)
    with open(cases) as f, open(out, "wb") as o:
        for line in f:
            fields = line.split()
            top, left, ch, cw, flip = (int(v) for v in fields[0:5])
            img = F.resized_crop(base, top, left, ch, cw, [int(oh), int(ow)],
                                 T.InterpolationMode.BILINEAR)
            if flip:
                img = F.hflip(img)
            img = color_steps(img, fields[5:])
            o.write(np.asarray(img, dtype=np.uint8).tobytes())


if __name__ == "__main__":
    cmds = {"rrc": rrc, "color": color, "crop": crop}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](*sys.argv[2:])
