// The GPU variant of ResizeCrop (augment.cc), for --decode gpu: one thread per output pixel,
// one grid row per sample. The sampling follows OpenCV's, which the CPU path uses, so the two
// agree within one level (tests/gpu/gpu_decode_test.cc):
//  - bilinear (enlarging, or shrinking by less than 2x): source x = (dx + 0.5) * scale - 0.5,
//    clamped to the box, weights in 11-bit fixed point as OpenCV's 8-bit INTER_LINEAR;
//  - area (shrinking by 2x or more in both axes): each output pixel averages the source
//    pixels its footprint covers, partial pixels weighted by their overlap, as INTER_AREA.
// The box is read in place from the decoded image (no crop copy); the flip picks the mirrored
// output column.
#include <cuda_runtime_api.h>

#include "common/cuda_internal.h"
#include "pipeline/transform/augment_device.h"

namespace coloader {

namespace {

constexpr int kCoefBits = 11;
constexpr int kCoefScale = 1 << kCoefBits;

__device__ __forceinline__ void Bilinear(const ResizeCropTask& t, int dx, int dy, double sx_scale, double sy_scale,
                                         uint8_t* out) {
  float fx = static_cast<float>((dx + 0.5) * sx_scale - 0.5);
  int sx = static_cast<int>(floorf(fx));
  fx -= sx;
  if (sx < 0) fx = 0.f, sx = 0;
  if (sx >= t.width - 1) fx = 0.f, sx = t.width - 1;
  float fy = static_cast<float>((dy + 0.5) * sy_scale - 0.5);
  int sy = static_cast<int>(floorf(fy));
  fy -= sy;
  if (sy < 0) fy = 0.f, sy = 0;
  if (sy >= t.height - 1) fy = 0.f, sy = t.height - 1;
  const int sx1 = min(sx + 1, t.width - 1), sy1 = min(sy + 1, t.height - 1);
  const int cx0 = __float2int_rn((1.f - fx) * kCoefScale), cx1 = kCoefScale - cx0;
  const int cy0 = __float2int_rn((1.f - fy) * kCoefScale), cy1 = kCoefScale - cy0;
  const uint8_t* r0 = t.src + static_cast<int64_t>(t.y + sy) * t.pitch + 3 * t.x;
  const uint8_t* r1 = t.src + static_cast<int64_t>(t.y + sy1) * t.pitch + 3 * t.x;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const int h0 = r0[3 * sx + c] * cx0 + r0[3 * sx1 + c] * cx1;
    const int h1 = r1[3 * sx + c] * cx0 + r1[3 * sx1 + c] * cx1;
    const int v = (h0 * cy0 + h1 * cy1 + (1 << (2 * kCoefBits - 1))) >> (2 * kCoefBits);
    out[c] = static_cast<uint8_t>(min(max(v, 0), 255));
  }
}

// The weight of source pixel i in the footprint [lo, hi) of one output pixel.
__device__ __forceinline__ float Overlap(int i, float lo, float hi) {
  return fmaxf(0.f, fminf(hi, i + 1.f) - fmaxf(lo, static_cast<float>(i)));
}

__device__ __forceinline__ void Area(const ResizeCropTask& t, int dx, int dy, double sx_scale, double sy_scale,
                                     uint8_t* out) {
  const float x_lo = static_cast<float>(dx * sx_scale);
  const float x_hi = fminf(static_cast<float>((dx + 1) * sx_scale), static_cast<float>(t.width));
  const float y_lo = static_cast<float>(dy * sy_scale);
  const float y_hi = fminf(static_cast<float>((dy + 1) * sy_scale), static_cast<float>(t.height));
  const int x0 = static_cast<int>(floorf(x_lo)), x1 = min(static_cast<int>(ceilf(x_hi)), t.width);
  const int y0 = static_cast<int>(floorf(y_lo)), y1 = min(static_cast<int>(ceilf(y_hi)), t.height);
  float acc[3] = {0.f, 0.f, 0.f};
  float total = 0.f;
  for (int y = y0; y < y1; ++y) {
    const float wy = Overlap(y, y_lo, y_hi);
    if (wy <= 0.f) continue;
    const uint8_t* row = t.src + static_cast<int64_t>(t.y + y) * t.pitch + 3 * t.x;
    for (int x = x0; x < x1; ++x) {
      const float w = wy * Overlap(x, x_lo, x_hi);
      if (w <= 0.f) continue;
      acc[0] += w * row[3 * x];
      acc[1] += w * row[3 * x + 1];
      acc[2] += w * row[3 * x + 2];
      total += w;
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
  for (int c = 0; c < 3; ++c) out[c] = static_cast<uint8_t>(min(max(__float2int_rn(acc[c] * inv), 0), 255));
}

__global__ void ResizeCropKernel(const ResizeCropTask* __restrict__ tasks, int size, uint8_t* __restrict__ dst) {
  const ResizeCropTask t = tasks[blockIdx.y];
  const int pixels = size * size;
  const double sx_scale = static_cast<double>(t.width) / size, sy_scale = static_cast<double>(t.height) / size;
  const bool shrinking = t.width >= 2 * size && t.height >= 2 * size;
  uint8_t* out_image = dst + static_cast<uint64_t>(t.dst_index) * pixels * 3;
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pixels; p += gridDim.x * blockDim.x) {
    const int dy = p / size, out_x = p % size;
    const int dx = t.flip ? size - 1 - out_x : out_x;
    if (shrinking) {
      Area(t, dx, dy, sx_scale, sy_scale, out_image + 3 * p);
    } else {
      Bilinear(t, dx, dy, sx_scale, sy_scale, out_image + 3 * p);
    }
  }
}

}  // namespace

Status ResizeCropBatchOnDevice(const ResizeCropTask* tasks, uint32_t count, int out_size, uint8_t* dst,
                               void* stream) {
  if (count == 0) return Status::OK();
  const int pixels = out_size * out_size;
  const dim3 grid(static_cast<unsigned>(std::min((pixels + 255) / 256, 64)), count);
  ResizeCropKernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(tasks, out_size, dst);
  CUDA_RETURN_NOT_OK(cudaGetLastError());
  return Status::OK();
}

}  // namespace coloader
