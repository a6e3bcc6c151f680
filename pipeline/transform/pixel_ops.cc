#include "pipeline/transform/pixel_ops.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>

#include "pipeline/transform/color.h"

namespace coloader {

namespace {

class ColorJitter : public PixelOp {
 public:
  ColorJitter(JitterRange b, JitterRange c, JitterRange s, JitterRange h) : r_{b, c, s, h} {}
  void Apply(cv::Mat& rgb, SampleRng& rng) const override {
    // torchvision's get_params: a random order of the four, then each factor that is set.
    std::array<int, 4> order = {0, 1, 2, 3};
    for (int i = 3; i > 0; --i) std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng.UniformInt(0, i))]);
    double f[4];
    for (int i = 0; i < 4; ++i) f[i] = r_[i].set ? rng.Uniform(r_[i].lo, r_[i].hi) : 0;
    for (int op : order) {
      if (!r_[op].set) continue;
      if (op == 0) color::AdjustBrightness(rgb, f[0]);
      if (op == 1) color::AdjustContrast(rgb, f[1]);
      if (op == 2) color::AdjustSaturation(rgb, f[2]);
      if (op == 3) color::AdjustHue(rgb, f[3]);
    }
  }

 private:
  JitterRange r_[4];
};

class RandomGrayscale : public PixelOp {
 public:
  explicit RandomGrayscale(double p) : p_(p) {}
  void Apply(cv::Mat& rgb, SampleRng& rng) const override {
    if (rng.Uniform(0, 1) < p_) color::Grayscale(rgb);
  }

 private:
  double p_;
};

class GaussianBlurOp : public PixelOp {
 public:
  GaussianBlurOp(int kx, int ky, double lo, double hi) : kx_(kx), ky_(ky), lo_(lo), hi_(hi) {}
  void Apply(cv::Mat& rgb, SampleRng& rng) const override {
    color::GaussianBlur(rgb, kx_, ky_, lo_ == hi_ ? lo_ : rng.Uniform(lo_, hi_));
  }

 private:
  int kx_, ky_;
  double lo_, hi_;
};

// The ops of the automatic augmentations, as data: each op's magnitudes are `bins` values
// spread over [0, top] (linspace), or none; signed ones are negated half the time.
enum class AugOp { kIdentity, kShearX, kShearY, kTranslateX, kTranslateY, kRotate, kBrightness, kColor,
                   kContrast, kSharpness, kPosterize, kSolarize, kAutoContrast, kEqualize, kInvert };
constexpr const char* kAugOpNames[] = {"Identity", "ShearX", "ShearY", "TranslateX", "TranslateY",
                                       "Rotate", "Brightness", "Color", "Contrast", "Sharpness",
                                       "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert"};

struct Space {
  bool wide = false;  // TrivialAugmentWide's ranges, else RandAugment's and AutoAugment's
};

bool HasMagnitudes(AugOp op) {
  return op != AugOp::kIdentity && op != AugOp::kAutoContrast && op != AugOp::kEqualize && op != AugOp::kInvert;
}
bool Signed(AugOp op) {
  return HasMagnitudes(op) && op != AugOp::kPosterize && op != AugOp::kSolarize;
}

// torchvision's _augmentation_space(num_bins, image_size)[op][0][bin].
double Magnitude(AugOp op, int bin, int bins, int width, int height, bool wide) {
  const double t = bins > 1 ? static_cast<double>(bin) / (bins - 1) : 0.0;  // linspace's step
  auto lin = [&](double top) { return static_cast<double>(static_cast<float>(top * t)); };
  switch (op) {
    case AugOp::kShearX:
    case AugOp::kShearY: return lin(wide ? 0.99 : 0.3);
    case AugOp::kTranslateX: return lin(wide ? 32.0 : 150.0 / 331.0 * width);
    case AugOp::kTranslateY: return lin(wide ? 32.0 : 150.0 / 331.0 * height);
    case AugOp::kRotate: return lin(wide ? 135.0 : 30.0);
    case AugOp::kBrightness:
    case AugOp::kColor:
    case AugOp::kContrast:
    case AugOp::kSharpness: return lin(wide ? 0.99 : 0.9);
    case AugOp::kPosterize: {
      // 8 - round(arange(bins) / ((bins - 1) / k)), k = 6 (wide) or 4, in float32, half to even
      const float div = static_cast<float>(bins - 1) / (wide ? 6.f : 4.f);
      return 8 - std::nearbyint(static_cast<float>(bin) / div);
    }
    case AugOp::kSolarize: return static_cast<float>(255.0 - 255.0 * t);
    default: return 0;
  }
}

