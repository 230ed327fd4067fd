"""Pillow's side of test_webp's differential cases: Pillow decodes WebP with
its own calls into libwebp (WebPAnimDecoder to RGBA or RGBX), dsrt with
WebPDecode to RGB, so the pixels of one file must be equal byte for byte.

  webp_ref.py check              exit 0 when Pillow reads and writes WebP
  webp_ref.py make DIR           writes WebPs of every kind Pillow makes into
                                 DIR (NAME.webp), an animation (anim.webp)
  webp_ref.py decode DIR         writes NAME.rgb beside every NAME.webp of DIR
                                 but anim.webp: Pillow's convert("RGB") of it,
                                 the rows packed
"""
import os
import random
import sys

from PIL import Image, features


def picture(w, h, seed, mode):
    """Smooth gradients with noise and a few hard edges: something between
    a photo and a drawing, deterministic for the seed."""
    rnd = random.Random(seed)
    noise = rnd.randbytes(w * h * 4)
    px = bytearray(w * h * 4)
    for y in range(h):
        for x in range(w):
            i = y * w + x
            edge = 60 if (x * 7 + y * 3) % 53 < 9 else 0
            px[4 * i] = (x * 255 // max(w - 1, 1) + noise[4 * i] % 24 + edge) & 255
            px[4 * i + 1] = (y * 255 // max(h - 1, 1) + noise[4 * i + 1] % 24) & 255
            px[4 * i + 2] = ((x + y) * 3 + noise[4 * i + 2] % 48) & 255
            px[4 * i + 3] = 1 + (x * 13 + y * 29 + noise[4 * i + 3] % 16) % 255
    img = Image.frombytes("RGBA", (w, h), bytes(px))
    return img if mode == "RGBA" else img.convert(mode)


def make(d):
    sizes = [(1, 1), (2, 3), (17, 13), (64, 48), (203, 150)]
    n = 0
    for (w, h) in sizes:
        for mode in ("RGB", "RGBA", "L"):
            img = picture(w, h, n, mode)
            for q in (10, 50, 90, 100):
                img.save(os.path.join(d, "lossy-%s-%dx%d-q%d.webp" % (mode, w, h, q)),
                         "WEBP", quality=q, method=4 if q != 90 else 6)
            img.save(os.path.join(d, "lossless-%s-%dx%d.webp" % (mode, w, h)), "WEBP",
                     lossless=True, exact=True)
            n += 1
    img = picture(64, 48, 99, "RGBA")
    img.save(os.path.join(d, "lossy-RGBA-alpha-q30.webp"), "WEBP", quality=90, alpha_quality=30)
    img.save(os.path.join(d, "lossless-RGBA-m0.webp"), "WEBP", lossless=True, method=0, quality=0)
    frames = [picture(32, 24, 7, "RGB"), picture(32, 24, 8, "RGB")]
    frames[0].save(os.path.join(d, "anim.webp"), "WEBP", save_all=True,
                   append_images=frames[1:], duration=100, loop=0)


def decode(d):
    for name in sorted(os.listdir(d)):
        if not name.endswith(".webp") or name == "anim.webp":
            continue
        with Image.open(os.path.join(d, name)) as img:
            rgb = img.convert("RGB")
            with open(os.path.join(d, name[:-5] + ".rgb"), "wb") as f:
                f.write(rgb.tobytes())


def main():
    if sys.argv[1] == "check":
        sys.exit(0 if features.check("webp") and features.check("webp_anim") else 1)
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "decode":
        decode(sys.argv[2])
    else:
        sys.exit("webp_ref.py: unknown command " + sys.argv[1])


if __name__ == "__main__":
    main()
