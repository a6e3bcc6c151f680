// The GPU twin of ResizeCrop (augment.cc), for --decode gpu: one thread per output pixel, one
// grid row per sample. Each output pixel sums its taps along both axes with the weights the CPU
// computes (resample_weights.h: PIL's and torchvision's antialiased filters, whose support
// widens with the shrink), normalised, rounded once; or, for the named recipes' fast resize,
// samples as OpenCV does. Either way the twins agree within a rounding
// (tests/gpu/gpu_decode_test.cu). The region is read in place from the decoded image (no crop
// copy); the flips pick the mirrored output pixel.
#include <cuda_runtime_api.h>

#include "common/cuda_internal.h"
#include "pipeline/transform/augment_device.h"
#include "pipeline/transform/resample_weights.h"

namespace coloader {

namespace {

// The fast resize of the named recipes (--augment train|eval|none; filter code 3): OpenCV's
// sampling, as the CPU path's cv::resize does it: area averaging when shrinking by 2x or more in
// both axes, bilinear in 11-bit fixed point otherwise, over the whole-pixel box.
constexpr int kCoefBits = 11;
constexpr int kCoefScale = 1 << kCoefBits;

__device__ __forceinline__ void FastBilinear(const ResizeCropTask& t, int dx, int dy, double sx_scale, double sy_scale,
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

__device__ __forceinline__ void FastArea(const ResizeCropTask& t, int dx, int dy, double sx_scale, double sy_scale,
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


// A tap window holds at most this many pixels an axis: bicubic's support of 2 widened by a
// shrink of up to 64x. Larger shrinks (a 30k-pixel image to 224) sample a strided subset.
constexpr int kMaxTaps = 2 * 2 * 64 + 1;

__device__ __forceinline__ void Resample(const ResizeCropTask& t, int dx, int dy, int size, uint8_t* out) {
  if (t.filter == 3) {
    const double sx = static_cast<double>(t.width) / size, sy = static_cast<double>(t.height) / size;
    if (t.width >= 2 * size && t.height >= 2 * size) {
      FastArea(t, dx, dy, sx, sy, out);
    } else {
      FastBilinear(t, dx, dy, sx, sy, out);
    }
    return;
  }
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
