// The recipe functions of the producer's C ABI (producer/c_api.h): the native twin of a recipe
// on one decoded image, and one automatic-augmentation op at a fixed magnitude. Each runs inside
// Guard() (common/c_abi_internal.h): nothing unwinds into C or Python.
#include <string>

#include <opencv2/core.hpp>

#include "common/c_abi_internal.h"
#include "pipeline/assemble/sample_transform.h"
#include "pipeline/transform/pixel_ops.h"
#include "pipeline/transform/recipe.h"
#include "producer/c_api.h"
#include "toolbox/json_reader.h"

using coloader::c_abi::Fail;
using coloader::c_abi::Guard;
using coloader::c_abi::NullArgument;

namespace {

coloader::Result<coloader::Recipe> ParseRecipeText(const char* text) {
  COLOADER_ASSIGN_OR_RETURN(const coloader::JsonValue doc, coloader::ParseJson(text, "recipe"));
  return coloader::ParseRecipe(doc);
}

}  // namespace

extern "C" {

int coloader_recipe_image_size(const char* recipe, int32_t* size) {
  constexpr const char* kWhat = "coloader_recipe_image_size";
  return Guard(kWhat, [&]() -> int {
    if (recipe == nullptr) return NullArgument(kWhat, "recipe");
    if (size == nullptr) return NullArgument(kWhat, "size");
    coloader::Result<coloader::Recipe> r = ParseRecipeText(recipe);
    if (!r.ok()) return Fail(r.status());
    *size = r->geometry.size;
    return COLOADER_OK;
  });
}

int coloader_recipe_apply(const char* recipe, const uint8_t* rgb, int32_t height, int32_t width, uint64_t seed,
                          uint64_t epoch, uint64_t index, int32_t out_dtype, void* out) {
  constexpr const char* kWhat = "coloader_recipe_apply";
  return Guard(kWhat, [&]() -> int {
    if (recipe == nullptr) return NullArgument(kWhat, "recipe");
    if (rgb == nullptr) return NullArgument(kWhat, "rgb");
    if (out == nullptr) return NullArgument(kWhat, "out");
    if (height < 1 || width < 1) return Fail(coloader::Status::Invalid("coloader_recipe_apply: an empty image"));
    if (out_dtype != COLOADER_UINT8 && out_dtype != COLOADER_FLOAT32)
      return Fail(coloader::Status::Invalid("coloader_recipe_apply: out_dtype must be uint8 or float32"));
    coloader::Result<coloader::Recipe> r = ParseRecipeText(recipe);
    if (!r.ok()) return Fail(r.status());
    coloader::TransformOptions to;
    coloader::ApplyRecipe(*r, &to);
    to.output = out_dtype == COLOADER_UINT8 ? coloader::DType::kUInt8 : coloader::DType::kFloat32;
    to.layout = coloader::TensorLayout::kNHWC;
    if (to.output == coloader::DType::kUInt8) to.erase.p = 0;  // erasing is of the normalised tensor
    coloader::SampleTransform t(to);
    const cv::Mat image(height, width, CV_8UC3, const_cast<uint8_t*>(rgb));
    const coloader::Status st = t.RunDecoded(image, seed, epoch, index, out);
    return st.ok() ? COLOADER_OK : Fail(st);
  });
}

int coloader_augment_op(const char* name, double magnitude, uint8_t* rgb, int32_t height, int32_t width,
                        const float* fill) {
  constexpr const char* kWhat = "coloader_augment_op";
  return Guard(kWhat, [&]() -> int {
    if (name == nullptr) return NullArgument(kWhat, "name");
    if (rgb == nullptr) return NullArgument(kWhat, "rgb");
    if (height < 1 || width < 1) return Fail(coloader::Status::Invalid("coloader_augment_op: an empty image"));
    const float black[3] = {0, 0, 0};
    cv::Mat image(height, width, CV_8UC3, rgb);
    const coloader::Status st =
        coloader::ApplyAugmentOp(image, name, magnitude, coloader::Interpolation::kNearest, fill ? fill : black);
    return st.ok() ? COLOADER_OK : Fail(st);
  });
}

}  // extern "C"
