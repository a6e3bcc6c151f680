#include "pipeline/transform/pixel_ops.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "pipeline/transform/color.h"
#include "pipeline/transform/pixel_math.h"

namespace coloader {

namespace {

PixelStep Step(PixelKind kind, double f0 = 0) {
  PixelStep s;
  s.kind = kind;
  s.f[0] = f0;
  return s;
}

void Append(PixelProgram* program, const PixelStep& s) {
  // The recipe bounds the steps of its ops (Recipe's kMaxPixelSteps check): a full program here
  // is a bug, not an input.
  if (!program->Add(s)) std::abort();
}

class ColorJitter : public PixelOp {
 public:
  ColorJitter(JitterRange b, JitterRange c, JitterRange s, JitterRange h) : r_{b, c, s, h} {}
  void Draw(SampleRng& rng, int, int, PixelProgram* program) const override {
    // torchvision's get_params: a random order of the four, then each factor that is set.
    std::array<int, 4> order = {0, 1, 2, 3};
    for (int i = 3; i > 0; --i) std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng.UniformInt(0, i))]);
    double f[4];
    for (int i = 0; i < 4; ++i) f[i] = r_[i].set ? rng.Uniform(r_[i].lo, r_[i].hi) : 0;
    constexpr PixelKind kinds[4] = {PixelKind::kBrightness, PixelKind::kContrast, PixelKind::kSaturation,
                                    PixelKind::kHue};
    for (int op : order)
      if (r_[op].set) Append(program, Step(kinds[op], f[op]));
  }
  int max_steps() const override { return 4; }

 private:
  JitterRange r_[4];
};

class RandomGrayscale : public PixelOp {
 public:
  explicit RandomGrayscale(double p) : p_(p) {}
  void Draw(SampleRng& rng, int, int, PixelProgram* program) const override {
    if (rng.Uniform(0, 1) < p_) Append(program, Step(PixelKind::kGrayscale));
  }
  int max_steps() const override { return 1; }

 private:
  double p_;
};

class GaussianBlurOp : public PixelOp {
 public:
  GaussianBlurOp(int kx, int ky, double lo, double hi) : kx_(kx), ky_(ky), lo_(lo), hi_(hi) {}
  void Draw(SampleRng& rng, int, int, PixelProgram* program) const override {
    PixelStep s = Step(PixelKind::kBlur, lo_ == hi_ ? lo_ : rng.Uniform(lo_, hi_));
    s.i[0] = kx_, s.i[1] = ky_;
    Append(program, s);
  }
  int max_steps() const override { return 1; }

 private:
  int kx_, ky_;
  double lo_, hi_;
};

class RandomCropOp : public PixelOp {
 public:
  RandomCropOp(PadSides p, PadMode mode, const float fill[3]) : p_(p), mode_(mode) {
    for (int c = 0; c < 3; ++c) fill_[c] = pixel::Truncate(fill[c]);
  }
  void Draw(SampleRng& rng, int, int, PixelProgram* program) const override {
    // The padded image is (w + left + right) x (h + top + bottom); the window of w x h starts at
    // i = randint(0, top + bottom), j = randint(0, left + right), i first.
    const auto i = rng.UniformInt(0, p_.top + p_.bottom);
    const auto j = rng.UniformInt(0, p_.left + p_.right);
    PixelStep s = Step(PixelKind::kPadCrop, static_cast<double>(j - p_.left));
    s.f[1] = static_cast<double>(i - p_.top);
    s.f[2] = static_cast<double>(mode_);
    for (int c = 0; c < 3; ++c) s.i[c] = fill_[c];
    if (s.f[0] != 0 || s.f[1] != 0) Append(program, s);  // the window on the image itself: a copy
  }
  int max_steps() const override { return 1; }

