// WriteSample's float output rounds x * scale and + shift separately, as the GPU's
// __fmul_rn/__fadd_rn do, even when normalize.cc is compiled where FMA exists (this test
// builds it with -mfma and the options pipeline/CMakeLists.txt gives it). Fused, some of
// the 256 x 3 values differ in the last bit and the paths are no longer bitwise equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pipeline/transform/normalize.h"

namespace coloader {
namespace {

// x * s + b with each operation rounded to float: the volatile keeps the compiler of this
// file from fusing it (this file is built without -mfma as well).
float RoundedApart(float x, float s, float b) {
  volatile float product = x * s;
  return product + b;
}

TEST(NormalizeRounding, MultiplyAndAddAreRoundedApartEvenWithFma) {
  if (!__builtin_cpu_supports("fma")) GTEST_SKIP() << "this CPU has no FMA: nothing could be fused";
  // Every uint8 value in each channel: a 16 x 16 image whose pixel i is (i, 255 - i, i ^ 0x5a).
  constexpr int kSide = 16, kPixels = kSide * kSide;
  std::vector<uint8_t> src(kPixels * 3);
  for (int i = 0; i < kPixels; ++i) {
    src[3 * i] = static_cast<uint8_t>(i);
    src[3 * i + 1] = static_cast<uint8_t>(255 - i);
    src[3 * i + 2] = static_cast<uint8_t>(i ^ 0x5a);
  }
  const NormalizeParams p;
  float scale[3], shift[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / p.std[c];
    shift[c] = -p.mean[c] / p.std[c];
  }
  int fused_would_differ = 0;
  for (TensorLayout layout : {TensorLayout::kNCHW, TensorLayout::kNHWC}) {
    std::vector<float> out(kPixels * 3);
    WriteSample(src.data(), kSide, kSide, DType::kFloat32, layout, p, out.data());
    for (int i = 0; i < kPixels; ++i) {
      for (int c = 0; c < 3; ++c) {
        const float x = src[3 * i + c];
        const float want = RoundedApart(x, scale[c], shift[c]);
        const float got = layout == TensorLayout::kNCHW ? out[c * kPixels + i] : out[3 * i + c];
        uint32_t want_bits, got_bits;
        std::memcpy(&want_bits, &want, 4);
        std::memcpy(&got_bits, &got, 4);
        ASSERT_EQ(got_bits, want_bits) << "value " << x << " channel " << c << ": the multiply-add was fused";
        fused_would_differ += std::fmaf(x, scale[c], shift[c]) != want;
      }
    }
  }
  // The inputs can tell the two apart at all (else this test could not fail).
  EXPECT_GT(fused_would_differ, 0);
}

}  // namespace
}  // namespace coloader
