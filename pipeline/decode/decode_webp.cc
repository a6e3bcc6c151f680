// WebP through libwebp: lossy and lossless, with or without alpha (dropped, as PIL's
// convert("RGB") drops it: libwebp hands back the stored colour, not premultiplied). An
// animated WebP gives its first frame as PIL does: libwebpdemux's animation decoder draws it
// on the canvas, transparent black where the frame does not reach.
#include <webp/decode.h>
#include <webp/demux.h>

#include <memory>

#include "pipeline/decode/decode_formats.h"

namespace coloader::formats {

namespace {

const char* VP8StatusName(VP8StatusCode s) {
  switch (s) {
    case VP8_STATUS_OK: return "ok";
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "not enough data";
  }
  return "unknown error";
}

Status WebpError(VP8StatusCode s, const std::string& path) {
  if (s == VP8_STATUS_NOT_ENOUGH_DATA) return Status::Invalid(path + ": truncated WebP data");
  return Status::Invalid(path + ": corrupt WebP data (" + VP8StatusName(s) + ")");
}

// The header's features, the size (the canvas, for an animation) accepted.
Result<WebPBitstreamFeatures> Features(const uint8_t* data, size_t size, const std::string& path) {
  WebPBitstreamFeatures f;
  if (VP8StatusCode s = WebPGetFeatures(data, size, &f); s != VP8_STATUS_OK) {
    if (s == VP8_STATUS_NOT_ENOUGH_DATA) return Status::Invalid(path + ": truncated WebP header");
    return Status::Invalid(path + ": corrupt WebP header (" + VP8StatusName(s) + ")");
  }
  COLOADER_RETURN_NOT_OK(CheckImageSize(f.width, f.height, path));
  return f;
}

struct AnimDecoderDeleter {
  void operator()(WebPAnimDecoder* d) const { WebPAnimDecoderDelete(d); }
};

Result<cv::Mat> FirstFrame(const uint8_t* data, size_t size, const WebPBitstreamFeatures& f, const std::string& path) {
  WebPAnimDecoderOptions opts;
  if (!WebPAnimDecoderOptionsInit(&opts)) {
    return Status::Invalid(path + ": cannot decode WebP (libwebp version mismatch)");
  }
  opts.color_mode = MODE_RGBA;
  opts.use_threads = 0;
  const WebPData whole{data, size};
  // Allocates the canvas the header declared, which Features has bounded.
  std::unique_ptr<WebPAnimDecoder, AnimDecoderDeleter> dec(WebPAnimDecoderNew(&whole, &opts));
  if (!dec) return Status::Invalid(path + ": corrupt animated WebP data");
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(dec.get(), &info) || int(info.canvas_width) != f.width ||
      int(info.canvas_height) != f.height) {
    return Status::Invalid(path + ": corrupt animated WebP header");
  }
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(dec.get(), &rgba, &timestamp) || !rgba) {
    return Status::Invalid(path + ": corrupt or truncated animated WebP data (no first frame)");
  }
  cv::Mat rgb(f.height, f.width, CV_8UC3);
  const uint8_t* in = rgba;
  uint8_t* out = rgb.data;
  for (size_t i = 0, n = rgb.total(); i < n; ++i, in += 4, out += 3) {
    out[0] = in[0];
    out[1] = in[1];
    out[2] = in[2];
  }
  return rgb;
}

}  // namespace

Result<ImageInfo> PeekWebp(const uint8_t* data, size_t size, const std::string& path) {
  COLOADER_ASSIGN_OR_RETURN(WebPBitstreamFeatures f, Features(data, size, path));
  ImageInfo info;
  info.kind = ImageKind::kWebp;
  info.width = f.width;
  info.height = f.height;
  return info;
}

Result<cv::Mat> DecodeWebp(const uint8_t* data, size_t size, const std::string& path) {
  COLOADER_ASSIGN_OR_RETURN(WebPBitstreamFeatures f, Features(data, size, path));
  if (f.has_animation) return FirstFrame(data, size, f, path);
  cv::Mat rgb(f.height, f.width, CV_8UC3);
  const size_t bytes = rgb.total() * rgb.elemSize();
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) return Status::Invalid(path + ": cannot decode WebP (libwebp version mismatch)");
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = rgb.data;
  config.output.u.RGBA.stride = static_cast<int>(rgb.step);
  config.output.u.RGBA.size = bytes;
  const VP8StatusCode s = WebPDecode(data, size, &config);
  WebPFreeDecBuffer(&config.output);  // external memory: frees nothing of ours
  if (s != VP8_STATUS_OK) return WebpError(s, path);
  return rgb;
}

}  // namespace coloader::formats
