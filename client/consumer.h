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
// Waiting: NextEpoch, Next and Connecting::Finish have forms that take a wait_ms: they give a
// Waited<T> (common/status.h), kNotYet when that much passed without an outcome (the overall
// timeout_ms still runs from the first call), and the next call goes on where it stopped: a
// caller can check for Ctrl-C between.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/protocol.h"
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
  // `resume_begin` (a group caught up in it: in its order from `resume_origin`, split_origin()),
  // this member had taken `resume_samples` samples. Of a producer that catches consumers up, the
  // rest of that epoch is served by the producer (decoded again, to a group's ranks together,
  // whatever the others have read since), then whole epochs. Of one without catch-up, the
  // member skips exactly those when the producer still serves that epoch at or before its
  // resume point; otherwise it says so (resume_note()) and continues at the next whole epoch.
  bool resume = false;
  uint64_t resume_epoch = 0;
  uint64_t resume_begin = 0;
  uint64_t resume_samples = 0;
  uint64_t resume_origin = 0;
};

namespace internal {
struct ConsumerState;
struct SlotLease;
class Handshake;
class Cursor;
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

// What a producer says of itself in the handshake (its Welcome).
struct ProducerInfo {
  uint32_t pid = 0;            // in the producer's PID namespace (nothing to a remote consumer)
  uint64_t dataset_size = 0;   // samples in its dataset (this node's share: see node_rank)
  uint64_t epoch_samples = 0;  // samples per epoch (nominal; bad files may reduce it)
  uint64_t seed = 0;           // its sampler's seed
  std::string data_key;        // a key of its data and settings (the same for the same files,
                               // labels and augmentation/output settings)
  int32_t node_rank = 0, num_nodes = 1;  // its node shard (serve --rank of --world-size)
  std::vector<std::string> classes;      // class names in label order (an ImageFolder's); empty: none
  // Why a consumer that joins mid-epoch gets only its rest (a partial epoch); empty: the
  // producer serves it the samples it missed as well (catch-up).
  std::string no_catch_up;
};

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
  // Every field's pointer at once (out[i] = field(i), for each of slots().fields): one walk of
  // the layout instead of one per field.
  void field_pointers(const void** out) const;
  size_t num_fields() const;  // slots().fields.size(): 0 for a producer of images
  // The same field in host memory: field(i) on the host path; on the device path a host copy,
  // for a field flagged kFieldOnHost only (nullptr for the others).
  const void* host_field(size_t i) const;
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
  friend class internal::Cursor;
  Batch() = default;
  // Destroyed last to first: the device buffer is freed (stream-ordered) before the leases go.
  std::shared_ptr<internal::ConsumerState> state_;
  std::vector<std::shared_ptr<internal::SlotLease>> leases_;  // the last reference to a slot acks it
  internal::HostBuffer owned_;  // gathered on the host; recycled through the consumer's pool
  std::vector<int64_t> owned_indices_, owned_labels_;
  std::vector<uint8_t> owned_on_host_;   // gathered on the device: the kFieldOnHost fields' host copy (OnHostOffsets)
  internal::DeviceBuffer owned_device_;  // gathered on the device (stream-ordered allocation)
  void* stream_ = nullptr;
  int device_ = -1;
  const int64_t* device_labels_ = nullptr;
  const void* data_ = nullptr;  // with a schema: where the batch's field regions begin
  const uint8_t* host_data_ = nullptr;  // device path, within one slot: where the host slot's regions begin
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
  // Goes on until it ends: the consumer, or why it failed (the producer did not come within
  // wait_for_producer_ms, did not answer within connect_timeout_ms, refused this consumer, ...).
  Result<std::unique_ptr<Consumer>> Finish();
  // The same for at most wait_ms: kNotYet when not done yet (call again); wait_ms < 0: no bound.
  Result<Waited<std::unique_ptr<Consumer>>> Finish(int wait_ms);

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
  Result<bool> NextEpoch();
  // The same, waiting at most wait_ms: kNotYet when that passed first (call again); wait_ms < 0:
  // no bound (never kNotYet).
  Result<Waited<bool>> NextEpoch(int wait_ms);
  // The next batch of the current epoch, or nullopt at its end. On the device path, `stream`
  // (a cudaStream_t; nullptr is the default stream) is made to wait for the batch, and the
  // batch's release is ordered after the work enqueued on it by then. A stream cut short by
  // the producer's stop is an error after the last batch it delivered (partial() is then true).
  Result<std::optional<Batch>> Next(void* stream = nullptr);
  // The same, waiting at most wait_ms, as NextEpoch(wait_ms).
  Result<Waited<std::optional<Batch>>> Next(void* stream, int wait_ms);
  // The producer served every epoch it was started for (the stream ended; NextEpoch is false).
  bool finished() const;

  uint64_t epoch() const;      // the current epoch's number (the producer's count)
  bool partial() const;        // this epoch began mid-way (late join, or resumed)
  uint64_t size() const;       // batches per whole epoch for this consumer's batch size (and
                               // in a group, for this rank's share)
  // Where this epoch's positions began (in a group: its split; alone: its first batch's, the
  // positions running on modulo the epoch when it was caught up), and the samples this
  // consumer has taken in the epoch (a resumed one counts those of its saved state).
  uint64_t split_begin() const;
  // A group member in an epoch it was caught up on (it joined mid-epoch and the producer served
  // what came before after the rest): the position the epoch's order starts at, its split's
  // positions counted from there round the epoch's end; 0 otherwise, and for a consumer alone.
  uint64_t split_origin() const;
  uint64_t samples_seen() const;
  // Resumes a saved state (see ConsumerOptions::resume) on this connection; only before the
  // first NextEpoch(), when what was published since the handshake is still unread.
  Status Resume(uint64_t epoch, uint64_t begin, uint64_t samples, uint64_t origin = 0);
  // What a resume did not give exactly (the producer had moved past the saved point); "" if
  // it did, or none was asked for.
  const std::string& resume_note() const;
  uint32_t batch_size() const;
  const SlotTable& slots() const;
  // What the producer said of itself in the handshake.
  const ProducerInfo& producer() const;
  uint64_t consumer_id() const;
  // Device path in use, and why not when it was asked for but is not.
  bool on_device() const;
  const std::string& fallback_reason() const;

  // Ends the session now (the destructor does it otherwise).
  void Close();

 private:
  friend class internal::Handshake;
  explicit Consumer(std::unique_ptr<internal::Cursor> cursor);
  std::unique_ptr<internal::Cursor> cursor_;  // the connection's state and the iteration cursor
};

}  // namespace coloader
