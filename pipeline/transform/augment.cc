#include "pipeline/transform/augment.h"

#include <algorithm>
#include <cmath>

#include <opencv2/imgproc.hpp>

#include "pipeline/transform/resample.h"

namespace coloader {

Result<AugmentMode> ParseAugmentMode(const std::string& s) {
  if (s == "train") return AugmentMode::kTrain;
  if (s == "eval") return AugmentMode::kEval;
  if (s == "none") return AugmentMode::kNone;
  return Status::Invalid("--augment must be train, eval or none, got '" + s + "'");
}

const char* AugmentModeName(AugmentMode mode) {
  switch (mode) {
    case AugmentMode::kTrain: return "train";
    case AugmentMode::kEval: return "eval";
    case AugmentMode::kNone: return "none";
  }
  return "?";
}


namespace {

// Python's round() takes halves to even, as std::nearbyint does in the default rounding mode.
int RoundHalfEven(double v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace

Xoshiro256StarStar SampleRng::Seeded(uint64_t seed, uint64_t epoch, uint64_t index) {
  // Each input goes through its own splitmix round before mixing, so (seed, epoch, index)
  // triples that differ in one coordinate give unrelated streams.
  uint64_t x = seed;
  uint64_t h = SplitMix64(&x);
  x = h ^ epoch;
  h = SplitMix64(&x);
  x = h ^ index;
  const uint64_t s0 = SplitMix64(&x), s1 = SplitMix64(&x), s2 = SplitMix64(&x), s3 = SplitMix64(&x);
  return Xoshiro256StarStar(s0, s1, s2, s3);
}

SampleRng::SampleRng(uint64_t seed, uint64_t epoch, uint64_t index) : gen_(Seeded(seed, epoch, index)) {}

uint64_t SampleRng::NextU64() { return gen_.Next(); }

double SampleRng::Uniform(double lo, double hi) {
  const double unit = static_cast<double>(NextU64() >> 11) * 0x1.0p-53;  // [0, 1)
  return lo + (hi - lo) * unit;
}

int64_t SampleRng::UniformInt(int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  // Rejection keeps the draw unbiased for spans that do not divide 2^64.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t r;
  do {
    r = NextU64();
  } while (r >= limit);
  return lo + static_cast<int64_t>(r % span);
}

CropBox SampleTrainCrop(int width, int height, const AugmentOptions& o, SampleRng& rng) {
  CropBox box;
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target_area = area * rng.Uniform(o.scale_min, o.scale_max);
    const double aspect = std::exp(rng.Uniform(log_lo, log_hi));
    const int w = static_cast<int>(std::lround(std::sqrt(target_area * aspect)));
    const int h = static_cast<int>(std::lround(std::sqrt(target_area / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      box.y = static_cast<int>(rng.UniformInt(0, height - h));
      box.x = static_cast<int>(rng.UniformInt(0, width - w));
      box.width = w;
      box.height = h;
      found = true;
    }
  }
  if (!found) {
    // torchvision's fallback: the largest centred box whose ratio is clamped into range.
    const double in_ratio = static_cast<double>(width) / height;
    int w = width, h = height;
    if (in_ratio < o.ratio_min) {
      h = static_cast<int>(std::lround(w / o.ratio_min));
    } else if (in_ratio > o.ratio_max) {
      w = static_cast<int>(std::lround(h * o.ratio_max));
    }
    box.width = std::max(1, std::min(w, width));
    box.height = std::max(1, std::min(h, height));
    box.x = (width - box.width) / 2;
    box.y = (height - box.height) / 2;
  }
  box.exact_x = box.x, box.exact_y = box.y, box.exact_width = box.width, box.exact_height = box.height;
  box.flip = rng.Uniform(0.0, 1.0) < o.flip_probability;
  if (o.vflip_probability > 0) box.vflip = rng.Uniform(0.0, 1.0) < o.vflip_probability;
  return box;
}

CropBox EvalCrop(int width, int height, const AugmentOptions& o, SampleRng* rng) {
  // torchvision Resize(s) with an int s: the shorter side becomes s, the longer
  // int(s * long / short) (truncated). Users write Resize(256), an integer, so round here:
  // size * (256.0 / 224.0) need not come out exactly 256 in floating point.
  const int s = std::max(1, static_cast<int>(std::lround(o.size * o.eval_resize_ratio)));
  const bool wide = width >= height;
  const int shorter = wide ? height : width, longer = wide ? width : height;
  const int new_long = static_cast<int>(static_cast<double>(s) * longer / shorter);
  const int resized_w = wide ? new_long : s;
  const int resized_h = wide ? s : new_long;
  // CenterCrop(size): top = int(round((H' - size) / 2.0)), with Python's round (halves to
  // even: 500x375 gives left = round(58.5) = 58, not 59).
  const int crop_w = std::min(o.size, resized_w), crop_h = std::min(o.size, resized_h);
  int left = RoundHalfEven((resized_w - crop_w) / 2.0);
  int top = RoundHalfEven((resized_h - crop_h) / 2.0);
  if (o.eval_random_position && rng != nullptr) {
    top = static_cast<int>(rng->UniformInt(0, resized_h - crop_h));  // torchvision draws i, then j
    left = static_cast<int>(rng->UniformInt(0, resized_w - crop_w));
  }
  // Back to source pixels through each axis's own factor: the truncated long side makes the
  // two factors differ slightly (500 / 341 vs 375 / 256).
  const double fx = static_cast<double>(width) / resized_w;
  const double fy = static_cast<double>(height) / resized_h;
  CropBox box;
  box.x = std::clamp(static_cast<int>(std::lround(left * fx)), 0, width - 1);
  box.y = std::clamp(static_cast<int>(std::lround(top * fy)), 0, height - 1);
  box.width = std::clamp(static_cast<int>(std::lround(crop_w * fx)), 1, width - box.x);
  box.height = std::clamp(static_cast<int>(std::lround(crop_h * fy)), 1, height - box.y);
  // The resize sees the whole image: the crop's pixels are those of the resized image, whose
  // pixel centres map back between source pixels.
  box.exact_x = left * fx, box.exact_y = top * fy, box.exact_width = crop_w * fx, box.exact_height = crop_h * fy;
  box.crop_first = false;
  return box;
}

CropBox SampleCrop(int width, int height, const AugmentOptions& o, SampleRng& rng) {
  if (o.mode == AugmentMode::kTrain) return SampleTrainCrop(width, height, o, rng);
  CropBox box;
  if (o.mode == AugmentMode::kEval) {
    box = EvalCrop(width, height, o, &rng);
  } else {
    box.width = width;
    box.height = height;
    box.exact_width = width, box.exact_height = height;
  }
  // A recipe's flips after Resize + CenterCrop or a plain Resize (--augment eval and none have none).
  if (o.flip_probability > 0) box.flip = rng.Uniform(0.0, 1.0) < o.flip_probability;
  if (o.vflip_probability > 0) box.vflip = rng.Uniform(0.0, 1.0) < o.vflip_probability;
  return box;
}

namespace {

// The factors from full-resolution pixels to an image decoded at src_cols x src_rows. libjpeg's
// scaled pixel x covers full pixels [x * d, (x + 1) * d) and the scaled size is ceil(full / d),
// the last pixel standing for a partial block. So when the source has exactly that size the map
// is 1 / d; src_cols / full_width would drift by up to half a scaled pixel (4 full pixels at
// 1/8) towards the right and bottom edges. Any other size: the plain ratio.
std::pair<double, double> ScaleFactors(int src_cols, int src_rows, int full_width, int full_height) {
  for (int d : {1, 2, 4, 8}) {
    if ((full_width + d - 1) / d == src_cols && (full_height + d - 1) / d == src_rows) return {1.0 / d, 1.0 / d};
  }
  return {static_cast<double>(src_cols) / full_width, static_cast<double>(src_rows) / full_height};
}

}  // namespace

cv::Rect ScaledCropRect(int src_cols, int src_rows, int full_width, int full_height, const CropBox& box,
                        int out_size) {
  const auto [sx, sy] = ScaleFactors(src_cols, src_rows, full_width, full_height);
  int x0, y0, x1, y1;
  if (box.crop_first || out_size <= 0) {
    // Nearest whole scaled pixels: at most half a scaled pixel off on each edge, either way.
    x0 = static_cast<int>(std::lround(box.x * sx)), y0 = static_cast<int>(std::lround(box.y * sy));
    x1 = static_cast<int>(std::lround((box.x + box.width) * sx));
    y1 = static_cast<int>(std::lround((box.y + box.height) * sy));
  } else {
    // The exact box and the filter's reach around it (bicubic's support of 2 output pixels,
    // widened by the shrink), so the taps read what a resize of the whole image would.
    const cv::Rect2d e = box.Exact();
    const double reach_x = 2.0 * std::max(1.0, e.width * sx / out_size) + 1;
    const double reach_y = 2.0 * std::max(1.0, e.height * sy / out_size) + 1;
    x0 = static_cast<int>(std::floor(e.x * sx - reach_x)), y0 = static_cast<int>(std::floor(e.y * sy - reach_y));
    x1 = static_cast<int>(std::ceil((e.x + e.width) * sx + reach_x));
    y1 = static_cast<int>(std::ceil((e.y + e.height) * sy + reach_y));
  }
  x0 = std::clamp(x0, 0, src_cols - 1);
  y0 = std::clamp(y0, 0, src_rows - 1);
  x1 = std::clamp(x1, x0 + 1, src_cols);
  y1 = std::clamp(y1, y0 + 1, src_rows);
  return cv::Rect(x0, y0, x1 - x0, y1 - y0);
}

void ResizeCropPixels(const cv::Mat& pixels, const cv::Rect& where, int src_cols, int src_rows, int full_width,
                      int full_height, const CropBox& box, cv::Mat& dst, Interpolation interpolation, bool exact) {
  if (!exact && interpolation == Interpolation::kBilinear) {
    // The fast resize: the whole-pixel box's pixels (`pixels`, as ScaledCropRect without reach
    // gives them), area-averaged when shrinking by 2x or more (antialiased), else bilinear,
    // which below a 2x shrink already reads every source pixel.
    const bool shrinking = pixels.cols >= 2 * dst.cols && pixels.rows >= 2 * dst.rows;
    cv::Mat out = dst;  // shares dst's memory: cv::resize writes in place when size and type match
    cv::resize(pixels, out, dst.size(), 0, 0, shrinking ? cv::INTER_AREA : cv::INTER_LINEAR);
    if (box.flip || box.vflip) cv::flip(out, out, box.flip && box.vflip ? -1 : box.flip ? 1 : 0);
    if (out.data != dst.data) out.copyTo(dst);
    return;
  }
  const auto [sx, sy] = ScaleFactors(src_cols, src_rows, full_width, full_height);
  // The exact box in `pixels`' coordinates (after a crop at full size: all of them).
  const cv::Rect2d b = box.Exact();
  const cv::Rect2d e(b.x * sx - where.x, b.y * sy - where.y, b.width * sx, b.height * sy);
  cv::Mat out = dst;  // shares dst's memory
  ResampleBox(pixels, e.x, e.y, e.width, e.height, interpolation, out);
  if (box.flip && box.vflip) {
    cv::flip(out, out, -1);
  } else if (box.flip || box.vflip) {
    cv::flip(out, out, box.flip ? 1 : 0);
  }
  if (out.data != dst.data) out.copyTo(dst);
}

void ResizeCrop(const cv::Mat& src, int full_width, int full_height, const CropBox& box, cv::Mat& dst,
                Interpolation interpolation, bool exact) {
  const bool fast = !exact && interpolation == Interpolation::kBilinear;
  const cv::Rect where = ScaledCropRect(src.cols, src.rows, full_width, full_height, box, fast ? 0 : dst.cols);
  ResizeCropPixels(src(where), where, src.cols, src.rows, full_width, full_height, box, dst, interpolation, exact);
}

ResizeCropTask TaskFor(const CropBox& box, int full_width, int full_height, int out_size, Interpolation interpolation,
                       bool exact) {
  const bool fast = !exact && interpolation == Interpolation::kBilinear;
  const cv::Rect region = ScaledCropRect(full_width, full_height, full_width, full_height, box, fast ? 0 : out_size);
  const cv::Rect2d e = box.Exact();
  ResizeCropTask t;
  t.x = region.x;
  t.y = region.y;
  t.width = region.width;
  t.height = region.height;
  t.box_x = static_cast<float>(e.x - region.x);
  t.box_y = static_cast<float>(e.y - region.y);
  t.box_width = static_cast<float>(e.width);
  t.box_height = static_cast<float>(e.height);
  t.flip = box.flip ? 1 : 0;
  t.vflip = box.vflip ? 1 : 0;
  t.filter = fast ? 3 : FilterCode(interpolation);
  return t;
}

}  // namespace coloader
