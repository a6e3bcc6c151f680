// Image decoding to 3-channel RGB uint8: libjpeg-turbo (TurboJPEG) for JPEG, with DCT-domain
// scaling; OpenCV imdecode for everything else (PNG, also when named .JPEG). CMYK, YCCK and
// grayscale JPEGs come out as RGB like any other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <opencv2/core.hpp>

#include "common/status.h"
#include "server/augment.h"

namespace coloader {

enum class ImageKind { kJpeg, kPng, kOther };

// Larger images are refused by Peek and DecodeRgb (a decompression bomb is a few hundred
// bytes claiming gigapixels). 64 Mpixels is far above any training image.
inline constexpr int kMaxImageSide = 32768;
inline constexpr uint64_t kMaxImagePixels = uint64_t{64} << 20;

struct ImageInfo {
  ImageKind kind = ImageKind::kOther;
  int width = 0;
  int height = 0;
};

// One decoder per worker thread (it owns a TurboJPEG handle). Not thread-safe.
class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Reads the size from the header without decoding. `path` is only used in error messages.
  Result<ImageInfo> Peek(const uint8_t* data, size_t size, const std::string& path);

  // Decodes the whole image to RGB, reduced by 1/scale_denom in each dimension (JPEG only;
  // scale_denom in {1, 2, 4, 8}; other formats ignore it and decode at full size).
  // Truncated or corrupt data is an error naming `path`.
  Result<cv::Mat> DecodeRgb(const uint8_t* data, size_t size, int scale_denom,
                            const std::string& path);

 private:
  Result<cv::Mat> DecodeRgbUnchecked(const uint8_t* data, size_t size, int scale_denom, const std::string& path);
  void* tj_ = nullptr;  // tjhandle; kept out of the header's includes
};

// The largest DCT scale denominator in {1, 2, 4, 8} that still leaves the crop box at least
// out_size pixels in both dimensions after scaling (so scaling never loses resolution that the
// output needs). Returns 1 when `enabled` is false.
int ChooseScaleDenom(const CropBox& box, int out_size, bool enabled);

}  // namespace coloader
