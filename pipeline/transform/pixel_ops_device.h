// The GPU twin of the recipe's pixel ops (pixel_ops.cu): runs each sample's PixelProgram, as the
// CPU twin (RunPixelProgram) does, on a batch of uint8 RGB images in device memory. Declared
// without CUDA headers: the device ring calls it, and tests/gpu/pixel_ops_test.cu checks it
// against the CPU twin step by step.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "pipeline/transform/pixel_program.h"

namespace coloader {

// One sample's statistics for the step that needs them: the grayscale sum (adjust_contrast's
// mean), each channel's extremes (autocontrast) and histogram (equalize).
struct PixelStats {
  unsigned long long luma_sum;
  uint32_t low_inverted[3];  // 255 - the lowest value, so that zeroed memory starts every maximum
  uint32_t high[3];
  uint32_t hist[3][256];
};

// Whether any of `count` programs blurs: PixelOpsBatchOnDevice then needs a float scratch batch.
bool PixelProgramsBlur(const PixelProgram* programs, uint32_t count);

// Runs `count` programs (`programs` in device memory, `host_programs` the same on the host, for
// the step counts) on a batch of size x size x 3 uint8 images at `src`, on `stream` (a
// cudaStream_t). Step k of every sample runs in one kernel (and one statistics pass first where
// a sample's step needs it), reading the previous step's images and writing the other of `a`
// and `b` (each one batch; `src` may be either). GaussianBlur runs as two passes, the rows into
// `blur_rows` (count x size x size x 3 floats; needed only where PixelProgramsBlur). Returns the
// buffer holding the result: `src` when no sample has a step. `stats` holds `count` PixelStats.
// Defined only in CUDA builds.
Result<const uint8_t*> PixelOpsBatchOnDevice(const PixelProgram* programs, const PixelProgram* host_programs,
                                             uint32_t count, int size, const uint8_t* src, uint8_t* a, uint8_t* b,
                                             PixelStats* stats, float* blur_rows, void* stream);

}  // namespace coloader
