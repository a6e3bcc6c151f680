// The device path in a build without CUDA: Open fails, so consumers use the host path.
#include "client/device_mapper.h"

namespace coloader {

Result<std::unique_ptr<DeviceMapper>> DeviceMapper::Open(const DeviceTable&) {
  return Status::NotFound("this coloader client was built without CUDA");
}
Result<std::string> DeviceMapper::CurrentDeviceUuid() {
  return Status::NotFound("this coloader client was built without CUDA");
}
struct DeviceMapper::Cuda {};
DeviceMapper::DeviceMapper() = default;
DeviceMapper::~DeviceMapper() = default;
Status DeviceMapper::StreamWaitSlot(uint32_t, void*) { return Status::Internal("built without CUDA"); }
void DeviceMapper::WhenStreamDone(void*, std::function<void()> done) { done(); }
Result<uint8_t*> DeviceMapper::Allocate(uint64_t, void*) { return Status::Internal("built without CUDA"); }
void DeviceMapper::Free(uint8_t*, void*) {}
Status DeviceMapper::CopyAsync(void*, const void*, uint64_t, void*) { return Status::Internal("built without CUDA"); }

Status DeviceMapper::CopyToHost(void*, const void*, uint64_t, void*) { return Status::Internal("built without CUDA"); }

}  // namespace coloader
