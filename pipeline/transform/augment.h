// Augmentation on uint8 HWC RGB images, with torchvision's parameter meanings:
// RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip for training,
// Resize(size * resize_ratio) + CenterCrop(size) for evaluation.
//
// The geometry (which box, flipped or not) is separate from the pixel work so that the
// decoder can pick a DCT scale from the box before decoding, and so that a GPU variant can
// reproduce the same boxes from the same seed.
#pragma once

#include <cstdint>
#include <string>

#include <opencv2/core.hpp>

#include "pipeline/random.h"
#include "common/status.h"

namespace coloader {

enum class AugmentMode { kTrain, kEval, kNone };

// How the box is resized to the output. Bilinear shrinks of 2x or more average areas
// (antialiased, as PIL and torchvision's antialias=True); bicubic does the same down to twice
// the output, then bicubic; nearest samples as torchvision's nearest-exact.
enum class Interpolation { kNearest, kBilinear, kBicubic };
Result<Interpolation> ParseInterpolation(const std::string& s);  // torchvision's names, any case
const char* InterpolationName(Interpolation i);

Result<AugmentMode> ParseAugmentMode(const std::string& s);  // "train" | "eval" | "none"
const char* AugmentModeName(AugmentMode mode);

struct AugmentOptions {
  AugmentMode mode = AugmentMode::kTrain;
  int size = 224;             // output is size x size
  double scale_min = 0.08;    // RandomResizedCrop scale: fraction of the image area
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;  // RandomResizedCrop ratio: width / height
  double ratio_max = 4.0 / 3.0;
  double flip_probability = 0.5;   // RandomHorizontalFlip(p)
  double vflip_probability = 0.0;  // RandomVerticalFlip(p)
  Interpolation interpolation = Interpolation::kBilinear;
  double eval_resize_ratio = 256.0 / 224.0;  // eval: shorter side -> size * this, then center crop
};

// A deterministic per-sample random stream (splitmix64-seeded xoshiro256**). Seeded from
// (seed, epoch, dataset index), so a sample's augmentation does not depend on which worker
// thread handles it, nor on the batch size, nor on sharding.
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t index);
  uint64_t NextU64();
  double Uniform(double lo, double hi);       // [lo, hi)
  int64_t UniformInt(int64_t lo, int64_t hi);  // [lo, hi], inclusive as torch.randint(lo, hi + 1)

 private:
  static Xoshiro256StarStar Seeded(uint64_t seed, uint64_t epoch, uint64_t index);
  Xoshiro256StarStar gen_;
};

// A crop box in source-image pixel coordinates plus the flip decision.
struct CropBox {
  int x = 0, y = 0, width = 0, height = 0;
  bool flip = false;
  bool vflip = false;
  bool operator==(const CropBox& o) const {
    return x == o.x && y == o.y && width == o.width && height == o.height && flip == o.flip && vflip == o.vflip;
  }
};

// torchvision.transforms.RandomResizedCrop.get_params on an image of width x height:
// 10 attempts at a box of random area fraction and log-uniform aspect ratio, then the
// fallback centre crop with the ratio clamped. Then the flip draw.
CropBox SampleTrainCrop(int width, int height, const AugmentOptions& opts, SampleRng& rng);
// Resize(round(size * eval_resize_ratio)) on the shorter side + CenterCrop(size), expressed
// as the box of the source that ends up in the output.
CropBox EvalCrop(int width, int height, const AugmentOptions& opts);
// The box for any mode (kNone: the whole image), then the flips the options ask for.
CropBox SampleCrop(int width, int height, const AugmentOptions& opts, SampleRng& rng);

// Crops `box` (in the coordinates of an image of full_width x full_height) out of `src`,
// which may be that image downscaled (DCT scaling), resizes it to out_size x out_size and
// flips it if asked. Downscaling uses area interpolation (antialiased, as PIL), upscaling
// bilinear. `dst` must be a preallocated out_size x out_size CV_8UC3 (it may wrap slot memory).
void ResizeCrop(const cv::Mat& src, int full_width, int full_height, const CropBox& box,
                cv::Mat& dst, Interpolation interpolation = Interpolation::kBilinear);
// Its two halves: where the box falls in an image decoded at src_cols x src_rows (full size
// or DCT-scaled), and the resize (and flip) of those pixels into dst. A decoder that decodes
// only that rectangle (Decoder::DecodeJpegRegion) hands its pixels to the second.
cv::Rect ScaledCropRect(int src_cols, int src_rows, int full_width, int full_height, const CropBox& box);
void ResizeCropPixels(const cv::Mat& roi, const CropBox& box, cv::Mat& dst,
                      Interpolation interpolation = Interpolation::kBilinear);

}  // namespace coloader
