// The consumer library: connect to a producer by name (or endpoint), map its ring once, and
// iterate epochs of batches of any size.
//
//   COLOADER_ASSIGN_OR_RETURN(auto consumer, Consumer::Connect({.name = "imagenet", .batch_size = 96}));
//   while (true) {
//     COLOADER_ASSIGN_OR_RETURN(bool more, consumer->NextEpoch());
//     if (!more) break;                                  // the producer finished or stopped
//     for (;;) {
//       COLOADER_ASSIGN_OR_RETURN(std::optional<Batch> batch, consumer->Next());
//       if (!batch) break;                               // end of this epoch
//       use(batch->data(), batch->size());                // a view into shared memory
//     }                                                  // the lease ends with `batch`
//   }
//
// A Batch is a lease: while it lives, the producer will not reuse the memory it points at.
// Destroying or Release()-ing it acks the producer; releasing is cheap, never blocks, and may
// happen on any thread. What a batch's memory is (ConsumerOptions::zero_copy says more):
//   host path    a private copy-on-write view of the producer's slot: reading is zero-copy,
//                and a page this process writes becomes its own; one that straddles two
//                slots is gathered into a private buffer.
//   device path  a private device copy, made on the consumer's stream: the slot goes back as
//                soon as the copy is done, and the batch is the consumer's to write or keep.
// A batch kept while the consumer reads on is given back when the producer needs its slot
// (Reclaim): the host view is copied page by page first, so what the caller holds never changes.
//
// Threads: Connect/NextEpoch/Next are for one thread; a background thread owns the socket,
// sends acks and heartbeats, and watches the producer.
//
// Waiting: NextEpoch and Next take an optional wait_ms: the call then returns Status kAgain
// when that much passed without an outcome (the overall timeout_ms still runs from the first
// call), and the next call goes on where it stopped: a caller can check for Ctrl-C between.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "common/split.h"
#include "common/status.h"

namespace coloader {

inline constexpr int kDefaultWaitForProducerMs = 60000;

struct ConsumerOptions {
  std::string name;                // producer name (resolved in the per-user run directory)
  std::string endpoint;            // or an explicit ZeroMQ endpoint; overrides name
  uint32_t batch_size = 0;         // 0: the producer's batch size
  bool drop_last = false;          // drop each epoch's last batch if it is short
  bool wait_for_epoch = false;     // join at the next epoch boundary, not mid-epoch
  int connect_timeout_ms = 5000;   // for the handshake
  int wait_for_producer_ms = kDefaultWaitForProducerMs;
                                   // a producer not (yet) running: wait this long for it to
                                   // appear (jobs started together with it; said once on
                                   // stderr), 0: fail at once
  int timeout_ms = 0;              // max wait for one batch; 0 waits as long as the producer lives
  bool device = false;             // batches in the producer's GPU memory when it has a device
                                   // ring and this process can map it; otherwise the host path
  // Views of the producer's memory itself, for a job that promises never to write its batches:
  // on the host the ring mapped read-only (a write faults), on the device the IPC mapping (a
  // write there changes what every consumer of the producer reads). Saves the per-batch private
  // view or device copy (docs/BENCHMARKS.md has the figures); kept batches cannot be copied
  // away, so one that holds the others back is detached after the producer's stall timeout.
  bool zero_copy = false;
  // A group member that has no batch yet asks the producer after this long whether its group is
  // complete, and fails naming who is there and who is missing if it is not (whatever
  // timeout_ms says: a rank that never comes is a mistake, not a slow producer).
  int group_wait_ms = 20000;
  std::string client_name;         // shown by `coloader status`
  // tcp:// endpoints (a producer on another machine): this consumer's key pair file and the
  // producer's public key (Z85 text or a .pub file), both from `coloader keygen`; empty for a
  // producer started with --insecure. Batches arrive as message payload (no shared memory).
  std::string curve_key_file;
  std::string curve_server_key;

