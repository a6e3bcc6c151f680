// The last step on the host path: uint8 HWC images -> the slot's output tensor.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace coloader {

enum class OutputType { kUInt8, kFloat32 };
enum class Layout { kNHWC, kNCHW };

Result<OutputType> ParseOutputType(const std::string& s);  // "uint8" | "float32"
Result<Layout> ParseLayout(const std::string& s);          // "nhwc" | "nchw"
const char* OutputTypeName(OutputType t);
const char* LayoutName(Layout l);
size_t OutputElementSize(OutputType t);

// ImageNet mean/std on the 0..255 scale, as torchvision's Normalize after ToTensor.
struct NormalizeParams {
  float mean[3] = {0.485f * 255.f, 0.456f * 255.f, 0.406f * 255.f};
  float std[3] = {0.229f * 255.f, 0.224f * 255.f, 0.225f * 255.f};
};

// Writes one image: `src` is height x width x 3 uint8 (RGB). `dst` points at this image's
// place in the output batch. kUInt8 copies (NHWC) or transposes (NCHW) without normalising;
// kFloat32 computes (x - mean) / std per channel.
void WriteSample(const uint8_t* src, int height, int width, OutputType type, Layout layout,
                 const NormalizeParams& params, void* dst);

}  // namespace coloader
