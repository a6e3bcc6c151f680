// TIFF through libtiff, read from memory: the first image of the file (as PIL opens it), in
// strips or tiles, with any compression libtiff reads, turned by its Orientation tag as PIL
// turns it.
//
// The common layouts (8- and 16-bit grey, grey+alpha, RGB, RGBA and 8-bit palette, samples
// interleaved) are unpacked here, because PIL's results for them are not libtiff's RGBA
// interface's: that one premultiplies unassociated alpha (PIL drops it) and scales 16-bit grey
// where PIL clips it at 255 (mode "I;16"). Everything else (1/2/4-bit, separate planes, CMYK,
// YCbCr, JPEG-in-TIFF) goes through TIFFReadRGBAImage, which agrees with PIL on those.
#include <tiffio.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <opencv2/core.hpp>

#include "pipeline/decode/decode_formats.h"

namespace coloader::formats {

namespace {

// A single allocation libtiff may make for one file (its strip and tile buffers): far above a
// real image's strip, far below what a hostile header can ask for.
constexpr tmsize_t kMaxTiffAlloc = tmsize_t{256} << 20;

struct MemFile {
  const uint8_t* data;
  size_t size;
  size_t pos;
  std::string error;  // libtiff's first error message
};

tmsize_t MemRead(thandle_t h, void* buf, tmsize_t n) {
  auto* f = static_cast<MemFile*>(h);
  if (n <= 0 || f->pos >= f->size) return 0;
  const size_t k = std::min(static_cast<size_t>(n), f->size - f->pos);
  std::memcpy(buf, f->data + f->pos, k);
  f->pos += k;
  return static_cast<tmsize_t>(k);
}
tmsize_t MemWrite(thandle_t, void*, tmsize_t) { return -1; }
toff_t MemSeek(thandle_t h, toff_t off, int whence) {
  auto* f = static_cast<MemFile*>(h);
  uint64_t base = whence == SEEK_CUR ? f->pos : whence == SEEK_END ? f->size : 0;
  if (whence != SEEK_SET && whence != SEEK_CUR && whence != SEEK_END) return static_cast<toff_t>(-1);
  // Offsets are unsigned here; a position past the end is allowed (reads there return 0).
  if (off > UINT64_MAX - base) return static_cast<toff_t>(-1);
  f->pos = static_cast<size_t>(std::min<uint64_t>(base + off, SIZE_MAX));
  return f->pos;
}
int MemClose(thandle_t) { return 0; }
toff_t MemSize(thandle_t h) { return static_cast<MemFile*>(h)->size; }
// The whole file is already in memory: let libtiff read strips in place.
int MemMap(thandle_t h, void** base, toff_t* size) {
  auto* f = static_cast<MemFile*>(h);
  *base = const_cast<uint8_t*>(f->data);
  *size = f->size;
  return 1;
}
void MemUnmap(thandle_t, void*, toff_t) {}

int OnError(TIFF*, void* user, const char* module, const char* fmt, va_list ap) {
  auto* f = static_cast<MemFile*>(user);
  if (f->error.empty()) {
    char buf[256];
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    f->error = buf;
    if (module && *module) f->error = std::string(module) + ": " + f->error;
  }
  return 1;  // handled: nothing on stderr
}
int OnWarning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

struct TiffCloser {
  void operator()(TIFF* t) const { TIFFClose(t); }
};
using TiffPtr = std::unique_ptr<TIFF, TiffCloser>;

Status TiffError(const MemFile& f, const std::string& path, const char* what) {
  return Status::Invalid(path + ": " + what + (f.error.empty() ? "" : " (" + f.error + ")"));
}

// Opens the first image of the file; `file` must outlive the handle.
Result<TiffPtr> Open(MemFile* file, const std::string& path, int* width, int* height) {
  std::unique_ptr<TIFFOpenOptions, void (*)(TIFFOpenOptions*)> opts(TIFFOpenOptionsAlloc(), TIFFOpenOptionsFree);
  if (!opts) return Status::Invalid(path + ": cannot decode TIFF (out of memory)");
  TIFFOpenOptionsSetMaxSingleMemAlloc(opts.get(), kMaxTiffAlloc);
  TIFFOpenOptionsSetErrorHandlerExtR(opts.get(), OnError, file);
  TIFFOpenOptionsSetWarningHandlerExtR(opts.get(), OnWarning, file);
  TiffPtr tif(TIFFClientOpenExt(path.c_str(), "r", file, MemRead, MemWrite, MemSeek, MemClose, MemSize, MemMap,
                                MemUnmap, opts.get()));
  if (!tif) return TiffError(*file, path, "corrupt TIFF header");
  uint32_t w = 0, h = 0;
  if (!TIFFGetField(tif.get(), TIFFTAG_IMAGEWIDTH, &w) || !TIFFGetField(tif.get(), TIFFTAG_IMAGELENGTH, &h)) {
    return TiffError(*file, path, "corrupt TIFF header (no image size)");
  }
  COLOADER_RETURN_NOT_OK(CheckImageSize(w, h, path));
  *width = static_cast<int>(w);
  *height = static_cast<int>(h);
  return tif;
}

// The Orientation tag, 1 (top-left, the default) to 8; anything else counts as 1.
int Orientation(TIFF* tif) {
  uint16_t o = ORIENTATION_TOPLEFT;
  TIFFGetFieldDefaulted(tif, TIFFTAG_ORIENTATION, &o);
  return o >= ORIENTATION_TOPLEFT && o <= ORIENTATION_LEFTBOT ? o : ORIENTATION_TOPLEFT;
}

// PIL applies a TIFF's Orientation tag when it loads one (TiffImagePlugin's load_end calls
// ImageOps.exif_transpose; it does not for JPEG): the same flips and turns on the stored rows.
cv::Mat Orient(const cv::Mat& stored, int orientation) {
  cv::Mat out;
  switch (orientation) {
    case 2: cv::flip(stored, out, 1); return out;                                  // mirror
    case 3: cv::rotate(stored, out, cv::ROTATE_180); return out;
    case 4: cv::flip(stored, out, 0); return out;                                  // upside down
    case 5: cv::transpose(stored, out); return out;
    case 6: cv::rotate(stored, out, cv::ROTATE_90_CLOCKWISE); return out;
    case 7: cv::transpose(stored, out), cv::rotate(out, out, cv::ROTATE_180); return out;
    case 8: cv::rotate(stored, out, cv::ROTATE_90_COUNTERCLOCKWISE); return out;
    default: return stored;
  }
}

// How the interleaved layouts map to RGB.
enum class Layout { kGray, kInvertedGray, kRgb, kPalette, kNone };

struct Chunky {
  Layout layout = Layout::kNone;
  int bits = 8;              // per sample: 8 or 16
  int samples = 1;           // per pixel, extra samples (alpha) included
  std::vector<uint8_t> lut;  // kPalette: 256 RGB triples
};

Chunky ChunkyLayout(TIFF* tif) {
  Chunky c;
  uint16_t bps = 1, spp = 1, planar = PLANARCONFIG_CONTIG, photometric = 0, format = SAMPLEFORMAT_UINT;
  TIFFGetFieldDefaulted(tif, TIFFTAG_BITSPERSAMPLE, &bps);
  TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLESPERPIXEL, &spp);
  TIFFGetFieldDefaulted(tif, TIFFTAG_PLANARCONFIG, &planar);
  TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLEFORMAT, &format);
  if (!TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &photometric)) return c;
  if (planar != PLANARCONFIG_CONTIG || format != SAMPLEFORMAT_UINT || (bps != 8 && bps != 16)) return c;
  c.bits = bps;
  c.samples = spp;
  if (photometric == PHOTOMETRIC_MINISBLACK && spp >= 1) {
    c.layout = Layout::kGray;
  } else if (photometric == PHOTOMETRIC_MINISWHITE && spp >= 1 && bps == 8) {
    c.layout = Layout::kInvertedGray;  // PIL's "L;I"
  } else if (photometric == PHOTOMETRIC_RGB && spp >= 3) {
    c.layout = Layout::kRgb;
  } else if (photometric == PHOTOMETRIC_PALETTE && spp == 1 && bps == 8) {
    uint16_t *r = nullptr, *g = nullptr, *b = nullptr;
    if (!TIFFGetField(tif, TIFFTAG_COLORMAP, &r, &g, &b) || !r || !g || !b) return c;
    c.lut.resize(256 * 3);
    for (int i = 0; i < 256; ++i) {  // PIL keeps each 16-bit entry's high byte
      c.lut[3 * i] = static_cast<uint8_t>(r[i] >> 8);
      c.lut[3 * i + 1] = static_cast<uint8_t>(g[i] >> 8);
      c.lut[3 * i + 2] = static_cast<uint8_t>(b[i] >> 8);
    }
    c.layout = Layout::kPalette;
  }
  return c;
}

