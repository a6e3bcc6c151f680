// The weights of resample.h's resize, as inline functions that the CPU (resample.cc) and the
// GPU (augment.cu) both call, so the twins compute the same taps. Filter codes: 0 nearest,
// 1 bilinear, 2 bicubic. No OpenCV, no CUDA headers.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define COLOADER_HOST_DEVICE __host__ __device__
#else
#define COLOADER_HOST_DEVICE
#endif

namespace coloader {

namespace resample {

// The filters, as PIL defines them: bilinear is the triangle of support 1, bicubic the cubic
// convolution with a = -0.5 and support 2.
COLOADER_HOST_DEVICE inline float Support(int filter) { return filter == 2 ? 2.f : 1.f; }
COLOADER_HOST_DEVICE inline float Weight(int filter, float x) {
  x = x < 0 ? -x : x;
  if (filter == 2) {
    constexpr float a = -0.5f;
    if (x < 1.f) return ((a + 2.f) * x - (a + 3.f)) * x * x + 1.f;
    if (x < 2.f) return (((x - 5.f) * x + 8.f) * x - 4.f) * a;
    return 0.f;
  }
  return x < 1.f ? 1.f - x : 0.f;
}

// One output coordinate's taps along an axis: source pixels [*first, *first + count) of a
// source axis of `in_size` pixels, for output pixel `xx` of `out` resizing [in0, in0 + len).
// Returns the centre; `ss` is 1 / the filter's widening.
COLOADER_HOST_DEVICE inline void Taps(int filter, int in_size, float in0, float len, int out, int xx, int* first,
                                      int* count, float* center, float* ss) {
  const float scale = len / static_cast<float>(out);
  const float filterscale = scale > 1.f ? scale : 1.f;
  const float support = Support(filter) * filterscale;
  *center = in0 + (static_cast<float>(xx) + 0.5f) * scale;
  *ss = 1.f / filterscale;
  int lo = static_cast<int>(*center - support + 0.5f);  // truncated toward zero, as PIL's (int)
  if (lo < 0) lo = 0;
  int hi = static_cast<int>(*center + support + 0.5f);
  if (hi > in_size) hi = in_size;
  *first = lo;
  *count = hi > lo ? hi - lo : 0;
}

// Nearest: the source pixel under the centre, clamped into the source.
COLOADER_HOST_DEVICE inline int NearestTap(int in_size, float in0, float len, int out, int xx) {
  int i = static_cast<int>(floorf(in0 + (static_cast<float>(xx) + 0.5f) * len / static_cast<float>(out)));
  return i < 0 ? 0 : (i >= in_size ? in_size - 1 : i);
}

}  // namespace resample

}  // namespace coloader
