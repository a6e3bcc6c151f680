// SampleRng, the crop geometry (RandomResizedCrop / Resize+CenterCrop with torchvision's
// meanings) and ResizeCrop's pixels.
#include "pipeline/transform/augment.h"

#include <tuple>

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include <opencv2/core.hpp>

namespace coloader {
namespace {

std::vector<uint64_t> Draws(uint64_t seed, uint64_t epoch, uint64_t index, int n = 8) {
  SampleRng rng(seed, epoch, index);
  std::vector<uint64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(rng.NextU64());
  return out;
}

TEST(SampleRngTest, SameKeysGiveTheSameStream) {
  EXPECT_EQ(Draws(1, 2, 3), Draws(1, 2, 3));
  EXPECT_EQ(Draws(0, 0, 0), Draws(0, 0, 0));
}

TEST(SampleRngTest, EachKeyChangesTheStream) {
  const auto base = Draws(7, 3, 1000);
  EXPECT_NE(base, Draws(8, 3, 1000));
  EXPECT_NE(base, Draws(7, 4, 1000));
  EXPECT_NE(base, Draws(7, 3, 1001));
  // Swapping keys must not collide (a plain XOR of the keys would).
  EXPECT_NE(Draws(1, 2, 3), Draws(1, 3, 2));
  EXPECT_NE(Draws(1, 2, 3), Draws(2, 1, 3));
  // Neighbouring indices give unrelated first outputs: no two equal over many samples.
  std::set<uint64_t> first;
  for (uint64_t i = 0; i < 10000; ++i) first.insert(Draws(0, 0, i, 1)[0]);
  EXPECT_EQ(first.size(), 10000u);
}

TEST(SampleRngTest, FirstOutputBitsAreBalancedAcrossIndices) {
  // Seeding must mix well: each bit of the first output over consecutive indices is ~50% ones.
  constexpr int kN = 4000;
  int ones[64] = {};
  for (uint64_t i = 0; i < kN; ++i) {
    const uint64_t v = Draws(42, 0, i, 1)[0];
    for (int b = 0; b < 64; ++b) ones[b] += static_cast<int>((v >> b) & 1);
  }
  for (int b = 0; b < 64; ++b) {
    EXPECT_GT(ones[b], kN * 0.45) << "bit " << b;
    EXPECT_LT(ones[b], kN * 0.55) << "bit " << b;
  }
}

TEST(SampleRngTest, UniformStaysInRange) {
  SampleRng rng(1, 1, 1);
  double lo_seen = 1, hi_seen = 0, sum = 0;
  constexpr int kN = 100000;
  for (int i = 0; i < kN; ++i) {
    const double u = rng.Uniform(0.0, 1.0);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    lo_seen = std::min(lo_seen, u);
    hi_seen = std::max(hi_seen, u);
    sum += u;
  }
  EXPECT_LT(lo_seen, 0.001);
  EXPECT_GT(hi_seen, 0.999);
  EXPECT_NEAR(sum / kN, 0.5, 0.01);
  for (int i = 0; i < 1000; ++i) {
    const double v = rng.Uniform(-3.0, 5.0);
    ASSERT_GE(v, -3.0);
    ASSERT_LT(v, 5.0);
  }
}

TEST(SampleRngTest, UniformIntIsInclusiveAndCoversTheRange) {
  SampleRng rng(3, 0, 9);
  int counts[7] = {};
  for (int i = 0; i < 70000; ++i) {
    const int64_t v = rng.UniformInt(10, 16);
    ASSERT_GE(v, 10);
    ASSERT_LE(v, 16);
    ++counts[v - 10];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(rng.UniformInt(5, 5), 5);
  for (int i = 0; i < 100; ++i) {
    const int64_t v = rng.UniformInt(-2, 1);
    EXPECT_GE(v, -2);
    EXPECT_LE(v, 1);
  }
}

TEST(AugmentModeTest, ParseAndName) {
  for (AugmentMode m : {AugmentMode::kTrain, AugmentMode::kEval, AugmentMode::kNone}) {
    auto parsed = ParseAugmentMode(AugmentModeName(m));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, m);
  }
  auto bad = ParseAugmentMode("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("random"), std::string::npos);
}

bool Inside(const CropBox& b, int w, int h) {
  return b.x >= 0 && b.y >= 0 && b.width > 0 && b.height > 0 && b.x + b.width <= w &&
         b.y + b.height <= h;
}

// torchvision's fallback box for an image of w x h with the default ratio range.
CropBox FallbackBox(int w, int h, const AugmentOptions& o) {
  CropBox b;
  b.width = w;
  b.height = h;
  const double in_ratio = static_cast<double>(w) / h;
  if (in_ratio < o.ratio_min) b.height = static_cast<int>(std::nearbyint(w / o.ratio_min));
  if (in_ratio > o.ratio_max) b.width = static_cast<int>(std::nearbyint(h * o.ratio_max));
  b.x = (w - b.width) / 2;
  b.y = (h - b.height) / 2;
  return b;
}

struct Shape {
  int width, height;
};

class TrainCropTest : public ::testing::TestWithParam<Shape> {};

TEST_P(TrainCropTest, BoxesFollowRandomResizedCrop) {
  const auto [w, h] = GetParam();
  const AugmentOptions o;
  const CropBox fallback = FallbackBox(w, h, o);
  constexpr int kDraws = 5000;
  int fallbacks = 0, flips = 0;
  double min_frac = 2, max_frac = 0;
  for (int i = 0; i < kDraws; ++i) {
    SampleRng rng(11, 2, static_cast<uint64_t>(i));
    const CropBox b = SampleTrainCrop(w, h, o, rng);
    ASSERT_TRUE(Inside(b, w, h)) << w << "x" << h << " draw " << i << ": " << b.x << "," << b.y
                                 << " " << b.width << "x" << b.height;
    flips += b.flip;
    CropBox unflipped = b;
    unflipped.flip = false;
    if (unflipped == fallback) {
      ++fallbacks;
      continue;
    }
    // A sampled box: its area fraction lies in [scale_min, scale_max] and its aspect in
    // [ratio_min, ratio_max], up to the rounding of w and h to whole pixels.
    const double frac = static_cast<double>(b.width) * b.height / (static_cast<double>(w) * h);
    const double slack = 1.0 / b.width + 1.0 / b.height + 1e-9;
    EXPECT_GE(frac, o.scale_min * (1 - slack)) << b.width << "x" << b.height;
    EXPECT_LE(frac, o.scale_max * (1 + slack)) << b.width << "x" << b.height;
    const double ratio = static_cast<double>(b.width) / b.height;
    EXPECT_GE(ratio, o.ratio_min * (1 - slack)) << b.width << "x" << b.height;
    EXPECT_LE(ratio, o.ratio_max * (1 + slack)) << b.width << "x" << b.height;
    min_frac = std::min(min_frac, frac);
    max_frac = std::max(max_frac, frac);
  }
  const double aspect = static_cast<double>(w) / h;
  if (aspect > 10 || aspect < 0.1) {
    // No box of ratio 3/4..4/3 fits a very wide or tall image: nearly every draw falls back.
    EXPECT_GT(fallbacks, kDraws * 9 / 10);
  } else if (w >= 100 && h >= 100 && aspect > 0.5 && aspect < 2) {
    EXPECT_LT(fallbacks, kDraws / 100);
    EXPECT_LT(min_frac, 0.1);  // the whole scale range is reached
    EXPECT_GT(max_frac, 0.75);
  }
  EXPECT_NEAR(flips, kDraws / 2, kDraws * 0.04);
}

INSTANTIATE_TEST_SUITE_P(Shapes, TrainCropTest,
                         ::testing::Values(Shape{500, 375}, Shape{375, 500}, Shape{224, 224},
                                           Shape{4000, 3000}, Shape{2000, 100}, Shape{100, 2000},
                                           Shape{900, 200}, Shape{7, 5}, Shape{1, 1}, Shape{3, 1}),
                         [](const auto& info) {
                           return std::to_string(info.param.width) + "x" +
                                  std::to_string(info.param.height);
                         });

TEST(TrainCropTest, FallbackIsTheCentredClampedBox) {
  const AugmentOptions o;
  SampleRng rng(0, 0, 0);
  // 2000x100: 4/3 * 100 = 133 wide, centred.
  CropBox b = SampleTrainCrop(2000, 100, o, rng);
  EXPECT_EQ(b.x, (2000 - 133) / 2);
  EXPECT_EQ(b.y, 0);
  EXPECT_EQ(b.width, 133);
  EXPECT_EQ(b.height, 100);
  // 100x2000: 100 / (3/4) = 133 tall.
  b = SampleTrainCrop(100, 2000, o, rng);
  EXPECT_EQ(b.x, 0);
  EXPECT_EQ(b.y, (2000 - 133) / 2);
  EXPECT_EQ(b.width, 100);
  EXPECT_EQ(b.height, 133);
}

TEST(TrainCropTest, SameSampleSameBoxOtherEpochOtherBox) {
  const AugmentOptions o;
  int same_across_epochs = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    SampleRng a(5, 1, i), b(5, 1, i), c(5, 2, i);
    const CropBox ba = SampleTrainCrop(500, 375, o, a);
    EXPECT_EQ(ba, SampleTrainCrop(500, 375, o, b));
    same_across_epochs += ba == SampleTrainCrop(500, 375, o, c);
  }
  EXPECT_LE(same_across_epochs, 2);
}

TEST(TrainCropTest, FlipProbabilityIsHonoured) {
  AugmentOptions o;
  o.flip_probability = 0.0;
  for (uint64_t i = 0; i < 500; ++i) {
    SampleRng rng(1, 0, i);
    EXPECT_FALSE(SampleTrainCrop(500, 375, o, rng).flip);
  }
  o.flip_probability = 1.0;
  for (uint64_t i = 0; i < 500; ++i) {
    SampleRng rng(1, 0, i);
    EXPECT_TRUE(SampleTrainCrop(500, 375, o, rng).flip);
  }
  o.flip_probability = 0.2;
  int flips = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    SampleRng rng(1, 0, i);
    flips += SampleTrainCrop(500, 375, o, rng).flip;
  }
  EXPECT_NEAR(flips, 2000, 200);
}

TEST(TrainCropTest, ScaleOneAndFixedRatioGivesTheWholeImage) {
  AugmentOptions o;
  o.scale_min = o.scale_max = 1.0;
  o.ratio_min = o.ratio_max = 400.0 / 300.0;
  SampleRng rng(0, 0, 0);
  const CropBox b = SampleTrainCrop(400, 300, o, rng);
  EXPECT_EQ(b.x, 0);
  EXPECT_EQ(b.y, 0);
  EXPECT_EQ(b.width, 400);
  EXPECT_EQ(b.height, 300);
}

CropBox Box(int x, int y, int w, int h) {
  CropBox b;
  b.x = x;
  b.y = y;
  b.width = w;
  b.height = h;
  return b;
}

// Reference boxes from torchvision 0.14: Resize(256) gives 341x256 for 500x375
// (int(256 * 500 / 375)), CenterCrop(224) starts at top 16, left round(58.5) = 58; in source
// pixels that is x = 58 * 500 / 341 = 85.04, y = 16 * 375 / 256 = 23.44, w = 224 * 500 / 341 =
// 328.4, h = 224 * 375 / 256 = 328.1.
TEST(EvalCropTest, MatchesTorchvisionResizeCenterCrop) {
  const AugmentOptions o;  // size 224, ratio 256 / 224
  EXPECT_EQ(EvalCrop(500, 375, o), Box(85, 23, 328, 328));
  EXPECT_EQ(EvalCrop(375, 500, o), Box(23, 85, 328, 328));
  // 500x333 -> 384x256, left 80, top 16: x = 104.2, y = 20.8, w = 291.7, h = 291.4.
  EXPECT_EQ(EvalCrop(500, 333, o), Box(104, 21, 292, 291));
  // A square: 256x256, crop at 16: x = y = 14, w = h = 196.
  EXPECT_EQ(EvalCrop(224, 224, o), Box(14, 14, 196, 196));
  EXPECT_EQ(EvalCrop(256, 256, o), Box(16, 16, 224, 224));
  // The exact box, which the resize maps onto the output: torchvision's resized pixels between
  // source pixels, and the resize reads the image around the crop.
  const CropBox e = EvalCrop(500, 375, o);
  EXPECT_NEAR(e.exact_x, 58 * 500.0 / 341, 1e-9);
  EXPECT_NEAR(e.exact_y, 16 * 375.0 / 256, 1e-9);
  EXPECT_NEAR(e.exact_width, 224 * 500.0 / 341, 1e-9);
  EXPECT_NEAR(e.exact_height, 224 * 375.0 / 256, 1e-9);
  EXPECT_FALSE(e.crop_first);
}

TEST(EvalCropTest, BoxesStayInsideAndNeverFlip) {
  const AugmentOptions o;
  for (const Shape s : {Shape{1, 1}, Shape{3, 1000}, Shape{1000, 3}, Shape{100, 80}, Shape{6000, 4000}}) {
    const CropBox b = EvalCrop(s.width, s.height, o);
    EXPECT_TRUE(Inside(b, s.width, s.height)) << s.width << "x" << s.height;
    EXPECT_FALSE(b.flip);
  }
}

TEST(SampleCropTest, DispatchesOnMode) {
  AugmentOptions o;
  SampleRng a(1, 1, 1), b(1, 1, 1);
  o.mode = AugmentMode::kTrain;
  EXPECT_EQ(SampleCrop(500, 375, o, a), SampleTrainCrop(500, 375, o, b));
  o.mode = AugmentMode::kEval;
  o.flip_probability = 0;  // --augment eval and none flip nothing; a recipe may ask them to
  EXPECT_EQ(SampleCrop(500, 375, o, a), EvalCrop(500, 375, o));
  o.mode = AugmentMode::kNone;
  EXPECT_EQ(SampleCrop(500, 375, o, a), Box(0, 0, 500, 375));
}

TEST(SampleCropTest, ARecipesFlipsApplyAfterResizeAndCenterCropToo) {
  AugmentOptions o;
  o.mode = AugmentMode::kEval;
  o.flip_probability = 1;
  o.vflip_probability = 1;
  SampleRng rng(1, 2, 3);
  const CropBox box = SampleCrop(500, 375, o, rng);
  EXPECT_TRUE(box.flip);
  EXPECT_TRUE(box.vflip);
  CropBox plain = EvalCrop(500, 375, o);
  EXPECT_EQ(std::make_tuple(box.x, box.y, box.width, box.height),
            std::make_tuple(plain.x, plain.y, plain.width, plain.height));
}

// A smooth gradient at full resolution: red grows with x, green with y, blue is constant.
// `denom` > 1 builds it as a DCT-downscaled decode would see it (pixel centres spread out).
cv::Mat Gradient(int full_w, int full_h, int denom = 1) {
  const int w = (full_w + denom - 1) / denom, h = (full_h + denom - 1) / denom;
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const double fx = (x + 0.5) * denom - 0.5, fy = (y + 0.5) * denom - 0.5;
      m.at<cv::Vec3b>(y, x) = cv::Vec3b(cv::saturate_cast<uint8_t>(fx * 255.0 / (full_w - 1)),
                                        cv::saturate_cast<uint8_t>(fy * 255.0 / (full_h - 1)), 77);
    }
  }
  return m;
}