// One row of `n` pixels of layout `c` (samples in host order, as libtiff hands them back).
void RowToRgb(const Chunky& c, const uint8_t* in, int n, uint8_t* out) {
  const int s = c.samples;
  if (c.bits == 16) {
    const auto* p = reinterpret_cast<const uint16_t*>(in);  // libtiff's buffers are malloc'ed: aligned
    for (int x = 0; x < n; ++x, p += s, out += 3) {
      if (c.layout == Layout::kRgb) {  // high byte, as PIL's "RGB;16" modes
        out[0] = static_cast<uint8_t>(p[0] >> 8);
        out[1] = static_cast<uint8_t>(p[1] >> 8);
        out[2] = static_cast<uint8_t>(p[2] >> 8);
      } else {  // grey: PIL's "I;16" clipped by convert("RGB")
        out[0] = out[1] = out[2] = static_cast<uint8_t>(std::min<int>(p[0], 255));
      }
    }
    return;
  }
  for (int x = 0; x < n; ++x, in += s, out += 3) {
    switch (c.layout) {
      case Layout::kRgb: out[0] = in[0], out[1] = in[1], out[2] = in[2]; break;
      case Layout::kGray: out[0] = out[1] = out[2] = in[0]; break;
      case Layout::kInvertedGray: out[0] = out[1] = out[2] = static_cast<uint8_t>(255 - in[0]); break;
      case Layout::kPalette: std::memcpy(out, &c.lut[3 * in[0]], 3); break;
      case Layout::kNone: break;
    }
  }
}

