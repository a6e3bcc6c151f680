#include "pipeline/assemble/sample_transform.h"

#include "pipeline/source/read.h"

namespace coloader {

SampleTransform::SampleTransform(TransformOptions opts) : opts_(std::move(opts)) {
  hwc_.create(opts_.augment.size, opts_.augment.size, CV_8UC3);
}

size_t SampleTransform::sample_bytes() const {
  const size_t s = static_cast<size_t>(opts_.augment.size);
  return s * s * 3 * DTypeSize(opts_.output);
}

void ApplyRecipe(const Recipe& recipe, TransformOptions* opts) {
  opts->augment = recipe.geometry;
  opts->pixel_ops = recipe.pixel_ops;
  opts->normalize = recipe.normalize;
  opts->erase = recipe.erase;
}

CropBox SampleTransform::Crop(int width, int height, uint64_t seed, uint64_t epoch, uint64_t index) const {
  SampleRng rng(seed, epoch, index);
  return SampleCrop(width, height, opts_.augment, rng);
}

EraseBox SampleTransform::EraseFor(uint64_t seed, uint64_t epoch, uint64_t index) const {
  return erases() ? DrawErase(opts_.augment.size, opts_.erase, seed, epoch, index) : EraseBox{};
}

Status SampleTransform::Run(const std::string& path, uint64_t seed, uint64_t epoch, uint64_t index, void* dst) {
  COLOADER_RETURN_NOT_OK(ReadWholeFile(path, &file_buf_));
  return RunBytes(file_buf_.data(), file_buf_.size(), path, seed, epoch, index, dst);
}

Status SampleTransform::RunBytes(const uint8_t* data, size_t size, const std::string& path, uint64_t seed,
                                 uint64_t epoch, uint64_t index, void* dst) {
  COLOADER_ASSIGN_OR_RETURN(ImageInfo info, decoder_.Peek(data, size, path));
  SampleRng rng(seed, epoch, index);
  const CropBox box = SampleCrop(info.width, info.height, opts_.augment, rng);
  const int denom = info.kind == ImageKind::kJpeg ? ChooseScaleDenom(box, opts_.augment.size, opts_.dct_scaling) : 1;
  ++scale_hist_[denom];
  cv::Mat out = Staging(dst);
  bool done = false;
  if (info.kind == ImageKind::kJpeg && opts_.crop_decode) {
    // The crop's rectangle in the scaled image (libjpeg's ceil(full / d) pixels a side).
    const int sw = (info.width + denom - 1) / denom, sh = (info.height + denom - 1) / denom;
    const cv::Rect rect = RegionFor(sw, sh, info.width, info.height, box, opts_.augment);
    if (rect.area() < int64_t{sw} * sh) {
      if (auto region = decoder_.DecodeJpegRegion(data, size, denom, rect)) {
        ResizeCropPixels(region->rgb(cv::Rect(rect.x - region->x, 0, rect.width, rect.height)), rect, sw, sh,
                         info.width, info.height, box, out, opts_.augment.interpolation, opts_.augment.exact_resize);
        ++region_decodes_;
        done = true;
      }
    }
  }
  if (!done) {
    COLOADER_ASSIGN_OR_RETURN(cv::Mat decoded, decoder_.DecodeRgb(data, size, denom, path));
    ResizeCrop(decoded, info.width, info.height, box, out, opts_.augment.interpolation, opts_.augment.exact_resize);
  }
  Finish(out, seed, epoch, index, dst);
  return Status::OK();
}

Status SampleTransform::RunDecoded(const cv::Mat& rgb, uint64_t seed, uint64_t epoch, uint64_t index, void* dst) {
  if (rgb.type() != CV_8UC3 || rgb.empty()) return Status::Invalid("an image to transform is H x W x 3 uint8");
  SampleRng rng(seed, epoch, index);
  const CropBox box = SampleCrop(rgb.cols, rgb.rows, opts_.augment, rng);
  cv::Mat out = Staging(dst);
  ResizeCrop(rgb, rgb.cols, rgb.rows, box, out, opts_.augment.interpolation, opts_.augment.exact_resize);
  Finish(out, seed, epoch, index, dst);
  return Status::OK();
}

cv::Mat SampleTransform::Staging(void* dst) {
  // uint8 NHWC output: the slot itself, no copy after the resize.
  const int s = opts_.augment.size;
  return direct() ? cv::Mat(s, s, CV_8UC3, dst) : hwc_;
}

PixelProgram SampleTransform::PixelFor(uint64_t seed, uint64_t epoch, uint64_t index) const {
  return DrawPixelProgram(opts_.pixel_ops, opts_.augment.size, seed, epoch, index);
}

void SampleTransform::Finish(cv::Mat& out, uint64_t seed, uint64_t epoch, uint64_t index, void* dst) {
  // The recipe's pixel ops (unless the device ring runs them), then the tensor.
  if (!opts_.pixel_ops.empty() && !opts_.pixel_ops_on_device) RunPixelProgram(out, PixelFor(seed, epoch, index));
  const int s = opts_.augment.size;
  if (!direct()) WriteSample(hwc_.data, s, s, opts_.output, opts_.layout, opts_.normalize, dst);
  if (erases() && !opts_.erase_on_device)
    EraseSample(dst, s, opts_.output, opts_.layout, opts_.erase, EraseFor(seed, epoch, index));
}

}  // namespace coloader