  // Consumer group (docs/DISTRIBUTED.md): rank `rank` of the `world_size` ranks of one
  // data-parallel job, all using the name `group`. Every member reads the whole stream and
  // keeps its share (common/split.h); the producer serves them once all are attached. Empty
  // group: a plain consumer that sees every sample.
  std::string group;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Which node's share of the global permutation this job expects the producer to serve
  // (its --rank of --world-size); num_nodes 0: not stated, not checked.
  int32_t node_rank = 0;
  int32_t num_nodes = 0;
  // What a saved state expects (unset: not checked).
  std::optional<uint64_t> expect_seed;
  std::string expect_data_key;
  // Resume a saved state: in epoch `resume_epoch`, whose split began at position
  // `resume_begin`, this member had taken `resume_samples` samples. It skips exactly those
  // when the producer still serves that epoch at or before the group's resume point;
  // otherwise it says so (resume_note()) and continues at the next whole epoch.
  bool resume = false;
  uint64_t resume_epoch = 0;
  uint64_t resume_begin = 0;
  uint64_t resume_samples = 0;
};

namespace internal {
struct ConsumerState;
struct SlotLease;
class Handshake;
// Samples [offset, offset + count) of one producer slot, part of the batch being assembled.
struct Piece {
  std::shared_ptr<SlotLease> lease;
  uint32_t offset = 0, count = 0;
};
// A sample a group member takes a second time as padding (common/split.h), copied as the
// stream passed it: host pixels, or a place in the device stash.
struct PadSample {
  int64_t index = 0, label = 0;
  std::vector<uint8_t> pixels;
  uint32_t device_slot = 0;
};
// Owners of a gathered batch's private memory. Each deleter holds the consumer's state, so the
// memory can outlive the Consumer: a host buffer goes back to the consumer's pool, a device
// buffer is freed in order on the stream that read it (after the reads).
struct ReturnToPool {
  std::shared_ptr<ConsumerState> state;
  uint64_t capacity = 0;
  void operator()(uint8_t* p) const noexcept;
};
struct FreeOnStream {
  std::shared_ptr<ConsumerState> state;
  void* stream = nullptr;
  void operator()(uint8_t* p) const noexcept;
};
using HostBuffer = std::unique_ptr<uint8_t[], ReturnToPool>;
using DeviceBuffer = std::unique_ptr<uint8_t, FreeOnStream>;
}  // namespace internal

class Batch {
 public:
  // Moves by default: every resource is held by an owning member (the leases, the gathered
  // buffers); a moved-from Batch holds nothing and its views are not to be used.
  Batch(Batch&&) noexcept = default;
  Batch& operator=(Batch&&) noexcept = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch() = default;

  uint32_t size() const { return count_; }  // samples
  // The tensor: host memory, or device memory of device() when device() >= 0. For a
  // caller-fed producer with a schema (slots().fields), use field() instead.
  const void* data() const { return fields_ ? nullptr : data_; }
  // Field `i` of the schema (slots().fields[i]): its size() samples, contiguous, in the same
  // memory as data() would be; nullptr without a schema or past its last field.
  const void* field(size_t i) const;
  int device() const { return device_; }
  // Labels in device memory (device path only; nullptr on the host path).
  const int64_t* device_labels() const { return device_labels_; }
  const int64_t* indices() const { return indices_; }  // dataset index of each sample
  const int64_t* labels() const { return labels_; }
  uint64_t epoch() const { return epoch_; }
  DType dtype() const;
  TensorLayout layout() const;
  // {size, C, H, W} for NCHW, {size, H, W, C} for NHWC.
  std::vector<int64_t> shape() const;
  uint64_t bytes() const;
  bool gathered() const { return owned_ != nullptr || owned_device_ != nullptr; }  // copied: it straddled slots
  // CLOCK_MONOTONIC ns at which the producer published the (first) slot of this batch.
  uint64_t ready_ns() const { return ready_ns_; }

  // Copies the tensor into host memory (bytes() bytes), from either path; on the device path
  // it is ordered on the batch's stream and waits for it.
  Status CopyTo(void* host_dst) const;

  // Ends the lease now (the destructor does it otherwise). Safe to call twice.
  void Release();

 private:
  friend class Consumer;
  Batch() = default;
  // Destroyed last to first: the device buffer is freed (stream-ordered) before the leases go.
  std::shared_ptr<internal::ConsumerState> state_;
  std::vector<std::shared_ptr<internal::SlotLease>> leases_;  // the last reference to a slot acks it
  internal::HostBuffer owned_;  // gathered on the host; recycled through the consumer's pool
  std::vector<int64_t> owned_indices_, owned_labels_;
  internal::DeviceBuffer owned_device_;  // gathered on the device (stream-ordered allocation)
  void* stream_ = nullptr;
  int device_ = -1;
  const int64_t* device_labels_ = nullptr;
  const void* data_ = nullptr;  // with a schema: where the batch's field regions begin
  bool fields_ = false;
  uint32_t capacity_ = 0, first_ = 0;  // with a schema: the regions hold capacity_ samples from first_
  const int64_t* indices_ = nullptr;
  const int64_t* labels_ = nullptr;
  uint32_t count_ = 0;
  uint64_t epoch_ = 0;
  uint64_t ready_ns_ = 0;
};

class Consumer;

// A connection under way (Consumer::Start): Finish() completes it in bounded steps.
class Connecting {
 public:
  ~Connecting();
  Connecting(const Connecting&) = delete;
  Connecting& operator=(const Connecting&) = delete;
  // Goes on for at most wait_ms (-1: until it ends): the consumer, Status kAgain when not done
  // yet (call again), or why it failed (the producer did not come within wait_for_producer_ms,
  // did not answer within connect_timeout_ms, refused this consumer, ...).
  Result<std::unique_ptr<Consumer>> Finish(int wait_ms = -1);

