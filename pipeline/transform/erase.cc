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

namespace {

// A standard normal draw (Box-Muller), for value="random".
float Normal(SampleRng& rng) {
  const double u1 = 1.0 - rng.Uniform(0, 1), u2 = rng.Uniform(0, 1);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace

void EraseSample(void* dst, int size, DType type, TensorLayout layout, const EraseOptions& o, const EraseBox& box,
                 SampleRng& rng) {
  if (!box.erase) return;
  const size_t plane = static_cast<size_t>(size) * size;
  // torchvision fills the (C, h, w) block channel by channel, row by row.
  for (int c = 0; c < 3; ++c) {
    for (int y = box.top; y < box.top + box.height; ++y) {
      for (int x = box.left; x < box.left + box.width; ++x) {
        const size_t pixel = static_cast<size_t>(y) * size + x;
        const size_t at = layout == TensorLayout::kNCHW ? c * plane + pixel : 3 * pixel + c;
        const float v = o.random_value ? Normal(rng) : o.value[c];
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
