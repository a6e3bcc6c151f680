// Netpbm (PBM, PGM, PPM; binary P4-P6 and plain-text P1-P3), decoded here: a text header and
// raw samples, read with every count checked against the file.
//
// Values as PIL 9.4's PpmImagePlugin gives them after convert("RGB"): samples are scaled by
// 255 / maxval (rounded) and clipped at 255; a PGM with maxval above 255 opens in PIL's mode
// "I" scaled to 0..65535, which convert("RGB") clips at 255 (so nearly every grey is white, as
// it is for torchvision); a bitmap's 1 is black.
#include <algorithm>
#include <cstring>

#include "pipeline/decode/decode_formats.h"

namespace coloader::formats {

namespace {

bool IsSpace(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

struct Header {
  char type = 0;  // '1'..'6'
  int width = 0, height = 0;
  uint32_t maxval = 1;
  size_t data_at = 0;  // first byte after the header's last whitespace
  bool Plain() const { return type <= '3'; }
  bool Bitmap() const { return type == '1' || type == '4'; }
  int Channels() const { return type == '3' || type == '6' ? 3 : 1; }
};

// Reads one header or plain-data token of at most 10 digits from `*i`, skipping whitespace and
// '#' comments (to the end of the line) before it; consumes the one whitespace byte after it.
bool ReadNumber(const uint8_t* d, size_t n, size_t* i, uint64_t* out) {
  while (*i < n) {
    if (IsSpace(d[*i])) {
      ++*i;
    } else if (d[*i] == '#') {
      while (*i < n && d[*i] != '\n' && d[*i] != '\r') ++*i;
    } else {
      break;
    }
  }
  uint64_t v = 0;
  int digits = 0;
  while (*i < n && d[*i] >= '0' && d[*i] <= '9') {
    if (++digits > 10) return false;
    v = v * 10 + (d[*i] - '0');
    ++*i;
  }
  if (digits == 0) return false;
  if (*i < n) {
    if (!IsSpace(d[*i])) return false;  // "12x"
    ++*i;
  }
  *out = v;
  return true;
}

Status ParseHeader(const uint8_t* d, size_t n, const std::string& path, Header* h) {
  if (n < 3 || d[0] != 'P' || d[1] < '1' || d[1] > '6' || !IsSpace(d[2])) {
    return Status::Invalid(path + ": corrupt PNM header (no P1-P6 magic)");
  }
  h->type = static_cast<char>(d[1]);
  size_t i = 2;
  uint64_t w = 0, hh = 0, maxval = 1;
  if (!ReadNumber(d, n, &i, &w) || !ReadNumber(d, n, &i, &hh) || (!h->Bitmap() && !ReadNumber(d, n, &i, &maxval))) {
    return Status::Invalid(path + ": corrupt PNM header (width, height" + (h->Bitmap() ? "" : ", maxval") +
                           " must be decimal numbers of at most 10 digits)");
  }
  if (maxval < 1 || maxval > 65535) {
    return Status::Invalid(path + ": corrupt PNM header (maxval " + std::to_string(maxval) +
                           " is not within 1..65535)");
  }
  COLOADER_RETURN_NOT_OK(CheckImageSize(static_cast<int64_t>(std::min<uint64_t>(w, INT64_MAX)),
                               static_cast<int64_t>(std::min<uint64_t>(hh, INT64_MAX)), path));
  h->width = static_cast<int>(w);
  h->height = static_cast<int>(hh);
  h->maxval = static_cast<uint32_t>(maxval);
  h->data_at = i;
  return Status::OK();
}

// One sample brought to 0..255 as PIL does (see the top of the file).
struct Scale {
  uint64_t mul, maxval;
  explicit Scale(const Header& h)
      : mul(h.Channels() == 1 && h.maxval > 255 ? 65535 : 255), maxval(h.maxval) {}
  uint8_t operator()(uint32_t v) const {
    return static_cast<uint8_t>(std::min<uint64_t>(255, (uint64_t(v) * mul * 2 + maxval) / (2 * maxval)));
  }
};

Status Truncated(const std::string& path, uint64_t need, size_t have) {
  return Status::Invalid(path + ": truncated PNM data (" + std::to_string(need) + " bytes of pixels, the file has " +
                         std::to_string(have) + ")");
}

}  // namespace

Result<ImageInfo> PeekPnm(const uint8_t* data, size_t size, const std::string& path) {
  Header h;
  COLOADER_RETURN_NOT_OK(ParseHeader(data, size, path, &h));
  ImageInfo info;
  info.kind = ImageKind::kPnm;
  info.width = h.width;
  info.height = h.height;
  return info;
}

Result<cv::Mat> DecodePnm(const uint8_t* data, size_t size, const std::string& path) {
  Header h;
  COLOADER_RETURN_NOT_OK(ParseHeader(data, size, path, &h));
  const int w = h.width, rows = h.height, ch = h.Channels();
  const size_t have = size - h.data_at;
  const uint8_t* p = data + h.data_at;
  const Scale scale(h);
  if (h.type == '4') {  // rows of packed bits, 1 = black
    const uint64_t row_bytes = (uint64_t(w) + 7) / 8;
    if (row_bytes * rows > have) return Truncated(path, row_bytes * rows, have);
    cv::Mat rgb(rows, w, CV_8UC3);
    for (int y = 0; y < rows; ++y) {
      uint8_t* out = rgb.ptr<uint8_t>(y);
      const uint8_t* in = p + y * row_bytes;
      for (int x = 0; x < w; ++x) {
        out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = ((in[x >> 3] >> (7 - (x & 7))) & 1) ? 0 : 255;
      }
    }
    return rgb;
  }
  if (!h.Plain()) {  // P5, P6: 1 or 2 (big-endian) bytes per sample
    const int bytes = h.maxval > 255 ? 2 : 1;
    const uint64_t need = uint64_t(w) * rows * ch * bytes;
    if (need > have) return Truncated(path, need, have);
    cv::Mat rgb(rows, w, CV_8UC3);
    const bool identity = h.maxval == 255;
    for (int y = 0; y < rows; ++y) {
      uint8_t* out = rgb.ptr<uint8_t>(y);
      const uint8_t* in = p + uint64_t(y) * w * ch * bytes;
      for (int x = 0; x < w; ++x, out += 3) {
        for (int c = 0; c < 3; ++c) {
          const uint8_t* s = in + (uint64_t(x) * ch + (ch == 3 ? c : 0)) * bytes;
          const uint32_t v = bytes == 2 ? (uint32_t{s[0]} << 8 | s[1]) : s[0];
          out[c] = identity ? static_cast<uint8_t>(v) : scale(v);
        }
      }
    }
    return rgb;
  }
  // Plain text: P1 is a stream of '0'/'1' (whitespace optional between them), P2/P3 decimal
  // numbers no larger than maxval. The smallest possible file is still checked first (one byte
  // per P1 pixel, two per number), so a short file does not get a large image allocated.
  const uint64_t samples = uint64_t(w) * rows * ch;
  const uint64_t least = h.type == '1' ? samples : 2 * samples - 1;
  if (least > have) return Truncated(path, least, have);
  cv::Mat rgb(rows, w, CV_8UC3);
  uint8_t* out = rgb.data;
  size_t i = 0;
  for (uint64_t s = 0; s < samples; ++s) {
    uint8_t v = 0;
    if (h.type == '1') {
      while (i < have && (IsSpace(p[i]) || p[i] == '#')) {
        if (p[i] == '#') {
          while (i < have && p[i] != '\n' && p[i] != '\r') ++i;
        } else {
          ++i;
        }
      }
      if (i >= have) return Status::Invalid(path + ": truncated PNM data (" + std::to_string(s) + " of " +
                                            std::to_string(samples) + " pixels)");
      if (p[i] != '0' && p[i] != '1') return Status::Invalid(path + ": corrupt PBM data (a byte other than 0 or 1)");
      v = p[i++] == '1' ? 0 : 255;
    } else {
      uint64_t value = 0;
      if (!ReadNumber(p, have, &i, &value)) {
        return Status::Invalid(path + ": corrupt or truncated PNM data (sample " + std::to_string(s) + " of " +
                               std::to_string(samples) + " is not a number)");
      }
      if (value > h.maxval) {
        return Status::Invalid(path + ": corrupt PNM data (sample " + std::to_string(value) + " above maxval " +
                               std::to_string(h.maxval) + ")");
      }
      v = scale(static_cast<uint32_t>(value));
    }
    if (ch == 3) {
      out[s] = v;
    } else {
      out[3 * s] = out[3 * s + 1] = out[3 * s + 2] = v;
    }
  }
  return rgb;
}

}  // namespace coloader::formats