// What the gradient holds at the centre of output pixel (i, j) of `box` resized to n x n.
cv::Vec3d Expected(const CropBox& box, int n, int i, int j, int full_w, int full_h) {
  const double fx = box.x + (j + 0.5) * box.width / n - 0.5;
  const double fy = box.y + (i + 0.5) * box.height / n - 0.5;
  return {fx * 255.0 / (full_w - 1), fy * 255.0 / (full_h - 1), 77};
}

double MaxError(const cv::Mat& out, const CropBox& box, int full_w, int full_h) {
  double worst = 0;
  const int n = out.cols;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const int jj = box.flip ? n - 1 - j : j;
      const cv::Vec3d want = Expected(box, n, i, jj, full_w, full_h);
      const cv::Vec3b got = out.at<cv::Vec3b>(i, j);
      for (int c = 0; c < 3; ++c) worst = std::max(worst, std::abs(got[c] - want[c]));
    }
  }
  return worst;
}

TEST(ResizeCropTest, ShrinkEnlargeAndFlipFollowTheGradient) {
  const cv::Mat src = Gradient(400, 300);
  cv::Mat out(64, 64, CV_8UC3);
  for (const CropBox& base : {Box(100, 50, 200, 200), Box(0, 0, 400, 300), Box(300, 200, 40, 30),
                              Box(10, 260, 64, 40)}) {
    for (bool flip : {false, true}) {
      CropBox box = base;
      box.flip = flip;
      ResizeCrop(src, 400, 300, box, out);
      EXPECT_LE(MaxError(out, box, 400, 300), 2.0)
          << box.x << "," << box.y << " " << box.width << "x" << box.height << " flip " << flip;
    }
  }
}

