// What the recipe's pixel ops (pixel_ops.h) do to one sample, once their random parameters are
// drawn: a short list of steps, each one of color.h's kernels with its arguments. The draws
// happen on the CPU, from the sample's own stream; the steps then run on the CPU
// (RunPixelProgram) or on the GPU (pixel_ops.cu): both twins execute the same program, so they
// agree by construction on what was drawn and differ at most in a kernel's rounding.
//
// Plain data, no CUDA or OpenCV headers: the device ring copies it to the GPU as it is.
#pragma once

#include <cstdint>

namespace coloader {

enum class PixelKind : int32_t {
  kBrightness,    // f[0]: factor (blend with black)
  kContrast,      // f[0]: factor (blend with the mean of the grayscale image)
  kSaturation,    // f[0]: factor (blend with the grayscale image)
  kHue,           // f[0]: shift in [-0.5, 0.5]
  kSharpness,     // f[0]: factor (blend with a 3x3 smoothing, the border kept)
  kGrayscale,
  kPosterize,     // i[0]: bits kept
  kSolarize,      // f[0]: threshold
  kAutoContrast,
  kEqualize,
  kInvert,
  kBlur,          // i[0], i[1]: kernel x, y; f[0]: sigma
  kAffine,        // f[0..5]: the inverse map (color::AffineMatrix); i[0..2]: fill, uint8
  kPadCrop,       // f[0], f[1]: the window's offset (x, y) from the image's corner; f[2]: PadMode;
                  // i[0..2]: fill, uint8
};

// RandomCrop's padding_mode.
enum class PadMode : int32_t { kConstant, kEdge, kReflect, kSymmetric };

struct PixelStep {
  PixelKind kind = PixelKind::kBrightness;
  int32_t i[3] = {0, 0, 0};
  double f[6] = {0, 0, 0, 0, 0, 0};  // as drawn: each kernel rounds them to float32 as torchvision does
};

// The most steps one sample's program holds: ColorJitter takes 4, RandAugment num_ops (at most
// 16), AutoAugment 2, the others 1. The recipe refuses pixel ops that could draw more.
constexpr int kMaxPixelSteps = 24;

struct PixelProgram {
  int32_t count = 0;
  PixelStep steps[kMaxPixelSteps];

  // Appends a step; false (and nothing appended) when the program is full.
  bool Add(const PixelStep& s) {
    if (count >= kMaxPixelSteps) return false;
    steps[count++] = s;
    return true;
  }
};

}  // namespace coloader
