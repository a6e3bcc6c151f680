#include "pipeline/transform/color.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include <opencv2/imgproc.hpp>

namespace coloader::color {

namespace {

// float32 -> uint8 as torch's .to(torch.uint8) after a clamp to [0, 255]: truncation.
inline uint8_t Truncate(float v) { return static_cast<uint8_t>(std::min(255.f, std::max(0.f, v))); }
// The same after torch.round (half to even), as _cast_squeeze_out does for filters.
inline uint8_t RoundToU8(float v) { return static_cast<uint8_t>(std::min(255.f, std::max(0.f, std::nearbyint(v)))); }

// rgb_to_grayscale in float32, before its cast.
inline float Luma(const uint8_t* p) { return 0.2989f * p[0] + 0.587f * p[1] + 0.114f * p[2]; }

cv::Mat GrayscaleCopy(const cv::Mat& rgb) {
  cv::Mat gray(rgb.size(), CV_8UC3);
  for (int y = 0; y < rgb.rows; ++y) {
    const uint8_t* s = rgb.ptr<uint8_t>(y);
    uint8_t* d = gray.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols; ++x, s += 3, d += 3) d[0] = d[1] = d[2] = static_cast<uint8_t>(Luma(s));
  }
  return gray;
}

template <typename F>
void ForEachValue(cv::Mat& rgb, F f) {
  for (int y = 0; y < rgb.rows; ++y) {
    uint8_t* p = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols * 3; ++x) p[x] = f(p[x]);
  }
}

}  // namespace

void BlendWithImage(cv::Mat& rgb, const cv::Mat& other, double ratio) {
  const float r = static_cast<float>(ratio), q = static_cast<float>(1.0 - ratio);
  for (int y = 0; y < rgb.rows; ++y) {
    uint8_t* p = rgb.ptr<uint8_t>(y);
    const uint8_t* o = other.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols * 3; ++x) p[x] = Truncate(r * p[x] + q * o[x]);
  }
}

void BlendWithValue(cv::Mat& rgb, float value, double ratio) {
  const float r = static_cast<float>(ratio), qv = static_cast<float>(1.0 - ratio) * value;
  ForEachValue(rgb, [&](uint8_t v) { return Truncate(r * v + qv); });
}

void AdjustBrightness(cv::Mat& rgb, double factor) { BlendWithValue(rgb, 0.f, factor); }

void AdjustContrast(cv::Mat& rgb, double factor) {
  double sum = 0;
  for (int y = 0; y < rgb.rows; ++y) {
    const uint8_t* p = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols; ++x, p += 3) sum += static_cast<uint8_t>(Luma(p));
  }
  const float mean = static_cast<float>(sum / (static_cast<double>(rgb.rows) * rgb.cols));
  BlendWithValue(rgb, mean, factor);
}

void AdjustSaturation(cv::Mat& rgb, double factor) { BlendWithImage(rgb, GrayscaleCopy(rgb), factor); }

void AdjustHue(cv::Mat& rgb, double shift) {
  const float hf = static_cast<float>(shift);
  for (int y = 0; y < rgb.rows; ++y) {
    uint8_t* p = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols; ++x, p += 3) {
      const float r = p[0] / 255.f, g = p[1] / 255.f, b = p[2] / 255.f;
      // _rgb2hsv
      const float maxc = std::max(r, std::max(g, b)), minc = std::min(r, std::min(g, b));
      const bool eqc = maxc == minc;
      const float cr = maxc - minc;
      const float s = cr / (eqc ? 1.f : maxc);
      const float div = eqc ? 1.f : cr;
      const float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
      float h;
      if (maxc == r) h = bc - gc;
      else if (maxc == g) h = 2.f + rc - bc;
      else h = 4.f + gc - rc;
      h = std::fmod(h / 6.f + 1.f, 1.f);
      // the shift, then _hsv2rgb
      h = std::fmod(h + hf, 1.f);
      if (h < 0) h += 1.f;  // Python's % keeps the sign of the divisor
      const float v = maxc;
      const float fi = std::floor(h * 6.f);
      const float f = h * 6.f - fi;
      const int i = static_cast<int>(fi) % 6;
      const float pp = std::clamp(v * (1.f - s), 0.f, 1.f);
      const float qq = std::clamp(v * (1.f - s * f), 0.f, 1.f);
      const float tt = std::clamp(v * (1.f - s * (1.f - f)), 0.f, 1.f);
      const std::array<std::array<float, 3>, 6> table = {{{v, tt, pp}, {qq, v, pp}, {pp, v, tt},
                                                         {pp, qq, v}, {tt, pp, v}, {v, pp, qq}}};
      for (int c = 0; c < 3; ++c) p[c] = Truncate(table[static_cast<size_t>(i)][static_cast<size_t>(c)] * 255.f);
    }
  }
}

