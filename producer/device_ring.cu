#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/align.h"
#include "common/cuda_internal.h"
#include "pipeline/stage_times.h"
#include "pipeline/transform/pixel_ops_device.h"
#include "producer/device_ring.h"

namespace coloader {

namespace {
constexpr uint64_t kAlign = 256;
}  // namespace

struct DeviceRing::Impl {
  // Members go in reverse order, after the destructor has let the stream finish: events,
  // stream, staging, the slots, then the host pages are unpinned.
  DeviceRingOptions opts;
  std::vector<CudaHostRegistration> host_registered;  // the shared memory cudaHostRegister pinned
  CudaDeviceMemory<uint8_t> device_base;  // every slot, one allocation, one IPC handle
  CudaDeviceMemory<uint8_t> staging;      // one uint8 batch: uploads are serialised on `stream`
  CudaDeviceMemory<EraseTask> erase_tasks;  // one batch's RandomErasing boxes (serialised likewise)
  // With pixel ops: a second uint8 batch (their steps alternate between it and `staging`), one
  // batch's programs and their statistics, GaussianBlur's float rows (made at the first batch
  // that blurs), and each slot's programs in pinned memory (copied from there asynchronously; a
  // slot's are rewritten only after WaitIdle(slot), as its staging is).
  CudaDeviceMemory<uint8_t> pixel_scratch;
  CudaDeviceMemory<PixelProgram> pixel_programs;
  CudaDeviceMemory<PixelStats> pixel_stats;
  CudaDeviceMemory<float> pixel_blur_rows;
  CudaPinnedMemory<PixelProgram> pixel_programs_host;
  uint64_t slot_bytes = 0, labels_offset = 0, data_offset = 0, alloc_bytes = 0;
  CudaStream stream;
  std::vector<CudaEvent> events;

  ~Impl() {
    if (stream) cudaStreamSynchronize(stream.get());
  }
  uint64_t sample_bytes() const { return uint64_t{opts.height} * opts.width * 3 * DTypeSize(opts.dtype); }
  uint64_t data_bytes() const {
    return opts.fields.empty() ? uint64_t{opts.batch_size} * sample_bytes() : FieldsBytes(opts.fields, opts.batch_size);
  }
  uint64_t staged_sample_bytes() const { return uint64_t{opts.height} * opts.width * 3; }
  uint8_t* host_slot(uint32_t s) const { return opts.host_base + s * opts.host_slot_bytes; }
  uint8_t* device_slot(uint32_t s) const { return device_base.get() + s * slot_bytes; }
};

DeviceRing::DeviceRing(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceRing::~DeviceRing() {
  if (impl_) cudaSetDevice(impl_->opts.device);
}

uint64_t DeviceRing::device_bytes() const { return impl_->alloc_bytes; }

Result<std::unique_ptr<DeviceRing>> DeviceRing::Make(const DeviceRingOptions& o) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    return Status::Invalid("--device cuda:" + std::to_string(o.device) + ": no CUDA device is visible to this process");
  }
  if (o.device < 0 || o.device >= count) {
    return Status::Invalid("--device cuda:" + std::to_string(o.device) + ": only " + std::to_string(count) +
                           " CUDA device(s) visible (cuda:0 to cuda:" + std::to_string(count - 1) + ")");
  }
  CUDA_RETURN_NOT_OK(cudaSetDevice(o.device));
  auto impl = std::make_unique<Impl>();
  impl->opts = o;
  Impl& r = *impl;
  r.labels_offset = 0;
  r.data_offset = RoundUp(8ull * o.batch_size, kAlign);
  r.slot_bytes = RoundUp(r.data_offset + r.data_bytes(), 2 << 20);
  r.alloc_bytes = r.slot_bytes * o.num_slots;
  CUDA_RETURN_NOT_OK(CudaMalloc(&r.device_base, r.alloc_bytes));
  if (o.fields.empty()) CUDA_RETURN_NOT_OK(CudaMalloc(&r.staging, uint64_t{o.batch_size} * r.staged_sample_bytes()));
  if (o.fields.empty() && o.erase.p > 0)
    CUDA_RETURN_NOT_OK(CudaMalloc(&r.erase_tasks, uint64_t{o.batch_size} * sizeof(EraseTask)));
  if (o.fields.empty() && o.pixel_ops) {
    CUDA_RETURN_NOT_OK(CudaMalloc(&r.pixel_scratch, uint64_t{o.batch_size} * r.staged_sample_bytes()));
    CUDA_RETURN_NOT_OK(CudaMalloc(&r.pixel_programs, uint64_t{o.batch_size} * sizeof(PixelProgram)));
    CUDA_RETURN_NOT_OK(CudaMalloc(&r.pixel_stats, uint64_t{o.batch_size} * sizeof(PixelStats)));
    CUDA_RETURN_NOT_OK(CudaMallocHost(&r.pixel_programs_host, uint64_t{o.num_slots} * o.batch_size * sizeof(PixelProgram)));
  }
  CUDA_RETURN_NOT_OK(CudaStreamCreate(&r.stream, cudaStreamNonBlocking));
  // The shared memory becomes pinned, so uploads are true asynchronous DMA from the slot.
  if (o.register_host) {
    // Portable: every device's uploads read it as pinned memory.
    std::vector<std::pair<uint64_t, uint64_t>> pin = o.host_pinned;
    if (pin.empty()) pin.emplace_back(0, o.host_bytes);
    for (const auto& [offset, length] : pin) {
      if (length == 0) continue;
      CUDA_RETURN_NOT_OK(cudaHostRegister(o.host_base + offset, length, cudaHostRegisterPortable));
      r.host_registered.emplace_back(o.host_base + offset);
    }
  }

