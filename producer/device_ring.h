// The GPU side of the producer's ring (with --device cuda:N): one device allocation holding
// every slot, exported once through CUDA IPC, and one interprocess event per slot.
//
// Per batch: the workers have written uint8 NHWC samples into the host slot's staging area
// (pinned: the shared memory is registered with CUDA); Upload enqueues one host-to-device
// copy, the normalise/cast/layout kernel into the device slot, and records the slot's event.
// Nothing waits on the host: consumers order their own stream after the event.
//
// No CUDA types here: a build without CUDA compiles this header and gets an error at Make.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/protocol.h"
#include "common/status.h"
#include "pipeline/transform/erase.h"
#include "pipeline/transform/normalize.h"
#include "pipeline/transform/pixel_program.h"

namespace coloader {

struct DeviceRingOptions {
  int device = 0;
  uint32_t num_slots = 0;
  uint32_t batch_size = 0;
  uint32_t height = 0, width = 0;  // channels are 3
  DType dtype = DType::kFloat32;
  TensorLayout layout = TensorLayout::kNCHW;
  NormalizeParams normalize;
  EraseOptions erase;  // RandomErasing after normalising (p 0: none)
  bool pixel_ops = false;  // the recipe has pixel ops: Upload runs their programs before normalising
  // A caller-fed producer's fields: each slot's are copied from the host slot's data area as
  // they are (no staging, no conversion), laid out alike (FieldOffsets).
  std::vector<FieldSpec> fields;
  // The host ring (shared memory) and where each slot keeps its parts.
  uint8_t* host_base = nullptr;
  uint64_t host_bytes = 0;
  uint64_t host_slot_bytes = 0;
  uint64_t host_labels_offset = 0;
  uint64_t host_staging_offset = 0;  // uint8 NHWC samples from the workers
  uint64_t host_output_offset = 0;   // the tensor for host-path consumers (DownloadToHost)
  // Pin the host ring (once per process: the first ring registers it for every device).
  bool register_host = true;
  // The parts of the host ring to pin, as (offset, length) from host_base; empty: all of
  // host_bytes. Pinning faults every page in, so only what /dev/shm has reserved is pinned: the
  // slots' indices, labels and staging. The tensor areas of host-path consumers are reserved
  // only when one attaches, and stay pageable (DownloadToHost copies into them synchronously).
  std::vector<std::pair<uint64_t, uint64_t>> host_pinned;
};

class DeviceRing {
 public:
  static Result<std::unique_ptr<DeviceRing>> Make(const DeviceRingOptions& opts);
  ~DeviceRing();
  DeviceRing(const DeviceRing&) = delete;
  DeviceRing& operator=(const DeviceRing&) = delete;

  // What consumers need to map the ring (sent once, in Welcome).
  const DeviceTable& table() const { return table_; }
  int device() const { return table_.device; }
  uint64_t device_bytes() const;

  // Enqueues the upload and conversion of `count` staged samples of `slot`, then records the
  // slot's event. Returns at once. With `device_staged` (--decode gpu) the uint8 NHWC samples
  // are already in device memory on GPU `staged_device`, complete: they are converted from
  // there (copied over first when that is another GPU) instead of from the host staging.
  // With `pixel`, each sample's program runs on the uint8 batch first (pixel_ops_device.h);
  // with `erase`, the samples' boxes are erased in the normalised tensor last.
  Status Upload(uint32_t slot, uint32_t count, const uint8_t* device_staged = nullptr, int staged_device = -1,
                const std::vector<EraseBox>* erase = nullptr, const std::vector<PixelProgram>* pixel = nullptr);
  // Copies the slot's finished tensor back to the host slot's output area and waits: the
  // path for consumers that cannot map device memory. Nothing to do for fields: the host slot
  // holds what was uploaded.
  Status DownloadToHost(uint32_t slot, uint32_t count);
  // Waits until the slot's last upload no longer reads its host staging (before refilling it).
  Status WaitIdle(uint32_t slot);

  struct Impl;

 private:
  explicit DeviceRing(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  DeviceTable table_;
};

// How this process's threads wait for GPU `device` (cudaSetDeviceFlags): `block` sleeps on an
// OS primitive until the work is done; otherwise CUDA's default, which spins on a core while
// the process has fewer contexts than cores. `coloader serve` blocks: its threads wait on
// the GPU for most of each batch (decode, upload, download), and spinning there takes cores
// from the jobs for a few microseconds of latency. Process-wide, so the library leaves it
// to the program (the Python-fed producer runs inside the user's process and does not set it).
Status SetGpuWait(int device, bool block);

}  // namespace coloader
