// RandomErasing's GPU twin: the boxes the workers drew (erase.h's DrawErase, the CPU twin's
// draw), written into the normalised batch after NormalizeBatchOnDevice, in its dtype and
// layout. One grid row per sample; threads stride over the box's elements.
#include <cuda_runtime_api.h>

#include "common/cuda_internal.h"
#include "pipeline/transform/erase_device.h"
#include "pipeline/transform/from_float_device.h"

namespace coloader {

namespace {

template <typename T>
__global__ void EraseKernel(const EraseTask* __restrict__ tasks, uint32_t count, int size, int nchw, EraseFill fill,
                            T* __restrict__ dst) {
  // Grid rows stride over the boxes: a grid has at most 65535 rows, a batch may have more boxes.
  for (uint32_t k = blockIdx.y; k < count; k += gridDim.y) {
    const EraseTask t = tasks[k];
    const int area = t.height * t.width;
    const uint64_t plane = static_cast<uint64_t>(size) * size;
    T* image = dst + static_cast<uint64_t>(t.index) * plane * 3;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < 3 * area; e += gridDim.x * blockDim.x) {
      const int c = e / area, rest = e % area;
      const int y = t.top + rest / t.width, x = t.left + rest % t.width;
      const uint64_t pixel = static_cast<uint64_t>(y) * size + x;
      const float v = fill.random ? EraseNoise(t.noise_key, static_cast<uint32_t>(e)) : fill.value[c];
      image[nchw ? c * plane + pixel : 3 * pixel + c] = FromFloat<T>(v);
    }
  }
}

template <typename T>
void Launch(const EraseTask* tasks, uint32_t count, int size, int nchw, EraseFill fill, void* dst, cudaStream_t s) {
  const dim3 grid(64, count < 65535 ? count : 65535);
  EraseKernel<T><<<grid, 256, 0, s>>>(tasks, count, size, nchw, fill, static_cast<T*>(dst));
}

}  // namespace

Status EraseBatchOnDevice(const EraseTask* tasks, uint32_t count, int size, DType dtype, TensorLayout layout,
                          EraseFill fill, void* dst, void* stream) {
  if (count == 0) return Status::OK();
  const auto s = static_cast<cudaStream_t>(stream);
  const int nchw = layout == TensorLayout::kNCHW ? 1 : 0;
  switch (dtype) {
    case DType::kFloat32: Launch<float>(tasks, count, size, nchw, fill, dst, s); break;
    case DType::kBFloat16: Launch<__nv_bfloat16>(tasks, count, size, nchw, fill, dst, s); break;
    case DType::kFloat16: Launch<__half>(tasks, count, size, nchw, fill, dst, s); break;
    case DType::kUInt8: Launch<uint8_t>(tasks, count, size, nchw, fill, dst, s); break;
    default: return Status::Invalid("RandomErasing: an image batch of dtype " + std::string(DTypeName(dtype)));
  }
  CUDA_RETURN_NOT_OK(cudaGetLastError());
  return Status::OK();
}

}  // namespace coloader
