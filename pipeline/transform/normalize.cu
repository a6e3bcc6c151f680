// The GPU variant of normalize.cc: one thread per pixel, reading 3 uint8 channels (NHWC) and
// writing them normalised and cast, in NCHW or NHWC. The arithmetic is x * scale + shift in
// float with explicit round-to-nearest multiply and add (no fused multiply-add), the same
// operations in the same order as the host loop, so float32 results are bitwise equal.
#include "common/cuda_internal.h"
#include "pipeline/transform/from_float_device.h"
#include "pipeline/transform/normalize.h"

namespace coloader {

namespace {

struct Affine {
  float scale[3];
  float shift[3];
};

template <typename T, bool kNCHW>
__global__ void NormalizeKernel(const uint8_t* __restrict__ src, uint64_t pixels_per_image, uint64_t total_pixels,
                                Affine a, T* __restrict__ dst) {
  for (uint64_t p = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; p < total_pixels;
       p += uint64_t{gridDim.x} * blockDim.x) {
    const uint8_t* in = src + 3 * p;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      const float v = __fadd_rn(__fmul_rn(static_cast<float>(in[c]), a.scale[c]), a.shift[c]);
      if (kNCHW) {
        const uint64_t image = p / pixels_per_image, pixel = p % pixels_per_image;
        dst[(image * 3 + c) * pixels_per_image + pixel] = FromFloat<T>(v);
      } else {
        dst[3 * p + c] = FromFloat<T>(v);
      }
    }
  }
}

__global__ void TransposeU8Kernel(const uint8_t* __restrict__ src, uint64_t pixels_per_image, uint64_t total_pixels,
                                  uint8_t* __restrict__ dst) {
  for (uint64_t p = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; p < total_pixels;
       p += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t image = p / pixels_per_image, pixel = p % pixels_per_image;
#pragma unroll
    for (int c = 0; c < 3; ++c) dst[(image * 3 + c) * pixels_per_image + pixel] = src[3 * p + c];
  }
}

template <typename T>
void Launch(const uint8_t* src, uint64_t ppi, uint64_t total, const Affine& a, bool nchw, void* dst, cudaStream_t s,
            int blocks) {
  if (nchw) {
    NormalizeKernel<T, true><<<blocks, 256, 0, s>>>(src, ppi, total, a, static_cast<T*>(dst));
  } else {
    NormalizeKernel<T, false><<<blocks, 256, 0, s>>>(src, ppi, total, a, static_cast<T*>(dst));
  }
}

}  // namespace

Status NormalizeBatchOnDevice(const uint8_t* src, uint32_t count, uint32_t height, uint32_t width, DType dtype,
                              TensorLayout layout, const NormalizeParams& params, void* dst, void* stream) {
  const uint64_t ppi = uint64_t{height} * width;
  const uint64_t total = ppi * count;
  if (total == 0) return Status::OK();
  auto s = static_cast<cudaStream_t>(stream);
  const int blocks = static_cast<int>(std::min<uint64_t>((total + 255) / 256, 4096));
  const bool nchw = layout == TensorLayout::kNCHW;
  Affine a;
  for (int c = 0; c < 3; ++c) {
    // Computed on the host exactly as WriteSample computes them.
    a.scale[c] = 1.0f / params.std[c];
    a.shift[c] = -params.mean[c] / params.std[c];
  }
  switch (dtype) {
    case DType::kUInt8:
      if (nchw) {
        TransposeU8Kernel<<<blocks, 256, 0, s>>>(src, ppi, total, static_cast<uint8_t*>(dst));
      } else {
        CUDA_RETURN_NOT_OK(cudaMemcpyAsync(dst, src, total * 3, cudaMemcpyDeviceToDevice, s));
      }
      break;
    case DType::kFloat32: Launch<float>(src, ppi, total, a, nchw, dst, s, blocks); break;
    case DType::kBFloat16: Launch<__nv_bfloat16>(src, ppi, total, a, nchw, dst, s, blocks); break;
    case DType::kFloat16: Launch<__half>(src, ppi, total, a, nchw, dst, s, blocks); break;
  }
  CUDA_RETURN_NOT_OK(cudaGetLastError());
  return Status::OK();
}

}  // namespace coloader
