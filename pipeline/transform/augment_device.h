// The GPU twin of augment.cc's ResizeCrop (augment.cu), declared without CUDA or OpenCV
// headers: the GPU decode stage (gpu_decode_nvjpeg.cc) and the tests call it.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace coloader {

// The GPU variant of ResizeCrop (augment.cu), over a batch. Each task resizes the exact box
// (box_x, box_y, box_width, box_height: fractional, relative to the region's top-left) of one
// decoded RGB image in device memory to out_size x out_size with the CPU's weights
// (resample_weights.h: antialiased bilinear or bicubic, or nearest), reading only the region's
// pixels (x, y, width, height in the image), flips it if asked, into uint8 NHWC at
// dst + dst_index * out_size * out_size * 3.
struct ResizeCropTask {
  const uint8_t* src = nullptr;  // device, interleaved RGB
  int32_t pitch = 0;             // bytes per row
  int32_t x = 0, y = 0, width = 0, height = 0;  // the region the taps may read
  float box_x = 0, box_y = 0, box_width = 0, box_height = 0;  // the exact box, in the region
  int32_t flip = 0, vflip = 0;
  int32_t filter = 1;  // resample_weights.h's codes: 0 nearest, 1 bilinear, 2 bicubic; 3 the fast
                       // resize (OpenCV's area/bilinear over the whole-pixel box x, y, width, height)
  uint32_t dst_index = 0;
};
// `tasks` is in device memory; `stream` is a cudaStream_t.
Status ResizeCropBatchOnDevice(const ResizeCropTask* tasks, uint32_t count, int out_size, uint8_t* dst,
                               void* stream);

}  // namespace coloader
