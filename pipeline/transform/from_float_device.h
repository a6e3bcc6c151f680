// float -> an output dtype on the GPU, as every kernel that writes a normalised batch stores it
// (normalize.cu, erase.cu): round to nearest even for the float types, and for uint8 a round
// and a clamp to [0, 255]. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include <cstdint>

namespace coloader {

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ uint8_t FromFloat<uint8_t>(float v) {
  return static_cast<uint8_t>(fminf(fmaxf(rintf(v), 0.f), 255.f));
}

}  // namespace coloader
