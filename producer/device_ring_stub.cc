// The device ring in a build without CUDA: the same interface, a clear error at Make.
#include "producer/device_ring.h"

namespace coloader {

struct DeviceRing::Impl {};
DeviceRing::DeviceRing(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceRing::~DeviceRing() = default;
uint64_t DeviceRing::device_bytes() const { return 0; }

Result<std::unique_ptr<DeviceRing>> DeviceRing::Make(const DeviceRingOptions& o) {
  return Status::Invalid("--device cuda:" + std::to_string(o.device) +
                         ": this coloader was built without CUDA (configure with -DCOLOADER_WITH_CUDA=ON where nvcc is installed)");
}
Status DeviceRing::Upload(uint32_t, uint32_t, const uint8_t*, int, const std::vector<EraseBox>*,
                          const std::vector<PixelProgram>*) { return Status::Internal("built without CUDA"); }
Status DeviceRing::DownloadToHost(uint32_t, uint32_t) { return Status::Internal("built without CUDA"); }
Status DeviceRing::WaitIdle(uint32_t) { return Status::Internal("built without CUDA"); }
Status SetGpuWait(int, bool) { return Status::OK(); }  // DeviceRing::Make reports the missing CUDA

}  // namespace coloader