void AdjustSharpness(cv::Mat& rgb, double factor) {
  if (rgb.rows <= 2 || rgb.cols <= 2) return;
  cv::Mat blurred = rgb.clone();
  for (int y = 1; y < rgb.rows - 1; ++y) {
    const uint8_t* up = rgb.ptr<uint8_t>(y - 1);
    const uint8_t* mid = rgb.ptr<uint8_t>(y);
    const uint8_t* down = rgb.ptr<uint8_t>(y + 1);
    uint8_t* d = blurred.ptr<uint8_t>(y);
    for (int x = 3; x < (rgb.cols - 1) * 3; ++x) {
      const float s = static_cast<float>(up[x - 3] + up[x] + up[x + 3] + mid[x - 3] + mid[x + 3] + down[x - 3] +
                                         down[x] + down[x + 3]) +
                      5.f * mid[x];
      d[x] = RoundToU8(s / 13.f);
    }
  }
  BlendWithImage(rgb, blurred, factor);
}

void Grayscale(cv::Mat& rgb) { GrayscaleCopy(rgb).copyTo(rgb); }

void Posterize(cv::Mat& rgb, int bits) {
  const auto mask = static_cast<uint8_t>(0xFF << (8 - std::clamp(bits, 0, 8)));
  ForEachValue(rgb, [mask](uint8_t v) { return static_cast<uint8_t>(v & mask); });
}

void Solarize(cv::Mat& rgb, double threshold) {
  ForEachValue(rgb, [threshold](uint8_t v) { return v >= threshold ? static_cast<uint8_t>(255 - v) : v; });
}

void Invert(cv::Mat& rgb) {
  ForEachValue(rgb, [](uint8_t v) { return static_cast<uint8_t>(255 - v); });
}

void AutoContrast(cv::Mat& rgb) {
  for (int c = 0; c < 3; ++c) {
    int lo = 255, hi = 0;
    for (int y = 0; y < rgb.rows; ++y) {
      const uint8_t* p = rgb.ptr<uint8_t>(y) + c;
      for (int x = 0; x < rgb.cols; ++x, p += 3) {
        lo = std::min<int>(lo, *p);
        hi = std::max<int>(hi, *p);
      }
    }
    float minimum = static_cast<float>(lo), scale = 255.f / static_cast<float>(hi - lo);
    if (hi == lo) minimum = 0, scale = 1;
    for (int y = 0; y < rgb.rows; ++y) {
      uint8_t* p = rgb.ptr<uint8_t>(y) + c;
      for (int x = 0; x < rgb.cols; ++x, p += 3) *p = Truncate((*p - minimum) * scale);
    }
  }
}

void Equalize(cv::Mat& rgb) {
  for (int c = 0; c < 3; ++c) {
    std::array<int64_t, 256> hist{};
    for (int y = 0; y < rgb.rows; ++y) {
      const uint8_t* p = rgb.ptr<uint8_t>(y) + c;
      for (int x = 0; x < rgb.cols; ++x, p += 3) ++hist[*p];
    }
    // torchvision's _scale_channel: the step is the count of all but the last non-empty bin / 255.
    int64_t last = -1, total = 0;
    for (int v = 0; v < 256; ++v)
      if (hist[static_cast<size_t>(v)] != 0) last = v;
    for (int v = 0; v < last; ++v) total += hist[static_cast<size_t>(v)];
    const int64_t step = total / 255;
    if (step == 0) continue;
    std::array<uint8_t, 256> lut{};
    int64_t cum = 0;
    for (int v = 0; v < 256; ++v) {
      // lut[v] = (cumsum up to v - 1 + step / 2) / step: the cumulative count before v.
      lut[static_cast<size_t>(v)] = static_cast<uint8_t>(std::min<int64_t>(255, (cum + step / 2) / step));
      cum += hist[static_cast<size_t>(v)];
    }
    for (int y = 0; y < rgb.rows; ++y) {
      uint8_t* p = rgb.ptr<uint8_t>(y) + c;
      for (int x = 0; x < rgb.cols; ++x, p += 3) *p = lut[*p];
    }
  }
}

