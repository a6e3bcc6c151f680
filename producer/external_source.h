// Batches made by the caller instead of the decode pipeline: the producer's session loop
// grants free slots, the caller's thread copies a batch into one and hands it back. This is
// how a Python DataLoader feeds a producer (coloader.Producer, through the C ABI).
//
// Threads: Grant/TakeCompleted/TakeReturned run on the session loop; Publish/EndEpoch/Finish
// on the caller's one thread. The last published batch is held back until the next Publish or
// EndEpoch, so that the epoch's last batch can carry its last-in-epoch flag.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "common/protocol.h"
#include "common/unique_fd.h"
#include "common/status.h"
#include "pipeline/pipeline.h"

namespace coloader {

class ExternalSource {
 public:
  // `layout` is the host slot layout; `base` the mapped ring.
  static Result<std::unique_ptr<ExternalSource>> Make(SlotTable layout, uint8_t* base);
  ~ExternalSource();

  // Session loop.
  void Grant(uint32_t slot);                              // a free slot the caller may fill
  std::vector<std::unique_ptr<BatchJob>> TakeCompleted();
  std::vector<uint32_t> TakeReturned();                  // slots granted, then given back by Finish
  bool finished() const;                                  // Finish() was called
  int event_fd() const { return events_.fd(); }
  // Wakes a Publish blocked on a slot; it and every later one return `why`.
  void Stop(Status why = Status::Disconnected("the producer stopped"));

  // Caller's thread.
  // Waits at most `timeout_ms` until Publish would not block: OK, kAgain when the time passed,
  // the stop's reason when the producer stopped (kEnded: its consumers all left).
  Status WaitForSlot(int timeout_ms);
  Status Publish(const void* data, uint32_t count, const int64_t* labels, const int64_t* indices);
  Status EndEpoch();
  void Finish();

 private:
  ExternalSource(SlotTable layout, uint8_t* base) : layout_(std::move(layout)), base_(base) {}
  void Complete(std::unique_ptr<BatchJob> job);

  SlotTable layout_;
  uint8_t* base_;
  EventFd events_;  // signalled when the caller completes a batch or finishes
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint32_t> free_;                  // granted, not filled yet
  std::vector<std::unique_ptr<BatchJob>> completed_;
  std::vector<uint32_t> returned_;
  bool finished_ = false, stopped_ = false;
  Status why_;  // why it stopped
  // Caller's thread only.
  std::unique_ptr<BatchJob> held_;
  uint64_t seq_ = 0, epoch_ = 0, position_ = 0;
};

}  // namespace coloader
