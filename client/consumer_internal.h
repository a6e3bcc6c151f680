// The consumer's shared state (private to client/):
//   connect.cc    the handshake: find the producer, Hello/Welcome, map the ring and mailbox
//   io_thread.cc  the background thread: heartbeats, acks, Attach, Reclaim, End, Bye, the
//                 producer's death
//   consumer.cc   taking announcements, epochs, how a stream ends
//   waiting.cc    what a long wait is told: who holds the producer back, an incomplete group
//   slicing.cc    cutting producer batches to the consumer's batch size (gathering stragglers)
//   group.cc      a group member's share of each epoch
//   batch.cc      Batch: a lease on producer memory whose end is the ack
#pragma once

#include "client/consumer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <tuple>

#include "client/device_mapper.h"
#include "common/curve.h"
#include "common/endpoint.h"
#include "common/mailbox.h"
#include "common/process.h"
#include "common/shm.h"
#include "common/socket.h"
#include "common/split.h"
#include "common/unique_fd.h"

namespace coloader {
namespace internal {

// Where releases land: any thread (a garbage collector's, a CUDA callback's) queues an ack
// without blocking, and the I/O thread sends them.
struct AckSink {
  std::mutex mu;
  std::vector<uint64_t> acks;
  EventFd wake;                 // made by Consumer::Connect; the I/O thread polls it
  std::atomic<int> pending{0};  // stream-ordered releases whose ack is not queued yet
  // The user thread asks for Attach: it writes attach_request, then sets attach_wanted.
  Attach attach_request;
  std::atomic<bool> attach_wanted{false};
  std::atomic<bool> status_wanted{false};  // the user thread asks for a StatusReply

  void Queue(uint64_t seq) {
    {
      std::lock_guard<std::mutex> lock(mu);
      acks.push_back(seq);
    }
    Wake();
  }
  void Wake() { wake.Signal(); }  // never blocks: the counter only grows
  std::vector<uint64_t> Take() {
    wake.Drain();
    std::vector<uint64_t> out;
    std::lock_guard<std::mutex> lock(mu);
    out.swap(acks);
    return out;
  }
};

// Everything the background thread and the leases share. Leases keep it (and so the mapping)
// alive after the Consumer is gone.
struct ConsumerState {
  ConsumerOptions opts;
  std::string endpoint;
  Welcome welcome;
  SharedMemory shm;
  // A remote consumer's copy of the ring: the payload of each batch lands in its slot here.
  // The producer reuses a slot only after our ack, so a slot is never overwritten under a lease.
  std::unique_ptr<uint8_t[]> local_slots;
  const uint8_t* slot_memory() const { return local_slots ? local_slots.get() : shm.data(); }
  std::unique_ptr<DeviceMapper> mapper;  // set on the device path
  MailboxArea mailboxes;                 // local consumers: announcements arrive here
  std::optional<Mailbox> mailbox;
  std::string fallback_reason;
  ProcessWatch producer_watch;
  zmq::context_t ctx{1};
  Socket sock;  // opened by the handshake
  std::thread io;
  std::atomic<bool> stopping{false};
  // Set by Close(): this group member took its whole share of its epoch, so its goodbye says
  // it finished (Bye kFinished) and the others read on; otherwise it leaves (kLeaving), which
  // ends its group for the others.
  std::atomic<bool> finished_share{false};

  // Announcements and the producer's fate, from the I/O thread to the user's thread.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<BatchAnnouncement> queue;
  std::optional<Bye> bye;
  std::optional<End> end;              // every epoch is published: nothing more will come
  std::optional<StatusReply> status;   // the answer to status_wanted
  Status error;

  // Host leases whose view can be copied away when the producer asks for their slot back
  // (Reclaim), by batch number. A lease removes itself when it goes.
  std::mutex leases_mu;
  std::map<uint64_t, std::weak_ptr<SlotLease>> leases;
  // Answers a Reclaim: copies what the lease's view still shares with the ring and acks it;
  // a lease without a private view (zero-copy, device, remote) goes on holding its slot.
  void GiveBack(uint64_t seq);

  // Host buffers of gathered batches, reused: a consumer whose batches straddle slots gathers
  // every one, and fresh allocations would page-fault and zero-fill each time.
  std::mutex pool_mu;
  std::vector<std::pair<std::unique_ptr<uint8_t[]>, uint64_t>> pool;
  static constexpr size_t kPoolMax = 4;