// The interleaved layouts: every strip or tile decoded by libtiff, its rows unpacked here.
Status ReadChunky(TIFF* tif, MemFile& file, const Chunky& c, cv::Mat& rgb, const std::string& path) {
  const int w = rgb.cols, h = rgb.rows;
  const uint64_t pixel_bytes = uint64_t(c.samples) * (c.bits / 8);
  // What one strip or tile may need, bounded by the image itself (a hostile header can declare
  // tiles of 4 G pixels around a 1-pixel image).
  const uint64_t limit = (uint64_t{16} << 20) + 2 * pixel_bytes * uint64_t(w) * uint64_t(h);
  std::vector<uint8_t> buf;
  if (TIFFIsTiled(tif)) {
    uint32_t tw = 0, th = 0;
    if (!TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tw) || !TIFFGetField(tif, TIFFTAG_TILELENGTH, &th) || tw == 0 ||
        th == 0) {
      return TiffError(file, path, "corrupt TIFF (no tile size)");
    }
    const uint64_t tile_bytes = uint64_t(tw) * th * pixel_bytes;
    if (tile_bytes > limit || uint64_t(TIFFTileSize64(tif)) != tile_bytes) {
      return Status::Invalid(path + ": implausible TIFF tile size " + std::to_string(tw) + "x" + std::to_string(th));
    }
    buf.resize(tile_bytes);
    for (uint32_t ty = 0; ty < uint32_t(h); ty += th) {
      for (uint32_t tx = 0; tx < uint32_t(w); tx += tw) {
        const uint32_t tile = TIFFComputeTile(tif, tx, ty, 0, 0);
        if (TIFFReadEncodedTile(tif, tile, buf.data(), static_cast<tmsize_t>(tile_bytes)) < 0) {
          return TiffError(file, path, "corrupt or truncated TIFF tile");
        }
        const int rows = static_cast<int>(std::min<uint32_t>(th, uint32_t(h) - ty));
        const int cols = static_cast<int>(std::min<uint32_t>(tw, uint32_t(w) - tx));
        for (int r = 0; r < rows; ++r) {
          RowToRgb(c, buf.data() + size_t(r) * tw * pixel_bytes, cols, rgb.ptr<uint8_t>(int(ty) + r) + size_t(tx) * 3);
        }
      }
    }
    return Status::OK();
  }
  uint32_t rps = 0;
  TIFFGetFieldDefaulted(tif, TIFFTAG_ROWSPERSTRIP, &rps);
  rps = std::clamp<uint32_t>(rps, 1, uint32_t(h));
  const uint64_t row_bytes = pixel_bytes * uint64_t(w);
  if (uint64_t(TIFFScanlineSize64(tif)) != row_bytes) return TiffError(file, path, "corrupt TIFF (row size)");
  const uint64_t strip_bytes = row_bytes * rps;
  if (strip_bytes > limit) {
    return Status::Invalid(path + ": implausible TIFF strip of " + std::to_string(rps) + " rows");
  }
  buf.resize(strip_bytes);
  for (uint32_t y = 0; y < uint32_t(h); y += rps) {
    const uint32_t rows = std::min<uint32_t>(rps, uint32_t(h) - y);
    const tmsize_t want = static_cast<tmsize_t>(row_bytes * rows);
    if (TIFFReadEncodedStrip(tif, TIFFComputeStrip(tif, y, 0), buf.data(), want) < want) {
      return TiffError(file, path, "corrupt or truncated TIFF strip");
    }
    for (uint32_t r = 0; r < rows; ++r) RowToRgb(c, buf.data() + r * row_bytes, w, rgb.ptr<uint8_t>(int(y + r)));
  }
  return Status::OK();
}

