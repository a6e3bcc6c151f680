// The recipe's pixel ops (phase 2 of recipe.h): each is a small class that draws its random
// parameters from the sample's pixel stream and states what to do as steps of a PixelProgram
// (pixel_program.h), as torchvision's transforms call their functional kernels. The program
// then runs on the CPU (RunPixelProgram, color.h's kernels, in place on the uint8 RGB image of
// the output size, after the geometry and before normalisation) or on the GPU
// (pixel_ops_device.h): one draw, two twins.
//
// The automatic augmentations express their policies as data (op, magnitude bins) over one set
// of kernels: TrivialAugmentWide, RandAugment and AutoAugment's ImageNet policy, with
// torchvision's op lists, magnitude ranges and draws.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "common/status.h"
#include "pipeline/transform/augment.h"
#include "pipeline/transform/pixel_program.h"

namespace coloader {

class PixelOp {
 public:
  virtual ~PixelOp() = default;
  // Draws this sample's parameters from `rng` for a width x height image and appends its steps
  // to `program`. Thread-safe (the op holds only its arguments).
  virtual void Draw(SampleRng& rng, int width, int height, PixelProgram* program) const = 0;
  // The most steps one Draw appends.
  virtual int max_steps() const = 0;
};

using PixelOps = std::vector<std::shared_ptr<const PixelOp>>;

// The program of sample (seed, epoch, index) at size x size: every op's draws in order, from a
// stream of its own (the seed salted, as RandomErasing's), so that every path draws the same
// steps whatever the crop drew before.
PixelProgram DrawPixelProgram(const PixelOps& ops, int size, uint64_t seed, uint64_t epoch, uint64_t index);
// Runs `program` on the CPU, in place on a uint8 RGB image.
void RunPixelProgram(cv::Mat& rgb, const PixelProgram& program);

// ColorJitter(brightness, contrast, saturation, hue): each factor that is set drawn uniformly
// from its range (torchvision's x means [max(0, 1 - x), 1 + x], hue's [-x, x]), the four
// applied in a random order.
struct JitterRange {
  double lo = 0, hi = 0;
  bool set = false;
};
std::shared_ptr<const PixelOp> MakeColorJitter(JitterRange brightness, JitterRange contrast, JitterRange saturation,
                                               JitterRange hue);
// RandomGrayscale(p): with probability p, ITU-R 601-2 luma into all three channels.
std::shared_ptr<const PixelOp> MakeRandomGrayscale(double p);
// GaussianBlur(kernel_size, sigma): sigma drawn uniformly from [lo, hi], reflect padding.
std::shared_ptr<const PixelOp> MakeGaussianBlur(int kernel_x, int kernel_y, double sigma_lo, double sigma_hi);

// RandomCrop(size, padding) on the image the geometry made, of that size: a window of the padded
// image (left, top, right, bottom pixels of padding by `mode`, `fill` for constant), its
// position drawn uniformly as torchvision's get_params draws it.
struct PadSides {
  int left = 0, top = 0, right = 0, bottom = 0;
};
std::shared_ptr<const PixelOp> MakeRandomCrop(PadSides padding, PadMode mode, const float fill[3]);

// The automatic augmentations. `fill` is the value of pixels that a geometric op uncovers.
enum class AutoAugmentKind { kTrivialAugmentWide, kRandAugment, kAutoAugmentImageNet };
struct AutoAugmentOptions {
  AutoAugmentKind kind = AutoAugmentKind::kTrivialAugmentWide;
  int num_ops = 2;              // RandAugment
  int magnitude = 9;            // RandAugment: the bin every op uses
  int num_magnitude_bins = 31;  // TrivialAugmentWide, RandAugment
  Interpolation interpolation = Interpolation::kNearest;
  float fill[3] = {0, 0, 0};
};
std::shared_ptr<const PixelOp> MakeAutoAugment(const AutoAugmentOptions& o);

// One op of the automatic augmentations at a given magnitude (signed where the op is), for the
// fidelity tests against torchvision's _apply_op: its step for a width x height image. Names as
// torchvision's ("ShearX", "Color"). Unknown names: InvalidArgument.
Result<PixelStep> AugmentOpStep(const std::string& name, double magnitude, Interpolation interpolation,
                                const float fill[3], int width, int height);
// The same, run on `rgb` in place.
Status ApplyAugmentOp(cv::Mat& rgb, const std::string& name, double magnitude, Interpolation interpolation,
                      const float fill[3]);

}  // namespace coloader