  std::pair<std::unique_ptr<uint8_t[]>, uint64_t> TakeBuffer(uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      for (auto it = pool.begin(); it != pool.end(); ++it) {
        if (it->second >= bytes) {
          auto out = std::move(*it);
          pool.erase(it);
          return out;
        }
      }
    }
    // Uninitialised on purpose; null when the memory is not there (the caller says so).
    return {std::unique_ptr<uint8_t[]>(new (std::nothrow) uint8_t[bytes]), bytes};
  }
  void GiveBuffer(std::unique_ptr<uint8_t[]> buf, uint64_t capacity) {
    std::lock_guard<std::mutex> lock(pool_mu);
    if (pool.size() < kPoolMax) pool.emplace_back(std::move(buf), capacity);
  }

  // Acks from any thread to the I/O thread. A separate object, so that a CUDA callback
  // queueing a late ack never holds (and never destroys) the whole state.
  std::shared_ptr<AckSink> sink = std::make_shared<AckSink>();

  void QueueAck(uint64_t seq) { sink->Queue(seq); }

  void Fail(Status st) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (error.ok()) error = std::move(st);
      cv.notify_all();
    }
    if (mailbox) mailbox->Wake();
  }

  std::string Who() const {
    return "producer '" + (opts.name.empty() ? endpoint : opts.name) + "' (pid " +
           std::to_string(welcome.producer_pid) + ")";
  }

  void IoLoop();
  // The I/O thread's parts: one message from the producer (false: stop the loop), and the
  // checks that the producer is still there (false: it is not, and the error is set).
  bool Receive(const zmq::message_t& msg, bool* said_bye);
  bool ProducerAlive(uint64_t now, uint64_t& last_heard, uint64_t& exit_seen_ns);

  // The frame after a remote Batch: [int64 indices][int64 labels][data] of its samples, the
  // data as SlotTable::LeadingRanges packs it.
  Status TakePayload(const zmq::message_t& head, const BatchAnnouncement& a) {
    zmq::message_t payload;
    // A message's frames arrive together: a payload that is not there now never comes.
    Result<bool> got = head.more() ? sock.Recv(&payload, zmq::recv_flags::dontwait) : Result<bool>(false);
    if (!got.ok() || !*got) {
      return Status::Protocol(Who() + " sent batch " + std::to_string(a.seq) + " without its payload");
    }
    const SlotTable& t = welcome.slots;
    const uint64_t n = a.count, tensor = n * t.sample_bytes();
    if (payload.more() || payload.size() != 16 * n + tensor) {
      return Status::Protocol(Who() + " sent a payload of " + std::to_string(payload.size()) + " bytes for " +
                              std::to_string(n) + " samples (want " + std::to_string(16 * n + tensor) + ")");
    }
    uint8_t* slot = local_slots.get() + uint64_t{a.slot} * t.slot_bytes;
    const auto* in = payload.data<uint8_t>();
    std::memcpy(slot + t.indices_offset, in, 8 * n);
    std::memcpy(slot + t.labels_offset, in + 8 * n, 8 * n);
    in += 16 * n;
    for (const auto& [offset, bytes] : t.LeadingRanges(n)) {
      std::memcpy(slot + t.data_offset + offset, in, bytes);
      in += bytes;
    }
    return Status::OK();
  }
};

// One producer slot this consumer was given. Its destruction is the ack, so exactly one
// exists per announcement (not copyable), and the ack goes exactly once: at the end, or earlier
// when a Reclaim copied its view away (`acked`). On the device path the ack waits until the
// work enqueued on the consumer's stream by then has finished: the producer may overwrite the
// slot as soon as it has every ack, so no kernel of ours may still be reading it.
struct SlotLease {
  SlotLease(std::shared_ptr<ConsumerState> s, const BatchAnnouncement& ann, const uint8_t* b)
      : state(std::move(s)), a(ann), base(b) {}
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  ~SlotLease() {
    if (view.data()) {
      std::lock_guard<std::mutex> lock(state->leases_mu);
      auto it = state->leases.find(a.seq);
      if (it != state->leases.end() && it->second.expired()) state->leases.erase(it);
    }
    if (acked.exchange(true)) return;  // a Reclaim gave the slot back already
    if (state->mapper && on_stream) {
      const uint64_t seq = a.seq;
      // The callback holds only the sink and the pending count: it must not be the one to
      // destroy the consumer (no CUDA calls are allowed in a stream callback).
      std::shared_ptr<AckSink> sink = state->sink;
      sink->pending.fetch_add(1);
      state->mapper->WhenStreamDone(stream, [sink, seq] {
        sink->Queue(seq);
        sink->pending.fetch_sub(1);
      });
    } else {
      state->QueueAck(a.seq);
    }
  }

