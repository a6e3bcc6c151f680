// The decoders for the formats other than JPEG, one file each (decode_png.cc, decode_webp.cc,
// decode_tiff.cc, decode_bmp.cc, decode_pnm.cc), behind Decoder (decode.h), which picks one by
// the file's leading bytes. Private to pipeline/.
//
// Every decoder gives what torchvision's default loader gives, PIL's
// Image.open(f).convert("RGB"): alpha is dropped (not composited), a palette is looked up,
// grey is repeated into R, G and B, and 16-bit samples are brought to 8 bits as PIL does for
// that format (tests/unit/decode_formats_test.cc compares each against PIL's pixels).
//
// Each Peek reads only the header; each Decode checks the size with CheckImageSize before it
// allocates anything for the pixels, so a small hostile file cannot ask for gigabytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <opencv2/core.hpp>

#include "common/status.h"
#include "pipeline/decode/image_kind.h"

namespace coloader::formats {

// The format the leading bytes announce (kOther when none coloader reads).
ImageKind Sniff(const uint8_t* data, size_t size);

// OK when width x height is an image the decoder accepts (both sides positive, at most
// kMaxImageSide, at most kMaxImagePixels in all); otherwise an error naming `path` and the size.
Status CheckImageSize(int64_t width, int64_t height, const std::string& path);

// Each returns the image's size (Peek) or its pixels as CV_8UC3 RGB (Decode); a file that is
// not what it claims, is cut short or uses a variant the decoder does not read is an error
// naming `path` and what was wrong.
Result<ImageInfo> PeekPng(const uint8_t* data, size_t size, const std::string& path);
Result<cv::Mat> DecodePng(const uint8_t* data, size_t size, const std::string& path);

Result<ImageInfo> PeekWebp(const uint8_t* data, size_t size, const std::string& path);
Result<cv::Mat> DecodeWebp(const uint8_t* data, size_t size, const std::string& path);

Result<ImageInfo> PeekTiff(const uint8_t* data, size_t size, const std::string& path);
Result<cv::Mat> DecodeTiff(const uint8_t* data, size_t size, const std::string& path);

Result<ImageInfo> PeekBmp(const uint8_t* data, size_t size, const std::string& path);
Result<cv::Mat> DecodeBmp(const uint8_t* data, size_t size, const std::string& path);

Result<ImageInfo> PeekPnm(const uint8_t* data, size_t size, const std::string& path);
Result<cv::Mat> DecodePnm(const uint8_t* data, size_t size, const std::string& path);

}  // namespace coloader::formats
