#include "pipeline/transform/resample.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace coloader {

Result<Interpolation> ParseInterpolation(const std::string& s) {
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l.rfind("interpolationmode.", 0) == 0) l = l.substr(18);
  if (l == "bilinear") return Interpolation::kBilinear;
  if (l == "bicubic") return Interpolation::kBicubic;
  if (l == "nearest" || l == "nearest_exact") return Interpolation::kNearest;
  return Status::Invalid("interpolation must be bilinear, bicubic or nearest, got '" + s + "'");
}

const char* InterpolationName(Interpolation i) {
  switch (i) {
    case Interpolation::kNearest: return "nearest";
    case Interpolation::kBilinear: return "bilinear";
    case Interpolation::kBicubic: return "bicubic";
  }
  return "?";
}


namespace {

// Every output coordinate's taps along one axis: first tap, count, and `stride` normalised
// weights each.
struct AxisTaps {
  std::vector<int> first, count;
  std::vector<float> weights;
  int stride = 0;
};

AxisTaps ComputeTaps(int filter, int in_size, float in0, float len, int out) {
  AxisTaps t;
  const float scale = len / static_cast<float>(out);
  t.stride = static_cast<int>(std::ceil(resample::Support(filter) * std::max(scale, 1.f))) * 2 + 1;
  t.first.resize(static_cast<size_t>(out));
  t.count.resize(static_cast<size_t>(out));
  t.weights.assign(static_cast<size_t>(out) * t.stride, 0.f);
  for (int xx = 0; xx < out; ++xx) {
    int first, count;
    float center, ss;
    resample::Taps(filter, in_size, in0, len, out, xx, &first, &count, &center, &ss);
    count = std::min(count, t.stride);
    float* w = &t.weights[static_cast<size_t>(xx) * t.stride];
    float total = 0;
    for (int k = 0; k < count; ++k) {
      w[k] = resample::Weight(filter, (static_cast<float>(k + first) - center + 0.5f) * ss);
      total += w[k];
    }
    if (total != 0)
      for (int k = 0; k < count; ++k) w[k] /= total;
    t.first[static_cast<size_t>(xx)] = first;
    t.count[static_cast<size_t>(xx)] = count;
  }
  return t;
}

}  // namespace

void ResampleBox(const cv::Mat& src, double x, double y, double width, double height, Interpolation interpolation,
                 cv::Mat& dst) {
  const int out_w = dst.cols, out_h = dst.rows;
  if (interpolation == Interpolation::kNearest) {
    std::vector<int> cols(static_cast<size_t>(out_w));
    for (int xx = 0; xx < out_w; ++xx)
      cols[static_cast<size_t>(xx)] = resample::NearestTap(src.cols, static_cast<float>(x), static_cast<float>(width), out_w, xx);
    for (int yy = 0; yy < out_h; ++yy) {
      const uint8_t* row = src.ptr<uint8_t>(resample::NearestTap(src.rows, static_cast<float>(y), static_cast<float>(height), out_h, yy));
      uint8_t* d = dst.ptr<uint8_t>(yy);
      for (int xx = 0; xx < out_w; ++xx, d += 3) {
        const uint8_t* s = row + 3 * cols[static_cast<size_t>(xx)];
        d[0] = s[0], d[1] = s[1], d[2] = s[2];
      }
    }
    return;
  }
  const int filter = FilterCode(interpolation);
  const AxisTaps h = ComputeTaps(filter, src.cols, static_cast<float>(x), static_cast<float>(width), out_w);
  const AxisTaps v = ComputeTaps(filter, src.rows, static_cast<float>(y), static_cast<float>(height), out_h);
  // The source rows any output row reads.
  int row_lo = src.rows, row_hi = 0;
  for (int yy = 0; yy < out_h; ++yy) {
    row_lo = std::min(row_lo, v.first[static_cast<size_t>(yy)]);
    row_hi = std::max(row_hi, v.first[static_cast<size_t>(yy)] + v.count[static_cast<size_t>(yy)]);
  }
  if (row_hi <= row_lo) return;
  // Horizontal pass over those rows, into floats.
  std::vector<float> tmp(static_cast<size_t>(row_hi - row_lo) * out_w * 3);
  for (int r = row_lo; r < row_hi; ++r) {
    const uint8_t* s = src.ptr<uint8_t>(r);
    float* t = &tmp[static_cast<size_t>(r - row_lo) * out_w * 3];
    for (int xx = 0; xx < out_w; ++xx, t += 3) {
      const int first = h.first[static_cast<size_t>(xx)], count = h.count[static_cast<size_t>(xx)];
      const float* w = &h.weights[static_cast<size_t>(xx) * h.stride];
      float a0 = 0, a1 = 0, a2 = 0;
      const uint8_t* p = s + 3 * first;
      for (int k = 0; k < count; ++k, p += 3) {
        a0 += w[k] * p[0];
        a1 += w[k] * p[1];
        a2 += w[k] * p[2];
      }
      t[0] = a0, t[1] = a1, t[2] = a2;
    }
  }
  // Vertical pass, rounded once (half to even, as torch.round).
  std::vector<float> acc(static_cast<size_t>(out_w) * 3);
  for (int yy = 0; yy < out_h; ++yy) {
    std::fill(acc.begin(), acc.end(), 0.f);
    const int first = v.first[static_cast<size_t>(yy)], count = v.count[static_cast<size_t>(yy)];
    const float* w = &v.weights[static_cast<size_t>(yy) * v.stride];
    for (int k = 0; k < count; ++k) {
      const float* t = &tmp[static_cast<size_t>(first + k - row_lo) * out_w * 3];
      const float wk = w[k];
      for (int i = 0; i < out_w * 3; ++i) acc[static_cast<size_t>(i)] += wk * t[i];
    }
    uint8_t* d = dst.ptr<uint8_t>(yy);
    for (int i = 0; i < out_w * 3; ++i)
      d[i] = static_cast<uint8_t>(std::min(255.f, std::max(0.f, std::nearbyint(acc[static_cast<size_t>(i)]))));
  }
}

}  // namespace coloader