  DeviceTable t;
  t.device = o.device;
  cudaDeviceProp prop{};
  CUDA_RETURN_NOT_OK(cudaGetDeviceProperties(&prop, o.device));
  t.device_uuid.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  cudaIpcMemHandle_t mem{};
  CUDA_RETURN_NOT_OK(cudaIpcGetMemHandle(&mem, r.device_base.get()));
  t.mem_handle.assign(reinterpret_cast<const char*>(&mem), sizeof(mem));
  r.events.resize(o.num_slots);
  for (uint32_t s = 0; s < o.num_slots; ++s) {
    CUDA_RETURN_NOT_OK(CudaEventCreate(&r.events[s], cudaEventDisableTiming | cudaEventInterprocess));
    // Recorded once at the start so that a wait on a never-filled slot is already satisfied.
    CUDA_RETURN_NOT_OK(cudaEventRecord(r.events[s].get(), r.stream.get()));
    cudaIpcEventHandle_t ev{};
    CUDA_RETURN_NOT_OK(cudaIpcGetEventHandle(&ev, r.events[s].get()));
    t.event_handles.emplace_back(reinterpret_cast<const char*>(&ev), sizeof(ev));
  }
  t.slot_bytes = r.slot_bytes;
  t.labels_offset = r.labels_offset;
  t.data_offset = r.data_offset;
  t.dtype = o.dtype;
  t.layout = o.layout;
  std::unique_ptr<DeviceRing> ring(new DeviceRing(std::move(impl)));
  ring->table_ = std::move(t);
  return Result<std::unique_ptr<DeviceRing>>(std::move(ring));
}

