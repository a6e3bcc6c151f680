#!/usr/bin/env python3
"""Builds an ImageNet-like dataset from real photographs: an ImageFolder tree
OUT/<class>/<name>.JPEG of ~500x375 JPEGs of 60-150 KB, each a random crop of a random source
photo at a random scale, re-encoded at a quality chosen so its size lands in that range.

Flat synthetic images decode several times faster than photographs and flatter every number;
these are real photo content at ImageNet's typical size. Deterministic for a seed.

    scripts/make_dataset.py --out /tmp/imagenet-like --images 20000 --classes 1000
    scripts/make_dataset.py --out DIR --source photos/ --images 5000      # photos from elsewhere
    --with-oddities   add CMYK, grayscale and progressive JPEGs and a PNG named .JPEG
    --imagenet-mix    make that share of the images such files (MIX below), so decoders meet
                      them as often as in a real ImageFolder, not once
    --with-bad        add a truncated JPEG and a text file named .JPEG
Needs only Pillow.

MIX (--imagenet-mix; --mix KIND=SHARE,... changes it): ImageNet-1k's training set holds 22 CMYK
JPEGs and one PNG behind a .JPEG name among 1,281,167 files (counted by the data-cleaning notes of
Andersen, "Cleaning the Imagenet Dataset, collected notes", 2016, and by terryalanunlimited.com's
survey, "Compression in the ImageNet Dataset"); those shares round to no file at all in a
benchmark set, so each kind gets at least one. No count of its grayscale or progressive files was
found: the 2% and 1% here are assumptions, chosen to be noticed, not measurements.
"""
import argparse
import glob
import io
import multiprocessing
import os
import random
import sys
import time

from PIL import Image

# Debian's mate-backgrounds ships twelve photographs under nature/ (the rest are drawings).
DEFAULT_SOURCES = ["/usr/share/backgrounds/mate/nature"]
SIZES = [(500, 375)] * 6 + [(375, 500)] * 2 + [(500, 333), (640, 480), (400, 400), (500, 500)]
LO_KB, HI_KB = 60, 150
MAX_TRIES = 6  # crops drawn per image until its JPEG size is in range

_photos = []
IMAGENET_MIX = {"cmyk": 22 / 1281167, "png": 1 / 1281167, "gray": 0.02, "progressive": 0.01}
ODD_KINDS = ("cmyk", "png", "gray", "progressive")


def load_sources(dirs):
    paths = []
    for d in dirs:
        for ext in ("jpg", "jpeg", "png", "webp", "JPG", "JPEG", "PNG"):
            paths += glob.glob(os.path.join(d, "**", f"*.{ext}"), recursive=True)
    return sorted(set(paths))


def init_worker(paths):
    # Each worker keeps the sources decoded once, reduced to at most 2000 px.
    global _photos
    _photos = []
    for p in paths:
        try:
            im = Image.open(p).convert("RGB")
            im.thumbnail((2000, 2000))
            _photos.append(im)
        except OSError:
            pass


def draw(rng, scale):
    """A random crop of a random source photo, `scale` of its shorter side at the output's
    aspect ratio (downsampled crops keep photographic detail, and JPEG size), possibly flipped."""
    src = _photos[rng.randrange(len(_photos))]
    w, h = rng.choice(SIZES)
    cw = min(src.width, int(min(src.width, src.height * w / h) * scale))
    ch = min(src.height, int(cw * h / w))
    x = rng.randrange(0, src.width - cw + 1)
    y = rng.randrange(0, src.height - ch + 1)
    img = src.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BICUBIC)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


def encode_in_range(img, rng, **save):
    """(JPEG bytes, in range): the encoding closest to a random target in [LO_KB, HI_KB], found
    by binary search over the quality; in range is False when no quality lands there."""
    lo, hi, best = 40, 100, None
    target = rng.uniform(LO_KB + 10, HI_KB - 10) * 1024
    while lo <= hi:
        q = (lo + hi) // 2
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=q, **save)
        data = buf.getvalue()
        if best is None or abs(len(data) - target) < abs(len(best) - target):
            best = data
        if len(data) < target:
            lo = q + 1
        else:
            hi = q - 1
    return best, LO_KB * 1024 <= len(best) <= HI_KB * 1024


def encode_kind(img, rng, kind):
    """The image as a file of `kind`: a baseline RGB JPEG, or one of the files real datasets
    hold that a decoder must still turn into RGB (a JPEG engine takes none of them)."""
    if kind == "png":
        buf = io.BytesIO()
        img.save(buf, "PNG")
        return buf.getvalue(), True
    if kind == "cmyk":
        return encode_in_range(img.convert("CMYK"), rng)
    if kind == "gray":
        return encode_in_range(img.convert("L"), rng)
    return encode_in_range(img, rng, progressive=(kind == "progressive"))


def make_one(job):
    index, out_path, seed, kind = job
    rng = random.Random(seed * 1_000_003 + index)
    # A crop of a smooth patch (sky, water) can be too small at any quality, one of foliage
    # too large: those are drawn again, the crop scale pushed the way that fixes the size.
    lo_scale, hi_scale = 0.2, 0.6
    for _ in range(MAX_TRIES):
        data, ok = encode_kind(draw(rng, rng.uniform(lo_scale, hi_scale)), rng, kind)
        if ok:
            break
        if len(data) < LO_KB * 1024:  # too little detail: a larger area, downsampled more
            lo_scale, hi_scale = min(0.9, lo_scale + 0.1), min(1.0, hi_scale + 0.1)
        else:
            lo_scale, hi_scale = max(0.05, lo_scale - 0.05), max(0.1, hi_scale - 0.1)
    with open(out_path, "wb") as f:
        f.write(data)
    return len(data), kind


