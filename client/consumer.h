// The consumer library: connect to a producer by name (or endpoint), map its ring once, and
// iterate epochs of batches of any size.
//
//   ASSIGN_OR_RETURN(auto consumer, Consumer::Connect({.name = "imagenet", .batch_size = 96}));
//   while (true) {
//     ASSIGN_OR_RETURN(bool more, consumer->NextEpoch());
//     if (!more) break;                                  // the producer finished or stopped
//     for (;;) {
//       ASSIGN_OR_RETURN(std::optional<Batch> batch, consumer->Next());
//       if (!batch) break;                               // end of this epoch
//       use(batch->data(), batch->size());                // a view into shared memory
//     }                                                  // the lease ends with `batch`
//   }
//
// A Batch is a lease: while it lives, the producer will not reuse the memory it points at.
// Destroying or Release()-ing it acks the producer; releasing is cheap, never blocks, and may
// happen on any thread. A consumer batch that lies within one producer slot is a view;
// one that straddles two slots is gathered into a private buffer.
//
// Threads: Connect/NextEpoch/Next are for one thread; a background thread owns the socket,
// sends acks and heartbeats, and watches the producer.
#pragma once

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
  // The tensor: host memory, or device memory of device() when device() >= 0.
  const void* data() const { return data_; }
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
  const void* data_ = nullptr;
  const int64_t* indices_ = nullptr;
  const int64_t* labels_ = nullptr;
  uint32_t count_ = 0;
  uint64_t epoch_ = 0;
  uint64_t ready_ns_ = 0;
};

class Consumer {
 public:
  static Result<std::unique_ptr<Consumer>> Connect(ConsumerOptions opts);
  ~Consumer();  // says goodbye; leases still alive keep their memory mapped
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // Waits for the next epoch to begin. False when there will be no more (the producer
  // finished every epoch, or stopped). An error when the producer died or broke the protocol.
  Result<bool> NextEpoch();
  // The next batch of the current epoch, or nullopt at its end. On the device path, `stream`
  // (a cudaStream_t; nullptr is the default stream) is made to wait for the batch, and the
  // batch's release is ordered after the work enqueued on it by then.
  Result<std::optional<Batch>> Next(void* stream = nullptr);

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
  explicit Consumer(std::shared_ptr<internal::ConsumerState> state);
  // Connect's body; may throw zmq::error_t, which Connect turns into a Status.
  static Result<std::unique_ptr<Consumer>> Handshake(ConsumerOptions opts);
  // The next announcement (a pushed-back one first); nullopt once the producer said Bye.
  Result<std::optional<BatchAnnouncement>> Take();
  Status SkipRestOfEpoch();
  // Copies `pieces` into `gathered` (created for the batch size on first use) and lets go of
  // their slots.
  Status Spill(std::vector<internal::Piece>& pieces, std::optional<Batch>& gathered, void* stream);

  // Groups (group.cc). Plans the epoch's split from its first announcement `a`, applying a
  // pending resume; false when this epoch is to be skipped whole (by a resume).
  Result<bool> StartSplit(const BatchAnnouncement& a);
  Result<std::optional<Batch>> NextInGroup(void* stream);
  // Moves the stream cursor up to position `upto`, taking the samples from `take_from` on into
  // `pieces` (nullptr: taking none) and keeping copies of padding positions it passes.
  Status Advance(uint64_t upto, uint64_t take_from, std::vector<internal::Piece>* pieces,
                 std::optional<Batch>* gathered, void* stream);
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
