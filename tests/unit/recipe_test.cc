// Recipes (pipeline/transform/recipe.h): what a recipe file means, and every way one is refused,
// named with its place in the file; the resize (resample.h) and erasing draws they rely on.
// Fidelity against torchvision itself is python/tests/test_recipes.py's.
#include "pipeline/transform/recipe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <tuple>

#include <opencv2/core.hpp>

#include "pipeline/transform/erase.h"
#include "pipeline/transform/resample.h"
#include "toolbox/json_reader.h"

namespace coloader {
namespace {

Result<Recipe> Parse(const std::string& yaml) {
  Result<JsonValue> doc = ParseYaml(yaml, "recipe.yaml");
  if (!doc.ok()) return doc.status();
  return ParseRecipe(*doc);
}

std::string ErrorOf(const std::string& yaml) {
  Result<Recipe> r = Parse(yaml);
  return r.ok() ? "(accepted)" : r.status().message();
}

TEST(RecipeTest, TheReferenceRecipeReadsAsTorchvisionStatesIt) {
  Result<Recipe> r = Parse(
      "- {op: RandomResizedCrop, size: 176, scale: [0.25, 1.0], interpolation: bicubic}\n"
      "- {op: RandomHorizontalFlip, p: 0.5}\n"
      "- {op: TrivialAugmentWide}\n"
      "- {op: PILToTensor}\n"
      "- {op: ConvertImageDtype, dtype: torch.float32}\n"
      "- {op: Normalize, mean: [0.5, 0.25, 0.125], std: [0.5, 0.5, 0.25]}\n"
      "- {op: RandomErasing, p: 0.1, value: random}\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->geometry.mode, AugmentMode::kTrain);
  EXPECT_EQ(r->geometry.size, 176);
  EXPECT_DOUBLE_EQ(r->geometry.scale_min, 0.25);
  EXPECT_DOUBLE_EQ(r->geometry.ratio_min, 3.0 / 4.0);  // torchvision's default
  EXPECT_EQ(r->geometry.interpolation, Interpolation::kBicubic);
  EXPECT_DOUBLE_EQ(r->geometry.flip_probability, 0.5);
  EXPECT_EQ(r->pixel_ops.size(), 1u);
  // Normalize on the 0..255 scale the host path computes in.
  EXPECT_FLOAT_EQ(r->normalize.mean[2], 0.125f * 255.f);
  EXPECT_FLOAT_EQ(r->normalize.std[2], 0.25f * 255.f);
  EXPECT_DOUBLE_EQ(r->erase.p, 0.1);
  EXPECT_TRUE(r->erase.random_value);
  EXPECT_EQ(r->pixel_ops[0]->max_steps(), 1);  // TrivialAugmentWide: one op per image
  EXPECT_EQ(r->ops.size(), 5u);  // the conversions are implied, not listed
  EXPECT_NE(r->Describe().find("RandomErasing(p=0.1"), std::string::npos) << r->Describe();
}

TEST(RecipeTest, TheEvalRecipeIsResizeThenCenterCrop) {
  Result<Recipe> r = Parse("ops:\n  - {op: Resize, size: 232}\n  - {op: CenterCrop, size: 224}\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->geometry.mode, AugmentMode::kEval);
  EXPECT_EQ(r->geometry.size, 224);
  EXPECT_DOUBLE_EQ(r->geometry.eval_resize_ratio, 232.0 / 224.0);
  EXPECT_DOUBLE_EQ(r->geometry.flip_probability, 0.0);  // no flip unless the recipe says so
  // No Normalize: ToTensor's x / 255.
  EXPECT_FLOAT_EQ(r->normalize.mean[0], 0.f);
  EXPECT_FLOAT_EQ(r->normalize.std[0], 255.f);
  // [s] is an int's meaning (the shorter side); [s, s] resizes to a square.
  EXPECT_EQ(Parse("- {op: Resize, size: [64, 64]}")->geometry.mode, AugmentMode::kNone);
  EXPECT_NE(ErrorOf("- {op: Resize, size: [64]}").find("CenterCrop"), std::string::npos);
}

TEST(RecipeTest, RandomCropIsACropAfterResizeAndAPaddedWindowAfterAFixedSize) {
  // The older ImageNet recipe: Resize(256) + RandomCrop(224), the eval geometry at a random place.
  Result<Recipe> r = Parse("- {op: Resize, size: 256}\n- {op: RandomCrop, size: 224}\n- {op: RandomHorizontalFlip}\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->geometry.mode, AugmentMode::kEval);
  EXPECT_TRUE(r->geometry.eval_random_position);
  EXPECT_TRUE(r->pixel_ops.empty());
  // Its boxes move, stay inside the image and keep the resized scale.
  std::set<int> lefts;
  for (uint64_t i = 0; i < 50; ++i) {
    SampleRng rng(1, 0, i);
    const CropBox b = SampleCrop(500, 375, r->geometry, rng);
    lefts.insert(b.x);
    EXPECT_GE(b.x, 0);
    EXPECT_LE(b.x + b.width, 500);
    EXPECT_NEAR(b.exact_width, 224.0 * 375 / 256, 1.0);
  }
  EXPECT_GT(lefts.size(), 10u);
  // CIFAR's: a fixed size, then a window of the padded image (a pixel op), a flip after it.
  r = Parse("- {op: Resize, size: [32, 32]}\n- {op: RandomCrop, size: 32, padding: 4, padding_mode: reflect}\n"
            "- {op: RandomHorizontalFlip}\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->pixel_ops.size(), 1u);
  EXPECT_DOUBLE_EQ(r->geometry.flip_probability, 0.5);
  int moved = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    const PixelProgram p = DrawPixelProgram(r->pixel_ops, 32, 1, 0, i);
    ASSERT_LE(p.count, 1);
    if (p.count == 0) continue;
    ++moved;
    EXPECT_EQ(p.steps[0].kind, PixelKind::kPadCrop);
    EXPECT_LE(std::abs(p.steps[0].f[0]), 4.0);
    EXPECT_LE(std::abs(p.steps[0].f[1]), 4.0);
    EXPECT_EQ(p.steps[0].f[2], static_cast<double>(PadMode::kReflect));
  }
  EXPECT_GT(moved, 90);  // the window on the image itself (no step) is 1 in 81
}

TEST(RecipeTest, NamedRecipesAreTheOldDefaults) {
  const Recipe train = NamedRecipe(AugmentMode::kTrain, 224);
  EXPECT_EQ(train.geometry.mode, AugmentMode::kTrain);
  EXPECT_DOUBLE_EQ(train.geometry.flip_probability, 0.5);
  EXPECT_FLOAT_EQ(train.normalize.mean[0], NormalizeParams{}.mean[0]);
  EXPECT_TRUE(train.pixel_ops.empty());
  EXPECT_DOUBLE_EQ(NamedRecipe(AugmentMode::kEval, 224).geometry.flip_probability, 0.0);
  EXPECT_DOUBLE_EQ(NamedRecipe(AugmentMode::kNone, 224).geometry.flip_probability, 0.0);
}

TEST(RecipeTest, EveryRefusalNamesWhereWhatAndWhatToDo) {
  struct Case {
    const char* yaml;
    const char* says;
  };
  const Case cases[] = {
      {"- {op: RandomResizedCrop, size: 32}\n- {op: Posterize, bits: 2}\n",
       "recipe.yaml:2:8: 'Posterize' has no native twin"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: Lambda}\n", "coloader.Producer"},
      {"- {op: RandomResizedCrop, size: 32, antialias: false}\n", "'antialias' false"},
      {"- {op: RandomResizedCrop, size: [32, 48]}\n", "not square"},
      {"- {op: RandomResizedCrop, size: 32, scale: [0.9, 0.1]}\n", "0 <= lo <= hi"},
      {"- {op: RandomResizedCrop, size: 32, sclae: [0.1, 0.9]}\n", "has no argument 'sclae'"},
      {"- {op: Resize, size: 256, max_size: 300}\n- {op: CenterCrop, size: 224}\n", "max_size"},
      {"- {op: Resize, size: 32}\n- {op: CenterCrop, size: 64}\n", "larger than the Resize's 32"},
      {"- {op: CenterCrop, size: 32}\n", "follows Resize(int)"},
      {"- {op: Normalize, mean: [0.5], std: [0.5]}\n", "no output size"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: RandomResizedCrop, size: 32}\n", "has its crop already"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: TrivialAugmentWide}\n- {op: RandomHorizontalFlip}\n",
       "before the pixel ops"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: Normalize, mean: [0.5], std: [0.5]}\n- {op: ColorJitter}\n",
       "must come before ToTensor/Normalize"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: RandomErasing}\n- {op: Normalize, mean: [0.5], std: [0.5]}\n",
       "must come before RandomErasing"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: Normalize, mean: [0.5, 0.5], std: [0.5]}\n", "one number or three"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: Normalize, mean: [0.5], std: [0]}\n", "'std' must be positive"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: ColorJitter, hue: 0.7}\n", "'hue' must be in [0, 0.5]"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: GaussianBlur, kernel_size: 4}\n", "odd positive"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: RandAugment, magnitude: 31}\n", "'magnitude' must be in [0, 30]"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: AutoAugment, policy: cifar10}\n", "must be imagenet"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: TrivialAugmentWide, interpolation: bilinear}\n",
       "interpolation nearest"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: RandomErasing, value: noise}\n", "\"random\""},
      {"- {op: RandomResizedCrop, size: 32, interpolation: lanczos}\n", "bilinear, bicubic or nearest"},
      {"[]", "non-empty list of ops"},
      {"- [RandomResizedCrop, 32]\n", "each op must be an object"},
      {"- {size: 32}\n", "needs 'op'"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: RandomHorizontalFlip}\n- {op: RandomHorizontalFlip}\n",
       "has it already"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: ToDtype, dtype: float32}\n", "scale=True"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: RandAugment, num_magnitude_bins: 5}\n", "past the last of 5"},
      {"- {op: RandomCrop, size: 32, padding: 4}\n", "follows the op that sets the image's size"},
      {"- {op: Resize, size: 256}\n- {op: RandomCrop, size: 224, padding: 4}\n", "takes no padding"},
      {"- {op: Resize, size: 32}\n- {op: RandomCrop, size: 64}\n", "larger than the Resize's 32"},
      {"- {op: Resize, size: [32, 32]}\n- {op: RandomCrop, size: 28}\n", "keeps the size the ops before it made (32)"},
      {"- {op: Resize, size: [8, 8]}\n- {op: RandomCrop, size: 8, padding: 8, padding_mode: reflect}\n",
       "smaller than the image's 8"},
      {"- {op: Resize, size: [8, 8]}\n- {op: RandomCrop, size: 8, padding: 2, padding_mode: wrap}\n",
       "constant, edge, reflect or symmetric"},
      {"- {op: Resize, size: [8, 8]}\n- {op: RandomCrop, size: 8, padding: [1, 2, 3]}\n", "[left, top, right, bottom]"},
      {"- {op: Resize, size: [8, 8]}\n- {op: RandomCrop, size: 8, padding: [2, 0, 1, 0]}\n- {op: RandomHorizontalFlip}\n",
       "must come before the pixel ops"},
      {"- {op: Resize, size: 256}\n- {op: ColorJitter, hue: 0.1}\n- {op: CenterCrop, size: 224}\n",
       "comes before the pixel ops"},
      {"- {op: RandomResizedCrop, size: 32}\n- {op: RandAugment, num_ops: 16}\n- {op: ColorJitter, hue: 0.1}\n"
       "- {op: RandAugment, num_ops: 6}\n",
       "may apply 26 kernels to one image; coloader runs at most 24"},
  };
  for (const Case& c : cases) {
    const std::string error = ErrorOf(c.yaml);
    EXPECT_NE(error.find(c.says), std::string::npos) << c.yaml << "\n  said: " << error;
  }
}

