// The per-pixel arithmetic of the pixel ops, shared by their CPU twin (color.cc) and their GPU
// twin (pixel_ops.cu): torchvision's float32 expressions, written once. Both sides compile
// them without fused multiply-adds (color.cc with -ffp-contract=off, pixel_ops.cu with
// -fmad=false), so each expression rounds the same way on both and the twins agree bit for
// bit (GaussianBlur aside: its sums run in another order on the CPU, within a rounding).
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define COLOADER_PIXEL_HD __host__ __device__
#else
#define COLOADER_PIXEL_HD
#endif

namespace coloader::pixel {

// float32 -> uint8 as torch's .to(torch.uint8) after a clamp to [0, 255]: truncation.
COLOADER_PIXEL_HD inline uint8_t Truncate(float v) { return static_cast<uint8_t>(fminf(255.f, fmaxf(0.f, v))); }
// The same after torch.round (half to even), as _cast_squeeze_out does for filters.
COLOADER_PIXEL_HD inline uint8_t RoundToU8(float v) { return static_cast<uint8_t>(fminf(255.f, fmaxf(0.f, rintf(v)))); }

// rgb_to_grayscale in float32, before its cast.
COLOADER_PIXEL_HD inline float Luma(const uint8_t* p) { return 0.2989f * p[0] + 0.587f * p[1] + 0.114f * p[2]; }

// _blend: ratio * a + (1 - ratio) * b, with r = float(ratio) and q = float(1 - ratio).
COLOADER_PIXEL_HD inline uint8_t Blend(float r, float q, float a, float b) { return Truncate(r * a + q * b); }

// adjust_hue on one pixel: _rgb2hsv, the shift `hf`, _hsv2rgb.
COLOADER_PIXEL_HD inline void ShiftHue(uint8_t* p, float hf) {
  const float r = p[0] / 255.f, g = p[1] / 255.f, b = p[2] / 255.f;
  const float maxc = fmaxf(r, fmaxf(g, b)), minc = fminf(r, fminf(g, b));
  const bool eqc = maxc == minc;
  const float cr = maxc - minc;
  const float s = cr / (eqc ? 1.f : maxc);
  const float div = eqc ? 1.f : cr;
  const float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
  float h;
  if (maxc == r) h = bc - gc;
  else if (maxc == g) h = 2.f + rc - bc;
  else h = 4.f + gc - rc;
  h = fmodf(h / 6.f + 1.f, 1.f);
  h = fmodf(h + hf, 1.f);
  if (h < 0) h += 1.f;  // Python's % keeps the sign of the divisor
  const float v = maxc;
  const float fi = floorf(h * 6.f);
  const float f = h * 6.f - fi;
  const int i = static_cast<int>(fi) % 6;
  const float pp = fminf(1.f, fmaxf(0.f, v * (1.f - s)));
  const float qq = fminf(1.f, fmaxf(0.f, v * (1.f - s * f)));
  const float tt = fminf(1.f, fmaxf(0.f, v * (1.f - s * (1.f - f))));
  float out[3];
  switch (i) {
    case 0: out[0] = v, out[1] = tt, out[2] = pp; break;
    case 1: out[0] = qq, out[1] = v, out[2] = pp; break;
    case 2: out[0] = pp, out[1] = v, out[2] = tt; break;
    case 3: out[0] = pp, out[1] = qq, out[2] = v; break;
    case 4: out[0] = tt, out[1] = pp, out[2] = v; break;
    default: out[0] = v, out[1] = pp, out[2] = qq; break;
  }
  for (int c = 0; c < 3; ++c) p[c] = Truncate(out[c] * 255.f);
}

// adjust_sharpness's smoothing at an inner pixel: the 3x3 kernel [[1,1,1],[1,5,1],[1,1,1]] / 13,
// rounded; `up`, `mid`, `down` point at the value in the rows above, at and below, 3 apart.
COLOADER_PIXEL_HD inline uint8_t Smooth(const uint8_t* up, const uint8_t* mid, const uint8_t* down) {
  const float s = static_cast<float>(up[-3] + up[0] + up[3] + mid[-3] + mid[3] + down[-3] + down[0] + down[3]) +
                  5.f * mid[0];
  return RoundToU8(s / 13.f);
}

// affine's grid_sample(nearest, align_corners=False) in float32: the source pixel of output
// pixel (x, y) under the inverse map `m`, rounded half to even; false where it falls outside.
COLOADER_PIXEL_HD inline bool AffineSource(int x, int y, int w, int h, const float m[6], int* sx, int* sy) {
  const float oy = static_cast<float>(y) - h * 0.5f + 0.5f;
  const float ox = static_cast<float>(x) - w * 0.5f + 0.5f;
  const float gx = (m[0] * ox + m[1] * oy + m[2]) / (0.5f * w);
  const float gy = (m[3] * ox + m[4] * oy + m[5]) / (0.5f * h);
  const float ix = ((gx + 1.f) * w - 1.f) * 0.5f, iy = ((gy + 1.f) * h - 1.f) * 0.5f;
  const float rx = rintf(ix), ry = rintf(iy);
  if (!(rx >= 0 && ry >= 0 && rx <= w - 1 && ry <= h - 1)) return false;  // NaN too
  *sx = static_cast<int>(rx), *sy = static_cast<int>(ry);
  return true;
}

// equalize's lookup table from one channel's histogram (torchvision's _scale_channel): the step
// is the count of all but the last non-empty bin / 255; false (leave the channel) when it is 0.
COLOADER_PIXEL_HD inline bool EqualizeLut(const uint32_t hist[256], uint8_t lut[256]) {
  int last = -1;
  for (int v = 0; v < 256; ++v)
    if (hist[v] != 0) last = v;
  int64_t total = 0;
  for (int v = 0; v < last; ++v) total += hist[v];
  const int64_t step = total / 255;
  if (step == 0) return false;
  int64_t cum = 0;
  for (int v = 0; v < 256; ++v) {
    // (the cumulative count before v + step / 2) / step
    const int64_t q = (cum + step / 2) / step;
    lut[v] = static_cast<uint8_t>(q < 255 ? q : 255);
    cum += hist[v];
  }
  return true;
}

// autocontrast on one value, from the channel's lowest and highest.
COLOADER_PIXEL_HD inline uint8_t Stretch(uint8_t v, int lo, int hi) {
  float minimum = static_cast<float>(lo), scale = 255.f / static_cast<float>(hi - lo);
  if (hi == lo) minimum = 0, scale = 1;
  return Truncate((v - minimum) * scale);
}

// gaussian_blur's 1-D kernel: k taps of standard deviation sigma, normalised.
COLOADER_PIXEL_HD inline void GaussianTaps(int k, float sigma, float* taps) {
  const float half = (k - 1) * 0.5f;
  float sum = 0;
  for (int i = 0; i < k; ++i) {
    const float x = -half + static_cast<float>(i);  // torch.linspace(-half, half, k)
    taps[i] = expf(-0.5f * (x / sigma) * (x / sigma));
    sum += taps[i];
  }
  for (int i = 0; i < k; ++i) taps[i] /= sum;
}

// Reflect padding without repeating the edge (torch's "reflect", OpenCV's BORDER_REFLECT_101).
COLOADER_PIXEL_HD inline int Reflect(int i, int n) {
  if (n == 1) return 0;
  while (i < 0 || i >= n) i = i < 0 ? -i : 2 * n - 2 - i;
  return i;
}

// Where index i of an axis of n pixels reads after padding (RandomCrop's padding_mode, as
// torch's pad: reflect without repeating the edge, symmetric with it); -1: the fill.
COLOADER_PIXEL_HD inline int PadIndex(int i, int n, int mode) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case 1: return i < 0 ? 0 : n - 1;  // edge
    case 2: return Reflect(i, n);      // reflect
    case 3:                            // symmetric
      while (i < 0 || i >= n) i = i < 0 ? -i - 1 : 2 * n - 1 - i;
      return i;
    default: return -1;                // constant
  }
}

}  // namespace coloader::pixel