// Everything else, through libtiff's RGBA interface (ABGR words). The rows come in the order
// they are stored, as in the interleaved path above: asked for the file's own orientation,
// libtiff flips nothing (Orient applies the tag afterwards, to both).
Status ReadRgba(TIFF* tif, MemFile& file, cv::Mat& rgb, const std::string& path) {
  char why[1024] = {};
  if (!TIFFRGBAImageOK(tif, why)) {
    return Status::Invalid(path + ": unsupported TIFF layout (" + std::string(why) + ")");
  }
  const uint16_t orientation = static_cast<uint16_t>(Orientation(tif));
  cv::Mat abgr(rgb.rows, rgb.cols, CV_32SC1);
  if (!TIFFReadRGBAImageOriented(tif, uint32_t(rgb.cols), uint32_t(rgb.rows), reinterpret_cast<uint32_t*>(abgr.data),
                                 orientation, /*stop_on_error=*/1)) {
    return TiffError(file, path, "corrupt or truncated TIFF data");
  }
  const auto* in = reinterpret_cast<const uint32_t*>(abgr.data);
  uint8_t* out = rgb.data;
  for (size_t i = 0, n = rgb.total(); i < n; ++i, out += 3) {
    out[0] = static_cast<uint8_t>(TIFFGetR(in[i]));
    out[1] = static_cast<uint8_t>(TIFFGetG(in[i]));
    out[2] = static_cast<uint8_t>(TIFFGetB(in[i]));
  }
  return Status::OK();
}

}  // namespace

Result<ImageInfo> PeekTiff(const uint8_t* data, size_t size, const std::string& path) {
  MemFile file{data, size, 0, {}};
  ImageInfo info;
  info.kind = ImageKind::kTiff;
  COLOADER_ASSIGN_OR_RETURN(TiffPtr tif, Open(&file, path, &info.width, &info.height));
  if (Orientation(tif.get()) >= 5) std::swap(info.width, info.height);  // turned a quarter
  return info;
}

Result<cv::Mat> DecodeTiff(const uint8_t* data, size_t size, const std::string& path) {
  MemFile file{data, size, 0, {}};
  int w = 0, h = 0;
  COLOADER_ASSIGN_OR_RETURN(TiffPtr tif, Open(&file, path, &w, &h));
  cv::Mat rgb(h, w, CV_8UC3);
  const Chunky c = ChunkyLayout(tif.get());
  COLOADER_RETURN_NOT_OK(c.layout != Layout::kNone ? ReadChunky(tif.get(), file, c, rgb, path)
                                          : ReadRgba(tif.get(), file, rgb, path));
  return Orient(rgb, Orientation(tif.get()));
}

}  // namespace coloader::formats