void ApplyOp(cv::Mat& rgb, AugOp op, double magnitude, const float fill[3]) {
  switch (op) {
    case AugOp::kIdentity: break;
    case AugOp::kShearX: {
      const double center[2] = {0, 0};
      color::AffineNearest(rgb, 0, 0, 0, std::atan(magnitude) * 180.0 / M_PI, 0, center, fill);
      break;
    }
    case AugOp::kShearY: {
      const double center[2] = {0, 0};
      color::AffineNearest(rgb, 0, 0, 0, 0, std::atan(magnitude) * 180.0 / M_PI, center, fill);
      break;
    }
    case AugOp::kTranslateX: color::AffineNearest(rgb, 0, std::trunc(magnitude), 0, 0, 0, nullptr, fill); break;
    case AugOp::kTranslateY: color::AffineNearest(rgb, 0, 0, std::trunc(magnitude), 0, 0, nullptr, fill); break;
    case AugOp::kRotate: color::AffineNearest(rgb, -magnitude, 0, 0, 0, 0, nullptr, fill); break;
    case AugOp::kBrightness: color::AdjustBrightness(rgb, 1.0 + magnitude); break;
    case AugOp::kColor: color::AdjustSaturation(rgb, 1.0 + magnitude); break;
    case AugOp::kContrast: color::AdjustContrast(rgb, 1.0 + magnitude); break;
    case AugOp::kSharpness: color::AdjustSharpness(rgb, 1.0 + magnitude); break;
    case AugOp::kPosterize: color::Posterize(rgb, static_cast<int>(magnitude)); break;
    case AugOp::kSolarize: color::Solarize(rgb, magnitude); break;
    case AugOp::kAutoContrast: color::AutoContrast(rgb); break;
    case AugOp::kEqualize: color::Equalize(rgb); break;
    case AugOp::kInvert: color::Invert(rgb); break;
  }
}

// AutoAugment's ImageNet policy: 25 pairs of (op, probability, magnitude bin or -1), from the
// AutoAugment paper as torchvision states it.
struct PolicyStep {
  AugOp op;
  double p;
  int bin;
};
constexpr PolicyStep kImageNetPolicy[25][2] = {
    {{AugOp::kPosterize, 0.4, 8}, {AugOp::kRotate, 0.6, 9}},
    {{AugOp::kSolarize, 0.6, 5}, {AugOp::kAutoContrast, 0.6, -1}},
    {{AugOp::kEqualize, 0.8, -1}, {AugOp::kEqualize, 0.6, -1}},
    {{AugOp::kPosterize, 0.6, 7}, {AugOp::kPosterize, 0.6, 6}},
    {{AugOp::kEqualize, 0.4, -1}, {AugOp::kSolarize, 0.2, 4}},
    {{AugOp::kEqualize, 0.4, -1}, {AugOp::kRotate, 0.8, 8}},
    {{AugOp::kSolarize, 0.6, 3}, {AugOp::kEqualize, 0.6, -1}},
    {{AugOp::kPosterize, 0.8, 5}, {AugOp::kEqualize, 1.0, -1}},
    {{AugOp::kRotate, 0.2, 3}, {AugOp::kSolarize, 0.6, 8}},
    {{AugOp::kEqualize, 0.6, -1}, {AugOp::kPosterize, 0.4, 6}},
    {{AugOp::kRotate, 0.8, 8}, {AugOp::kColor, 0.4, 0}},
    {{AugOp::kRotate, 0.4, 9}, {AugOp::kEqualize, 0.6, -1}},
    {{AugOp::kEqualize, 0.0, -1}, {AugOp::kEqualize, 0.8, -1}},
    {{AugOp::kInvert, 0.6, -1}, {AugOp::kEqualize, 1.0, -1}},
    {{AugOp::kColor, 0.6, 4}, {AugOp::kContrast, 1.0, 8}},
    {{AugOp::kRotate, 0.8, 8}, {AugOp::kColor, 1.0, 2}},
    {{AugOp::kColor, 0.8, 8}, {AugOp::kSolarize, 0.8, 7}},
    {{AugOp::kSharpness, 0.4, 7}, {AugOp::kInvert, 0.6, -1}},
    {{AugOp::kShearX, 0.6, 5}, {AugOp::kEqualize, 1.0, -1}},
    {{AugOp::kColor, 0.4, 0}, {AugOp::kEqualize, 0.6, -1}},
    {{AugOp::kEqualize, 0.4, -1}, {AugOp::kSolarize, 0.2, 4}},
    {{AugOp::kSolarize, 0.6, 5}, {AugOp::kAutoContrast, 0.6, -1}},
    {{AugOp::kInvert, 0.6, -1}, {AugOp::kEqualize, 1.0, -1}},
    {{AugOp::kColor, 0.6, 4}, {AugOp::kContrast, 1.0, 8}},
    {{AugOp::kEqualize, 0.8, -1}, {AugOp::kEqualize, 0.6, -1}},
};

