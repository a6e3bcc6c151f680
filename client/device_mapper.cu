#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#include "client/device_mapper.h"
#include "common/cuda_internal.h"
#include "common/log.h"
#include "common/process.h"

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

struct DeviceMapper::Cuda {
  // A release: `done` runs once `event`, recorded after the work it must follow, has fired.
  struct Release {
    CudaEvent event;
    std::function<void()> done;
  };
  // Made in this order, freed in reverse: the events, the mapping, the pool (a pool goes last:
  // buffers still allocated from it would keep it alive; every batch holds this mapper, so none are).
  CudaMemPool pool;
  CudaIpcMapping base;
  std::vector<CudaEvent> slot_events;  // the producer's, one per slot
  // Under release_mu_:
  std::deque<Release> releases;
  std::vector<CudaEvent> free_events;  // recorded and waited for: reused
};

DeviceMapper::DeviceMapper() : cuda_(std::make_unique<Cuda>()) {}

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
  Cuda& cuda = *m->cuda_;
  void* base = nullptr;
  CUDA_RETURN_NOT_OK(cudaIpcOpenMemHandle(&base, mem, cudaIpcMemLazyEnablePeerAccess));
  cuda.base.reset(static_cast<uint8_t*>(base));
  m->base_ = cuda.base.get();
  for (const std::string& h : t.event_handles) {
    cudaIpcEventHandle_t eh;
    std::memcpy(&eh, h.data(), sizeof(eh));
    cudaEvent_t e = nullptr;
    CUDA_RETURN_NOT_OK(cudaIpcOpenEventHandle(&e, eh));
    cuda.slot_events.emplace_back(e);
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  CUDA_RETURN_NOT_OK(cudaMemPoolCreate(&pool, &props));
  cuda.pool.reset(pool);
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
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    stopping_ = true;
  }
  release_cv_.notify_one();
  if (release_thread_.joinable()) release_thread_.join();  // runs what is pending first
  if (device_ < 0) return;  // Open failed before choosing a device: nothing was made
  DeviceGuard guard(device_);
  cuda_.reset();
}

Status DeviceMapper::StreamWaitSlot(uint32_t slot, void* stream) {
  DeviceGuard guard(device_);
  CUDA_RETURN_NOT_OK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), cuda_->slot_events[slot].get(), 0));
  return Status::OK();
}

void DeviceMapper::WhenStreamDone(void* stream, std::function<void()> done) {
  // An event recorded on the stream, waited for by this mapper's release thread: the stream
  // itself never waits (cudaLaunchHostFunc would hold it until a host thread had run the
  // callback, ~0.35 ms a batch measured on the H200: docs/BENCHMARKS.md).
  CudaEvent event;
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    if (!cuda_->free_events.empty()) {
      event = std::move(cuda_->free_events.back());
      cuda_->free_events.pop_back();
    }
  }
  DeviceGuard guard(device_);
  cudaError_t err = guard.ok() ? cudaSuccess : cudaErrorInvalidDevice;
  if (err == cudaSuccess && !event) err = CudaEventCreate(&event, cudaEventDisableTiming | cudaEventBlockingSync);
  if (err == cudaSuccess) err = cudaEventRecord(event.get(), static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    cudaGetLastError();
    event.reset();
    // Not silently: an ack that does not wait for the stream lets the producer overwrite a
    // slot that a kernel may still read.
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      char where[32];
      std::snprintf(where, sizeof where, "%p", stream);
      Log(LogLevel::kWarning, std::string("cannot order a release after the work on stream ") + where + " (" +
                                  cudaGetErrorString(err) + "); acking at once");
    }
    done();
    return;
  }
  Status no_thread;
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    if (!release_thread_.joinable()) {
      Result<std::thread> t = StartThread("the consumer's release thread", [this] { ReleaseLoop(); });
      if (t.ok()) release_thread_ = std::move(*t);
      else no_thread = t.status();
    }
    if (no_thread.ok()) cuda_->releases.push_back({std::move(event), std::move(done)});
  }
  if (!no_thread.ok()) {
    // No thread to wait with (the thread limit): wait here; correct, if slower. (Said outside
    // the lock: a log handler may run code that releases another batch.)
    Log(LogLevel::kWarning, no_thread.message() + "; releases wait for their stream on the caller's thread");
    cudaEventSynchronize(event.get());
    event.reset();
    done();
    return;
  }
  release_cv_.notify_one();
}

void DeviceMapper::ReleaseLoop() {
  NameThisThread("cl-release");
  cudaSetDevice(device_);
  std::deque<Cuda::Release>& releases = cuda_->releases;
  std::unique_lock<std::mutex> lock(release_mu_);
  for (;;) {
    release_cv_.wait(lock, [&] { return !releases.empty() || stopping_; });
    if (releases.empty()) return;  // stopping, and nothing left to wait for
    Cuda::Release r = std::move(releases.front());
    releases.pop_front();
    lock.unlock();
    // Blocking (cudaEventBlockingSync): this thread sleeps, it does not spin a core.
    cudaEventSynchronize(r.event.get());
    r.done();
    lock.lock();
    cuda_->free_events.push_back(std::move(r.event));
  }
}

Result<uint8_t*> DeviceMapper::Allocate(uint64_t bytes, void* stream) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  CUDA_RETURN_NOT_OK(cudaMallocFromPoolAsync(&p, bytes, cuda_->pool.get(), static_cast<cudaStream_t>(stream)));
  return static_cast<uint8_t*>(p);
}

void DeviceMapper::Free(uint8_t* ptr, void* stream) {
  if (!ptr) return;
  DeviceGuard guard(device_);
  if (cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)) != cudaSuccess) cudaGetLastError();
}

Status DeviceMapper::CopyAsync(void* dst, const void* src, uint64_t bytes, void* stream) {
  // The producer's GPU current, as for the slot's wait and the allocation: stream 0 (the legacy
  // default stream) is the current device's, and all three must be queued on the same one.
  DeviceGuard guard(device_);
  CUDA_RETURN_NOT_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
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
