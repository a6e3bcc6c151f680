// The last step on the host path: uint8 HWC images -> the slot's output tensor.
#pragma once

#include <cstdint>
#include <string>

#include "common/protocol.h"
#include "common/status.h"

namespace coloader {

// The output vocabulary is the wire protocol's (DType, TensorLayout in common/protocol.h): the
// host path writes uint8 or float32; bfloat16 and float16 are made on the GPU only.

// ImageNet mean/std on the 0..255 scale, as torchvision's Normalize after ToTensor.
struct NormalizeParams {
  float mean[3] = {0.485f * 255.f, 0.456f * 255.f, 0.406f * 255.f};
  float std[3] = {0.229f * 255.f, 0.224f * 255.f, 0.225f * 255.f};
};

// Writes one image: `src` is height x width x 3 uint8 (RGB). `dst` points at this image's
// place in the output batch. kUInt8 copies (NHWC) or transposes (NCHW) without normalising;
// kFloat32 computes (x - mean) / std per channel.
void WriteSample(const uint8_t* src, int height, int width, DType type, TensorLayout layout,
                 const NormalizeParams& params, void* dst);

// The GPU twin of WriteSample over a whole batch (normalize.cu): uint8 NHWC in, `dtype` in
// `layout` out, (x - mean) / std rounded exactly as the host path rounds it. `stream` is a
// cudaStream_t. Declared here without CUDA headers; defined only in CUDA builds.
Status NormalizeBatchOnDevice(const uint8_t* src, uint32_t count, uint32_t height, uint32_t width, DType dtype,
                              TensorLayout layout, const NormalizeParams& params, void* dst, void* stream);

}  // namespace coloader
