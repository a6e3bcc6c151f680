// Reading a JPEG's markers without decoding it: whether the data is complete, and what its
// frame header says. The CPU decoder's region decode and the GPU routing both judge files by
// these, so they agree on which are whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace coloader {

// Whether a JPEG's data is closed by its end-of-image marker (within the last 64 bytes: some
// writers leave a little padding after it). A file without one was cut short.
bool JpegEndsWithEoi(const uint8_t* data, size_t size);

// What a JPEG's frame header says: enough to route the file before any decoder sees it.
struct JpegFrame {
  int sof = 0;         // the frame marker: 0xC0 baseline, 0xC1 extended, 0xC2 progressive...
  int precision = 0;   // bits per sample
  int components = 0;  // 1 grayscale, 3 YCbCr (or RGB), 4 CMYK/YCCK
  int width = 0, height = 0;
  bool adobe_no_transform = false;  // APP14 "Adobe" with transform 0: stored as RGB/CMYK as is
  bool ends_with_eoi = false;       // the end-of-image marker closes the data (not cut short)
};
// Walks the markers up to the frame header. nullopt when there is none to read.
std::optional<JpegFrame> ScanJpegFrame(const uint8_t* data, size_t size);

}  // namespace coloader