  std::shared_ptr<ConsumerState> state;
  BatchAnnouncement a;
  PrivateView view;                      // the host path's own copy-on-write view of the slot
  const uint8_t* base = nullptr;         // host slot: view.data(), or the shared ring's
  const uint8_t* device_base = nullptr;  // device slot (device path)
  void* stream = nullptr;                // the consumer stream that reads it (the last one)
  bool on_stream = false;
  void* waited_stream = nullptr;         // the stream last made to wait for the slot's event
  bool waited = false;
  std::atomic<bool> acked{false};
};

// Where sample `i` of a data area laid out for `capacity` samples lies: one range of the image
// tensor, or one per field of a schema (FieldOffsets). A sample copied apart (a group's
// padding) keeps these ranges one after another.
struct ByteRange {
  uint64_t offset = 0, bytes = 0;
};
std::vector<ByteRange> SampleRanges(const SlotTable& t, uint64_t capacity, uint64_t i);


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
  std::vector<uint8_t> on_host;  // device path: its kFieldOnHost fields, one after another
};

// The outcome of a wait without a bound (wait_ms < 0), which is never kNotYet.
template <typename T>
Result<T> Outcome(Result<Waited<T>> r) {
  if (!r.ok()) return r.status();
  assert(r->ready() && "a wait without a bound ended without an outcome");
  return **std::move(r);
}

// A connected consumer's whole state behind the public Consumer (consumer.h): the shared state
// (ConsumerState, which the I/O thread and batches' deleters hold too) and the iteration cursor,
// touched only by the thread that calls NextEpoch/Next. Its methods are Consumer's, and the
// steps they are made of.
class Cursor {
 public:
  explicit Cursor(std::shared_ptr<ConsumerState> state);
  ~Cursor();  // says goodbye
  Cursor(const Cursor&) = delete;
  Cursor& operator=(const Cursor&) = delete;

  // Consumer's methods (consumer.h says what each does).
  // wait_ms < 0: until an outcome (never kNotYet).
  Result<Waited<bool>> NextEpoch(int wait_ms);
  Result<Waited<std::optional<Batch>>> Next(void* stream, int wait_ms);
  Status Resume(uint64_t epoch, uint64_t begin, uint64_t samples, uint64_t origin);
  void Close();
  bool finished() const { return finished_; }
  uint64_t epoch() const { return epoch_; }
  bool partial() const { return partial_; }
  uint64_t size() const;
  // Where this epoch's positions begin (they run on modulo the epoch's samples: a caught-up
  // epoch is the shared stream's rest, then what came before).
  uint64_t split_begin() const { return split_mode() ? split_.begin : epoch_begin_.load(); }
  // A group member's caught-up epoch: the position its order starts at (its split's positions
  // count from there round the epoch's end); 0 otherwise, and for a consumer alone (whose
  // split_begin() says it).
  uint64_t split_origin() const { return split_mode() ? origin_.load() : 0; }
  uint64_t samples_seen() const { return samples_seen_; }
  const std::string& resume_note() const { return resume_note_; }
  uint32_t batch_size() const { return state_->opts.batch_size; }
  const SlotTable& slots() const { return state_->welcome.slots; }
  const ProducerInfo& producer() const { return producer_; }
  uint64_t consumer_id() const { return state_->welcome.consumer_id; }
  bool on_device() const { return state_->mapper != nullptr; }
  const std::string& fallback_reason() const { return state_->fallback_reason; }

 private:
  // The next announcement (a pushed-back one first); nullopt at the end of the stream (the
  // producer served every epoch). Waits until `slice_end` at most (kNotYet then).
  Result<Waited<std::optional<BatchAnnouncement>>> Take(std::chrono::steady_clock::time_point slice_end);
  // Whether a wait that found nothing goes on: false once `slice_end` passed; the Timeout
  // (naming who holds the producer back) after the overall timeout, or a group found incomplete.
  Result<bool> WaitOver(std::chrono::steady_clock::time_point slice_end);
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
  // A group member's saved state as the rest of its epoch for the producer to serve (group.cc):
  // positions [from, to) of `epoch`, taken modulo the epoch (empty: the saved epoch was done,
  // `epoch` is the next one).
  struct GroupRest {
    uint64_t epoch = 0, from = 0, to = 0;
  };
  Result<GroupRest> SavedGroupRest() const;
  // A lease on the slot `a` announces, its memory mapped as this consumer reads it.
  Result<std::shared_ptr<SlotLease>> OpenSlot(const BatchAnnouncement& a);
  // The consumer batch made of `pieces`: a view of one slot, or what Spill gathered.
  Result<std::optional<Batch>> Deliver(std::vector<Piece>& pieces, std::optional<Batch>& gathered,
                                       uint32_t count, void* stream);
  // Every consumer batch is copied out of the ring at once (the device path without zero_copy).
  bool copies_every_batch() const;
  // Passes the rest of the epoch unread: true when done, false when `slice_end` came first.
  Result<bool> SkipRestOfEpoch(std::chrono::steady_clock::time_point slice_end);
  // Copies `pieces` into `gathered` (created for the batch size on first use) and lets go of
  // their slots.
  Status Spill(std::vector<Piece>& pieces, std::optional<Batch>& gathered, void* stream);

