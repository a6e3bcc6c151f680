#include "server/normalize.h"

#include <cstring>

namespace coloader {

Result<OutputType> ParseOutputType(const std::string& s) {
  if (s == "uint8") return OutputType::kUInt8;
  if (s == "float32") return OutputType::kFloat32;
  return Status::Invalid("--output must be uint8 or float32, got '" + s + "'");
}

Result<Layout> ParseLayout(const std::string& s) {
  if (s == "nhwc") return Layout::kNHWC;
  if (s == "nchw") return Layout::kNCHW;
  return Status::Invalid("--layout must be nchw or nhwc, got '" + s + "'");
}

const char* OutputTypeName(OutputType t) { return t == OutputType::kUInt8 ? "uint8" : "float32"; }
const char* LayoutName(Layout l) { return l == Layout::kNHWC ? "nhwc" : "nchw"; }
size_t OutputElementSize(OutputType t) { return t == OutputType::kUInt8 ? 1 : 4; }

void WriteSample(const uint8_t* src, int height, int width, OutputType type, Layout layout,
                 const NormalizeParams& p, void* dst) {
  const size_t pixels = static_cast<size_t>(height) * width;
  if (type == OutputType::kUInt8) {
    auto* out = static_cast<uint8_t*>(dst);
    if (layout == Layout::kNHWC) {
      if (out != src) std::memcpy(out, src, pixels * 3);
      return;
    }
    for (size_t i = 0; i < pixels; ++i) {
      out[i] = src[3 * i];
      out[pixels + i] = src[3 * i + 1];
      out[2 * pixels + i] = src[3 * i + 2];
    }
    return;
  }
  // (x - mean) / std as x * scale + shift: one multiply-add per element, which vectorises.
  float scale[3], shift[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / p.std[c];
    shift[c] = -p.mean[c] / p.std[c];
  }
  auto* out = static_cast<float*>(dst);
  if (layout == Layout::kNHWC) {
    for (size_t i = 0; i < pixels; ++i) {
      for (int c = 0; c < 3; ++c) out[3 * i + c] = static_cast<float>(src[3 * i + c]) * scale[c] + shift[c];
    }
    return;
  }
  for (int c = 0; c < 3; ++c) {
    float* plane = out + c * pixels;
    const float s = scale[c], b = shift[c];
    for (size_t i = 0; i < pixels; ++i) plane[i] = static_cast<float>(src[3 * i + c]) * s + b;
  }
}

}  // namespace coloader
