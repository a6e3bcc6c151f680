// What a file's leading bytes say it is, and the size limits every decoder applies: shared by
// the decoder that picks (decode.h) and the per-format decoders it picks from (decode_formats.h).
#pragma once

#include <cstdint>

namespace coloader {

enum class ImageKind { kJpeg, kPng, kWebp, kTiff, kBmp, kPnm, kOther };

// "JPEG", "PNG", ... for messages.
const char* ImageKindName(ImageKind kind);

// Larger images are refused by Peek and DecodeRgb (a decompression bomb is a few hundred
// bytes claiming gigapixels). 64 Mpixels is far above any training image.
inline constexpr int kMaxImageSide = 32768;
inline constexpr uint64_t kMaxImagePixels = uint64_t{64} << 20;

struct ImageInfo {
  ImageKind kind = ImageKind::kOther;
  int width = 0;
  int height = 0;
};

}  // namespace coloader