TEST(ResizeCropTest, DownscaledSourceGivesTheSameCrop) {
  // The box is in full-resolution coordinates whatever the decode scale; 401x301 makes the
  // scaled sizes round up (51x38 at 1/8), as libjpeg's do.
  for (int denom : {2, 4, 8}) {
    const cv::Mat src = Gradient(401, 301, denom);
    const CropBox box = Box(40, 30, 320, 256);
    cv::Mat out(32, 32, CV_8UC3);
    ResizeCrop(src, 401, 301, box, out);
    EXPECT_LE(MaxError(out, box, 401, 301), 0.6 * denom + 2.0) << "1/" << denom;
  }
}

TEST(ResizeCropTest, WritesIntoCallerMemoryWithoutReallocating) {
  const cv::Mat src = Gradient(400, 300);
  std::vector<uint8_t> slot(32 * 32 * 3 + 16, 0xAB);  // 16 guard bytes after the image
  cv::Mat dst(32, 32, CV_8UC3, slot.data());
  ResizeCrop(src, 400, 300, Box(0, 0, 400, 300), dst);
  EXPECT_EQ(dst.data, slot.data());
  EXPECT_LE(MaxError(dst, Box(0, 0, 400, 300), 400, 300), 2.0);
  for (size_t i = 32 * 32 * 3; i < slot.size(); ++i) EXPECT_EQ(slot[i], 0xAB) << i;
}

TEST(ResizeCropTest, DegenerateBoxesDoNotCrash) {
  const cv::Mat src = Gradient(9, 7);
  cv::Mat out(16, 16, CV_8UC3);
  ResizeCrop(src, 9, 7, Box(8, 6, 1, 1), out);   // one pixel, enlarged
  ResizeCrop(src, 9, 7, Box(0, 0, 9, 7), out);
  const cv::Mat tiny = Gradient(72, 56, 8);  // 9x7 standing for 72x56 at 1/8
  ResizeCrop(tiny, 72, 56, Box(70, 54, 2, 2), out);  // less than one scaled pixel
  EXPECT_EQ(out.cols, 16);
}

}  // namespace
}  // namespace coloader
