#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "client/device_mapper.h"
#include "common/cuda_internal.h"

namespace coloader {

namespace {

// Makes `device` current for a scope and restores the caller's: the consumer's calls must not
// change which GPU the training code (torch's current device) works on.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      ok_ = cudaSetDevice(device) == cudaSuccess;
      changed_ = previous_ >= 0;
    }
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  bool ok() const { return ok_; }

 private:
  int previous_ = -1;
  bool ok_ = true, changed_ = false;
};

}  // namespace

Result<std::unique_ptr<DeviceMapper>> DeviceMapper::Open(const DeviceTable& t) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::NotFound("no CUDA device is visible to this process");
  }
  int device = -1;
  for (int d = 0; d < count && device < 0; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess &&
        t.device_uuid.size() == sizeof(prop.uuid.bytes) &&
        std::memcmp(prop.uuid.bytes, t.device_uuid.data(), sizeof(prop.uuid.bytes)) == 0)
      device = d;
  }
  if (device < 0) return Status::NotFound("the producer's GPU is not visible to this process");
  DeviceGuard guard(device);
  std::unique_ptr<DeviceMapper> m(new DeviceMapper());
  m->device_ = device;
  m->slot_bytes_ = t.slot_bytes;
  cudaIpcMemHandle_t mem;
  std::memcpy(&mem, t.mem_handle.data(), sizeof(mem));
  void* base = nullptr;
  CUDA_RETURN_NOT_OK(cudaIpcOpenMemHandle(&base, mem, cudaIpcMemLazyEnablePeerAccess));
  m->base_ = static_cast<uint8_t*>(base);
  for (const std::string& h : t.event_handles) {
    cudaIpcEventHandle_t eh;
    std::memcpy(&eh, h.data(), sizeof(eh));
    cudaEvent_t e = nullptr;
    CUDA_RETURN_NOT_OK(cudaIpcOpenEventHandle(&e, eh));
    m->events_.push_back(e);
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  CUDA_RETURN_NOT_OK(cudaMemPoolCreate(&pool, &props));
  m->pool_ = pool;
  // A job holds a batch or two (the one it computes on, the next one being copied); keeping
  // four slots' worth cached makes every later allocation a reuse.
  uint64_t keep = 4 * t.slot_bytes;
  CUDA_RETURN_NOT_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  return Result<std::unique_ptr<DeviceMapper>>(std::move(m));
}

Result<std::string> DeviceMapper::CurrentDeviceUuid() {
  int device = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::NotFound("no CUDA device is visible to this process");
  }
  CUDA_RETURN_NOT_OK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_RETURN_NOT_OK(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes));
}

DeviceMapper::~DeviceMapper() {
  DeviceGuard guard(device_);
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (base_) cudaIpcCloseMemHandle(base_);
  // Buffers still allocated from it (none: every batch holds this mapper) would keep it until freed.
  if (pool_) cudaMemPoolDestroy(static_cast<cudaMemPool_t>(pool_));
}

Status DeviceMapper::StreamWaitSlot(uint32_t slot, void* stream) {
  DeviceGuard guard(device_);
  CUDA_RETURN_NOT_OK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(events_[slot]), 0));
  return Status::OK();
}

namespace {
void CUDART_CB RunCallback(void* data) {
  auto* fn = static_cast<std::function<void()>*>(data);
  (*fn)();
  delete fn;
}
}  // namespace

void DeviceMapper::WhenStreamDone(void* stream, std::function<void()> done) {
  auto* fn = new std::function<void()>(std::move(done));
  DeviceGuard guard(device_);
  cudaError_t err = guard.ok() ? cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), RunCallback, fn)
                               : cudaErrorInvalidDevice;
  if (err != cudaSuccess) {
    cudaGetLastError();
    // Not silently: an ack that does not wait for the stream lets the producer overwrite a
    // slot that a kernel may still read.
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      std::fprintf(stderr, "coloader: cannot order a release after the work on stream %p (%s); acking at once\n",
                   stream, cudaGetErrorString(err));
    }
    RunCallback(fn);
  }
}

Result<uint8_t*> DeviceMapper::Allocate(uint64_t bytes, void* stream) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  CUDA_RETURN_NOT_OK(cudaMallocFromPoolAsync(&p, bytes, static_cast<cudaMemPool_t>(pool_), static_cast<cudaStream_t>(stream)));
  return static_cast<uint8_t*>(p);
}

void DeviceMapper::Free(uint8_t* ptr, void* stream) {
  if (!ptr) return;
  DeviceGuard guard(device_);
  if (cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)) != cudaSuccess) cudaGetLastError();
}

namespace {

// A plain copy through the SMs, 16 bytes a thread per step. The source is the producer's
// memory, opened through CUDA IPC: kernels read it at the device's bandwidth, while
// cudaMemcpyAsync treats it as another context's memory and is several times slower there
// (measured on the H200: docs/BENCHMARKS.md).
__global__ void CopyWords(uint4* __restrict__ dst, const uint4* __restrict__ src, uint64_t words) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words; i += stride) dst[i] = src[i];
}

}  // namespace

Status DeviceMapper::CopyAsync(void* dst, const void* src, uint64_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const uint64_t words = bytes / 16, tail = bytes % 16;
  const bool aligned = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0;
  if (!aligned || words < 4096) {  // small or unaligned (labels, a sample of odd size): the runtime's copy
    CUDA_RETURN_NOT_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    return Status::OK();
  }
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<uint64_t>((words + kThreads - 1) / kThreads, 4096));
  CopyWords<<<blocks, kThreads, 0, s>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src), words);
  CUDA_RETURN_NOT_OK(cudaGetLastError());
  if (tail)
    CUDA_RETURN_NOT_OK(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + 16 * words, static_cast<const uint8_t*>(src) + 16 * words,
                                       tail, cudaMemcpyDeviceToDevice, s));
  return Status::OK();
}

Status DeviceMapper::CopyToHost(void* dst, const void* src, uint64_t bytes, void* stream) {
  DeviceGuard guard(device_);
  auto s = static_cast<cudaStream_t>(stream);
  CUDA_RETURN_NOT_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  CUDA_RETURN_NOT_OK(cudaStreamSynchronize(s));
  return Status::OK();
}

}  // namespace coloader