void GaussianBlur(cv::Mat& rgb, int kx, int ky, double sigma) {
  auto kernel = [sigma](int k) {
    cv::Mat m(k, 1, CV_32F);
    const float half = (k - 1) * 0.5f;
    float sum = 0;
    for (int i = 0; i < k; ++i) {
      const float x = -half + static_cast<float>(i);  // torch.linspace(-half, half, k)
      const float v = std::exp(-0.5f * (x / static_cast<float>(sigma)) * (x / static_cast<float>(sigma)));
      m.at<float>(i) = v;
      sum += v;
    }
    return cv::Mat(m / sum);
  };
  cv::Mat f, out;
  rgb.convertTo(f, CV_32F);
  cv::sepFilter2D(f, out, CV_32F, kernel(kx), kernel(ky), cv::Point(-1, -1), 0, cv::BORDER_REFLECT_101);
  for (int y = 0; y < rgb.rows; ++y) {
    const float* s = out.ptr<float>(y);
    uint8_t* d = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols * 3; ++x) d[x] = RoundToU8(s[x]);
  }
}

void AffineNearest(cv::Mat& rgb, double angle, double tx, double ty, double shear_x, double shear_y,
                   const double* center, const float fill[3]) {
  const int w = rgb.cols, h = rgb.rows;
  // torchvision's _get_inverse_affine_matrix, about the centre in coordinates relative to the
  // image's centre.
  const double cx = center ? center[0] - w * 0.5 : 0.0, cy = center ? center[1] - h * 0.5 : 0.0;
  const double rot = angle * M_PI / 180.0, sx = shear_x * M_PI / 180.0, sy = shear_y * M_PI / 180.0;
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  double m[6] = {d, -b, 0.0, -c, a, 0.0};
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  // _gen_affine_grid and grid_sample(nearest, align_corners=False) in float32: output pixel
  // centres relative to the image's centre, mapped back, rounded half to even.
  const float mf[6] = {static_cast<float>(m[0]), static_cast<float>(m[1]), static_cast<float>(m[2]),
                       static_cast<float>(m[3]), static_cast<float>(m[4]), static_cast<float>(m[5])};
  const uint8_t fill_u8[3] = {Truncate(fill[0]), Truncate(fill[1]), Truncate(fill[2])};
  cv::Mat out(rgb.size(), CV_8UC3);
  for (int y = 0; y < h; ++y) {
    const float oy = static_cast<float>(y) - h * 0.5f + 0.5f;
    uint8_t* dst = out.ptr<uint8_t>(y);
    for (int x = 0; x < w; ++x, dst += 3) {
      const float ox = static_cast<float>(x) - w * 0.5f + 0.5f;
      const float gx = (mf[0] * ox + mf[1] * oy + mf[2]) / (0.5f * w);
      const float gy = (mf[3] * ox + mf[4] * oy + mf[5]) / (0.5f * h);
      const float ix = ((gx + 1.f) * w - 1.f) * 0.5f, iy = ((gy + 1.f) * h - 1.f) * 0.5f;
      const float rx = std::nearbyint(ix), ry = std::nearbyint(iy);
      if (!(rx >= 0 && ry >= 0 && rx <= w - 1 && ry <= h - 1)) {  // NaN too
        dst[0] = fill_u8[0], dst[1] = fill_u8[1], dst[2] = fill_u8[2];
      } else {
        const uint8_t* s = rgb.ptr<uint8_t>(static_cast<int>(ry)) + 3 * static_cast<int>(rx);
        dst[0] = s[0], dst[1] = s[1], dst[2] = s[2];
      }
    }
  }
  out.copyTo(rgb);
}

}  // namespace coloader::color
