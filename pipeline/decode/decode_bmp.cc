// Windows BMP, decoded here: the format is a header and rows of pixels, small enough to read
// carefully by hand, and the libraries that read it either come with much more (OpenCV,
// ImageMagick) or say they are not meant for untrusted files (stb_image).
//
// Read as PIL 9.4's BmpImagePlugin reads it: headers of 12 (OS/2), 40, 52, 56, 64, 108 and 124
// bytes; 1/4/8-bit palette, 16-bit (5-5-5, or 5-6-5 and other masks with BI_BITFIELDS), 24-bit
// BGR and 32-bit BGRX (any channel masks with BI_BITFIELDS); RLE8 and RLE4; bottom-up or
// top-down rows. Alpha is dropped. Every offset and size is checked against the file before
// it is used.
#include <algorithm>
#include <cstring>
#include <vector>

#include "pipeline/decode/decode_formats.h"

namespace coloader::formats {

namespace {

constexpr uint32_t kRgb = 0, kRle8 = 1, kRle4 = 2, kBitfields = 3;

uint32_t Le16(const uint8_t* p) { return uint32_t{p[0]} | (uint32_t{p[1]} << 8); }
uint32_t Le32(const uint8_t* p) { return Le16(p) | (Le16(p + 2) << 16); }

// One channel of a BI_BITFIELDS mask: where it sits and how many bits it has.
struct Channel {
  uint32_t mask = 0;
  int shift = 0;
  uint32_t max = 0;  // mask >> shift; 0 for an absent channel
  uint8_t Get(uint32_t pixel) const {
    // As PIL's unpackers: value * 255 / max, truncated (5-bit 31 is 255, 16 is 131).
    return max ? static_cast<uint8_t>(uint64_t((pixel & mask) >> shift) * 255 / max) : 0;
  }
};

bool MakeChannel(uint32_t mask, Channel* c) {
  c->mask = mask;
  if (mask == 0) return true;
  while (!((mask >> c->shift) & 1)) ++c->shift;
  c->max = mask >> c->shift;
  return (c->max & (c->max + 1)) == 0;  // contiguous bits
}

struct Header {
  int width = 0, height = 0;
  bool top_down = false;
  int bits = 0;
  uint32_t compression = kRgb;
  uint64_t pixel_offset = 0;
  Channel r, g, b;
  uint8_t palette[256][3];  // RGB
};

Status Corrupt(const std::string& path, const std::string& why) {
  return Status::Invalid(path + ": corrupt BMP (" + why + ")");
}

Status ParseHeader(const uint8_t* d, size_t n, const std::string& path, Header* h) {
  if (n < 18 || d[0] != 'B' || d[1] != 'M') return Corrupt(path, "file too short for its header");
  const uint32_t hsize = Le32(d + 14);
  if (hsize != 12 && hsize != 40 && hsize != 52 && hsize != 56 && hsize != 64 && hsize != 108 && hsize != 124) {
    return Status::Invalid(path + ": unsupported BMP header size " + std::to_string(hsize));
  }
  if (n < 14 + uint64_t(hsize)) return Corrupt(path, "file too short for its header");
  int64_t width = 0, height = 0;
  uint32_t colors = 0;
  if (hsize == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit sides, 3-byte palette entries
    width = Le16(d + 18);
    height = Le16(d + 20);
    h->bits = static_cast<int>(Le16(d + 24));
  } else {
    width = static_cast<int32_t>(Le32(d + 18));
    height = static_cast<int32_t>(Le32(d + 22));
    h->bits = static_cast<int>(Le16(d + 28));
    h->compression = Le32(d + 30);
    colors = Le32(d + 46);
  }
  if (height < 0) {
    h->top_down = true;
    height = -height;
  }
  COLOADER_RETURN_NOT_OK(CheckImageSize(width, height, path));
  h->width = static_cast<int>(width);
  h->height = static_cast<int>(height);

  const int bits = h->bits;
  if (bits != 1 && bits != 4 && bits != 8 && bits != 16 && bits != 24 && bits != 32) {
    return Status::Invalid(path + ": unsupported BMP pixel depth " + std::to_string(bits));
  }
  const uint32_t c = h->compression;
  const bool ok = c == kRgb || (c == kRle8 && bits == 8) || (c == kRle4 && bits == 4) ||
                  (c == kBitfields && (bits == 16 || bits == 32));
  if (!ok) {
    return Status::Invalid(path + ": unsupported BMP compression " + std::to_string(c) + " at " +
                           std::to_string(bits) + " bits per pixel");
  }
  uint64_t palette_at = 14 + uint64_t(hsize);
  if (bits == 16 || bits == 32) {
    uint32_t masks[3];
    if (c == kBitfields) {
      // BITMAPINFOHEADER puts the three masks right after itself; the longer headers hold them
      // in the same place, inside the header.
      if (n < 14 + 40 + 12) return Corrupt(path, "file too short for its colour masks");
      for (int i = 0; i < 3; ++i) masks[i] = Le32(d + 54 + 4 * i);
      if (masks[0] == 0 && masks[1] == 0 && masks[2] == 0) {  // PIL reads an all-zero set as BGRA
        masks[0] = 0xFF0000, masks[1] = 0xFF00, masks[2] = 0xFF;
      }
      if (hsize == 40) palette_at += 12;
    } else if (bits == 16) {
      masks[0] = 0x7C00, masks[1] = 0x3E0, masks[2] = 0x1F;
    } else {
      masks[0] = 0xFF0000, masks[1] = 0xFF00, masks[2] = 0xFF;
    }
    const uint32_t limit = bits == 16 ? 0xFFFFu : 0xFFFFFFFFu;
    if ((masks[0] | masks[1] | masks[2]) > limit || !MakeChannel(masks[0], &h->r) || !MakeChannel(masks[1], &h->g) ||
        !MakeChannel(masks[2], &h->b)) {
      return Status::Invalid(path + ": unsupported BMP colour masks");
    }
  }
  uint64_t offset = Le32(d + 10);
  if (bits <= 8) {
    if (colors == 0) colors = 1u << bits;
    if (colors > 65536) return Corrupt(path, "palette of " + std::to_string(colors) + " colours");
    const int entry = hsize == 12 ? 3 : 4;
    const uint32_t used = std::min<uint32_t>(colors, 256);
    if (palette_at + uint64_t(used) * entry > n) return Corrupt(path, "file too short for its palette");
    // Entries past the palette stay a grey ramp, as in a PIL palette image.
    for (int i = 0; i < 256; ++i) h->palette[i][0] = h->palette[i][1] = h->palette[i][2] = static_cast<uint8_t>(i);
    for (uint32_t i = 0; i < used; ++i) {
      const uint8_t* e = d + palette_at + uint64_t(i) * entry;
      h->palette[i][0] = e[2], h->palette[i][1] = e[1], h->palette[i][2] = e[0];
    }
    // Some writers point the pixel offset at the palette: PIL then skips it, and so does this.
    if (offset == 14 + uint64_t(hsize)) offset += 4 * uint64_t(colors);
    if (offset == 0) offset = palette_at + uint64_t(colors) * entry;
  } else if (offset == 0) {
    offset = palette_at;
  }
  if (offset >= n) return Status::Invalid(path + ": truncated BMP data (no pixels)");
  h->pixel_offset = offset;
  return Status::OK();
}

// RLE8 / RLE4 into one palette index per pixel, in file order (bottom row first unless
// top-down). Runs that reach past a row's end are cut there; a delta or end-of-line leaves
// index 0 behind, as PIL does. Data that ends before its end-of-bitmap code is truncated.
Status DecodeRle(const uint8_t* d, size_t n, const Header& h, std::vector<uint8_t>* idx, const std::string& path) {
  const uint64_t w = uint64_t(h.width), total = w * uint64_t(h.height);
  const bool rle4 = h.compression == kRle4;
  idx->assign(total, 0);
  uint64_t pos = 0;  // next pixel, row-major
  size_t i = h.pixel_offset;
  auto put = [&](uint8_t v) {
    if (pos < total) (*idx)[pos] = v;
    ++pos;
  };
  while (pos < total) {
    if (i + 2 > n) return Status::Invalid(path + ": truncated BMP data (RLE stream ends without its end code)");
    const uint8_t count = d[i], value = d[i + 1];
    i += 2;
    if (count > 0) {  // a run: `count` pixels of one value (RLE4: two alternating nibbles)
      const uint64_t room = w - pos % w;
      const uint64_t k = std::min<uint64_t>(count, room);
      for (uint64_t j = 0; j < k; ++j) put(rle4 ? ((j & 1) ? value & 15 : value >> 4) : value);
      continue;
    }
    if (value == 0) {  // end of line
      if (pos % w) pos += w - pos % w;
    } else if (value == 1) {  // end of bitmap: the rest stays index 0
      break;
    } else if (value == 2) {  // delta: right, up (in file order: forward)
      if (i + 2 > n) return Status::Invalid(path + ": truncated BMP data (RLE delta)");
      pos += uint64_t(d[i]) + uint64_t(d[i + 1]) * w;
      i += 2;
    } else {  // absolute: `value` literal pixels, padded to an even byte count
      const uint64_t bytes = rle4 ? (uint64_t(value) + 1) / 2 : value;
      if (i + bytes > n) return Status::Invalid(path + ": truncated BMP data (RLE literal run)");
      for (uint64_t j = 0; j < value; ++j) {
        const uint8_t b = d[i + (rle4 ? j / 2 : j)];
        put(rle4 ? ((j & 1) ? b & 15 : b >> 4) : b);
      }
      i += bytes + (bytes & 1);
    }
  }
  return Status::OK();
}

}  // namespace

Result<ImageInfo> PeekBmp(const uint8_t* data, size_t size, const std::string& path) {
  Header h;
  COLOADER_RETURN_NOT_OK(ParseHeader(data, size, path, &h));
  ImageInfo info;
  info.kind = ImageKind::kBmp;
  info.width = h.width;
  info.height = h.height;
  return info;
}

Result<cv::Mat> DecodeBmp(const uint8_t* data, size_t size, const std::string& path) {
  Header h;
  COLOADER_RETURN_NOT_OK(ParseHeader(data, size, path, &h));
  const int w = h.width, rows = h.height;
  auto out_row = [&](cv::Mat& m, int file_row) { return m.ptr<uint8_t>(h.top_down ? file_row : rows - 1 - file_row); };
  if (h.compression == kRle8 || h.compression == kRle4) {
    std::vector<uint8_t> idx;
    COLOADER_RETURN_NOT_OK(DecodeRle(data, size, h, &idx, path));
    cv::Mat rgb(rows, w, CV_8UC3);
    for (int y = 0; y < rows; ++y) {
      uint8_t* out = out_row(rgb, y);
      const uint8_t* in = idx.data() + size_t(y) * size_t(w);
      for (int x = 0; x < w; ++x) std::memcpy(out + 3 * x, h.palette[in[x]], 3);
    }
    return rgb;
  }
  // Uncompressed rows, each padded to 4 bytes; all of them must be in the file.
  const uint64_t stride = ((uint64_t(w) * uint64_t(h.bits) + 31) / 32) * 4;
  if (h.pixel_offset + stride * uint64_t(rows) > size) {
    return Status::Invalid(path + ": truncated BMP data (" + std::to_string(rows) + " rows of " +
                           std::to_string(stride) + " bytes need " + std::to_string(h.pixel_offset + stride * rows) +
                           " bytes, the file has " + std::to_string(size) + ")");
  }
  cv::Mat rgb(rows, w, CV_8UC3);
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = data + h.pixel_offset + uint64_t(y) * stride;
    uint8_t* out = out_row(rgb, y);
    switch (h.bits) {
      case 1: case 4: case 8: {
        const int per_byte = 8 / h.bits, mask = (1 << h.bits) - 1;
        for (int x = 0; x < w; ++x) {
          const int shift = 8 - h.bits * (x % per_byte + 1);
          std::memcpy(out + 3 * x, h.palette[(in[x / per_byte] >> shift) & mask], 3);
        }
        break;
      }
      case 24:
        for (int x = 0; x < w; ++x) {
          out[3 * x] = in[3 * x + 2], out[3 * x + 1] = in[3 * x + 1], out[3 * x + 2] = in[3 * x];
        }
        break;
      default: {  // 16 and 32: channel masks
        const int bytes = h.bits / 8;
        for (int x = 0; x < w; ++x) {
          const uint32_t p = bytes == 2 ? Le16(in + 2 * x) : Le32(in + 4 * x);
          out[3 * x] = h.r.Get(p), out[3 * x + 1] = h.g.Get(p), out[3 * x + 2] = h.b.Get(p);
        }
      }
    }
  }
  return rgb;
}

}  // namespace coloader::formats