class AutoAugmentOp : public PixelOp {
 public:
  explicit AutoAugmentOp(const AutoAugmentOptions& o) : o_(o) {}
  void Apply(cv::Mat& rgb, SampleRng& rng) const override {
    switch (o_.kind) {
      case AutoAugmentKind::kTrivialAugmentWide: {
        // One of the 14 ops (no Invert), a magnitude bin uniform over all bins, a sign.
        const auto op = static_cast<AugOp>(rng.UniformInt(0, 13));
        double m = 0;
        if (HasMagnitudes(op))
          m = Magnitude(op, static_cast<int>(rng.UniformInt(0, o_.num_magnitude_bins - 1)), o_.num_magnitude_bins,
                        rgb.cols, rgb.rows, true);
        if (Signed(op) && rng.UniformInt(0, 1) == 1) m = -m;
        ApplyOp(rgb, op, m, o_.fill);
        break;
      }
      case AutoAugmentKind::kRandAugment:
        for (int i = 0; i < o_.num_ops; ++i) {
          const auto op = static_cast<AugOp>(rng.UniformInt(0, 13));
          double m = HasMagnitudes(op)
                         ? Magnitude(op, o_.magnitude, o_.num_magnitude_bins, rgb.cols, rgb.rows, false)
                         : 0;
          if (Signed(op) && rng.UniformInt(0, 1) == 1) m = -m;
          ApplyOp(rgb, op, m, o_.fill);
        }
        break;
      case AutoAugmentKind::kAutoAugmentImageNet: {
        const auto& pair = kImageNetPolicy[rng.UniformInt(0, 24)];
        const double probs[2] = {rng.Uniform(0, 1), rng.Uniform(0, 1)};
        const bool negative[2] = {rng.UniformInt(0, 1) == 0, rng.UniformInt(0, 1) == 0};
        for (int i = 0; i < 2; ++i) {
          const PolicyStep& s = pair[i];
          if (probs[i] > s.p) continue;  // torchvision applies when probs[i] <= p
          double m = s.bin >= 0 ? Magnitude(s.op, s.bin, 10, rgb.cols, rgb.rows, false) : 0;
          if (Signed(s.op) && negative[i]) m = -m;
          ApplyOp(rgb, s.op, m, o_.fill);
        }
        break;
      }
    }
  }

 private:
  AutoAugmentOptions o_;
};

}  // namespace

std::shared_ptr<const PixelOp> MakeColorJitter(JitterRange brightness, JitterRange contrast, JitterRange saturation,
                                               JitterRange hue) {
  return std::make_shared<ColorJitter>(brightness, contrast, saturation, hue);
}
std::shared_ptr<const PixelOp> MakeRandomGrayscale(double p) { return std::make_shared<RandomGrayscale>(p); }
std::shared_ptr<const PixelOp> MakeGaussianBlur(int kernel_x, int kernel_y, double sigma_lo, double sigma_hi) {
  return std::make_shared<GaussianBlurOp>(kernel_x, kernel_y, sigma_lo, sigma_hi);
}
std::shared_ptr<const PixelOp> MakeAutoAugment(const AutoAugmentOptions& o) { return std::make_shared<AutoAugmentOp>(o); }

Status ApplyAugmentOp(cv::Mat& rgb, const std::string& name, double magnitude, Interpolation interpolation,
                      const float fill[3]) {
  if (interpolation != Interpolation::kNearest)
    return Status::Invalid("the automatic augmentations' geometric ops run with interpolation=nearest only");
  for (size_t i = 0; i < std::size(kAugOpNames); ++i) {
    if (name == kAugOpNames[i]) {
      ApplyOp(rgb, static_cast<AugOp>(i), magnitude, fill);
      return Status::OK();
    }
  }
  return Status::Invalid("no augmentation op named '" + name + "'");
}

}  // namespace coloader