def assign_kinds(images, mix, seed):
    """Which images are of each odd kind: round(share x images), at least one of each kind
    named, drawn without overlap by a seeded shuffle; the rest are baseline RGB JPEGs."""
    kinds = ["rgb"] * images
    order = list(range(images))
    random.Random(seed * 7919 + 17).shuffle(order)
    at = 0
    for kind in ODD_KINDS:
        if kind not in mix:
            continue
        count = max(1, round(mix[kind] * images))
        for i in order[at:at + count]:
            kinds[i] = kind
        at += count
    return kinds


def parse_mix(text):
    mix = {}
    for item in text.split(","):
        kind, _, share = item.partition("=")
        if kind not in ODD_KINDS:
            sys.exit(f"make_dataset: --mix: unknown kind {kind!r} (one of {', '.join(ODD_KINDS)})")
        try:
            mix[kind] = float(share)
        except ValueError:
            sys.exit(f"make_dataset: --mix: {kind}={share!r} is not a share")
        if not 0 <= mix[kind] <= 1:
            sys.exit(f"make_dataset: --mix: {kind}={share} is not between 0 and 1")
    return mix


def add_oddities(out, classes, rng):
    """The kinds of files real datasets hold that a decoder must still turn into RGB."""
    photo = _photos[0].resize((500, 375))
    made = []
    c = lambda: os.path.join(out, classes[rng.randrange(len(classes))])
    p = os.path.join(c(), "odd_cmyk.JPEG"); photo.convert("CMYK").save(p, "JPEG", quality=90); made.append(p)
    p = os.path.join(c(), "odd_gray.JPEG"); photo.convert("L").save(p, "JPEG", quality=90); made.append(p)
    p = os.path.join(c(), "odd_progressive.JPEG"); photo.save(p, "JPEG", quality=90, progressive=True); made.append(p)
    p = os.path.join(c(), "odd_png.JPEG"); photo.save(p, "PNG"); made.append(p)
    return made


def add_bad(out, classes):
    buf = io.BytesIO()
    _photos[0].resize((500, 375)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    trunc = os.path.join(out, classes[0], "bad_truncated.JPEG")
    with open(trunc, "wb") as f:
        f.write(data[: len(data) // 2])
    text = os.path.join(out, classes[-1], "bad_text.JPEG")
    with open(text, "w") as f:
        f.write("this is not an image\n")
    return [trunc, text]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", action="append", help="folder of photos (repeatable); default: Debian's backgrounds")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--with-oddities", action="store_true")
    ap.add_argument("--with-bad", action="store_true")
    ap.add_argument("--imagenet-mix", action="store_true", help="CMYK, grayscale, progressive and PNG files in "
                    "ImageNet's shares (see MIX above)")
    ap.add_argument("--mix", help="KIND=SHARE,... (cmyk, png, gray, progressive): these shares instead")
    args = ap.parse_args()
    mix = parse_mix(args.mix) if args.mix else IMAGENET_MIX if args.imagenet_mix else {}
    if mix and sum(max(1, round(v * args.images)) for v in mix.values()) > args.images:
        sys.exit(f"make_dataset: the mix's files ({mix}) outnumber --images {args.images}")

    sources = load_sources(args.source or DEFAULT_SOURCES)
    if not sources:
        sys.exit(f"make_dataset: no photos found in {args.source or DEFAULT_SOURCES}; "
                 "install mate-backgrounds (apt-get install mate-backgrounds) or pass --source DIR")
    if args.images < 1 or args.classes < 1:
        sys.exit("make_dataset: --images and --classes must be at least 1")
    classes = [f"n{c:08d}" for c in range(args.classes)]
    for c in classes:
        os.makedirs(os.path.join(args.out, c), exist_ok=True)
    kinds = assign_kinds(args.images, mix, args.seed)
    jobs = [(i, os.path.join(args.out, classes[i % args.classes], f"img_{i:07d}.JPEG"), args.seed, kinds[i])
            for i in range(args.images)]
    sizes = []
    made = {}
    start = time.monotonic()
    with multiprocessing.Pool(args.jobs, initializer=init_worker, initargs=(sources,)) as pool:
        for n, (size, kind) in enumerate(pool.imap_unordered(make_one, jobs, chunksize=16), 1):
            sizes.append(size)
            made[kind] = made.get(kind, 0) + 1
            if n % 500 == 0 or n == len(jobs):
                print(f"\rmake_dataset: {n}/{len(jobs)} images", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    init_worker(sources[:1])
    rng = random.Random(args.seed)
    extra = (add_oddities(args.out, classes, rng) if args.with_oddities else []) + \
            (add_bad(args.out, classes) if args.with_bad else [])
    elapsed = time.monotonic() - start
    kb = sorted(s / 1024 for s in sizes)
    outside = sum(1 for k in kb if not LO_KB <= k <= HI_KB)
    print(f"make_dataset: {len(sizes)} images in {args.classes} classes under {args.out} from {len(sources)} photos "
          f"in {elapsed:.1f} s with {args.jobs} processes; size mean {sum(kb) / len(kb):.0f} KB, min {kb[0]:.0f} KB, "
          f"median {kb[len(kb) // 2]:.0f} KB, max {kb[-1]:.0f} KB, {outside} outside {LO_KB}-{HI_KB} KB"
          + (f"; plus {len(extra)} special files" if extra else "")
          + ("; of which " + ", ".join(f"{made.get(k, 0)} {k}" for k in ODD_KINDS if k in mix) if mix else ""))


if __name__ == "__main__":
    main()
