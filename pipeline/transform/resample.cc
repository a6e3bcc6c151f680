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

// The two passes' inner loops, built for AVX2 and FMA where the processor has them (chosen at
// load time: one binary for every x86-64) and for the baseline otherwise. Not under the
// sanitizers: their runtimes are not up yet when the loader runs the clones' ifunc resolvers
// (a TSan build's tests crashed at start).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define COLOADER_SIMD_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define COLOADER_SIMD_CLONES
#endif

COLOADER_SIMD_CLONES void AccumulateRow(float* acc, const uint8_t* s, float w, int n) {
  for (int i = 0; i < n; ++i) acc[i] += w * static_cast<float>(s[i]);
}

COLOADER_SIMD_CLONES void AccumulateColumn(float* acc, const float* col, float w, int n) {
  for (int i = 0; i < n; ++i) acc[i] += w * col[i];
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
  // The source columns any output column reads.
  int col_lo = src.cols, col_hi = 0;
  for (int xx = 0; xx < out_w; ++xx) {
    col_lo = std::min(col_lo, h.first[static_cast<size_t>(xx)]);
    col_hi = std::max(col_hi, h.first[static_cast<size_t>(xx)] + h.count[static_cast<size_t>(xx)]);
  }
  if (col_hi <= col_lo) return;
  const int cols = col_hi - col_lo;
  // Laid out so that both passes run over contiguous floats (they vectorise):
  // 1. vertical: each output row, the weighted sum of its source rows over the columns read;
  // 2. transposed into planes of columns (per channel, column-major: [c][x][y]);
  // 3. horizontal: each output column, the weighted sum of its source columns, over all rows;
  // then rounded once (half to even, as torch.round) into dst.
  thread_local std::vector<float> rows_buf, planes, out_planes;
  rows_buf.assign(static_cast<size_t>(out_h) * cols * 3, 0.f);
  for (int yy = 0; yy < out_h; ++yy) {
    float* acc = &rows_buf[static_cast<size_t>(yy) * cols * 3];
    const int first = v.first[static_cast<size_t>(yy)], count = v.count[static_cast<size_t>(yy)];
    const float* w = &v.weights[static_cast<size_t>(yy) * v.stride];
    for (int k = 0; k < count; ++k) {
      AccumulateRow(acc, src.ptr<uint8_t>(first + k) + 3 * col_lo, w[k], cols * 3);
    }
  }
  // Both transposes go in tiles that stay in the cache.
  constexpr int kTile = 32;
  planes.resize(static_cast<size_t>(3) * cols * out_h);
  for (int y0 = 0; y0 < out_h; y0 += kTile) {
    for (int i0 = 0; i0 < cols; i0 += kTile) {
      for (int c = 0; c < 3; ++c) {
        for (int i = i0; i < std::min(cols, i0 + kTile); ++i) {
          float* p = &planes[(static_cast<size_t>(c) * cols + i) * out_h];
          for (int yy = y0; yy < std::min(out_h, y0 + kTile); ++yy) p[yy] = rows_buf[(static_cast<size_t>(yy) * cols + i) * 3 + c];
        }
      }
    }
  }
  out_planes.assign(static_cast<size_t>(3) * out_w * out_h, 0.f);
  for (int c = 0; c < 3; ++c) {
    for (int xx = 0; xx < out_w; ++xx) {
      float* acc = &out_planes[(static_cast<size_t>(c) * out_w + xx) * out_h];
      const int first = h.first[static_cast<size_t>(xx)] - col_lo, count = h.count[static_cast<size_t>(xx)];
      const float* w = &h.weights[static_cast<size_t>(xx) * h.stride];
      for (int k = 0; k < count; ++k) {
        AccumulateColumn(acc, &planes[(static_cast<size_t>(c) * cols + first + k) * out_h], w[k], out_h);
      }
    }
  }
  // A huge source (a 32k-pixel-wide PNG) leaves no lasting scratch behind in the worker.
  constexpr size_t kKeep = size_t{16} << 20;  // floats
  if (rows_buf.capacity() > kKeep) std::vector<float>().swap(rows_buf);
  if (planes.capacity() > kKeep) std::vector<float>().swap(planes);
  for (int y0 = 0; y0 < out_h; y0 += kTile) {
    for (int x0 = 0; x0 < out_w; x0 += kTile) {
      for (int yy = y0; yy < std::min(out_h, y0 + kTile); ++yy) {
        uint8_t* d = dst.ptr<uint8_t>(yy);
        for (int xx = x0; xx < std::min(out_w, x0 + kTile); ++xx)
          for (int c = 0; c < 3; ++c) {
            const float value = out_planes[(static_cast<size_t>(c) * out_w + xx) * out_h + yy];
            d[3 * xx + c] = static_cast<uint8_t>(std::min(255.f, std::max(0.f, std::nearbyint(value))));
          }
      }
    }
  }
}

}  // namespace coloader
