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
#include "pipeline/transform/augment_device.h"
#include "pipeline/transform/resample.h"

namespace coloader {

enum class AugmentMode { kTrain, kEval, kNone };


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
  // torchvision's resize, exactly (resample.h), or the fast one: OpenCV's area average when
  // shrinking by 2x or more, its bilinear otherwise, over the whole-pixel box (within ~2 levels
  // of torchvision's bilinear, ~10x less CPU). The named recipes (--augment) take the fast one.
  bool exact_resize = true;
  double eval_resize_ratio = 256.0 / 224.0;  // eval: shorter side -> size * this, then center crop
  // eval: RandomCrop(size) instead of CenterCrop(size): the window's top and left drawn
  // uniformly over the resized image, as torchvision's RandomCrop.get_params.
  bool eval_random_position = false;
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

// A crop box in source-image pixel coordinates plus the flip decisions. (x, y, width, height)
// is the box in whole pixels (what a region decode and the DCT scale are chosen by); the exact
// box, fractional, is what the resize maps onto the output (Resize then CenterCrop lands
// between pixels); `crop_first` says whether the resize reads only the box's pixels
// (RandomResizedCrop: torchvision crops, then resizes) or the image around it too (Resize then
// CenterCrop: the resize sees the whole image).
struct CropBox {
  int x = 0, y = 0, width = 0, height = 0;
  bool flip = false;
  bool vflip = false;
  double exact_x = 0, exact_y = 0, exact_width = 0, exact_height = 0;  // 0 width: the whole-pixel box
  bool crop_first = true;
  // The same whole-pixel box and flips (the exact box follows from the draw that made them).
  bool operator==(const CropBox& o) const {
    return x == o.x && y == o.y && width == o.width && height == o.height && flip == o.flip && vflip == o.vflip;
  }
  // The exact box (the whole-pixel one where none is set).
  cv::Rect2d Exact() const {
    return exact_width > 0 ? cv::Rect2d(exact_x, exact_y, exact_width, exact_height) : cv::Rect2d(x, y, width, height);
  }
};

// torchvision.transforms.RandomResizedCrop.get_params on an image of width x height:
// 10 attempts at a box of random area fraction and log-uniform aspect ratio, then the
// fallback centre crop with the ratio clamped. Then the flip draw.
CropBox SampleTrainCrop(int width, int height, const AugmentOptions& opts, SampleRng& rng);
// Resize(round(size * eval_resize_ratio)) on the shorter side + CenterCrop(size) (or, with
// eval_random_position, RandomCrop(size) drawing from `rng`), expressed as the box of the source
// that ends up in the output.
CropBox EvalCrop(int width, int height, const AugmentOptions& opts, SampleRng* rng = nullptr);
// The box for any mode (kNone: the whole image), then the flips the options ask for.
CropBox SampleCrop(int width, int height, const AugmentOptions& opts, SampleRng& rng);

// Crops `box` (in the coordinates of an image of full_width x full_height) out of `src`,
// which may be that image downscaled (DCT scaling), resizes it to dst's size as torchvision
// does (resample.h: antialiased bilinear or bicubic, or nearest) and flips it if asked. `dst`
// must be a preallocated CV_8UC3 of the output's size (it may wrap slot memory).
void ResizeCrop(const cv::Mat& src, int full_width, int full_height, const CropBox& box,
                cv::Mat& dst, Interpolation interpolation = Interpolation::kBilinear, bool exact = true);
// Its two halves: the pixels of an image decoded at src_cols x src_rows (full size or
// DCT-scaled) that the resize of the box to out_size reads (the box's, or with the filter's
// reach around it when !crop_first), and the resize (and flips) of those pixels into dst. A
// decoder that decodes only that rectangle (Decoder::DecodeJpegRegion) hands its pixels to the
// second, with the rectangle, so it can place the exact box in them.
cv::Rect ScaledCropRect(int src_cols, int src_rows, int full_width, int full_height, const CropBox& box,
                        int out_size = 0);
void ResizeCropPixels(const cv::Mat& pixels, const cv::Rect& where, int src_cols, int src_rows, int full_width,
                      int full_height, const CropBox& box, cv::Mat& dst,
                      Interpolation interpolation = Interpolation::kBilinear, bool exact = true);
// The pixels the resize reads for `o`'s resize: ScaledCropRect with the filter's reach for the
// exact resize, the whole-pixel box for the fast one.
inline cv::Rect RegionFor(int src_cols, int src_rows, int full_width, int full_height, const CropBox& box,
                          const AugmentOptions& o) {
  return ScaledCropRect(src_cols, src_rows, full_width, full_height, box, o.exact_resize ? o.size : 0);
}

// The GPU twin's task for `box` of a decoded full_width x full_height image (augment_device.h):
// the region ResizeCrop reads and the exact box in it, the flips, the filter. The caller sets
// src, pitch and dst_index.
ResizeCropTask TaskFor(const CropBox& box, int full_width, int full_height, int out_size, Interpolation interpolation,
                       bool exact = true);

}  // namespace coloader
