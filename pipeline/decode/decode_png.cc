// PNG through libspng: every colour type and bit depth, interlaced or not, to RGB as PIL's
// convert("RGB") gives it.
//
// What PIL 9.4 does, and this file with it (tests/unit/decode_formats_test.cc checks each):
// palette and low-bit grey are expanded (grey 1/2/4-bit scaled to 0..255), transparency (tRNS,
// alpha channels) is ignored, no gamma is applied; 16-bit RGB, RGBA and grey+alpha keep the
// high byte of each sample; 16-bit grey alone opens as PIL mode "I" (the sample's value), which
// convert("RGB") clips at 255, so 300 is 255, not 1.
#include <spng.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "pipeline/decode/decode_formats.h"

namespace coloader::formats {

namespace {

// Ancillary chunks (text, ICC profiles, EXIF) are kept in memory by libspng until the image is
// read; a hostile file can declare many large ones. 16 MB each and 64 MB in all is far above
// any real image's metadata.
constexpr size_t kMaxChunkBytes = size_t{16} << 20;
constexpr size_t kMaxChunkCache = size_t{64} << 20;

struct SpngDeleter {
  void operator()(spng_ctx* c) const { spng_ctx_free(c); }
};
using SpngCtx = std::unique_ptr<spng_ctx, SpngDeleter>;

Status SpngError(int rc, const std::string& path) {
  if (rc == SPNG_EOF || rc == SPNG_EIDAT_STREAM) return Status::Invalid(path + ": truncated PNG data");
  return Status::Invalid(path + ": corrupt PNG data (" + spng_strerror(rc) + ")");
}

// A context reading `data`, its header read and its size accepted.
Result<SpngCtx> Open(const uint8_t* data, size_t size, const std::string& path, spng_ihdr* ihdr) {
  SpngCtx ctx(spng_ctx_new(0));
  if (!ctx) return Status::Invalid(path + ": cannot decode PNG (out of memory)");
  spng_set_image_limits(ctx.get(), kMaxImageSide, kMaxImageSide);
  spng_set_chunk_limits(ctx.get(), kMaxChunkBytes, kMaxChunkCache);
  if (int rc = spng_set_png_buffer(ctx.get(), data, size); rc != 0) return SpngError(rc, path);
  if (int rc = spng_get_ihdr(ctx.get(), ihdr); rc != 0) {
    // libspng refuses sides above the limits set here with its own code; say it as the other
    // formats do.
    if (rc == SPNG_EWIDTH || rc == SPNG_EHEIGHT || rc == SPNG_EUSER_WIDTH || rc == SPNG_EUSER_HEIGHT) {
      if (size >= 24) {
        auto be32 = [&](size_t o) {
          return (uint32_t{data[o]} << 24) | (uint32_t{data[o + 1]} << 16) | (uint32_t{data[o + 2]} << 8) | data[o + 3];
        };
        COLOADER_RETURN_NOT_OK(CheckImageSize(be32(16), be32(20), path));
      }
    }
    return Status::Invalid(path + ": corrupt PNG header (" + spng_strerror(rc) + ")");
  }
  COLOADER_RETURN_NOT_OK(CheckImageSize(ihdr->width, ihdr->height, path));
  return ctx;
}

}  // namespace

Result<ImageInfo> PeekPng(const uint8_t* data, size_t size, const std::string& path) {
  spng_ihdr ihdr{};
  COLOADER_ASSIGN_OR_RETURN(SpngCtx ctx, Open(data, size, path, &ihdr));
  ImageInfo info;
  info.kind = ImageKind::kPng;
  info.width = static_cast<int>(ihdr.width);
  info.height = static_cast<int>(ihdr.height);
  return info;
}

Result<cv::Mat> DecodePng(const uint8_t* data, size_t size, const std::string& path) {
  spng_ihdr ihdr{};
  COLOADER_ASSIGN_OR_RETURN(SpngCtx ctx, Open(data, size, path, &ihdr));
  const int w = static_cast<int>(ihdr.width), h = static_cast<int>(ihdr.height);
  cv::Mat rgb(h, w, CV_8UC3);
  if (ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr.bit_depth == 16) {
    // Host-endian 16-bit samples, clipped as PIL's I -> RGB conversion clips.
    cv::Mat gray(h, w, CV_16UC1);
    const size_t bytes = gray.total() * gray.elemSize();
    if (int rc = spng_decode_image(ctx.get(), gray.data, bytes, SPNG_FMT_PNG, 0); rc != 0) return SpngError(rc, path);
    for (int y = 0; y < h; ++y) {
      const uint16_t* in = gray.ptr<uint16_t>(y);
      uint8_t* out = rgb.ptr<uint8_t>(y);
      for (int x = 0; x < w; ++x) {
        out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = static_cast<uint8_t>(std::min<int>(in[x], 255));
      }
    }
    return rgb;
  }
  // SPNG_FMT_RGB8 expands palette and grey, drops alpha and tRNS (SPNG_DECODE_TRNS is not
  // asked for) and keeps the high byte of 16-bit samples: PIL's result for every other type.
  size_t want = 0;
  if (int rc = spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &want); rc != 0) return SpngError(rc, path);
  if (want != rgb.total() * rgb.elemSize()) {
    return Status::Invalid(path + ": corrupt PNG header (decoded size " + std::to_string(want) + " bytes for " +
                           std::to_string(w) + "x" + std::to_string(h) + ")");
  }
  if (int rc = spng_decode_image(ctx.get(), rgb.data, want, SPNG_FMT_RGB8, 0); rc != 0) return SpngError(rc, path);
  return rgb;
}

}  // namespace coloader::formats
