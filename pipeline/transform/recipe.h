// A training recipe as torchvision states it: a list of named ops with their keyword arguments,
// read from JSON or YAML (`serve --transform recipe.yaml`) or made from `--augment train|eval|none`.
//
//   - {op: RandomResizedCrop, size: 176, scale: [0.08, 1.0], interpolation: bilinear}
//   - {op: RandomHorizontalFlip, p: 0.5}
//   - {op: TrivialAugmentWide}
//   - {op: Normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
//   - {op: RandomErasing, p: 0.1}
//
// A recipe runs in three phases, in the order torchvision runs them on a PIL image or a uint8
// tensor and then on the float tensor:
//   1. geometry, fused with decoding: RandomResizedCrop, or Resize + CenterCrop, or CenterCrop,
//      picks the box of the source that becomes the size x size output (a region decode, a DCT
//      scale), then the flips;
//   2. pixel ops on the uint8 RGB image (ColorJitter, RandomGrayscale, GaussianBlur, the
//      automatic augmentations), each drawing its parameters from the sample's SampleRng;
//   3. the float tensor: ToTensor/ConvertImageDtype (implied), Normalize, then RandomErasing.
// An op out of that order, an op with no native twin or an argument the twin cannot honour is
// an error that names the op, the argument and what to do.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "pipeline/transform/augment.h"
#include "pipeline/transform/erase.h"
#include "pipeline/transform/normalize.h"
#include "pipeline/transform/pixel_ops.h"

namespace coloader {

struct Recipe {
  // Phase 1: the box and the output size (geometry.mode: kTrain = RandomResizedCrop, kEval =
  // Resize + CenterCrop, kNone = Resize to size x size), its interpolation, the flips.
  AugmentOptions geometry;
  // Phase 2, in order.
  PixelOps pixel_ops;
  // Phase 3. Without a Normalize, a float output is x / 255 (ToTensor's).
  NormalizeParams normalize;
  EraseOptions erase;
  // The ops as read, one line each ("RandomResizedCrop(size=176, scale=(0.08, 1.0), ...)"), for
  // the producer's log and its data key.
  std::vector<std::string> ops;

  // The whole recipe on one line: what the producer logs and the data key mixes.
  std::string Describe() const;
};

// `--augment train|eval|none` at `size`, as the recipes they always were:
//   train: RandomResizedCrop(size) + RandomHorizontalFlip() + Normalize(ImageNet)
//   eval:  Resize(round(size * 256 / 224)) + CenterCrop(size) + Normalize(ImageNet)
//   none:  Resize((size, size)) + Normalize(ImageNet)
Recipe NamedRecipe(AugmentMode mode, int size);

// A recipe from its JSON/YAML tree: a list of ops, or an object with the list under "ops".
// Errors say where (file:line:column), which op and argument, and what to do.
Result<Recipe> ParseRecipe(const class JsonValue& doc);
// From a file (.json, .yaml/.yml). A .py file is refused with how to translate it.
Result<Recipe> ReadRecipeFile(const std::string& path);

}  // namespace coloader
