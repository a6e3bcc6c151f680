// The producer's worker pool: fills a slot with one batch, sample by sample, on N threads.
// Each sample is read, decoded and augmented straight into its place in the slot, so the
// host path makes no copy after decoding. Finished batches are handed back through an
// eventfd that the producer's poll loop watches.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/protocol.h"
#include "common/unique_fd.h"
#include "pipeline/source/dataset.h"
#include "pipeline/decode/decode_split.h"
#include "pipeline/decode/gpu_decode.h"
#include "pipeline/substitution.h"
#include "pipeline/assemble/sample_transform.h"

namespace coloader {

struct BatchJob {
  uint64_t seq = 0;
  uint32_t slot = 0;
  uint64_t epoch = 0;
  uint64_t first = 0;  // position of the first sample within the epoch
  bool last_in_epoch = false;
  std::vector<int64_t> indices;  // dataset indices, in order
  uint8_t* slot_base = nullptr;  // the slot's memory (the pipeline writes indices, labels, data)

  // Filled in by the workers.
  std::atomic<uint32_t> remaining{0};
  std::mutex failures_mu;
  std::vector<std::pair<uint32_t, std::string>> failures;  // (position in batch, reason)
  // With GPU stages (--decode gpu|auto): this batch's part of them.
  struct GpuPart {
    std::vector<GpuSample> samples;  // what each position left for the GPU lane
    uint32_t decoder = 0;            // which GPU's stage decodes it (seq mod count)
    uint32_t cpu_from = 0;           // positions from here on are the CPU's share
    uint32_t decoded = 0;            // samples the GPU decoded (set by its lane)
    std::atomic<uint64_t> cpu_ns{0}, other_ns{0};  // workers' wall time on the CPU's share, on the rest
  } gpu;
  // With RandomErasing on the device path: each position's box, for the device ring to erase
  // after normalising (empty otherwise).
  std::vector<EraseBox> erase;
  // With pixel ops on the device path: each position's program, for the device ring to run on
  // the uint8 batch before normalising (empty otherwise).
  std::vector<PixelProgram> pixel;
  Status fatal;                // the GPU or the machine failed on this batch (not a file): the run stops
  uint32_t substitutions = 0;  // times none of its samples decoded and it went round again
};

class Pipeline {
 public:
  // `dataset` must outlive the pipeline. Starts `workers` threads. With GPU stages (--decode
  // gpu or auto, one stage per GPU that decodes) the workers read and route files and decode
  // the CPU's share of each batch (gpu.share, steered per stage by a DecodeSplit), and one
  // thread per lane of each stage finishes batches on its GPU: batch k goes to stage k mod
  // gpu.stages.size(), so every GPU's JPEG engines take an equal share. `layout` must then be
  // the uint8 NHWC staging layout.
  static Result<std::unique_ptr<Pipeline>> Make(const Dataset* dataset, TransformOptions opts,
                                                int workers, uint64_t seed, SlotTable layout,
                                                GpuDecode gpu = {});
  ~Pipeline();  // stops and joins the workers
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  void Submit(std::unique_ptr<BatchJob> job);
  // Jobs whose every sample is done, in completion order.
  std::vector<std::unique_ptr<BatchJob>> TakeCompleted();
  // Readable while TakeCompleted has something to return.
  int event_fd() const { return events_.fd(); }
  size_t in_flight() const { return in_flight_.load(); }
  int workers() const { return static_cast<int>(threads_.size()); }

  // Gives each sample that failed in a completed job's slot the sample of its replacement
  // (ReplacementFor: its data, index and label), so that every batch keeps its count and every
  // consumer and group rank its share whatever is skipped. Returns the batch's count: its
  // size, or 0 when every sample failed. (With --decode gpu the stage fills the device staging
  // the same way; only the indices and labels are set here.)
  uint32_t FillFailed(BatchJob& job) const;

  // A completed job none of whose samples decoded (FillFailed returned 0) has nothing to lend
  // its positions; it goes round again with each index replaced by the one after it in the
  // dataset (indices + 1, then + 2, ...: a function of the batch's own indices, so a replay
  // agrees), at most kMaxSubstitutions times. Returns false, leaving the job with the caller,
  // once those are spent: the batch is then published empty.
  static constexpr uint32_t kMaxSubstitutions = 16;
  bool Resubmit(std::unique_ptr<BatchJob>& job);

  // With --decode gpu: a completed job's finished uint8 NHWC batch on the GPU that decoded it,
  // and that GPU; nullptr and -1 otherwise.
  const uint8_t* DeviceStaging(const BatchJob& job) const {
    return gpu_.empty() ? nullptr : gpu_[job.gpu.decoder]->device_staging(job.slot);
  }
  int DecodeDevice(const BatchJob& job) const { return gpu_.empty() ? -1 : gpu_[job.gpu.decoder]->device(); }
  // With RandomErasing on the device path: each position's box (nullptr otherwise).
  const std::vector<EraseBox>* EraseBoxes(const BatchJob& job) const { return job.erase.empty() ? nullptr : &job.erase; }
  // With pixel ops on the device path: each position's program (nullptr otherwise).
  const std::vector<PixelProgram>* PixelPrograms(const BatchJob& job) const {
    return job.pixel.empty() ? nullptr : &job.pixel;
  }

  // With GPU stages: what the CPU workers decode of each batch now, per decoding GPU ("cpu 22%
  // of each batch (...)"), for the progress line and `coloader status`; "" without.
  std::string DecodeSplitSummary() const;
  // The same as numbers: the CPU's share of the next batch, per decoding GPU.
  std::vector<double> CpuShares() const;

 private:
  Pipeline(const Dataset* dataset, TransformOptions opts, uint64_t seed, SlotTable layout);
  void WorkerLoop(int worker);
  void GpuLaneLoop(uint32_t stage, int lane);
  void Complete(BatchJob* job);

  const Dataset* dataset_;
  TransformOptions opts_;
  uint64_t seed_;
  SlotTable layout_;
  EventFd events_;  // signalled when a batch completes

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<BatchJob*, uint32_t>> tasks_;  // (job, position) in submission order
  std::vector<std::unique_ptr<BatchJob>> running_;
  std::vector<std::unique_ptr<BatchJob>> completed_;
  bool stopping_ = false;
  std::atomic<size_t> in_flight_{0};
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<GpuDecodeStage>> gpu_;
  std::vector<std::unique_ptr<DecodeSplit>> split_;  // per stage
  // Per stage: jobs with every sample routed, waiting for one of that stage's lanes.
  std::vector<std::deque<BatchJob*>> gpu_jobs_;
  std::condition_variable gpu_cv_;
  std::vector<std::thread> lanes_;
};

}  // namespace coloader