 private:
  PadSides p_;
  PadMode mode_;
  uint8_t fill_[3];
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

PixelStep AffineStep(int w, int h, double angle, double tx, double ty, double shear_x, double shear_y,
                     const double* center, const float fill[3]) {
  PixelStep s = Step(PixelKind::kAffine);
  color::AffineMatrix(w, h, angle, tx, ty, shear_x, shear_y, center, s.f);
  for (int c = 0; c < 3; ++c) s.i[c] = pixel::Truncate(fill[c]);
  return s;
}

// The step of one op at `magnitude` on a w x h image, as torchvision's _apply_op calls its
// kernels; Identity: none.
std::optional<PixelStep> StepFor(AugOp op, double magnitude, const float fill[3], int w, int h) {
  const double origin[2] = {0, 0};
  switch (op) {
    case AugOp::kIdentity: return std::nullopt;
    case AugOp::kShearX: return AffineStep(w, h, 0, 0, 0, std::atan(magnitude) * 180.0 / M_PI, 0, origin, fill);
    case AugOp::kShearY: return AffineStep(w, h, 0, 0, 0, 0, std::atan(magnitude) * 180.0 / M_PI, origin, fill);
    case AugOp::kTranslateX: return AffineStep(w, h, 0, std::trunc(magnitude), 0, 0, 0, nullptr, fill);
    case AugOp::kTranslateY: return AffineStep(w, h, 0, 0, std::trunc(magnitude), 0, 0, nullptr, fill);
    case AugOp::kRotate: return AffineStep(w, h, -magnitude, 0, 0, 0, 0, nullptr, fill);
    case AugOp::kBrightness: return Step(PixelKind::kBrightness, 1.0 + magnitude);
    case AugOp::kColor: return Step(PixelKind::kSaturation, 1.0 + magnitude);
    case AugOp::kContrast: return Step(PixelKind::kContrast, 1.0 + magnitude);
    case AugOp::kSharpness: return Step(PixelKind::kSharpness, 1.0 + magnitude);
    case AugOp::kPosterize: {
      PixelStep s = Step(PixelKind::kPosterize);
      s.i[0] = static_cast<int32_t>(magnitude);
      return s;
    }
    case AugOp::kSolarize: return Step(PixelKind::kSolarize, magnitude);
    case AugOp::kAutoContrast: return Step(PixelKind::kAutoContrast);
    case AugOp::kEqualize: return Step(PixelKind::kEqualize);
    case AugOp::kInvert: return Step(PixelKind::kInvert);
  }
  return std::nullopt;
}

void AppendOp(PixelProgram* program, AugOp op, double magnitude, const float fill[3], int w, int h) {
  if (const std::optional<PixelStep> s = StepFor(op, magnitude, fill, w, h)) Append(program, *s);
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
  void Draw(SampleRng& rng, int w, int h, PixelProgram* program) const override {
    switch (o_.kind) {
      case AutoAugmentKind::kTrivialAugmentWide: {
        // One of the 14 ops (no Invert), a magnitude bin uniform over all bins, a sign.
        const auto op = static_cast<AugOp>(rng.UniformInt(0, 13));
        double m = 0;
        if (HasMagnitudes(op))
          m = Magnitude(op, static_cast<int>(rng.UniformInt(0, o_.num_magnitude_bins - 1)), o_.num_magnitude_bins,
                        w, h, true);
        if (Signed(op) && rng.UniformInt(0, 1) == 1) m = -m;
        AppendOp(program, op, m, o_.fill, w, h);
        break;
      }
      case AutoAugmentKind::kRandAugment:
        for (int i = 0; i < o_.num_ops; ++i) {
          const auto op = static_cast<AugOp>(rng.UniformInt(0, 13));
          double m = HasMagnitudes(op)
                         ? Magnitude(op, o_.magnitude, o_.num_magnitude_bins, w, h, false)
                         : 0;
          if (Signed(op) && rng.UniformInt(0, 1) == 1) m = -m;
          AppendOp(program, op, m, o_.fill, w, h);
        }
        break;
      case AutoAugmentKind::kAutoAugmentImageNet: {
        const auto& pair = kImageNetPolicy[rng.UniformInt(0, 24)];
        const double probs[2] = {rng.Uniform(0, 1), rng.Uniform(0, 1)};
        const bool negative[2] = {rng.UniformInt(0, 1) == 0, rng.UniformInt(0, 1) == 0};
        for (int i = 0; i < 2; ++i) {
          const PolicyStep& s = pair[i];
          if (probs[i] > s.p) continue;  // torchvision applies when probs[i] <= p
          double m = s.bin >= 0 ? Magnitude(s.op, s.bin, 10, w, h, false) : 0;
          if (Signed(s.op) && negative[i]) m = -m;
          AppendOp(program, s.op, m, o_.fill, w, h);
        }
        break;
      }
    }
  }

  int max_steps() const override {
    return o_.kind == AutoAugmentKind::kRandAugment ? o_.num_ops : o_.kind == AutoAugmentKind::kAutoAugmentImageNet ? 2 : 1;
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
std::shared_ptr<const PixelOp> MakeRandomCrop(PadSides padding, PadMode mode, const float fill[3]) {
  return std::make_shared<RandomCropOp>(padding, mode, fill);
}

PixelProgram DrawPixelProgram(const PixelOps& ops, int size, uint64_t seed, uint64_t epoch, uint64_t index) {
  PixelProgram program;
  if (ops.empty()) return program;
  SampleRng rng(seed ^ 0x91C5E1A9D0E5A17Bull, epoch, index);
  for (const auto& op : ops) op->Draw(rng, size, size, &program);
  return program;
}

void RunPixelProgram(cv::Mat& rgb, const PixelProgram& program) {
  for (int k = 0; k < program.count; ++k) {
    const PixelStep& s = program.steps[k];
    switch (s.kind) {
      case PixelKind::kBrightness: color::AdjustBrightness(rgb, s.f[0]); break;
      case PixelKind::kContrast: color::AdjustContrast(rgb, s.f[0]); break;
      case PixelKind::kSaturation: color::AdjustSaturation(rgb, s.f[0]); break;
      case PixelKind::kHue: color::AdjustHue(rgb, s.f[0]); break;
      case PixelKind::kSharpness: color::AdjustSharpness(rgb, s.f[0]); break;
      case PixelKind::kGrayscale: color::Grayscale(rgb); break;
      case PixelKind::kPosterize: color::Posterize(rgb, s.i[0]); break;
      case PixelKind::kSolarize: color::Solarize(rgb, s.f[0]); break;
      case PixelKind::kAutoContrast: color::AutoContrast(rgb); break;
      case PixelKind::kEqualize: color::Equalize(rgb); break;
      case PixelKind::kInvert: color::Invert(rgb); break;
      case PixelKind::kBlur: color::GaussianBlur(rgb, s.i[0], s.i[1], s.f[0]); break;
      case PixelKind::kAffine:
      case PixelKind::kPadCrop: {
        const uint8_t fill[3] = {static_cast<uint8_t>(s.i[0]), static_cast<uint8_t>(s.i[1]), static_cast<uint8_t>(s.i[2])};
        if (s.kind == PixelKind::kAffine) {
          color::AffineNearest(rgb, s.f, fill);
        } else {
          color::PadCrop(rgb, static_cast<int>(s.f[0]), static_cast<int>(s.f[1]), static_cast<int>(s.f[2]), fill);
        }
        break;
      }
    }
  }
}

Result<PixelStep> AugmentOpStep(const std::string& name, double magnitude, Interpolation interpolation,
                                const float fill[3], int width, int height) {
  if (interpolation != Interpolation::kNearest)
    return Status::Invalid("the automatic augmentations' geometric ops run with interpolation=nearest only");
  for (size_t i = 0; i < std::size(kAugOpNames); ++i) {
    if (name != kAugOpNames[i]) continue;
    // Identity: a program of no steps, as a brightness of factor 1 would be.
    return StepFor(static_cast<AugOp>(i), magnitude, fill, width, height).value_or(Step(PixelKind::kBrightness, 1.0));
  }
  return Status::Invalid("no augmentation op named '" + name + "'");
}

Status ApplyAugmentOp(cv::Mat& rgb, const std::string& name, double magnitude, Interpolation interpolation,
                      const float fill[3]) {
  COLOADER_ASSIGN_OR_RETURN(const PixelStep step, AugmentOpStep(name, magnitude, interpolation, fill, rgb.cols, rgb.rows));
  PixelProgram program;
  program.Add(step);
  RunPixelProgram(rgb, program);
  return Status::OK();
}

}  // namespace coloader
