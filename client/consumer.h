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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "common/status.h"

namespace coloader {

struct ConsumerOptions {
  std::string name;                // producer name (resolved in the per-user run directory)
  std::string endpoint;            // or an explicit ZeroMQ endpoint; overrides name
  uint32_t batch_size = 0;         // 0: the producer's batch size
  bool drop_last = false;          // drop each epoch's last batch if it is short
  bool wait_for_epoch = false;     // join at the next epoch boundary, not mid-epoch
  int connect_timeout_ms = 5000;   // for the handshake
  int wait_for_producer_ms = 0;    // a producer not (yet) running: wait this long for it to
                                   // appear (jobs started together with it), 0: fail at once
  int timeout_ms = 0;              // max wait for one batch; 0 waits as long as the producer lives
  bool device = false;             // batches in the producer's GPU memory when it has a device
                                   // ring and this process can map it; otherwise the host path
  std::string client_name;         // shown by `coloader status`
  // tcp:// endpoints (a producer on another machine): this consumer's key pair file and the
  // producer's public key (Z85 text or a .pub file), both from `coloader keygen`; empty for a
  // producer started with --insecure. Batches arrive as message payload (no shared memory).
  std::string curve_key_file;
  std::string curve_server_key;
};

namespace internal {
struct ConsumerState;
struct SlotLease;
// Samples [offset, offset + count) of one producer slot, part of the batch being assembled.
struct Piece {
  std::shared_ptr<SlotLease> lease;
  uint32_t offset = 0, count = 0;
};
}  // namespace internal

class Batch {
 public:
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

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
  std::shared_ptr<internal::ConsumerState> state_;
  std::vector<std::shared_ptr<internal::SlotLease>> leases_;
  std::unique_ptr<uint8_t[]> owned_;  // gathered on the host; recycled through the consumer's pool
  uint64_t owned_capacity_ = 0;
  std::vector<int64_t> owned_indices_, owned_labels_;
  uint8_t* owned_device_ = nullptr;  // gathered on the device (stream-ordered allocation)
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
  bool partial() const;        // this epoch began mid-way (late join)
  uint64_t size() const;       // batches per whole epoch for this consumer's batch size
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
  // The next announcement (a pushed-back one first); nullopt once the producer said Bye.
  Result<std::optional<BatchAnnouncement>> Take();
  Status SkipRestOfEpoch();
  // Copies `pieces` into `gathered` (created for the batch size on first use) and lets go of
  // their slots.
  Status Spill(std::vector<internal::Piece>& pieces, std::optional<Batch>& gathered, void* stream);

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
};

}  // namespace coloader
