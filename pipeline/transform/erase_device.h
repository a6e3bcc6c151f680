// RandomErasing's GPU twin (erase.cu), declared without CUDA headers, and what both twins share:
// the noise of value="random", a pure function of the sample's key and the element, so the CPU
// (erase.cc) and the GPU write the same numbers.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/protocol.h"
#include "common/status.h"

#if defined(__CUDACC__)
#define COLOADER_ERASE_HD __host__ __device__
#else
#define COLOADER_ERASE_HD
#endif

namespace coloader {

// One sample's box, as the device ring's kernel takes it.
struct EraseTask {
  int32_t top = 0, left = 0, height = 0, width = 0;  // height 0: nothing to erase
  uint64_t noise_key = 0;  // value="random": the sample's key for EraseNoise
  uint32_t index = 0;      // the sample's position in the batch
};

// The value erasing writes, per channel in the output's units, or standard normal noise.
struct EraseFill {
  int32_t random = 0;
  float value[3] = {0, 0, 0};
};

// A standard normal draw for element `element` of the erased block (c * height * width +
// y * width + x, from its top-left): splitmix64 of (key, element) into two uniforms, Box-Muller.
COLOADER_ERASE_HD inline float EraseNoise(uint64_t key, uint32_t element) {
  uint64_t z = key + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(element) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u1 = (static_cast<float>(z >> 40) + 1.f) * (1.f / 16777216.f);  // (0, 1]
  const float u2 = static_cast<float>((z >> 16) & 0xFFFFFF) * (1.f / 16777216.f);
  return sqrtf(-2.f * logf(u1)) * cosf(6.283185307179586f * u2);
}

// Erases `count` samples' boxes (`tasks` in device memory) in a batch of size x size x 3 in
// `dtype` and `layout` at `dst`, on `stream` (a cudaStream_t). Defined only in CUDA builds.
Status EraseBatchOnDevice(const EraseTask* tasks, uint32_t count, int size, DType dtype, TensorLayout layout,
                          EraseFill fill, void* dst, void* stream);

}  // namespace coloader
