// The GPU twin of the pixel ops (pixel_ops_device.h): one kernel per step of the batch's
// programs, one grid row per sample, each thread a pixel's three values, with the CPU twin's
// arithmetic (pixel_math.h; this file is compiled with -fmad=false so that no product and sum
// fuse where the CPU rounds them apart). Ops that need the whole image first (contrast's mean,
// autocontrast's extremes, equalize's histogram) get a statistics pass before their step;
// GaussianBlur a first pass that sums the rows into float, as the CPU's separable filter does.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "common/cuda_internal.h"
#include "pipeline/transform/pixel_math.h"
#include "pipeline/transform/pixel_ops_device.h"

namespace coloader {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTaps = 255;  // GaussianBlur's largest kernel (the recipe's bound)

__device__ __forceinline__ const PixelStep* StepOf(const PixelProgram* programs, uint32_t n, int step) {
  return step < programs[n].count ? &programs[n].steps[step] : nullptr;
}

__host__ __device__ __forceinline__ bool NeedsStats(PixelKind k) {
  return k == PixelKind::kContrast || k == PixelKind::kAutoContrast || k == PixelKind::kEqualize;
}

// Grid: (blocks over a sample's pixels, samples); every block of a sample adds its part.
__global__ void StatsKernel(const PixelProgram* __restrict__ programs, uint32_t count, int step, int size,
                            const uint8_t* __restrict__ src, PixelStats* __restrict__ stats) {
  __shared__ uint32_t hist[3][256];
  __shared__ unsigned long long sum;
  __shared__ uint32_t low_inverted[3], high[3];
  const int pixels = size * size;
  for (uint32_t n = blockIdx.y; n < count; n += gridDim.y) {
    const PixelStep* s = StepOf(programs, n, step);
    if (s == nullptr || !NeedsStats(s->kind)) continue;  // the same for the whole block
    const PixelKind kind = s->kind;
    for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) hist[i / 256][i % 256] = 0;
    if (threadIdx.x == 0) sum = 0;
    if (threadIdx.x < 3) low_inverted[threadIdx.x] = 0, high[threadIdx.x] = 0;
    __syncthreads();
    const uint8_t* image = src + static_cast<uint64_t>(n) * pixels * 3;
    unsigned long long local_sum = 0;
    uint32_t lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};  // lo as 255 - value
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pixels; p += gridDim.x * blockDim.x) {
      const uint8_t* px = image + 3 * p;
      if (kind == PixelKind::kContrast) {
        local_sum += static_cast<uint8_t>(pixel::Luma(px));
      } else if (kind == PixelKind::kAutoContrast) {
        for (int c = 0; c < 3; ++c) lo[c] = max(lo[c], 255u - px[c]), hi[c] = max(hi[c], uint32_t{px[c]});
      } else {
        for (int c = 0; c < 3; ++c) atomicAdd(&hist[c][px[c]], 1u);
      }
    }
    if (kind == PixelKind::kContrast) atomicAdd(&sum, local_sum);
    if (kind == PixelKind::kAutoContrast)
      for (int c = 0; c < 3; ++c) atomicMax(&low_inverted[c], lo[c]), atomicMax(&high[c], hi[c]);
    __syncthreads();
    PixelStats& out = stats[n];
    if (kind == PixelKind::kContrast && threadIdx.x == 0) atomicAdd(&out.luma_sum, sum);
    if (kind == PixelKind::kAutoContrast && threadIdx.x < 3) {
      atomicMax(&out.low_inverted[threadIdx.x], low_inverted[threadIdx.x]);
      atomicMax(&out.high[threadIdx.x], high[threadIdx.x]);
    }
    if (kind == PixelKind::kEqualize)
      for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x)
        if (hist[i / 256][i % 256] != 0) atomicAdd(&out.hist[i / 256][i % 256], hist[i / 256][i % 256]);
    __syncthreads();  // the shared counts are reset for the next sample
  }
}

// gaussian_blur's first pass, for the samples whose step `step` blurs: each row's horizontal
// sums (reflect padding) into `rows`, in float, as the CPU's separable filter keeps them.
__global__ void BlurRowsKernel(const PixelProgram* __restrict__ programs, uint32_t count, int step, int size,
                               const uint8_t* __restrict__ src, float* __restrict__ rows) {
  __shared__ float taps[kMaxTaps];
  const int pixels = size * size;
  for (uint32_t n = blockIdx.y; n < count; n += gridDim.y) {
    const PixelStep* s = StepOf(programs, n, step);
    if (s == nullptr || s->kind != PixelKind::kBlur) continue;  // the same for the whole block
    const int kx = s->i[0];
    if (threadIdx.x == 0) pixel::GaussianTaps(kx, static_cast<float>(s->f[0]), taps);
    __syncthreads();
    const uint8_t* image = src + static_cast<uint64_t>(n) * pixels * 3;
    float* out = rows + static_cast<uint64_t>(n) * pixels * 3;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pixels; p += gridDim.x * blockDim.x) {
      const int x = p % size;
      const uint8_t* row = image + static_cast<int64_t>(p / size) * size * 3;
      for (int c = 0; c < 3; ++c) {
        float h = 0.f;
        for (int k = 0; k < kx; ++k) h += taps[k] * row[3 * pixel::Reflect(x + k - kx / 2, size) + c];
        out[3 * p + c] = h;
      }
    }
    __syncthreads();  // the taps are redrawn for the next sample
  }
}

