#!/usr/bin/python3
"""Writes the seed corpus of decode_fuzz (tests/fuzz/corpus/decode): a few of the decode
fixtures (tests/data), small images of each JPEG layout and PNG colour type the decoder
meets, made from tests/data/reference.png with PIL, and the small PNG, WebP, TIFF, BMP and PNM
fixtures of tests/data/formats. Every file is a few KB: small seeds mutate
faster.
    /usr/bin/python3 tests/fuzz/make_decode_corpus.py   (Debian python3-pil)
"""
import io
import shutil
from pathlib import Path

from PIL import Image

root = Path(__file__).resolve().parents[2]
out = root / "tests/fuzz/corpus/decode"
out.mkdir(parents=True, exist_ok=True)

for name in ["gray.jpg", "progressive.jpg", "cmyk.jpg", "truncated.jpg", "reference.png"]:
    shutil.copyfile(root / "tests/data" / name, out / name)

ref = Image.open(root / "tests/data/reference.png").convert("RGB")
small = ref.resize((23, 17))  # odd sizes: partial MCUs at every subsampling


def save(name, image, **kwargs):
    buf = io.BytesIO()
    image.save(buf, **kwargs)
    (out / name).write_bytes(buf.getvalue())


save("420.jpg", small, format="JPEG", quality=75, subsampling=2)
save("422.jpg", small, format="JPEG", quality=75, subsampling=1)
save("444.jpg", small, format="JPEG", quality=90, subsampling=0)
save("progressive-444.jpg", small, format="JPEG", quality=60, subsampling=0, progressive=True)
save("optimized.jpg", small, format="JPEG", quality=50, optimize=True)
save("rgb.png", small, format="PNG")
save("rgba.png", small.convert("RGBA"), format="PNG")
save("gray.png", small.convert("L"), format="PNG")
save("palette.png", small.convert("P"), format="PNG")
save("interlaced.png", small, format="PNG", interlace=1)
save("image.bmp", small.resize((8, 6)), format="BMP")

# Every other format and variant the decoder reads (tests/data/formats, made by
# scripts/make_test_fixtures.py), those of a few KB: libspng, libwebp, libtiff and the BMP/PNM
# decoders each get seeds of every layout they take apart.
formats = root / "tests/data/formats"
for line in (formats / "MANIFEST").read_text().splitlines():
    if not line or line.startswith("#") or line.startswith("jpeg_rgb"):
        continue
    name = line.split()[0]
    if (formats / name).stat().st_size <= 6000:
        shutil.copyfile(formats / name, out / ("formats-" + name))