 private:
  friend class Consumer;
  explicit Connecting(std::unique_ptr<internal::Handshake> h);
  std::unique_ptr<internal::Handshake> handshake_;
};

class Consumer {
 public:
  // Connects (Start, then Finish until it ends). The consumer is attached, and counted by the
  // producer, when it first calls NextEpoch(): until then it holds nobody back.
  static Result<std::unique_ptr<Consumer>> Connect(ConsumerOptions opts);
  static Result<std::unique_ptr<Connecting>> Start(ConsumerOptions opts);
  ~Consumer();  // says goodbye; leases still alive keep their memory mapped
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // Waits for the next epoch to begin. False when there will be no more: the producer served
  // every epoch (finished() is then true). An error when the producer stopped, was killed or
  // crashed before that (kDisconnected, saying how and where the stream stopped), detached this
  // consumer (kDetached) or broke the protocol. The first call attaches the consumer.
  Result<bool> NextEpoch(int wait_ms = -1);
  // The next batch of the current epoch, or nullopt at its end. On the device path, `stream`
  // (a cudaStream_t; nullptr is the default stream) is made to wait for the batch, and the
  // batch's release is ordered after the work enqueued on it by then. A stream cut short by
  // the producer's stop is an error after the last batch it delivered (partial() is then true).
  Result<std::optional<Batch>> Next(void* stream = nullptr, int wait_ms = -1);
  // The producer served every epoch it was started for (the stream ended; NextEpoch is false).
  bool finished() const;

  uint64_t epoch() const;      // the current epoch's number (the producer's count)
  bool partial() const;        // this epoch began mid-way (late join, or resumed)
  uint64_t size() const;       // batches per whole epoch for this consumer's batch size (and
                               // in a group, for this rank's share)
  // In a group (or resuming): where this epoch's split began, and the samples this member
  // has taken in the epoch (a resumed member counts those of its saved state).
  uint64_t split_begin() const;
  uint64_t samples_seen() const;
  // Resumes a saved state (see ConsumerOptions::resume) on this connection; only before the
  // first NextEpoch(), when what was published since the handshake is still unread.
  Status Resume(uint64_t epoch, uint64_t begin, uint64_t samples);
  // What a resume did not give exactly (the producer had moved past the saved point); "" if
  // it did, or none was asked for.
  const std::string& resume_note() const;
  uint32_t batch_size() const;
  const SlotTable& slots() const;
  const Welcome& welcome() const;
  uint64_t consumer_id() const;
  // Device path in use, and why not when it was asked for but is not.
  bool on_device() const;
  const std::string& fallback_reason() const;

  // Ends the session now (the destructor does it otherwise).
  void Close();