// Its second pass at (x, y), channel c: the vertical sum of the rows' sums, rounded.
__device__ __forceinline__ uint8_t BlurColumnAt(const float* rows, int size, int x, int y, int c, int ky,
                                                const float* taps_y) {
  float acc = 0.f;
  for (int j = 0; j < ky; ++j) acc += taps_y[j] * rows[(static_cast<int64_t>(pixel::Reflect(y + j - ky / 2, size)) * size + x) * 3 + c];
  return pixel::RoundToU8(acc);
}

__global__ void StepKernel(const PixelProgram* __restrict__ programs, uint32_t count, int step, int size,
                           const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                           const PixelStats* __restrict__ stats, const float* __restrict__ blur_rows) {
  __shared__ uint8_t lut[3][256];
  __shared__ bool lut_used[3];
  __shared__ float taps_y[kMaxTaps];
  const int pixels = size * size;
  for (uint32_t n = blockIdx.y; n < count; n += gridDim.y) {
    const PixelStep* sp = StepOf(programs, n, step);
    const uint8_t* in_image = src + static_cast<uint64_t>(n) * pixels * 3;
    uint8_t* out_image = dst + static_cast<uint64_t>(n) * pixels * 3;
    if (sp == nullptr) {  // this sample's program has ended: carry it over
      for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pixels; p += gridDim.x * blockDim.x)
        for (int c = 0; c < 3; ++c) out_image[3 * p + c] = in_image[3 * p + c];
      continue;
    }
    const PixelStep s = *sp;
    if (s.kind == PixelKind::kEqualize && threadIdx.x < 3)
      lut_used[threadIdx.x] = pixel::EqualizeLut(stats[n].hist[threadIdx.x], lut[threadIdx.x]);
    if (s.kind == PixelKind::kBlur && threadIdx.x == 0) pixel::GaussianTaps(s.i[1], static_cast<float>(s.f[0]), taps_y);
    __syncthreads();
    const float r = static_cast<float>(s.f[0]), q = static_cast<float>(1.0 - s.f[0]);
    float mean = 0.f;
    if (s.kind == PixelKind::kContrast)
      mean = static_cast<float>(static_cast<double>(stats[n].luma_sum) / (static_cast<double>(size) * size));
    float m[6];
    for (int i = 0; i < 6; ++i) m[i] = static_cast<float>(s.f[i]);
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pixels; p += gridDim.x * blockDim.x) {
      const int x = p % size, y = p / size;
      const uint8_t* in = in_image + 3 * p;
      uint8_t v[3] = {in[0], in[1], in[2]};
      switch (s.kind) {
        case PixelKind::kBrightness:
          for (int c = 0; c < 3; ++c) v[c] = pixel::Blend(r, q, in[c], 0.f);
          break;
        case PixelKind::kContrast:
          for (int c = 0; c < 3; ++c) v[c] = pixel::Blend(r, q, in[c], mean);
          break;
        case PixelKind::kSaturation: {
          const float gray = static_cast<uint8_t>(pixel::Luma(in));
          for (int c = 0; c < 3; ++c) v[c] = pixel::Blend(r, q, in[c], gray);
          break;
        }
        case PixelKind::kHue: pixel::ShiftHue(v, r); break;
        case PixelKind::kSharpness: {
          if (size <= 2) break;  // the CPU twin leaves such an image as it is
          const bool inner = x > 0 && y > 0 && x < size - 1 && y < size - 1;
          for (int c = 0; c < 3; ++c) {
            const uint8_t smooth = inner ? pixel::Smooth(in - 3 * size + c, in + c, in + 3 * size + c) : in[c];
            v[c] = pixel::Blend(r, q, in[c], smooth);
          }
          break;
        }
        case PixelKind::kGrayscale: v[0] = v[1] = v[2] = static_cast<uint8_t>(pixel::Luma(in)); break;
        case PixelKind::kPosterize: {
          const auto mask = static_cast<uint8_t>(0xFF << (8 - min(max(s.i[0], 0), 8)));
          for (int c = 0; c < 3; ++c) v[c] = in[c] & mask;
          break;
        }
        case PixelKind::kSolarize:
          for (int c = 0; c < 3; ++c) v[c] = in[c] >= s.f[0] ? static_cast<uint8_t>(255 - in[c]) : in[c];
          break;
        case PixelKind::kAutoContrast:
          for (int c = 0; c < 3; ++c)
            v[c] = pixel::Stretch(in[c], 255 - static_cast<int>(stats[n].low_inverted[c]), static_cast<int>(stats[n].high[c]));
          break;
        case PixelKind::kEqualize:
          for (int c = 0; c < 3; ++c) v[c] = lut_used[c] ? lut[c][in[c]] : in[c];
          break;
        case PixelKind::kInvert:
          for (int c = 0; c < 3; ++c) v[c] = static_cast<uint8_t>(255 - in[c]);
          break;
        case PixelKind::kBlur: {
          const float* rows = blur_rows + static_cast<uint64_t>(n) * pixels * 3;
          for (int c = 0; c < 3; ++c) v[c] = BlurColumnAt(rows, size, x, y, c, s.i[1], taps_y);
          break;
        }
        case PixelKind::kPadCrop: {
          const int mode = static_cast<int>(s.f[2]);
          const int sx = pixel::PadIndex(x + static_cast<int>(s.f[0]), size, mode);
          const int sy = pixel::PadIndex(y + static_cast<int>(s.f[1]), size, mode);
          if (sx >= 0 && sy >= 0) {
            const uint8_t* from = in_image + 3 * (static_cast<int64_t>(sy) * size + sx);
            v[0] = from[0], v[1] = from[1], v[2] = from[2];
          } else {
            v[0] = static_cast<uint8_t>(s.i[0]), v[1] = static_cast<uint8_t>(s.i[1]), v[2] = static_cast<uint8_t>(s.i[2]);
          }
          break;
        }
        case PixelKind::kAffine: {
          int sx, sy;
          if (pixel::AffineSource(x, y, size, size, m, &sx, &sy)) {
            const uint8_t* from = in_image + 3 * (static_cast<int64_t>(sy) * size + sx);
            v[0] = from[0], v[1] = from[1], v[2] = from[2];
          } else {
            v[0] = static_cast<uint8_t>(s.i[0]), v[1] = static_cast<uint8_t>(s.i[1]), v[2] = static_cast<uint8_t>(s.i[2]);
          }
          break;
        }
      }
      uint8_t* out = out_image + 3 * p;
      out[0] = v[0], out[1] = v[1], out[2] = v[2];
    }
    __syncthreads();  // the shared tables are rebuilt for the next sample
  }
}

}  // namespace