TEST(RecipeTest, APythonRecipeFileIsRefusedWithHowToTranslateIt) {
  Result<Recipe> r = ReadRecipeFile("/tmp/recipe.py");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("python -m coloader serve --transform /tmp/recipe.py"), std::string::npos);
  EXPECT_NE(ReadRecipeFile("/no/such/recipe.yaml").status().message().find("/no/such/recipe.yaml"), std::string::npos);
}

// The resize keeps a constant image constant and reproduces an image resized to its own size,
// for every filter and for fractional boxes: the taps' weights are normalised and centred.
TEST(ResampleTest, ConstantStaysConstantAndIdentityIsExact) {
  cv::Mat flat(37, 53, CV_8UC3, cv::Scalar(17, 130, 250));
  cv::Mat noise(40, 60, CV_8UC3);
  cv::randu(noise, 0, 256);
  for (const Interpolation i : {Interpolation::kNearest, Interpolation::kBilinear, Interpolation::kBicubic}) {
    for (const int out : {5, 16, 37, 90}) {
      cv::Mat dst(out, out, CV_8UC3);
      ResampleBox(flat, 1.5, 2.25, 40.75, 30.5, i, dst);
      EXPECT_EQ(cv::norm(dst, cv::Mat(out, out, CV_8UC3, cv::Scalar(17, 130, 250)), cv::NORM_INF), 0)
          << InterpolationName(i) << " to " << out;
    }
    cv::Mat same(40, 60, CV_8UC3);
    ResampleBox(noise, 0, 0, 60, 40, i, same);
    EXPECT_EQ(cv::norm(same, noise, cv::NORM_INF), 0) << InterpolationName(i);
  }
}

