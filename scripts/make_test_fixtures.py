#!/usr/bin/env python3
"""Writes the small image fixtures that tests/unit/decode_test.cc reads from tests/data/.

The decoder must turn the odd files real datasets contain into RGB; these fixtures are made by
Pillow (the library whose output the decoder should agree with), from one small crop of a real
photograph, so the tests stay self-contained C++ and need no Python at test time:

    reference.png       the RGB crop, lossless: what the others are compared against
    cmyk.jpg            Pillow's CMYK conversion, saved as an Adobe (inverted) CMYK JPEG
    gray.jpg            single-channel JPEG
    progressive.jpg     progressive JPEG
    png_named.JPEG      PNG bytes behind a JPEG name (format is sniffed, not taken from the name)
    truncated.jpg       the first half of a baseline JPEG
    not_an_image.jpg    an HTML error page saved under an image name

Run with Debian's Python (needs Pillow):  /usr/bin/python3 scripts/make_test_fixtures.py
The output is deterministic; rerunning it only changes the files if Pillow's encoder changes.
"""
import argparse
import io
import os
import sys

from PIL import Image

DEFAULT_PHOTO = "/usr/share/backgrounds/mate/nature/LadyBird.jpg"
HERE = os.path.dirname(os.path.abspath(__file__))
# Small enough to keep each file a few KB, large enough for a 4:2:0 JPEG to have several MCUs
# and for grayscale/CMYK differences to average out in the tests' mean-colour checks.
WIDTH, HEIGHT = 96, 72


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photo", default=DEFAULT_PHOTO, help="source photograph (default: %(default)s)")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "tests", "data"))
    args = ap.parse_args()
    if not os.path.exists(args.photo):
        sys.exit(f"make_test_fixtures: {args.photo} not found; install mate-backgrounds or pass --photo")
    os.makedirs(args.out, exist_ok=True)

    src = Image.open(args.photo).convert("RGB")
    # A detailed, colourful patch from the middle of the photo, downscaled so it stays photographic.
    side = min(src.size) // 3
    cx, cy = src.width // 2, src.height // 2
    crop = src.crop((cx - side * 2 // 3, cy - side // 2, cx + side * 2 // 3, cy + side // 2))
    ref = crop.resize((WIDTH, HEIGHT), Image.LANCZOS)

    def save(name, img, fmt, **kw):
        path = os.path.join(args.out, name)
        img.save(path, fmt, **kw)
        return path

    written = [
        save("reference.png", ref, "PNG", optimize=True),
        save("cmyk.jpg", ref.convert("CMYK"), "JPEG", quality=95),
        save("gray.jpg", ref.convert("L"), "JPEG", quality=95),
        save("progressive.jpg", ref, "JPEG", quality=95, progressive=True),
        save("png_named.JPEG", ref, "PNG", optimize=True),
    ]
    buf = io.BytesIO()
    ref.save(buf, "JPEG", quality=95)
    data = buf.getvalue()
    for name, payload in [("truncated.jpg", data[: len(data) // 2]),
                          ("not_an_image.jpg", b"<html><body>404 Not Found</body></html>\n")]:
        path = os.path.join(args.out, name)
        with open(path, "wb") as f:
            f.write(payload)
        written.append(path)
    for p in written:
        print(f"{os.path.relpath(p)}: {os.path.getsize(p)} bytes")


if __name__ == "__main__":
    main()
