// One sample, from file bytes to its place in the output batch: peek, choose the crop,
// choose the DCT scale, decode, crop+resize+flip, normalise/lay out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "common/status.h"
#include "pipeline/transform/augment.h"
#include "pipeline/source/sample.h"
#include "pipeline/decode/decode.h"
#include "pipeline/transform/normalize.h"
#include "pipeline/transform/recipe.h"

namespace coloader {

struct TransformOptions {
  AugmentOptions augment;  // the recipe's geometry (phase 1)
  PixelOps pixel_ops;      // phase 2, in order
  // The output here is the device ring's uint8 staging: the pixel ops run there, on the GPU
  // (the pool hands it each sample's PixelFor), not in this chain.
  bool pixel_ops_on_device = false;
  EraseOptions erase;      // phase 3's last op (with normalize)
  // The output here is the device ring's uint8 staging: erasing happens there after
  // normalising (the pool hands it each sample's EraseFor), not in this chain.
  bool erase_on_device = false;
  DType output = DType::kFloat32;
  TensorLayout layout = TensorLayout::kNCHW;
  NormalizeParams normalize;
  bool dct_scaling = true;
  // JPEG: decode only the rows and columns the crop needs (Decoder::DecodeJpegRegion); the
  // same pixels as decoding the whole image, for less work when the crop is small.
  bool crop_decode = true;
};

// The options a recipe gives (its geometry, pixel ops, normalisation and erasing); the output
// dtype, layout and decoding choices stay the caller's.
void ApplyRecipe(const Recipe& recipe, TransformOptions* opts);

// Per worker thread: owns a Decoder and scratch buffers. Not thread-safe.
class SampleTransform {
 public:
  explicit SampleTransform(TransformOptions opts);

  // Bytes of one output sample (size * size * 3 * element size).
  size_t sample_bytes() const;

  // The box of a width x height image that the sample (seed, epoch, index) crops: what
  // RunBytes crops, for a decoder that crops elsewhere (the GPU stage).
  CropBox Crop(int width, int height, uint64_t seed, uint64_t epoch, uint64_t index) const;
  // The box RandomErasing erases in the sample (seed, epoch, index) (none without erasing).
  EraseBox EraseFor(uint64_t seed, uint64_t epoch, uint64_t index) const;
  bool erases() const { return opts_.erase.p > 0; }
  // The steps of the recipe's pixel ops for the sample (seed, epoch, index) (none without them).
  PixelProgram PixelFor(uint64_t seed, uint64_t epoch, uint64_t index) const;

  // Reads `path` and writes the transformed sample to `dst` (sample_bytes() bytes).
  // The random draws come from SampleRng(seed, epoch, index). Errors name the path.
  Status Run(const std::string& path, uint64_t seed, uint64_t epoch, uint64_t index, void* dst);
  // The same, from bytes already in memory.
  Status RunBytes(const uint8_t* data, size_t size, const std::string& path, uint64_t seed,
                  uint64_t epoch, uint64_t index, void* dst);

  // The same on an image already decoded (H x W x 3 uint8 RGB): the recipe alone, for
  // inspecting it and testing it against torchvision on the same pixels.
  Status RunDecoded(const cv::Mat& rgb, uint64_t seed, uint64_t epoch, uint64_t index, void* dst);

  // How many decodes used each DCT scale denominator (index 1, 2, 4, 8), for the benchmark.
  const uint64_t* scale_histogram() const { return scale_hist_; }
  // How many JPEG decodes were of the crop's region only.
  uint64_t region_decodes() const { return region_decodes_; }

 private:
  bool direct() const { return opts_.output == DType::kUInt8 && opts_.layout == TensorLayout::kNHWC; }
  // Where the resize writes: `dst` itself (direct), else the scratch image.
  cv::Mat Staging(void* dst);
  // After the resize into `out`: the pixel ops, the tensor (normalised, laid out) and erasing.
  void Finish(cv::Mat& out, uint64_t seed, uint64_t epoch, uint64_t index, void* dst);

  TransformOptions opts_;
  Decoder decoder_;
  std::vector<uint8_t> file_buf_;
  cv::Mat hwc_;  // size x size x 3 uint8 scratch
  uint64_t scale_hist_[9] = {};
  uint64_t region_decodes_ = 0;
};

}  // namespace coloader
