#include "pipeline/transform/erase.h"

#include <algorithm>
#include <cmath>

namespace coloader {

EraseBox SampleErase(int size, const EraseOptions& o, SampleRng& rng) {
  EraseBox box;
  if (o.p <= 0 || !(rng.Uniform(0, 1) < o.p)) return box;
  const double area = static_cast<double>(size) * size;
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * rng.Uniform(o.scale_min, o.scale_max);
    const double aspect = std::exp(rng.Uniform(log_lo, log_hi));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(erase_area * aspect)));
    const int w = static_cast<int>(std::nearbyint(std::sqrt(erase_area / aspect)));
    if (!(h < size && w < size)) continue;
    box.erase = h > 0 && w > 0;
    box.height = h, box.width = w;
    box.top = static_cast<int>(rng.UniformInt(0, size - h));
    box.left = static_cast<int>(rng.UniformInt(0, size - w));
    return box;
  }
  return box;
}

EraseBox DrawErase(int size, const EraseOptions& o, uint64_t seed, uint64_t epoch, uint64_t index) {
  // Its own stream: the seed salted, so the box does not depend on what the ops before it drew.
  SampleRng rng(seed ^ 0xE7A5E5A17C0FFEEull, epoch, index);
  EraseBox box = SampleErase(size, o, rng);
  box.noise_key = rng.NextU64();
  return box;
}

EraseFill FillOf(const EraseOptions& o) {
  EraseFill f;
  f.random = o.random_value ? 1 : 0;
  for (int c = 0; c < 3; ++c) f.value[c] = o.value[c];
  return f;
}

EraseTask TaskOf(const EraseBox& box, uint32_t index) {
  EraseTask t;
  if (box.erase) t.top = box.top, t.left = box.left, t.height = box.height, t.width = box.width;
  t.noise_key = box.noise_key;
  t.index = index;
  return t;
}

void EraseSample(void* dst, int size, DType type, TensorLayout layout, const EraseOptions& o, const EraseBox& box) {
  if (!box.erase) return;
  const size_t plane = static_cast<size_t>(size) * size;
  // torchvision fills the (C, h, w) block channel by channel, row by row; EraseNoise numbers the
  // elements the same way.
  for (int c = 0; c < 3; ++c) {
    for (int y = box.top; y < box.top + box.height; ++y) {
      for (int x = box.left; x < box.left + box.width; ++x) {
        const size_t pixel = static_cast<size_t>(y) * size + x;
        const size_t at = layout == TensorLayout::kNCHW ? c * plane + pixel : 3 * pixel + c;
        const auto element = static_cast<uint32_t>((c * box.height + (y - box.top)) * box.width + (x - box.left));
        const float v = o.random_value ? EraseNoise(box.noise_key, element) : o.value[c];
        if (type == DType::kFloat32) {
          static_cast<float*>(dst)[at] = v;
        } else {
          static_cast<uint8_t*>(dst)[at] = static_cast<uint8_t>(std::clamp(std::nearbyint(v), 0.f, 255.f));
        }
      }
    }
  }
}

}  // namespace coloader