  // Groups (group.cc). Plans the epoch's split from its first announcement `a`, applying a
  // pending resume; false when this epoch is to be skipped whole (by a resume).
  Result<bool> StartSplit(const BatchAnnouncement& a);
  Result<Waited<std::optional<Batch>>> NextInGroup(void* stream, std::chrono::steady_clock::time_point slice_end);
  // The cursor's next slot of this epoch (current_, offset_ 0); false at the epoch's end (or the
  // stream's, or its stop when `have_samples` are gathered already: stopped_ says it next).
  Result<Waited<bool>> NextSlot(std::chrono::steady_clock::time_point slice_end, bool have_samples);
  // The plain consumer's: slices producer batches to the consumer's batch size.
  Result<Waited<std::optional<Batch>>> NextSliced(void* stream, std::chrono::steady_clock::time_point slice_end);
  // Moves the stream cursor up to position `upto`, taking the samples from `take_from` on into
  // `pieces` (nullptr: taking none) and keeping copies of padding positions it passes: true
  // when there, false when `slice_end` came first.
  Result<bool> Advance(uint64_t upto, uint64_t take_from, std::vector<Piece>* pieces,
                 std::optional<Batch>* gathered, void* stream, std::chrono::steady_clock::time_point slice_end);
  Status Stash(uint32_t from, uint32_t n, void* stream);
  // Where position `pos` of this epoch comes in its order: the split's coordinate (a caught-up
  // epoch runs origin_..N-1, 0..origin_-1).
  uint64_t Coord(uint64_t pos) const;
  Status AppendPadding(Batch& b, void* stream);
  void FreeStash();
  bool split_mode() const;  // in a group, or resuming: batches follow common/split.h
  std::shared_ptr<ConsumerState> state_;
  // The iteration cursor; touched only by the thread that calls NextEpoch/Next (but see epoch_).
  std::optional<BatchAnnouncement> pending_;       // read ahead, belongs to a later epoch
  std::shared_ptr<SlotLease> current_;   // the slot being sliced
  uint32_t offset_ = 0;                            // samples of current_ already handed out
  std::vector<Piece> gathering_;         // a batch in assembly, kept across a timeout
  std::optional<Batch> assembling_;                // ... and what of it is already copied out
  // epoch_, partial_, finished_ and samples_seen_ are also read by the getters above from
  // another thread than the one in Next() (the Python Loader's batch ahead is taken on a
  // thread of its own while the job asks for its state): atomic, written only here.
  std::atomic<uint64_t> epoch_{0};
  std::atomic<bool> partial_{false};
  bool in_epoch_ = false;
  bool epoch_ended_ = false;
  bool stream_ended_ = false;
  bool attached_ = false;
  std::atomic<bool> finished_{false};  // the stream ended: the producer served every epoch
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
  std::atomic<uint64_t> origin_{0};  // where a caught-up epoch's order starts (split_origin())
  uint64_t walked_ = 0;              // the split's coordinate the cursor has passed up to in this epoch
  uint64_t group_batch_ = 0;
  std::atomic<uint64_t> samples_seen_{0};
  bool stream_epoch_done_ = false;
  bool resume_pending_ = false;
  // The producer serves a resumed state's rest itself (kAttachResume): no split, no skipping.
  bool served_resume_ = false;
  std::atomic<uint64_t> epoch_begin_{0};  // a plain consumer's split_begin()
  std::string resume_note_;
  std::vector<Segment> padding_;
  std::map<uint64_t, PadSample> stash_;
  uint8_t* stash_device_ = nullptr;  // device path: labels, then samples, for padding_
  void* stash_stream_ = nullptr;
  ProducerInfo producer_;
};

}  // namespace internal
}  // namespace coloader