bool PixelProgramsBlur(const PixelProgram* programs, uint32_t count) {
  for (uint32_t n = 0; n < count; ++n)
    for (int k = 0; k < programs[n].count; ++k)
      if (programs[n].steps[k].kind == PixelKind::kBlur) return true;
  return false;
}

Result<const uint8_t*> PixelOpsBatchOnDevice(const PixelProgram* programs, const PixelProgram* host_programs,
                                             uint32_t count, int size, const uint8_t* src, uint8_t* a, uint8_t* b,
                                             PixelStats* stats, float* blur_rows, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  int steps = 0;
  for (uint32_t n = 0; n < count; ++n) steps = std::max(steps, static_cast<int>(host_programs[n].count));
  const int pixels = size * size;
  const dim3 grid(static_cast<unsigned>(std::min((pixels + kThreads - 1) / kThreads, 64)),
                  std::min<uint32_t>(count, 65535));
  const uint8_t* current = src;
  uint8_t* buffers[2] = {a, b};
  int next = src == a ? 1 : 0;
  for (int step = 0; step < steps; ++step) {
    bool stats_needed = false, blur = false;
    for (uint32_t n = 0; n < count; ++n) {
      if (step >= host_programs[n].count) continue;
      stats_needed = stats_needed || NeedsStats(host_programs[n].steps[step].kind);
      blur = blur || host_programs[n].steps[step].kind == PixelKind::kBlur;
    }
    if (stats_needed) {
      CUDA_RETURN_NOT_OK(cudaMemsetAsync(stats, 0, sizeof(PixelStats) * count, stream));
      StatsKernel<<<grid, kThreads, 0, stream>>>(programs, count, step, size, current, stats);
      CUDA_RETURN_NOT_OK(cudaGetLastError());
    }
    if (blur) {
      if (blur_rows == nullptr) return Status::Internal("pixel ops: a GaussianBlur step without its float scratch");
      BlurRowsKernel<<<grid, kThreads, 0, stream>>>(programs, count, step, size, current, blur_rows);
      CUDA_RETURN_NOT_OK(cudaGetLastError());
    }
    StepKernel<<<grid, kThreads, 0, stream>>>(programs, count, step, size, current, buffers[next], stats, blur_rows);
    CUDA_RETURN_NOT_OK(cudaGetLastError());
    current = buffers[next];
    next ^= 1;
  }
  return current;
}

}  // namespace coloader
