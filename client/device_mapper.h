// The consumer's view of a producer's device ring: the IPC allocation opened once, one
// interprocess event per slot, and the stream-ordered operations a Batch needs. No CUDA types
// in this header; streams are cudaStream_t passed as void*. A build without CUDA links the
// stub, whose Open fails (and the consumer falls back to the host path).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "common/protocol.h"
#include "common/status.h"

namespace coloader {

class DeviceMapper {
 public:
  // Finds the local device with the table's UUID, opens the memory handle and the events.
  // Fails when this process cannot map it (no such device visible, a MIG instance, another
  // container): the caller then uses the host path.
  static Result<std::unique_ptr<DeviceMapper>> Open(const DeviceTable& table);
  // The UUID (16 bytes) of this thread's current CUDA device: the GPU the consumer computes
  // on, so that a producer with rings on several GPUs serves it from that one's.
  static Result<std::string> CurrentDeviceUuid();
  ~DeviceMapper();
  DeviceMapper(const DeviceMapper&) = delete;
  DeviceMapper& operator=(const DeviceMapper&) = delete;

  int device() const { return device_; }
  uint8_t* slot_base(uint32_t slot) const { return base_ + slot * slot_bytes_; }

  // Makes `stream` wait for the producer's work on `slot` (no host synchronisation).
  Status StreamWaitSlot(uint32_t slot, void* stream);
  // Runs `done` on this mapper's release thread once everything enqueued on `stream` so far
  // has finished (an event recorded there; the stream does not wait for it). `done` must not
  // call CUDA. If the stream cannot take the event (the context is going away), runs `done` now.
  void WhenStreamDone(void* stream, std::function<void()> done);
  // Stream-ordered private buffers: every batch's copy (unless zero_copy), and batches gathered
  // across slots. From a memory pool of this consumer's own that keeps a few slots' worth
  // cached (the default pool would give memory back to the driver at every synchronisation,
  // and take it anew for the next batch).
  Result<uint8_t*> Allocate(uint64_t bytes, void* stream);
  void Free(uint8_t* ptr, void* stream);
  Status CopyAsync(void* dst, const void* src, uint64_t bytes, void* stream);
  // Device to host, then waits for the stream.
  Status CopyToHost(void* dst, const void* src, uint64_t bytes, void* stream);

 private:
  DeviceMapper();
  // The CUDA handles, in owners (device_mapper.cu), and the releases waiting on their events.
  // The destructor frees them with this mapper's device current, then restores the caller's.
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
  int device_ = -1;
  uint8_t* base_ = nullptr;  // the IPC mapping's address (owned by cuda_)
  uint64_t slot_bytes_ = 0;

  // The thread that waits for the releases' streams, in order; cuda_'s queue is under the mutex.
  void ReleaseLoop();
  std::mutex release_mu_;
  std::condition_variable release_cv_;
  bool stopping_ = false;
  std::thread release_thread_;  // started with the first release
};

}  // namespace coloader