// A shrink averages every source pixel it covers (antialiasing): a 1-pixel checkerboard shrunk
// 4x is mid-grey, where point sampling would keep it black or white.
TEST(ResampleTest, ShrinksAreAntialiased) {
  cv::Mat board(64, 64, CV_8UC3);
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 64; ++x) board.at<cv::Vec3b>(y, x) = (x + y) % 2 ? cv::Vec3b(255, 255, 255) : cv::Vec3b(0, 0, 0);
  for (const Interpolation i : {Interpolation::kBilinear, Interpolation::kBicubic}) {
    cv::Mat dst(16, 16, CV_8UC3);
    ResampleBox(board, 0, 0, 64, 64, i, dst);
    double lo, hi;
    cv::minMaxLoc(dst.reshape(1), &lo, &hi);
    EXPECT_GE(lo, 110) << InterpolationName(i);
    EXPECT_LE(hi, 145) << InterpolationName(i);
  }
}

TEST(EraseTest, TheBoxIsAFunctionOfTheSampleAndFollowsTheOptions) {
  EraseOptions o;
  o.p = 1;
  int erased = 0;
  for (uint64_t index = 0; index < 500; ++index) {
    const EraseBox a = DrawErase(64, o, 3, 1, index), b = DrawErase(64, o, 3, 1, index);
    EXPECT_EQ(std::make_tuple(a.erase, a.top, a.left, a.height, a.width, a.noise_key),
              std::make_tuple(b.erase, b.top, b.left, b.height, b.width, b.noise_key));
    if (!a.erase) continue;
    ++erased;
    const double area = double(a.height) * a.width / (64.0 * 64.0);
    EXPECT_GE(area, o.scale_min * 0.8);
    EXPECT_LE(area, o.scale_max * 1.2);
    EXPECT_LE(a.top + a.height, 64);
    EXPECT_LE(a.left + a.width, 64);
  }
  EXPECT_GT(erased, 400);  // p = 1: only boxes that fit nowhere in 10 tries are skipped
  o.p = 0;
  EXPECT_FALSE(DrawErase(64, o, 3, 1, 7).erase);
}

TEST(EraseTest, NoiseIsStandardNormal) {
  double sum = 0, squares = 0;
  const int n = 200000;
  for (int e = 0; e < n; ++e) {
    const double v = EraseNoise(0xABCDEFull, static_cast<uint32_t>(e));
    sum += v;
    squares += v * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(squares / n, 1.0, 0.02);
}

}  // namespace
}  // namespace coloader
