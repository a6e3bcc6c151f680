// RandomErasing(p, scale, ratio, value), torchvision's draw and meaning, on one normalised output
// sample (after Normalize: the last op of a recipe). The box is drawn from a stream of its own
// (DrawErase), so every path draws the same one for a sample: the host path erases it here
// (EraseSample), the device path in the device ring after normalising (erase_device.h's twin).
#pragma once

#include <cstdint>

#include "common/protocol.h"
#include "pipeline/transform/augment.h"
#include "pipeline/transform/erase_device.h"

namespace coloader {

struct EraseOptions {
  double p = 0;  // 0: no erasing
  double scale_min = 0.02, scale_max = 0.33;  // of the image's area
  double ratio_min = 0.3, ratio_max = 3.3;    // height / width, log-uniform
  bool random_value = false;  // value="random": standard normal noise per element
  float value[3] = {0, 0, 0};  // per channel, in the output's units
};

struct EraseBox {
  bool erase = false;
  int top = 0, left = 0, height = 0, width = 0;
  uint64_t noise_key = 0;  // value="random": the key of its EraseNoise
};

// torchvision's get_params on a size x size image: with probability p, up to 10 attempts at a box
// of random area and log-uniform aspect (h = round(sqrt(area * r)), w = round(sqrt(area / r)),
// both smaller than the image), then its top-left uniform; no box when none fits.
EraseBox SampleErase(int size, const EraseOptions& o, SampleRng& rng);

// The box of sample (seed, epoch, index) on a size x size image: SampleErase on the sample's own
// erasing stream.
EraseBox DrawErase(int size, const EraseOptions& o, uint64_t seed, uint64_t epoch, uint64_t index);

// Writes the box into one sample of size x size x 3 at `dst` (float32: the value or EraseNoise;
// uint8: the value, rounded and clamped).
void EraseSample(void* dst, int size, DType type, TensorLayout layout, const EraseOptions& o, const EraseBox& box);
// The fill and task of the GPU twin.
EraseFill FillOf(const EraseOptions& o);
EraseTask TaskOf(const EraseBox& box, uint32_t index);

}  // namespace coloader
