// --decode gpu in a build without nvJPEG's header (or without CUDA): the same interface, a
// clear error at Make; --decode auto takes the CPU decoder.
#include "pipeline/decode/gpu_decode.h"

namespace coloader {

namespace {
const char kWhy[] =
    "this coloader was built without nvJPEG (configure with CUDA and nvjpeg.h: scripts/setup.sh "
    "fetches it into .deps/nvjpeg, or set -DCOLOADER_NVJPEG_ROOT=DIR)";
}

struct GpuDecodeStage::Impl {};
GpuDecodeStage::GpuDecodeStage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuDecodeStage::~GpuDecodeStage() = default;

Result<std::unique_ptr<GpuDecodeStage>> GpuDecodeStage::Make(const GpuDecodeOptions&) {
  return Status::Invalid(std::string("--decode gpu: ") + kWhy + "; use --decode cpu or auto");
}
bool GpuDecodeStage::HardwareAvailable(int, std::string* why) {
  *why = kWhy;
  return false;
}
Result<uint32_t> GpuDecodeStage::Finish(int, GpuBatch&) {
  return Status::Internal("built without nvJPEG");
}
const uint8_t* GpuDecodeStage::device_staging(uint32_t) const { return nullptr; }
int GpuDecodeStage::device() const { return -1; }
int GpuDecodeStage::lanes() const { return 0; }
bool GpuDecodeStage::hardware() const { return false; }
const AugmentOptions& GpuDecodeStage::augment() const {
  static const AugmentOptions none;
  return none;
}
GpuDecodeCounts GpuDecodeStage::counts() const { return {}; }
std::string GpuDecodeStage::description() const { return "none"; }

}  // namespace coloader
