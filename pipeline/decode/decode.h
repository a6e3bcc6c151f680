// Image decoding to 3-channel RGB uint8, the format chosen by the file's leading bytes, never
// its name (ImageNet has PNGs behind .JPEG names): libjpeg-turbo (TurboJPEG) for JPEG, with
// DCT-domain scaling; libspng for PNG, libwebp for WebP, libtiff for TIFF, and small decoders of
// coloader's own for BMP and PNM (decode_formats.h) -- every format torchvision's ImageFolder
// accepts, with the pixels PIL's convert("RGB") gives. CMYK, YCCK and grayscale JPEGs come out
// as RGB like any other. A crop of a JPEG can be decoded alone (libjpeg-turbo's own API: rows
// above it skipped, rows below never read, columns cut to it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "common/status.h"
#include "pipeline/transform/augment.h"
#include "pipeline/decode/image_kind.h"

namespace coloader {

// Part of a scaled image: `rgb` holds the pixels whose top-left is (x, y) in the image scaled
// by 1/scale_denom.
struct DecodedRegion {
  cv::Mat rgb;
  int x = 0, y = 0;
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
  // A file in none of the formats read is an error naming its first bytes.
  // Truncated or corrupt data is an error naming `path`.
  Result<cv::Mat> DecodeRgb(const uint8_t* data, size_t size, int scale_denom,
                            const std::string& path);

  // Decodes only what `rect` (in the image scaled by 1/scale_denom) needs, as the same
  // pixels DecodeRgb gives there (bit for bit; tests/unit/decode_test.cc). Columns widen to
  // libjpeg's block boundaries, so the region may be larger than `rect`. nullopt when this
  // does not apply or anything looks wrong (not a JPEG, CMYK/YCCK, no end-of-image marker, a
  // libjpeg warning or error): DecodeRgb then decodes the whole image and judges the file, so
  // a damaged file fails as before. Damage entirely below the rows a crop needs is not read,
  // and goes unnoticed for that crop. The region's pixels live in this decoder: valid until
  // its next DecodeJpegRegion.
  std::optional<DecodedRegion> DecodeJpegRegion(const uint8_t* data, size_t size, int scale_denom,
                                                const cv::Rect& rect);

 private:
  Result<cv::Mat> DecodeRgbUnchecked(const uint8_t* data, size_t size, int scale_denom, const std::string& path);
  void* tj_ = nullptr;  // tjhandle; kept out of the header's includes
  std::vector<uint8_t> region_buf_;  // DecodeJpegRegion's rows, reused
};

// The largest DCT scale denominator in {1, 2, 4, 8} that still leaves the crop box at least
// out_size pixels in both dimensions after scaling (so scaling never loses resolution that the
// output needs). Returns 1 when `enabled` is false.
int ChooseScaleDenom(const CropBox& box, int out_size, bool enabled);

}  // namespace coloader