 private:
  friend class internal::Handshake;
  explicit Consumer(std::shared_ptr<internal::ConsumerState> state);
  // The next announcement (a pushed-back one first); nullopt at the end of the stream (the
  // producer served every epoch). Waits until `slice_end` at most (Status kAgain then).
  Result<std::optional<BatchAnnouncement>> Take(std::chrono::steady_clock::time_point slice_end);
  // Take's wait, over the mailbox or the I/O thread's queue.
  Status AwaitAnnouncement(std::chrono::steady_clock::time_point until);
  // What ends a wait that found nothing: Again before the overall timeout, else the Timeout
  // (naming who holds the producer back), or a group found incomplete.
  Status WaitOver(std::chrono::steady_clock::time_point slice_end);
  // `st`, about the producer's end, with where this consumer's stream stopped.
  Status StreamStopped(Status st);
  // How a stream with nothing left to take ends (waiting.cc): the producer's End or goodbye.
  Result<std::optional<BatchAnnouncement>> Ending();
  // Asks the producer for its status through the I/O thread, for at most wait_ms (waiting.cc).
  Result<StatusReply> AskStatus(int wait_ms);
  // Why no batch came (waiting.cc): who holds the producer back, or what it waits for.
  std::string ExplainWait();
  // A group member's first wait, after group_wait_ms: an error naming who came and who did
  // not if the group is incomplete; OK otherwise (waiting.cc).
  Status CheckGroupComplete();
  Status Attach();
  // A lease on the slot `a` announces, its memory mapped as this consumer reads it.
  Result<std::shared_ptr<internal::SlotLease>> OpenSlot(const BatchAnnouncement& a);
  // The consumer batch made of `pieces`: a view of one slot, or what Spill gathered.
  Result<std::optional<Batch>> Deliver(std::vector<internal::Piece>& pieces, std::optional<Batch>& gathered,
                                       uint32_t count, void* stream);
  // Every consumer batch is copied out of the ring at once (the device path without zero_copy).
  bool copies_every_batch() const;
  Status SkipRestOfEpoch(std::chrono::steady_clock::time_point slice_end);
  // Copies `pieces` into `gathered` (created for the batch size on first use) and lets go of
  // their slots.
  Status Spill(std::vector<internal::Piece>& pieces, std::optional<Batch>& gathered, void* stream);

  // Groups (group.cc). Plans the epoch's split from its first announcement `a`, applying a
  // pending resume; false when this epoch is to be skipped whole (by a resume).
  Result<bool> StartSplit(const BatchAnnouncement& a);
  Result<std::optional<Batch>> NextInGroup(void* stream, std::chrono::steady_clock::time_point slice_end);
  // The cursor's next slot of this epoch (current_, offset_ 0); false at the epoch's end (or the
  // stream's, or its stop when `have_samples` are gathered already: stopped_ says it next).
  Result<bool> NextSlot(std::chrono::steady_clock::time_point slice_end, bool have_samples);
  // The plain consumer's: slices producer batches to the consumer's batch size.
  Result<std::optional<Batch>> NextSliced(void* stream, std::chrono::steady_clock::time_point slice_end);
  // Moves the stream cursor up to position `upto`, taking the samples from `take_from` on into
  // `pieces` (nullptr: taking none) and keeping copies of padding positions it passes.
  Status Advance(uint64_t upto, uint64_t take_from, std::vector<internal::Piece>* pieces,
                 std::optional<Batch>* gathered, void* stream, std::chrono::steady_clock::time_point slice_end);
  Status Stash(uint32_t from, uint32_t n, void* stream);
  Status AppendPadding(Batch& b, void* stream);
  void FreeStash();
  bool split_mode() const;  // in a group, or resuming: batches follow common/split.h
  std::shared_ptr<internal::ConsumerState> state_;
  // The iteration cursor; touched only by the thread that calls NextEpoch/Next.
  std::optional<BatchAnnouncement> pending_;       // read ahead, belongs to a later epoch
  std::shared_ptr<internal::SlotLease> current_;   // the slot being sliced
  uint32_t offset_ = 0;                            // samples of current_ already handed out
  std::vector<internal::Piece> gathering_;         // a batch in assembly, kept across a timeout
  std::optional<Batch> assembling_;                // ... and what of it is already copied out
  uint64_t epoch_ = 0;
  bool partial_ = false;
  bool in_epoch_ = false;
  bool epoch_ended_ = false;
  bool stream_ended_ = false;
  bool attached_ = false;
  bool finished_ = false;       // the stream ended: the producer served every epoch
  Status stopped_;              // the producer stopped after the last batch delivered: said next
  bool group_checked_ = false;  // an incomplete group was looked for (group_wait_ms)
  // The newest announcement taken (where the stream stands), and since when the current wait
  // for one has lasted (0: not waiting): timeout_ms runs across calls cut short by wait_ms.
  std::optional<BatchAnnouncement> last_taken_;
  uint64_t wait_since_ns_ = 0;
  // Groups: this epoch's split, the next batch of it, and whether the stream has passed the
  // epoch's end (a member's share can end before the stream's epoch does).
  SplitSpec split_{};
  SplitPlan plan_{};
  uint64_t group_batch_ = 0;
  uint64_t samples_seen_ = 0;
  bool stream_epoch_done_ = false;
  bool resume_pending_ = false;
  std::string resume_note_;
  std::vector<Segment> padding_;
  std::map<uint64_t, internal::PadSample> stash_;
  uint8_t* stash_device_ = nullptr;  // device path: labels, then samples, for padding_
  void* stash_stream_ = nullptr;
};

}  // namespace coloader