Status DeviceRing::Upload(uint32_t slot, uint32_t count, const uint8_t* device_staged, int staged_device,
                          const std::vector<EraseBox>* erase, const std::vector<PixelProgram>* pixel) {
  Impl& r = *impl_;
  ScopedStage timer(Stage::kUploadEnqueue, count);
  CUDA_RETURN_NOT_OK(cudaSetDevice(r.opts.device));
  const uint8_t* host = r.host_slot(slot);
  uint8_t* dev = r.device_slot(slot);
  if (count > 0) {
    CUDA_RETURN_NOT_OK(cudaMemcpyAsync(dev + r.labels_offset, host + r.opts.host_labels_offset, 8ull * count,
                                       cudaMemcpyHostToDevice, r.stream.get()));
    const uint64_t staged = uint64_t{count} * r.staged_sample_bytes();
    if (!r.opts.fields.empty()) {
      // A caller's fields: each region's first `count` samples, as they are.
      const std::vector<uint64_t> offsets = FieldOffsets(r.opts.fields, r.opts.batch_size);
      for (size_t f = 0; f < offsets.size(); ++f) {
        CUDA_RETURN_NOT_OK(cudaMemcpyAsync(dev + r.data_offset + offsets[f], host + r.opts.host_output_offset + offsets[f],
                                           uint64_t{count} * r.opts.fields[f].sample_bytes(), cudaMemcpyHostToDevice,
                                           r.stream.get()));
      }
    } else if (device_staged == nullptr && pixel == nullptr && r.opts.dtype == DType::kUInt8 &&
               r.opts.layout == TensorLayout::kNHWC) {
      // Already in its final form: one copy straight into the slot.
      CUDA_RETURN_NOT_OK(cudaMemcpyAsync(dev + r.data_offset, host + r.opts.host_staging_offset, staged,
                                         cudaMemcpyHostToDevice, r.stream.get()));
    } else {
      // The uint8 batch on this GPU: decoded and augmented on it (no host copy in between), on
      // another GPU (copied over), or by the CPU workers (uploaded).
      const uint8_t* src = device_staged;
      if (src == nullptr) {
        CUDA_RETURN_NOT_OK(cudaMemcpyAsync(r.staging.get(), host + r.opts.host_staging_offset, staged,
                                           cudaMemcpyHostToDevice, r.stream.get()));
        src = r.staging.get();
      } else if (staged_device != r.opts.device) {
        CUDA_RETURN_NOT_OK(cudaMemcpyPeerAsync(r.staging.get(), r.opts.device, device_staged, staged_device, staged, r.stream.get()));
        src = r.staging.get();
      }
      if (pixel != nullptr) {
        // The recipe's pixel ops, each sample's drawn program, through the slot's pinned copy (so
        // the copy is asynchronous and `pixel` may go when this returns). Images are square
        // (width == height), as every recipe makes them.
        if (!r.pixel_programs || pixel->size() < count)
          return Status::Internal("device ring: pixel programs for " + std::to_string(pixel->size()) + " of " +
                                  std::to_string(count) + " samples, or for a ring made without pixel ops");
        PixelProgram* programs = r.pixel_programs_host.get() + uint64_t{slot} * r.opts.batch_size;
        std::copy(pixel->begin(), pixel->begin() + count, programs);
        if (!r.pixel_blur_rows && PixelProgramsBlur(programs, count))
          CUDA_RETURN_NOT_OK(CudaMalloc(&r.pixel_blur_rows, uint64_t{r.opts.batch_size} * r.staged_sample_bytes() * sizeof(float)));
        CUDA_RETURN_NOT_OK(cudaMemcpyAsync(r.pixel_programs.get(), programs, count * sizeof(PixelProgram),
                                           cudaMemcpyHostToDevice, r.stream.get()));
        COLOADER_ASSIGN_OR_RETURN(src, PixelOpsBatchOnDevice(r.pixel_programs.get(), programs, count,
                                                             static_cast<int>(r.opts.width), src, r.staging.get(),
                                                             r.pixel_scratch.get(), r.pixel_stats.get(),
                                                             r.pixel_blur_rows.get(), r.stream.get()));
      }
      COLOADER_RETURN_NOT_OK(NormalizeBatchOnDevice(src, count, r.opts.height, r.opts.width, r.opts.dtype, r.opts.layout,
                                                    r.opts.normalize, dev + r.data_offset, r.stream.get()));
    }
  }
  if (erase != nullptr && r.erase_tasks) {
    // RandomErasing, in the normalised tensor: the boxes the workers drew. The copy is from
    // pageable memory, so `tasks` may go when it returns; the kernel follows on the stream.
    std::vector<EraseTask> tasks;
    for (uint32_t i = 0; i < count && i < erase->size(); ++i)
      if ((*erase)[i].erase) tasks.push_back(TaskOf((*erase)[i], i));
    if (!tasks.empty()) {
      CUDA_RETURN_NOT_OK(cudaMemcpyAsync(r.erase_tasks.get(), tasks.data(), tasks.size() * sizeof(EraseTask),
                                         cudaMemcpyHostToDevice, r.stream.get()));
      COLOADER_RETURN_NOT_OK(EraseBatchOnDevice(r.erase_tasks.get(), static_cast<uint32_t>(tasks.size()),
                                                static_cast<int>(r.opts.width), r.opts.dtype, r.opts.layout,
                                                FillOf(r.opts.erase), r.device_slot(slot) + r.data_offset,
                                                r.stream.get()));
    }
  }
  CUDA_RETURN_NOT_OK(cudaEventRecord(r.events[slot].get(), r.stream.get()));
  return Status::OK();
}

Status DeviceRing::DownloadToHost(uint32_t slot, uint32_t count) {
  Impl& r = *impl_;
  if (!r.opts.fields.empty()) return Status::OK();  // the host slot holds what was uploaded
  CUDA_RETURN_NOT_OK(cudaSetDevice(r.opts.device));
  if (count > 0) {
    CUDA_RETURN_NOT_OK(cudaMemcpyAsync(r.host_slot(slot) + r.opts.host_output_offset, r.device_slot(slot) + r.data_offset,
                                       uint64_t{count} * r.sample_bytes(), cudaMemcpyDeviceToHost, r.stream.get()));
  }
  CUDA_RETURN_NOT_OK(cudaStreamSynchronize(r.stream.get()));
  return Status::OK();
}

Status SetGpuWait(int device, bool block) {
  CUDA_RETURN_NOT_OK(cudaSetDevice(device));
  CUDA_RETURN_NOT_OK(cudaSetDeviceFlags(block ? cudaDeviceScheduleBlockingSync : cudaDeviceScheduleAuto));
  return Status::OK();
}

Status DeviceRing::WaitIdle(uint32_t slot) {
  ScopedStage timer(Stage::kUploadWaitIdle, 0);
  CUDA_RETURN_NOT_OK(cudaEventSynchronize(impl_->events[slot].get()));
  return Status::OK();
}

}  // namespace coloader
