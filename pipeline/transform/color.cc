#include "pipeline/transform/color.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <opencv2/imgproc.hpp>

#include "pipeline/transform/pixel_math.h"

namespace coloader::color {

using pixel::Luma;
using pixel::Truncate;

namespace {

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
    for (int x = 0; x < rgb.cols * 3; ++x) p[x] = pixel::Blend(r, q, p[x], o[x]);
  }
}

void BlendWithValue(cv::Mat& rgb, float value, double ratio) {
  const float r = static_cast<float>(ratio), q = static_cast<float>(1.0 - ratio);
  ForEachValue(rgb, [&](uint8_t v) { return pixel::Blend(r, q, v, value); });
}

void AdjustBrightness(cv::Mat& rgb, double factor) { BlendWithValue(rgb, 0.f, factor); }

float GrayMean(const cv::Mat& rgb) {
  uint64_t sum = 0;
  for (int y = 0; y < rgb.rows; ++y) {
    const uint8_t* p = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols; ++x, p += 3) sum += static_cast<uint8_t>(Luma(p));
  }
  return static_cast<float>(static_cast<double>(sum) / (static_cast<double>(rgb.rows) * rgb.cols));
}

void AdjustContrast(cv::Mat& rgb, double factor) { BlendWithValue(rgb, GrayMean(rgb), factor); }

void AdjustSaturation(cv::Mat& rgb, double factor) { BlendWithImage(rgb, GrayscaleCopy(rgb), factor); }

void AdjustHue(cv::Mat& rgb, double shift) {
  const float hf = static_cast<float>(shift);
  for (int y = 0; y < rgb.rows; ++y) {
    uint8_t* p = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols; ++x, p += 3) pixel::ShiftHue(p, hf);
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
    for (int x = 3; x < (rgb.cols - 1) * 3; ++x) d[x] = pixel::Smooth(up + x, mid + x, down + x);
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
    for (int y = 0; y < rgb.rows; ++y) {
      uint8_t* p = rgb.ptr<uint8_t>(y) + c;
      for (int x = 0; x < rgb.cols; ++x, p += 3) *p = pixel::Stretch(*p, lo, hi);
    }
  }
}

void Equalize(cv::Mat& rgb) {
  for (int c = 0; c < 3; ++c) {
    uint32_t hist[256] = {};
    for (int y = 0; y < rgb.rows; ++y) {
      const uint8_t* p = rgb.ptr<uint8_t>(y) + c;
      for (int x = 0; x < rgb.cols; ++x, p += 3) ++hist[*p];
    }
    uint8_t lut[256];
    if (!pixel::EqualizeLut(hist, lut)) continue;
    for (int y = 0; y < rgb.rows; ++y) {
      uint8_t* p = rgb.ptr<uint8_t>(y) + c;
      for (int x = 0; x < rgb.cols; ++x, p += 3) *p = lut[*p];
    }
  }
}

void GaussianBlur(cv::Mat& rgb, int kx, int ky, double sigma) {
  auto kernel = [sigma](int k) {
    cv::Mat m(k, 1, CV_32F);
    pixel::GaussianTaps(k, static_cast<float>(sigma), m.ptr<float>());
    return m;
  };
  cv::Mat f, out;
  rgb.convertTo(f, CV_32F);
  cv::sepFilter2D(f, out, CV_32F, kernel(kx), kernel(ky), cv::Point(-1, -1), 0, cv::BORDER_REFLECT_101);
  for (int y = 0; y < rgb.rows; ++y) {
    const float* s = out.ptr<float>(y);
    uint8_t* d = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols * 3; ++x) d[x] = pixel::RoundToU8(s[x]);
  }
}

void PadCrop(cv::Mat& rgb, int dx, int dy, int mode, const uint8_t fill[3]) {
  cv::Mat out(rgb.size(), CV_8UC3);
  for (int y = 0; y < rgb.rows; ++y) {
    const int sy = pixel::PadIndex(y + dy, rgb.rows, mode);
    uint8_t* dst = out.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols; ++x, dst += 3) {
      const int sx = pixel::PadIndex(x + dx, rgb.cols, mode);
      const uint8_t* s = sx >= 0 && sy >= 0 ? rgb.ptr<uint8_t>(sy) + 3 * sx : fill;
      dst[0] = s[0], dst[1] = s[1], dst[2] = s[2];
    }
  }
  out.copyTo(rgb);
}

void AffineMatrix(int w, int h, double angle, double tx, double ty, double shear_x, double shear_y,
                  const double* center, double m[6]) {
  // About the centre, in coordinates relative to the image's centre.
  const double cx = center ? center[0] - w * 0.5 : 0.0, cy = center ? center[1] - h * 0.5 : 0.0;
  const double rot = angle * M_PI / 180.0, sx = shear_x * M_PI / 180.0, sy = shear_y * M_PI / 180.0;
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  m[0] = d, m[1] = -b, m[2] = 0.0, m[3] = -c, m[4] = a, m[5] = 0.0;
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
}

void AffineNearest(cv::Mat& rgb, const double m[6], const uint8_t fill[3]) {
  const int w = rgb.cols, h = rgb.rows;
  // _gen_affine_grid and grid_sample(nearest, align_corners=False) in float32: output pixel
  // centres relative to the image's centre, mapped back, rounded half to even.
  const float mf[6] = {static_cast<float>(m[0]), static_cast<float>(m[1]), static_cast<float>(m[2]),
                       static_cast<float>(m[3]), static_cast<float>(m[4]), static_cast<float>(m[5])};
  cv::Mat out(rgb.size(), CV_8UC3);
  for (int y = 0; y < h; ++y) {
    uint8_t* dst = out.ptr<uint8_t>(y);
    for (int x = 0; x < w; ++x, dst += 3) {
      int sx, sy;
      const uint8_t* s = pixel::AffineSource(x, y, w, h, mf, &sx, &sy) ? rgb.ptr<uint8_t>(sy) + 3 * sx : fill;
      dst[0] = s[0], dst[1] = s[1], dst[2] = s[2];
    }
  }
  out.copyTo(rgb);
}

}  // namespace coloader::color
