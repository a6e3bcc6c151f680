// Where a producer's batches come from. The session loop (producer.cc, publish.cc) owns the
// ring, the window and the order of publishing; a source is handed free slots one at a time,
// fills each with the run's next batch, and gives the filled jobs back in any order. Two
// implement it: DatasetSource (dataset_source.h: `serve`'s dataset, sampler and decode
// pipeline) and ExternalSource (external_source.h: batches the caller makes, coloader.Producer).
//
// Threads: everything here is called on the session loop's thread, except where an
// implementation says otherwise (ExternalSource's caller side).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "common/status.h"
#include "pipeline/decode/gpu_decode.h"
#include "pipeline/assemble/pool.h"
#include "pipeline/assemble/sample_transform.h"

namespace coloader {

// What a source learns once the ring exists.
struct SourceRing {
  SlotTable table;    // the host slots consumers map
  SlotTable staging;  // where decode workers write (the same slots, uint8 NHWC at the staging offset)
  uint8_t* base = nullptr;  // the host ring's mapping
  TransformOptions transform;  // decode and augment, for a source that decodes
  GpuDecodeRequest gpu;        // which GPUs decode, for a source that decodes
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // The ring is made: a source starts what fills it (the decode workers).
  virtual Status Attach(const SourceRing& ring) = 0;

  // What the producer asks before the run.
  virtual uint64_t epoch_samples() const = 0;  // samples per epoch on this node (0: not known)
  virtual uint64_t dataset_size() const = 0;   // samples in all, for `status`
  // The class names in label order, told to consumers (loader.dataset.classes); empty: none.
  virtual const std::vector<std::string>& classes() const {
    static const std::vector<std::string> kNone;
    return kNone;
  }
  // Feeds `mix` what decides each sample's content: the data key a resumed run checks.
  virtual void MixDataKey(const std::function<void(const std::string&)>& mix) const = 0;
  // Whether the run can start mid-way (`serve --resume`): a dataset can, a caller's stream cannot.
  virtual bool resumable() const = 0;

  // The run starts (min_consumers reached) at `epoch` and `position` (0 and 0 unless resumed).
  virtual void Start(uint64_t epoch, uint64_t position) = 0;
  // True once it fills no more slots: every epoch handed out, or the caller finished.
  virtual bool exhausted() const = 0;
  // Why the source stopped before its epochs were done (the caller's own data failed), once it
  // is exhausted: the run then ends as stopped, with this as the consumers' reason. OK otherwise.
  virtual Status failure() const { return Status::OK(); }
  // Fills `slot` (its memory at `base`) as batch number `seq`; TakeCompleted gives it back.
  virtual void Fill(uint32_t slot, uint8_t* base, uint64_t seq) = 0;
  // Catch-up: whether it can fill a batch of any stretch of any epoch again (FillAt), so that a
  // consumer that joined mid-epoch gets the samples it missed. "" when it can; else why not.
  virtual std::string WhyNoRefill() const { return "it cannot make a batch again"; }
  // Fills `slot` with the samples at positions [first, first + count) of `epoch`, as batch
  // `seq` (flagged last in its epoch when `last`), beside the run's own order (Fill), which it
  // leaves where it was. Only where WhyNoRefill() is "".
  virtual void FillAt(uint32_t slot, uint8_t* base, uint64_t seq, uint64_t epoch, uint64_t first, uint32_t count,
                      bool last) {
    (void)slot, (void)base, (void)seq, (void)epoch, (void)first, (void)count, (void)last;
  }
  // Slots given to Fill that come back unfilled (the caller finished first), the newest last.
  virtual std::vector<uint32_t> TakeReturned() { return {}; }
  virtual std::vector<std::unique_ptr<BatchJob>> TakeCompleted() = 0;
  // Readable while TakeCompleted or TakeReturned has something to give.
  virtual int event_fd() const = 0;
  // Batches being filled by workers of its own (the run is over when none is).
  virtual size_t in_flight() const { return 0; }
  // With GPU decoding: what the CPU workers decode of each batch now (Pipeline); "" without.
  virtual std::string DecodeSplitSummary() const { return ""; }
  virtual std::vector<double> CpuShares() const { return {}; }

  // A completed job with failed samples: how many samples the batch keeps once their places
  // are filled (Pipeline::FillFailed); a job that keeps none may be filled again (Resubmit:
  // true when it will come back through TakeCompleted).
  virtual uint32_t FillFailed(BatchJob& job) const { return static_cast<uint32_t>(job.indices.size()); }
  virtual bool Resubmit(std::unique_ptr<BatchJob>& job) {
    (void)job;
    return false;
  }
  // Where the device path uploads the batch from (nullptr: the host slot) and which GPU
  // decoded it (-1: none).
  virtual const uint8_t* DeviceStaging(const BatchJob& job) const {
    (void)job;
    return nullptr;
  }
  virtual int DecodeDevice(const BatchJob& job) const {
    (void)job;
    return -1;
  }
  // The boxes the device ring erases after normalising, one per position (nullptr: none).
  virtual const std::vector<EraseBox>* EraseBoxes(const BatchJob& job) const {
    (void)job;
    return nullptr;
  }
  // The programs the device ring runs on the uint8 batch before normalising (nullptr: none).
  virtual const std::vector<PixelProgram>* PixelPrograms(const BatchJob& job) const {
    (void)job;
    return nullptr;
  }
  // The run is over: whoever waits on the source hears `why`, the error that ended it (stopped,
  // failed) or OK when it ended without one (its consumers all left).
  virtual void Stop(const Status& why) { (void)why; }
};

}  // namespace coloader
