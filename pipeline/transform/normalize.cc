#include "pipeline/transform/normalize.h"

#include <cstring>

namespace coloader {

void WriteSample(const uint8_t* src, int height, int width, DType type, TensorLayout layout,
                 const NormalizeParams& p, void* dst) {
  const size_t pixels = static_cast<size_t>(height) * width;
  if (type == DType::kUInt8) {
    auto* out = static_cast<uint8_t*>(dst);
    if (layout == TensorLayout::kNHWC) {
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
  if (layout == TensorLayout::kNHWC) {
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
