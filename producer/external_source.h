// Batches made by the caller instead of the decode pipeline: the producer's session loop
// grants free slots, the caller's thread copies a batch into one and hands it back. This is
// how a Python DataLoader feeds a producer (coloader.Producer, through the C ABI): a batch is
// the fields of a schema (FieldSpec), each written to its region of the slot.
//
// Threads: the BatchSource side runs on the session loop; WaitForSlot/Publish/EndEpoch/Finish
// on the caller's one thread. The last published batch is held back until the next Publish or
// EndEpoch, so that the epoch's last batch can carry its last-in-epoch flag.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "pipeline/assemble/pool.h"
#include "producer/batch_source.h"

namespace coloader {

class ExternalSource : public BatchSource {
 public:
  // Batches of these fields (the producer checked them); `epoch_samples` per epoch if the
  // caller knows (0: not known).
  static Result<std::unique_ptr<ExternalSource>> Make(std::vector<FieldSpec> fields, uint64_t epoch_samples);
  ~ExternalSource() override;
  // The ring, once it exists: the caller copies batches into its host slots.
  Status Attach(const SourceRing& ring) override;

  // BatchSource, on the session loop.
  uint64_t epoch_samples() const override { return epoch_samples_; }
  uint64_t dataset_size() const override { return epoch_samples_; }
  void MixDataKey(const std::function<void(const std::string&)>& mix) const override;
  bool resumable() const override { return false; }
  std::string WhyNoRefill() const override {
    return "this producer is fed by its caller (coloader.Producer), which hands each batch over once: catching "
           "a late consumer up would need a map-style Dataset to read the missed samples again, which it does not "
           "take yet";
  }
  void Start(uint64_t, uint64_t) override {}
  bool exhausted() const override;  // Finish() or Fail() was called
  Status failure() const override;   // Fail()'s reason
  // Grants the caller the slot: it counts as on its way until the caller's batch is published.
  void Fill(uint32_t slot, uint8_t* base, uint64_t seq) override;
  std::vector<uint32_t> TakeReturned() override;  // slots granted, then given back by Finish
  std::vector<std::unique_ptr<BatchJob>> TakeCompleted() override;
  int event_fd() const override { return events_.fd(); }
  // Wakes a Publish blocked on a slot; it and every later one return `why` (false for OK: the
  // run ended without an error).
  void Stop(const Status& why) override;

  // Caller's thread.
  // Waits at most `timeout_ms` until Publish would not block: true then; false when the run
  // is over without an error (its consumers all left); kNotYet when the time passed; the
  // error that stopped the producer.
  Result<Waited<bool>> WaitForSlot(int timeout_ms);
  // Copies `count` samples of every field (fields[i]: count x its sample bytes, contiguous)
  // into a granted slot; `indices` may be null (the samples' positions in the epoch). False,
  // publishing nothing, when the run is over without an error (its consumers all left).
  Result<bool> Publish(const void* const* fields, uint32_t count, const int64_t* indices);
  Status EndEpoch();
  void Finish();
  // The caller's data failed (its DataLoader raised): what was published is served, the epoch
  // under way stays cut (its last batch does not end it), and the consumers are told `why` as
  // the reason the producer stopped. Then as Finish.
  void Fail(const std::string& why);

 private:
  ExternalSource(std::vector<FieldSpec> fields, uint64_t epoch_samples)
      : fields_(std::move(fields)), epoch_samples_(epoch_samples) {}
  void Complete(std::unique_ptr<BatchJob> job);

  const std::vector<FieldSpec> fields_;
  const uint64_t epoch_samples_;
  SlotTable layout_;
  uint8_t* base_ = nullptr;
  EventFd events_;  // signalled when the caller completes a batch or finishes
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint32_t> free_;                  // granted, not filled yet
  std::vector<std::unique_ptr<BatchJob>> completed_;
  std::vector<uint32_t> returned_;
  bool finished_ = false, stopped_ = false;
  Status why_;      // why it stopped
  Status failure_;  // why the caller's data failed (Fail)
  // Caller's thread only.
  std::unique_ptr<BatchJob> held_;
  uint64_t seq_ = 0, epoch_ = 0, position_ = 0;
};

}  // namespace coloader
