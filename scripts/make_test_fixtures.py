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
    formats/            one small file per format and variant torchvision's ImageFolder meets
                        (PNG, WebP, TIFF, BMP, PNM, CMYK/YCCK JPEG), each with NAME.rgb beside
                        it: Pillow's Image.open(f).convert("RGB") of it as raw RGB bytes, which
                        tests/unit/decode_formats_test.cc compares the decoder's pixels against
                        (within 1 per channel); formats/MANIFEST lists them with their sizes.
                        Variants Pillow cannot write (16-bit RGB PNG, tiled or big-endian TIFF,
                        16-bit and RLE BMP, plain PNM...) are built here byte by byte.

Run with Debian's Python (needs Pillow):  /usr/bin/python3 scripts/make_test_fixtures.py
The output is deterministic; rerunning it only changes the files if Pillow's encoder changes.
"""
import argparse
import ctypes
import io
import os
import struct
import sys
import zlib

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
    written += write_formats(os.path.join(args.out, "formats"), ref, data)
    for p in written:
        print(f"{os.path.relpath(p)}: {os.path.getsize(p)} bytes")


# --- formats/: every other format, against Pillow's convert("RGB") ---------------------------

FW, FH = 37, 23  # odd sizes: padded BMP rows, partial tiles and strips, odd PBM row bits


def png_bytes(w, h, depth, color_type, rows, chunks=()):
    """A PNG from raw scanlines (each a bytes object without its filter byte)."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    raw = b"".join(b"\0" + r for r in rows)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0))
    for kind, body in chunks:
        out += chunk(kind, body)
    return out + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def tiff_bytes(w, h, spp, bps, photometric, pixels, tile=None, big_endian=False, extra=()):
    """An uncompressed TIFF: `pixels` is the image as rows of interleaved samples (bytes, 16-bit
    samples already in the file's byte order); strips of 5 rows, or tiles of `tile` (tw, th)."""
    e = ">" if big_endian else "<"
    row = w * spp * bps // 8
    chunks = []
    if tile:
        tw, th = tile
        for ty in range(0, h, th):
            for tx in range(0, w, tw):
                buf = b""
                for y in range(ty, ty + th):
                    line = pixels[y * row:(y + 1) * row] if y < h else b""
                    part = line[tx * spp * bps // 8:(tx + tw) * spp * bps // 8]
                    buf += part + b"\0" * (tw * spp * bps // 8 - len(part))
                chunks.append(buf)
    else:
        chunks = [pixels[y * row:(y + 5) * row] for y in range(0, h, 5)]
    data_at = 8
    body = b"".join(chunks)
    offsets, at = [], data_at
    for c in chunks:
        offsets.append(at)
        at += len(c)
    extra_data = b""
    ifd_at = data_at + len(body)
    tags = [(256, 4, [w]), (257, 4, [h]), (258, 3, [bps] * spp), (259, 3, [1]), (262, 3, [photometric]),
            (277, 3, [spp])] + list(extra)
    if tile:
        tags += [(322, 3, [tile[0]]), (323, 3, [tile[1]]), (324, 4, offsets), (325, 4, [len(c) for c in chunks])]
    else:
        tags += [(273, 4, offsets), (278, 3, [5]), (279, 4, [len(c) for c in chunks])]
    tags.sort()
    n = len(tags)
    after_ifd = ifd_at + 2 + 12 * n + 4
    entries = b""
    for tag, typ, values in tags:
        fmt = "H" if typ == 3 else "I"
        packed = struct.pack(e + fmt * len(values), *values)
        if len(packed) <= 4:
            entries += struct.pack(e + "HHI", tag, typ, len(values)) + packed.ljust(4, b"\0")
        else:
            entries += struct.pack(e + "HHII", tag, typ, len(values), after_ifd + len(extra_data))
            extra_data += packed
    head = (b"MM\0*" if big_endian else b"II*\0") + struct.pack(e + "I", ifd_at)
    return head + body + struct.pack(e + "H", n) + entries + b"\0\0\0\0" + extra_data


def bmp_bytes(w, h, bits, pixel_rows, palette=b"", compression=0, masks=(), header=40, top_down=False,
              data=None):
    """A BMP: `pixel_rows` top row first, each unpadded (padded here), or `data` as given (RLE)."""
    if data is None:
        stride = (w * bits + 31) // 32 * 4
        rows = pixel_rows if top_down else pixel_rows[::-1]
        data = b"".join(r.ljust(stride, b"\0") for r in rows)
    if header == 12:
        info = struct.pack("<IHHHH", 12, w, h, 1, bits)
    else:
        info = struct.pack("<IiiHHIIiiII", header, w, -h if top_down else h, 1, bits, compression, len(data),
                           2835, 2835, len(palette) // (3 if header == 12 else 4), 0)
        info += b"".join(struct.pack("<I", m) for m in masks)
        info = info.ljust(header, b"\0") if header > 40 else info
    offset = 14 + len(info) + len(palette)
    return b"BM" + struct.pack("<IHHI", offset + len(data), 0, 0, offset) + info + palette + data


def ycck_jpeg(cmyk_image):
    """A YCCK JPEG through libjpeg-turbo's TurboJPEG (Pillow writes CMYK JPEGs, never YCCK)."""
    tj = ctypes.CDLL("libturbojpeg.so.0")
    tj.tjInitCompress.restype = ctypes.c_void_p
    handle = ctypes.c_void_p(tj.tjInitCompress())
    src = cmyk_image.tobytes()
    buf, size = ctypes.POINTER(ctypes.c_ubyte)(), ctypes.c_ulong(0)
    tjpf_cmyk, tjsamp_444 = 11, 0
    rc = tj.tjCompress2(handle, src, cmyk_image.width, 0, cmyk_image.height, tjpf_cmyk, ctypes.byref(buf),
                        ctypes.byref(size), tjsamp_444, 95, 0)
    if rc != 0:
        sys.exit("make_test_fixtures: TurboJPEG could not write the YCCK JPEG")
    out = ctypes.string_at(buf, size.value)
    tj.tjFree(buf)
    tj.tjDestroy(handle)
    return out


def write_formats(out, ref, jpeg_bytes):
    os.makedirs(out, exist_ok=True)
    img = ref.resize((FW, FH), Image.LANCZOS)
    # Alpha that varies over the image, fully transparent and fully opaque pixels included:
    # convert("RGB") must drop it, not composite.
    alpha = Image.linear_gradient("L").resize((FW, FH)).point(lambda v: 0 if v < 40 else 255 if v > 215 else v)
    rgba = img.copy()
    rgba.putalpha(alpha)
    gray = img.convert("L")
    pal = img.convert("P", palette=Image.ADAPTIVE, colors=64)
    files = {}

    def pil(name, image, fmt, **kw):
        buf = io.BytesIO()
        image.save(buf, fmt, **kw)
        files[name] = buf.getvalue()

    # PNG: what Pillow writes, then 16-bit and low-bit types built by hand.
    pil("png_rgb8.png", img, "PNG")
    pil("png_rgba8.png", rgba, "PNG")
    pil("png_gray8.png", gray, "PNG")
    la = gray.convert("LA")
    la.putalpha(alpha)
    pil("png_gray_alpha8.png", la, "PNG")
    pil("png_palette.png", pal, "PNG")
    pal_t = pal.copy()
    pal_t.info["transparency"] = bytes(range(0, 256, 4))
    pil("png_palette_trns.png", pal_t, "PNG", transparency=bytes(range(0, 256, 4)))
    pil("png_palette_4bit.png", img.convert("P", palette=Image.ADAPTIVE, colors=16), "PNG", bits=4)
    pil("png_bilevel.png", gray.convert("1"), "PNG")
    pil("png_gray16.png", Image.fromarray(
        __import__("numpy").asarray(gray, dtype="uint16") * 3 + 17), "PNG")  # above 255 in places: clipped
    g = gray.tobytes()
    rgb = img.tobytes()
    rgba_b = rgba.tobytes()
    files["png_gray4.png"] = png_bytes(FW, FH, 4, 0, [bytes(
        ((g[y * FW + x] >> 4) << 4) | (g[y * FW + x + 1] >> 4 if x + 1 < FW else 0) for x in range(0, FW, 2))
        for y in range(FH)])
    files["png_gray8_trns.png"] = png_bytes(FW, FH, 8, 0, [g[y * FW:(y + 1) * FW] for y in range(FH)],
                                            [(b"tRNS", struct.pack(">H", g[0]))])
    wide = lambda b, i: struct.pack(">H", b[i] * 257 ^ (i * 37 & 0xFF))  # low byte must not matter
    files["png_rgb16.png"] = png_bytes(FW, FH, 16, 2, [b"".join(wide(rgb, (y * FW) * 3 + k) for k in range(FW * 3))
                                                       for y in range(FH)])
    files["png_rgba16.png"] = png_bytes(FW, FH, 16, 6, [b"".join(wide(rgba_b, (y * FW) * 4 + k)
                                                                 for k in range(FW * 4)) for y in range(FH)])
    la_b = la.tobytes()
    files["png_gray_alpha16.png"] = png_bytes(FW, FH, 16, 4, [b"".join(wide(la_b, (y * FW) * 2 + k)
                                                                       for k in range(FW * 2)) for y in range(FH)])
    files["png_behind_jpeg_name.JPEG"] = files["png_rgb8.png"]

    # WebP: lossy and lossless, with alpha, and the first frame of an animation.
    pil("webp_lossy.webp", img, "WEBP", quality=80)
    pil("webp_lossless.webp", img, "WEBP", lossless=True)
    pil("webp_lossy_alpha.webp", rgba, "WEBP", quality=80)
    pil("webp_lossless_alpha.webp", rgba, "WEBP", lossless=True)
    pil("webp_animated.webp", img, "WEBP", save_all=True, lossless=True,
        append_images=[img.transpose(Image.FLIP_LEFT_RIGHT)], duration=100)

    # TIFF: Pillow's strips (raw and compressed), then tiles and big-endian by hand.
    pil("tiff_rgb.tif", img, "TIFF")
    pil("tiff_rgb_lzw.tif", img, "TIFF", compression="tiff_lzw")
    pil("tiff_rgb_deflate.tif", img, "TIFF", compression="tiff_adobe_deflate")
    pil("tiff_rgb_jpeg.tif", img, "TIFF", compression="jpeg", quality=90)
    pil("tiff_rgba.tif", rgba, "TIFF", compression="tiff_lzw")
    pil("tiff_gray.tif", gray, "TIFF")
    pil("tiff_gray_alpha.tif", la, "TIFF")
    pil("tiff_gray16.tif", Image.fromarray(__import__("numpy").asarray(gray, dtype="uint16") * 3 + 17), "TIFF")
    pil("tiff_palette.tif", pal, "TIFF")
    pil("tiff_bilevel.tif", gray.convert("1"), "TIFF", compression="group4")
    pil("tiff_cmyk.tif", img.convert("CMYK"), "TIFF")
    files["tiff_rgb_tiled.tif"] = tiff_bytes(FW, FH, 3, 8, 2, rgb, tile=(16, 16))
    files["tiff_gray_tiled_be.tif"] = tiff_bytes(FW, FH, 1, 8, 1, g, tile=(16, 16), big_endian=True)
    files["tiff_rgb16_be.tif"] = tiff_bytes(FW, FH, 3, 16, 2, b"".join(wide(rgb, i) for i in range(len(rgb))),
                                            big_endian=True)
    files["tiff_miniswhite.tif"] = tiff_bytes(FW, FH, 1, 8, 0, bytes(255 - v for v in g))
    # The Orientation tag, which Pillow applies to a TIFF (ImageOps.exif_transpose on load): on
    # the interleaved layouts and on one libtiff's RGBA interface reads, quarter turns included.
    files["tiff_cmyk_bottom_left.tif"] = tiff_bytes(FW, FH, 4, 8, 5, img.convert("CMYK").tobytes(),
                                                    extra=[(274, 3, [4])])
    for o in (2, 3, 5, 6, 7, 8):
        files[f"tiff_rgb_orientation{o}.tif"] = tiff_bytes(FW, FH, 3, 8, 2, rgb, extra=[(274, 3, [o])])

    # BMP: Pillow's, then the depths and codings it reads but does not write.
    pil("bmp_rgb24.bmp", img, "BMP")
    pil("bmp_rgba32.bmp", rgba, "BMP")
    pil("bmp_palette8.bmp", pal, "BMP")
    pil("bmp_gray8.bmp", gray, "BMP")
    pil("bmp_bilevel.bmp", gray.convert("1"), "BMP")
    px = list(img.getdata())
    rows24 = [b"".join(bytes((b, g_, r)) for r, g_, b in px[y * FW:(y + 1) * FW]) for y in range(FH)]
    files["bmp_rgb24_topdown.bmp"] = bmp_bytes(FW, FH, 24, rows24, top_down=True)
    files["bmp_os2.bmp"] = bmp_bytes(FW, FH, 24, rows24, header=12)
    r555 = [b"".join(struct.pack("<H", (r >> 3) << 10 | (g_ >> 3) << 5 | b >> 3) for r, g_, b in px[y * FW:(y + 1) * FW])
            for y in range(FH)]
    files["bmp_rgb555.bmp"] = bmp_bytes(FW, FH, 16, r555)
    r565 = [b"".join(struct.pack("<H", (r >> 3) << 11 | (g_ >> 2) << 5 | b >> 3) for r, g_, b in px[y * FW:(y + 1) * FW])
            for y in range(FH)]
    files["bmp_rgb565.bmp"] = bmp_bytes(FW, FH, 16, r565, compression=3, masks=(0xF800, 0x7E0, 0x1F))
    rows32 = [b"".join(bytes((b, g_, r, a)) for (r, g_, b), a in zip(px[y * FW:(y + 1) * FW],
                                                                  alpha.tobytes()[y * FW:(y + 1) * FW]))
              for y in range(FH)]
    files["bmp_bgra32_v4.bmp"] = bmp_bytes(FW, FH, 32, rows32, compression=3,
                                           masks=(0xFF0000, 0xFF00, 0xFF, 0xFF000000), header=108)
    pal16 = img.convert("P", palette=Image.ADAPTIVE, colors=16)
    p16 = pal16.getpalette()[:48]
    palette16 = b"".join(bytes((p16[3 * i + 2], p16[3 * i + 1], p16[3 * i], 0)) for i in range(16))
    idx16 = pal16.tobytes()
    rows4 = [bytes((idx16[y * FW + x] << 4) | (idx16[y * FW + x + 1] if x + 1 < FW else 0) for x in range(0, FW, 2))
             for y in range(FH)]
    files["bmp_palette4.bmp"] = bmp_bytes(FW, FH, 4, rows4, palette=palette16)
    p64 = pal.getpalette()[:192]
    palette64 = b"".join(bytes((p64[3 * i + 2], p64[3 * i + 1], p64[3 * i], 0)) for i in range(64))
    idx = pal.tobytes()
    rle = b""
    for y in reversed(range(FH)):  # bottom row first; runs where a value repeats, literals elsewhere
        row, x = idx[y * FW:(y + 1) * FW], 0
        while x < FW:
            run = 1
            while x + run < FW and row[x + run] == row[x] and run < 255:
                run += 1
            if run >= 3:
                rle += bytes((run, row[x]))
                x += run
            else:
                lit = row[x:x + min(8, FW - x)]
                if len(lit) < 3:
                    rle += b"".join(bytes((1, v)) for v in lit)
                else:
                    rle += bytes((0, len(lit))) + lit + (b"\0" if len(lit) % 2 else b"")
                x += len(lit)
        rle += b"\0\0"  # end of line
    rle += b"\0\1"  # end of bitmap
    files["bmp_rle8.bmp"] = bmp_bytes(FW, FH, 8, None, palette=palette64, compression=1, data=rle)

    # PNM: binary and plain, 8-bit and 16-bit, maxval other than 255, bitmaps.
    pil("pnm_rgb.ppm", img, "PPM")
    pil("pnm_gray.pgm", gray, "PPM")
    pil("pnm_bilevel.pbm", gray.convert("1"), "PPM")
    head = lambda magic, maxval: f"{magic}\n# made by make_test_fixtures.py\n{FW} {FH}\n{maxval}\n".encode()
    files["pnm_rgb_maxval1000.ppm"] = head("P6", 1000) + b"".join(struct.pack(">H", v * 1000 // 255) for v in rgb)
    files["pnm_gray_maxval65535.pgm"] = head("P5", 65535) + b"".join(struct.pack(">H", v * 3) for v in g)
    files["pnm_gray_maxval1000.pgm"] = head("P5", 1000) + b"".join(struct.pack(">H", v // 64) for v in g)
    files["pnm_gray_maxval100.pgm"] = head("P5", 100) + bytes(v * 100 // 255 for v in g)
    files["pnm_plain_rgb.ppm"] = head("P3", 255) + "\n".join(
        " ".join(str(v) for v in rgb[y * FW * 3:(y + 1) * FW * 3]) for y in range(FH)).encode() + b"\n"
    files["pnm_plain_gray.pgm"] = head("P2", 255) + " ".join(str(v) for v in g).encode() + b"\n"
    files["pnm_plain_bilevel.pbm"] = f"P1\n{FW} {FH}\n".encode() + "\n".join(
        "".join("1" if g[y * FW + x] < 128 else "0" for x in range(FW)) for y in range(FH)).encode() + b"\n"

    # JPEG: CMYK (Adobe, inverted, as Pillow writes it) and YCCK (as TurboJPEG writes it).
    pil("jpeg_cmyk.jpg", img.convert("CMYK"), "JPEG", quality=95)
    files["jpeg_ycck.jpg"] = ycck_jpeg(img.convert("CMYK"))
    files["jpeg_rgb.jpg"] = jpeg_bytes

    written, manifest = [], []
    for name in sorted(files):
        path = os.path.join(out, name)
        with open(path, "wb") as f:
            f.write(files[name])
        decoded = Image.open(path).convert("RGB")
        with open(path + ".rgb", "wb") as f:
            f.write(decoded.tobytes())
        manifest.append(f"{name} {decoded.width} {decoded.height}")
        written += [path]
    with open(os.path.join(out, "MANIFEST"), "w") as f:
        f.write("# file width height: file.rgb holds Pillow's convert(\"RGB\") of file (scripts/make_test_fixtures.py)\n")
        f.write("\n".join(manifest) + "\n")
    return written


if __name__ == "__main__":
    main()
