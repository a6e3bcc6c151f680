// The GPU twin of ResizeCrop (augment.cc), for --decode gpu: one thread per output pixel, one
// grid row per sample. Each output pixel sums its taps along both axes with the weights the CPU
// computes (resample_weights.h: PIL's and torchvision's antialiased filters, whose support
// widens with the shrink), normalised, rounded once: the twins agree within a rounding
// (tests/gpu/gpu_decode_test.cu). The region is read in place from the decoded image (no crop
// copy); the flips pick the mirrored output pixel.
#include <cuda_runtime_api.h>

#include "common/cuda_internal.h"
#include "pipeline/transform/augment_device.h"
#include "pipeline/transform/resample_weights.h"

namespace coloader {

namespace {

// A tap window holds at most this many pixels an axis: bicubic's support of 2 widened by a
// shrink of up to 64x. Larger shrinks (a 30k-pixel image to 224) sample a strided subset.
constexpr int kMaxTaps = 2 * 2 * 64 + 1;

__device__ __forceinline__ void Resample(const ResizeCropTask& t, int dx, int dy, int size, uint8_t* out) {
  const uint8_t* base = t.src + static_cast<int64_t>(t.y) * t.pitch + 3 * t.x;
  if (t.filter == 0) {
    const int sx = resample::NearestTap(t.width, t.box_x, t.box_width, size, dx);
    const int sy = resample::NearestTap(t.height, t.box_y, t.box_height, size, dy);
    const uint8_t* p = base + static_cast<int64_t>(sy) * t.pitch + 3 * sx;
    out[0] = p[0], out[1] = p[1], out[2] = p[2];
    return;
  }
  int x0, nx, y0, ny;
  float cx, ssx, cy, ssy;
  resample::Taps(t.filter, t.width, t.box_x, t.box_width, size, dx, &x0, &nx, &cx, &ssx);
  resample::Taps(t.filter, t.height, t.box_y, t.box_height, size, dy, &y0, &ny, &cy, &ssy);
  const int step_x = nx > kMaxTaps ? (nx + kMaxTaps - 1) / kMaxTaps : 1;
  const int step_y = ny > kMaxTaps ? (ny + kMaxTaps - 1) / kMaxTaps : 1;
  float wx_total = 0.f;
  for (int i = 0; i < nx; i += step_x) wx_total += resample::Weight(t.filter, (x0 + i - cx + 0.5f) * ssx);
  float acc[3] = {0.f, 0.f, 0.f};
  float wy_total = 0.f;
  for (int j = 0; j < ny; j += step_y) {
    const float wy = resample::Weight(t.filter, (y0 + j - cy + 0.5f) * ssy);
    wy_total += wy;
    if (wy == 0.f) continue;
    const uint8_t* row = base + static_cast<int64_t>(y0 + j) * t.pitch;
    float h[3] = {0.f, 0.f, 0.f};
    for (int i = 0; i < nx; i += step_x) {
      const float wx = resample::Weight(t.filter, (x0 + i - cx + 0.5f) * ssx);
      const uint8_t* p = row + 3 * (x0 + i);
      h[0] += wx * p[0];
      h[1] += wx * p[1];
      h[2] += wx * p[2];
    }
    acc[0] += wy * h[0];
    acc[1] += wy * h[1];
    acc[2] += wy * h[2];
  }
  const float norm = wx_total * wy_total;
  const float inv = norm != 0.f ? 1.f / norm : 0.f;
#pragma unroll
  for (int c = 0; c < 3; ++c) out[c] = static_cast<uint8_t>(min(max(__float2int_rn(acc[c] * inv), 0), 255));
}

__global__ void ResizeCropKernel(const ResizeCropTask* __restrict__ tasks, int size, uint8_t* __restrict__ dst) {
  const ResizeCropTask t = tasks[blockIdx.y];
  const int pixels = size * size;
  uint8_t* out_image = dst + static_cast<uint64_t>(t.dst_index) * pixels * 3;
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pixels; p += gridDim.x * blockDim.x) {
    const int out_y = p / size, out_x = p % size;
    const int dx = t.flip ? size - 1 - out_x : out_x;
    const int dy = t.vflip ? size - 1 - out_y : out_y;
    Resample(t, dx, dy, size, out_image + 3 * p);
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
