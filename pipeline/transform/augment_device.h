// The GPU twin of augment.cc's ResizeCrop (augment.cu), declared without CUDA or OpenCV
// headers: the GPU decode stage (gpu_decode_nvjpeg.cc) and the tests call it.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace coloader {

// The GPU variant of ResizeCrop (augment.cu), over a batch. Each task crops a box out of one
// decoded full-size RGB image in device memory, resizes it to out_size x out_size (area
// averaging when shrinking by 2x or more in both axes, bilinear otherwise: the CPU path's
// rule and OpenCV's sampling grid) and flips it if asked, into uint8 NHWC at
// dst + dst_index * out_size * out_size * 3.
struct ResizeCropTask {
  const uint8_t* src = nullptr;  // device, interleaved RGB
  int32_t pitch = 0;             // bytes per row
  int32_t x = 0, y = 0, width = 0, height = 0;
  int32_t flip = 0;
  uint32_t dst_index = 0;
};
// `tasks` is in device memory; `stream` is a cudaStream_t.
Status ResizeCropBatchOnDevice(const ResizeCropTask* tasks, uint32_t count, int out_size, uint8_t* dst,
                               void* stream);

}  // namespace coloader
