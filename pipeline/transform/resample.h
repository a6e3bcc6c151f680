// Resizing as torchvision does it (PIL's resize, and torch's interpolate with antialias=True on
// tensors): a separable filter whose support widens with the shrink factor, so a shrink averages
// every source pixel it covers (antialiased) and an enlargement interpolates. The output pixel
// xx of a box [in0, in1) resized to out pixels is centred on in0 + (xx + 0.5) * (in1 - in0) / out;
// its taps are the source pixels within the filter's support of that centre, inside the source
// region given (the box itself after a crop, as RandomResizedCrop crops and then resizes; the
// whole image for Resize then CenterCrop), weighted by the filter and normalised to sum 1.
// Nearest takes the pixel under the centre (PIL's nearest).
//
// The weights are computed by the same inline functions on the CPU (resample.cc: two passes,
// float in between, rounded once) and on the GPU (augment.cu: one pass per output pixel), so
// the twins agree within a rounding.
#pragma once

#include <cmath>
#include <string>

#include <opencv2/core.hpp>

#include "common/status.h"
#include "pipeline/transform/resample_weights.h"

namespace coloader {

// How a box is resized to the output (below): antialiased bilinear or bicubic, or nearest.
enum class Interpolation { kNearest, kBilinear, kBicubic };
Result<Interpolation> ParseInterpolation(const std::string& s);  // torchvision's names, any case
const char* InterpolationName(Interpolation i);
// The filter codes of resample_weights.h: 0 nearest, 1 bilinear, 2 bicubic.
inline int FilterCode(Interpolation i) { return i == Interpolation::kNearest ? 0 : i == Interpolation::kBicubic ? 2 : 1; }

// Resizes the box (x, y, width, height; fractional, in `src`'s pixels) of `src` into `dst`
// (preallocated CV_8UC3, its size the output's), reading only `src`'s pixels. uint8 RGB in and out.
void ResampleBox(const cv::Mat& src, double x, double y, double width, double height, Interpolation interpolation,
                 cv::Mat& dst);

}  // namespace coloader
