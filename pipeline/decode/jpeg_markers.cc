#include "pipeline/decode/jpeg_markers.h"

#include <algorithm>
#include <cstring>

namespace coloader {

namespace {
int BigEndian16(const uint8_t* p) { return (p[0] << 8) | p[1]; }
bool IsFrameMarker(int m) {
  // SOF0..SOF15 less DHT (C4), JPG (C8) and DAC (CC).
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}
}  // namespace

bool JpegEndsWithEoi(const uint8_t* data, size_t size) {
  const size_t tail = std::min<size_t>(size, 64);
  for (size_t i = size - tail; i + 1 < size; ++i)
    if (data[i] == 0xFF && data[i + 1] == 0xD9) return true;
  return false;
}

std::optional<JpegFrame> ScanJpegFrame(const uint8_t* data, size_t size) {
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return std::nullopt;
  JpegFrame f;
  f.ends_with_eoi = JpegEndsWithEoi(data, size);
  size_t pos = 2;
  while (pos + 4 <= size) {
    if (data[pos] != 0xFF) return std::nullopt;
    while (pos < size && data[pos] == 0xFF) ++pos;  // fill bytes
    if (pos + 3 > size) return std::nullopt;
    const int marker = data[pos];
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  // no length
      ++pos;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return std::nullopt;  // scan before any frame header
    const size_t length = static_cast<size_t>(BigEndian16(data + pos + 1));
    const uint8_t* seg = data + pos + 3;
    if (length < 2 || pos + 1 + length > size) return std::nullopt;
    const size_t seg_len = length - 2;
    if (marker == 0xEE && seg_len >= 12 && std::memcmp(seg, "Adobe", 5) == 0) {
      f.adobe_no_transform = seg[11] == 0;
    } else if (IsFrameMarker(marker)) {
      if (seg_len < 6) return std::nullopt;
      f.sof = marker;
      f.precision = seg[0];
      f.height = BigEndian16(seg + 1);
      f.width = BigEndian16(seg + 3);
      f.components = seg[5];
      return f;
    }
    pos += 1 + length;
  }
  return std::nullopt;
}

}  // namespace coloader
