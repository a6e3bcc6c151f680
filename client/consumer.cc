#include "client/consumer.h"

#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <new>
#include <mutex>
#include <thread>
#include <tuple>
#include <zmq.hpp>

#include "client/device_mapper.h"
#include "common/curve.h"
#include "common/endpoint.h"
#include "common/mailbox.h"
#include "common/process.h"
#include "common/shm.h"

namespace coloader {
namespace internal {

// Where releases land: any thread (a garbage collector's, a CUDA callback's) queues an ack
// without blocking, and the I/O thread sends them.
struct AckSink {
  std::mutex mu;
  std::vector<uint64_t> acks;
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::atomic<int> pending{0};  // stream-ordered releases whose ack is not queued yet

  ~AckSink() {
    if (fd >= 0) ::close(fd);
  }
  void Queue(uint64_t seq) {
    {
      std::lock_guard<std::mutex> lock(mu);
      acks.push_back(seq);
    }
    Wake();
  }
  void Wake() {
    uint64_t one = 1;
    (void)!::write(fd, &one, sizeof(one));  // never blocks: the counter only grows
  }
  std::vector<uint64_t> Take() {
    uint64_t counter = 0;
    (void)!::read(fd, &counter, sizeof(counter));
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
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};
  std::thread io;
  std::atomic<bool> stopping{false};

  // Announcements and the producer's fate, from the I/O thread to the user's thread.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<BatchAnnouncement> queue;
  std::optional<Bye> bye;
  Status error;

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
    return {std::unique_ptr<uint8_t[]>(new uint8_t[bytes]), bytes};  // uninitialised on purpose
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

  // The frame after a remote Batch: [int64 indices][int64 labels][tensor] of its samples.
  Status TakePayload(const zmq::message_t& head, const BatchAnnouncement& a) {
    zmq::message_t payload;
    if (!head.more() || !sock.recv(payload, zmq::recv_flags::none)) {
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
    std::memcpy(slot + t.data_offset, in + 16 * n, tensor);
    return Status::OK();
  }
};

// One producer slot this consumer was given. Its destruction is the ack, so exactly one
// exists per announcement (not copyable). On the device path the ack waits until the work
// enqueued on the consumer's stream by then has finished: the producer may overwrite the
// slot as soon as it has every ack, so no kernel of ours may still be reading it.
struct SlotLease {
  SlotLease(std::shared_ptr<ConsumerState> s, const BatchAnnouncement& ann, const uint8_t* b)
      : state(std::move(s)), a(ann), base(b) {}
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  ~SlotLease() {
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
  const uint8_t* base = nullptr;         // host slot
  const uint8_t* device_base = nullptr;  // device slot (device path)
  void* stream = nullptr;                // the consumer stream that reads it (the last one)
  bool on_stream = false;
  void* waited_stream = nullptr;         // the stream last made to wait for the slot's event
  bool waited = false;
};

void ConsumerState::IoLoop() {
  NameThisThread("cl-consumer-io");
  const uint64_t hb_ns = uint64_t{welcome.heartbeat_ms} * 1000000;
  const uint64_t timeout_ns = uint64_t{welcome.heartbeat_timeout_ms} * 1000000;
  uint64_t last_heard = MonotonicNs(), last_sent = last_heard;
  auto send = [&](const Message& m) {
    std::vector<uint8_t> bytes = Encode(m);
    try {
      if (sock.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) last_sent = MonotonicNs();
    } catch (const zmq::error_t&) {
      // The connection is gone; the liveness checks below report it.
    }
  };
  bool said_bye = false;
  uint64_t exit_seen_ns = 0;  // when the producer's pidfd fired
  uint64_t last_awake = last_heard;
  while (!stopping.load()) {
    std::vector<zmq::pollitem_t> items = {{sock.handle(), 0, ZMQ_POLLIN, 0},
                                          {nullptr, sink->fd, ZMQ_POLLIN, 0}};
    if (producer_watch.valid() && exit_seen_ns == 0) items.push_back({nullptr, producer_watch.fd(), ZMQ_POLLIN, 0});
    const uint32_t wait_ms = exit_seen_ns ? 10 : std::min<uint32_t>(welcome.heartbeat_ms, 100);
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(wait_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) {
        Fail(Status::IOError(std::string("poll: ") + e.what()));
        return;
      }
    }
    // Acks first: they free the producer.
    for (uint64_t seq : sink->Take()) send(Ack{seq});

    for (;;) {
      zmq::message_t msg;
      if (!sock.recv(msg, zmq::recv_flags::dontwait)) break;
      last_heard = MonotonicNs();
      Result<Message> m = Decode(msg.data<uint8_t>(), msg.size());
      if (!m.ok()) {
        Fail(Status::Protocol(Who() + " sent a malformed message: " + m.status().message()));
        return;
      }
      if (auto* a = std::get_if<BatchAnnouncement>(&*m)) {
        if (a->slot >= welcome.slots.num_slots || a->count > welcome.slots.batch_size) {
          Fail(Status::Protocol(Who() + " announced slot " + std::to_string(a->slot) + " with " +
                                std::to_string(a->count) + " samples, outside its slot table"));
          return;
        }
        if (local_slots) {
          Status st = TakePayload(msg, *a);
          if (!st.ok()) {
            Fail(st);
            return;
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(*a);
        cv.notify_all();
      } else if (auto* bye_msg = std::get_if<Bye>(&*m)) {
        {
          std::lock_guard<std::mutex> lock(mu);
          bye = *bye_msg;
          said_bye = true;
          cv.notify_all();
        }
        if (mailbox) mailbox->Wake();
      } else if (!std::holds_alternative<Heartbeat>(*m)) {
        Fail(Status::Protocol(Who() + " sent an unexpected " + MessageTypeName(*m) + " message"));
        return;
      }
    }
    if (said_bye) break;  // the producer is done with us; nothing more will come

    const uint64_t now = MonotonicNs();
    // Silence counts only while we were running: a process stopped (SIGSTOP, a debugger, a
    // suspended VM) finds the producer's last words still on their way through libzmq when it
    // resumes (typically that it was detached), and must read them rather than conclude from
    // its own absence that the producer went silent.
    if (now - last_awake > uint64_t{wait_ms} * 1000000 + 250'000'000) {
      if (last_heard <= last_awake) last_heard = now - (last_awake - last_heard);  // not if heard since
      send(Heartbeat{});
    }
    last_awake = now;
    if (producer_watch.valid() && producer_watch.Exited()) {
      // What it sent before it went may still be on its way through libzmq (a goodbye, or
      // that we were detached while stopped): give it a moment to arrive before concluding.
      if (exit_seen_ns == 0) exit_seen_ns = now;
      if (now - exit_seen_ns > 200'000'000) {
        Fail(Status::Disconnected(Who() + " exited without saying goodbye (killed or crashed); "
                                  "restart it and reconnect"));
        return;
      }
      continue;
    }
    if (now - last_heard > timeout_ns) {
      Fail(Status::Disconnected(Who() + " has not been heard from for " +
                                std::to_string(welcome.heartbeat_timeout_ms) +
                                " ms; it is gone or unreachable"));
      return;
    }
    if (now - last_sent > hb_ns) send(Heartbeat{});
  }
  if (!said_bye) {
    // Closing: flush the acks of what we still held, then say goodbye so the producer
    // reclaims our slots at once instead of waiting for the pidfd or the heartbeat.
    for (uint64_t seq : sink->Take()) send(Ack{seq});
    send(Bye{ByeReason::kLeaving, ""});
  }
}

}  // namespace internal

using internal::ConsumerState;
using internal::SlotLease;

// ---------------------------------------------------------------------------------------------
// Batch

Batch::Batch(Batch&& o) noexcept
    : state_(std::move(o.state_)),
      leases_(std::move(o.leases_)),
      owned_(std::move(o.owned_)),
      owned_capacity_(o.owned_capacity_),
      owned_indices_(std::move(o.owned_indices_)),
      owned_labels_(std::move(o.owned_labels_)),
      owned_device_(o.owned_device_),
      stream_(o.stream_),
      device_(o.device_),
      device_labels_(o.device_labels_),
      data_(o.data_),
      indices_(o.indices_),
      labels_(o.labels_),
      count_(o.count_),
      epoch_(o.epoch_),
      ready_ns_(o.ready_ns_) {
  o.owned_device_ = nullptr;
}
Batch& Batch::operator=(Batch&& o) noexcept {
  if (this != &o) {
    Release();
    state_ = std::move(o.state_);
    leases_ = std::move(o.leases_);
    owned_ = std::move(o.owned_);
    owned_capacity_ = o.owned_capacity_;
    owned_indices_ = std::move(o.owned_indices_);
    owned_labels_ = std::move(o.owned_labels_);
    owned_device_ = o.owned_device_;
    o.owned_device_ = nullptr;
    stream_ = o.stream_;
    device_ = o.device_;
    device_labels_ = o.device_labels_;
    data_ = o.data_;
    indices_ = o.indices_;
    labels_ = o.labels_;
    count_ = o.count_;
    epoch_ = o.epoch_;
    ready_ns_ = o.ready_ns_;
  }
  return *this;
}
Batch::~Batch() { Release(); }

void Batch::Release() {
  if (owned_device_) {
    state_->mapper->Free(owned_device_, stream_);  // stream-ordered: after our reads
    owned_device_ = nullptr;
  }
  leases_.clear();  // the last reference to a slot acks it
  if (owned_) state_->GiveBuffer(std::move(owned_), owned_capacity_);
  data_ = nullptr;
  indices_ = labels_ = device_labels_ = nullptr;
  count_ = 0;
}

Status Batch::CopyTo(void* host_dst) const {
  if (!data_) return Status::Invalid("the batch was released");
  if (device_ >= 0) return state_->mapper->CopyToHost(host_dst, data_, bytes(), stream_);
  std::memcpy(host_dst, data_, bytes());
  return Status::OK();
}

DType Batch::dtype() const { return state_->welcome.slots.dtype; }
TensorLayout Batch::layout() const { return state_->welcome.slots.layout; }
uint64_t Batch::bytes() const { return uint64_t{count_} * state_->welcome.slots.sample_bytes(); }
std::vector<int64_t> Batch::shape() const {
  const SlotTable& t = state_->welcome.slots;
  if (t.layout == TensorLayout::kNCHW) return {count_, t.channels, t.height, t.width};
  return {count_, t.height, t.width, t.channels};
}

// ---------------------------------------------------------------------------------------------
// Consumer

Consumer::Consumer(std::shared_ptr<ConsumerState> state) : state_(std::move(state)) {}
Consumer::~Consumer() { Close(); }

void Consumer::Close() {
  if (!state_) return;
  current_.reset();
  gathering_.clear();  // their acks go out before the goodbye
  assembling_.reset();
  if (state_->io.joinable()) {
    // Releases still waiting on GPU work would be lost to the goodbye (the producer reclaims
    // everything of ours at once): give them a bounded time to land first.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (state_->sink->pending.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    state_->stopping.store(true);
    state_->sink->Wake();  // wake it now, not at its next poll timeout
    state_->io.join();
  }
  state_->sock.close();
  // The mapper (and its IPC mapping) stays with the state while leases are alive.
}

Result<std::unique_ptr<Consumer>> Consumer::Connect(ConsumerOptions opts) {
  auto state = std::make_shared<ConsumerState>();
  if (state->sink->fd < 0) return Status::FromErrno("eventfd", errno);
  if (!opts.endpoint.empty()) {
    state->endpoint = opts.endpoint;
    if (opts.endpoint.rfind("ipc://", 0) == 0) {
      // ZeroMQ would retry a socket it may not open forever, silently: say why now.
      const std::string path = opts.endpoint.substr(6);
      if (::access(path.c_str(), R_OK | W_OK) != 0) {
        const int err = errno;
        if (err == EACCES) {
          return Status::Invalid("permission denied for " + path +
                                 ": it belongs to another user's producer (run directories are private, mode 0700)");
        }
        return Status::NotFound("no producer socket at " + path + " (" + std::strerror(err) + ")");
      }
    }
  } else {
    ASSIGN_OR_RETURN(ProducerPaths paths, PathsFor(opts.name));
    struct stat st {};
    auto live = [&] { return ::stat(paths.socket.c_str(), &st) == 0 && NameLock::IsHeld(paths.lock); };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts.wait_for_producer_ms);
    while (!live() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling a path: no event to wait on
    }
    if (!live()) {
      return Status::NotFound("no producer named '" + opts.name + "' is running (nothing live at " +
                              paths.socket + "); start one with: coloader serve --name " +
                              opts.name + " --data DIR");
    }
    state->endpoint = paths.endpoint;
  }
  state->opts = std::move(opts);
  const ConsumerOptions& o = state->opts;

  zmq::socket_t& sock = state->sock;
  sock.set(zmq::sockopt::linger, 200);
  sock.set(zmq::sockopt::rcvhwm, 100000);
  const bool tcp = state->endpoint.rfind("tcp://", 0) == 0;
  const bool curve = !o.curve_key_file.empty() || !o.curve_server_key.empty();
  std::string our_key;
  if (curve) {
    if (!tcp) return Status::Invalid("CURVE keys apply to tcp:// endpoints; local producers are reached through the private run directory");
    ASSIGN_OR_RETURN(our_key, UseCurveClientKeys(sock, o.curve_key_file, o.curve_server_key));
  }
  // On tcp, a refused key shows only as a failed handshake: watch for it to say so.
  zmq::socket_t monitor(state->ctx, zmq::socket_type::pair);
  if (tcp) {
    const std::string mon = "inproc://coloader-handshake-" + std::to_string(reinterpret_cast<uintptr_t>(state.get()));
    if (zmq_socket_monitor(sock.handle(), mon.c_str(),
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
      monitor.set(zmq::sockopt::linger, 0);
      monitor.connect(mon);
    }
  }
  try {
    sock.connect(state->endpoint);
  } catch (const zmq::error_t& e) {
    return Status::Invalid("cannot connect to '" + state->endpoint + "': " + e.what());
  }
  Hello hello;
  // A remote consumer's pid means nothing to the producer (it is watched by heartbeat).
  hello.pid = tcp ? 0 : static_cast<uint32_t>(::getpid());
  hello.batch_size = o.batch_size;
  hello.flags = static_cast<uint8_t>((o.wait_for_epoch ? kHelloWaitForEpoch : 0) | (o.device ? kHelloDevice : 0));
  hello.client_name = o.client_name;
  if (o.device) {
    if (auto uuid = DeviceMapper::CurrentDeviceUuid(); uuid.ok()) hello.device_uuid = *uuid;
  }
  std::vector<uint8_t> bytes = Encode(hello);
  sock.send(zmq::buffer(bytes), zmq::send_flags::none);

  zmq::message_t reply;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.connect_timeout_ms);
  // Handshakes that failed for other reasons than a refused key: a producer restarting
  // mid-handshake looks like this as well as a wrong key, so they are retried to the deadline.
  int failed_handshakes = 0;
  bool mismatch = false;  // the producer uses another security mechanism (CURVE or none)
  std::string last_failure;
  for (;;) {
    std::vector<zmq::pollitem_t> items = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
    if (monitor.handle() && tcp) items.push_back({monitor.handle(), 0, ZMQ_POLLIN, 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() > 0) zmq::poll(items.data(), items.size(), left);
    if ((items[0].revents & ZMQ_POLLIN) && sock.recv(reply, zmq::recv_flags::dontwait)) break;
    if (items.size() > 1 && (items[1].revents & ZMQ_POLLIN)) {
      zmq::message_t event, where;
      (void)monitor.recv(event, zmq::recv_flags::none);
      if (event.more()) (void)monitor.recv(where, zmq::recv_flags::none);
      uint16_t id = 0;
      uint32_t value = 0;
      if (event.size() >= 2) std::memcpy(&id, event.data(), 2);
      if (event.size() >= 6) std::memcpy(&value, event.data<uint8_t>() + 2, 4);
      if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        return Status::Invalid("the producer at " + state->endpoint + " refused this consumer's key" +
                               (our_key.empty() ? std::string(" (none given: it requires CURVE; pass --curve-key and --server-key)")
                                                : " " + our_key + ": its operator must add this consumer's .pub to --authorized-keys"));
      }
      ++failed_handshakes;
      if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        char code[16];
        std::snprintf(code, sizeof(code), "0x%08x", value);
        mismatch = mismatch || value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH;
        last_failure = std::string("a ZMTP protocol error ") + code +
                       (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? " (security mechanisms differ)"
                        : value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC    ? " (cryptographic)"
                                                                             : "");
      } else {
        last_failure = "the connection closed mid-handshake";
      }
    }
    if (std::chrono::steady_clock::now() >= deadline && failed_handshakes > 0) {
      const std::string why =
          curve ? "check that --server-key is that producer's public key, and that it was started with --curve-key "
                  "(a producer started with --insecure takes no keys)"
          : mismatch ? "the producer requires CURVE keys (--curve-key and --server-key)"
                     : "is the producer restarting, or does it require CURVE keys (--curve-key and --server-key)?";
      return Status::Invalid(std::string(curve ? "the CURVE handshake" : "the handshake") + " with " + state->endpoint +
                             " failed " + std::to_string(failed_handshakes) + " time(s) within " +
                             std::to_string(o.connect_timeout_ms) + " ms (last: " + last_failure + "): " + why);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout("producer at " + state->endpoint + " did not answer the handshake within " +
                             std::to_string(o.connect_timeout_ms) + " ms; is it running and responsive?" +
                             (curve ? " (with CURVE: a wrong --server-key looks like this too)" : ""));
    }
  }
  if (tcp) {
    (void)zmq_socket_monitor(sock.handle(), nullptr, 0);
    monitor.close();
  }
  Result<Message> m = Decode(reply.data<uint8_t>(), reply.size());
  if (!m.ok()) {
    auto version = PeekVersion(reply.data<uint8_t>(), reply.size());
    if (version.ok() && *version != kProtocolVersion) {
      return Status::Protocol("the producer speaks protocol version " + std::to_string(*version) +
                              " and this consumer version " + std::to_string(kProtocolVersion) +
                              "; use the same coloader release on both sides");
    }
    return Status::Protocol("malformed handshake reply from " + state->endpoint + ": " + m.status().message());
  }
  if (auto* reject = std::get_if<Reject>(&*m)) {
    return Status::Protocol("the producer refused this consumer: " + reject->reason);
  }
  if (auto* bye = std::get_if<Bye>(&*m)) {
    return Status::Disconnected("the producer said goodbye at once: " + bye->message);
  }
  auto* welcome = std::get_if<Welcome>(&*m);
  if (!welcome) {
    return Status::Protocol(std::string("expected Welcome from the producer, got ") + MessageTypeName(*m));
  }
  state->welcome = *welcome;
  const SlotTable& t = welcome->slots;
  if (t.shm_name.empty()) {
    // A remote consumer: the producer sends each batch along with its announcement.
    state->local_slots.reset(new (std::nothrow) uint8_t[t.slot_bytes * t.num_slots]);
    if (!state->local_slots) {
      return Status::IOError("cannot allocate " + std::to_string(t.slot_bytes * t.num_slots) +
                             " bytes for a remote copy of the producer's ring");
    }
  }
  // Watch the producer before mapping what it made: if it exits between its Welcome and our
  // mapping (a restart, a kill), its shared memory is already gone, and that is said as such.
  bool producer_gone = false;
  if (state->endpoint.rfind("ipc://", 0) == 0 && welcome->producer_pid > 0) {
    if (auto w = ProcessWatch::Open(static_cast<int>(welcome->producer_pid)); w.ok())
      state->producer_watch = std::move(*w);
    else
      producer_gone = true;  // no such process any more
  }
  auto explain = [&](Status st) {
    if (producer_gone || (state->producer_watch.valid() && state->producer_watch.Exited()))
      return Status::Disconnected("the producer stopped while this consumer was connecting (" + st.message() + ")");
    return st;
  };
  if (!t.shm_name.empty()) {
    auto shm = SharedMemory::Open(t.shm_name, t.slot_bytes * t.num_slots, false);
    if (!shm.ok()) return explain(shm.status());
    state->shm = std::move(*shm);
  }
  if (!welcome->mailbox_name.empty()) {
    auto boxes = MailboxArea::Open(welcome->mailbox_name, welcome->mailbox_count, welcome->mailbox_capacity);
    if (!boxes.ok()) return explain(boxes.status());
    state->mailboxes = std::move(*boxes);
    state->mailbox.emplace(state->mailboxes.at(welcome->mailbox_index));
  }
  if (state->opts.device) {
    if (tcp) {
      // The producer offers its device ring to local consumers only (CUDA IPC does not cross
      // machines); it did not even look for one.
      state->fallback_reason = "consumers over tcp:// read the host path: batches arrive as message payload "
                               "(the producer's GPU memory can be mapped only on its own machine)";
    } else if (!welcome->has_device) {
      state->fallback_reason = "the producer has no device ring (start it with --device cuda:N)";
    } else if (auto mapper = DeviceMapper::Open(welcome->device); mapper.ok()) {
      state->mapper = std::move(*mapper);
    } else {
      state->fallback_reason = "cannot map the producer's GPU memory: " + mapper.status().message();
    }
  }
  if (welcome->has_device) {
    // Tell the producer which path we read; it sends no batch before this, so falling back
    // to the host path loses nothing.
    std::vector<uint8_t> attach = Encode(Attach{static_cast<uint8_t>(state->mapper ? 1 : 0)});
    sock.send(zmq::buffer(attach), zmq::send_flags::none);
  }
  if (state->opts.batch_size == 0) state->opts.batch_size = t.batch_size;
  ConsumerState* raw = state.get();
  state->io = std::thread([raw] { raw->IoLoop(); });
  return std::unique_ptr<Consumer>(new Consumer(std::move(state)));
}

Result<std::optional<BatchAnnouncement>> Consumer::Take() {
  if (pending_) {
    std::optional<BatchAnnouncement> a = pending_;
    pending_.reset();
    return a;
  }
  ConsumerState& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  auto ready = [&s] { return !s.queue.empty() || s.bye || !s.error.ok(); };
  if (s.mailbox) {
    // The mailbox road: wait on its doorbell, which the producer rings for a batch and our
    // I/O thread for a goodbye or an error. Announcements pushed before a goodbye are all
    // taken before the goodbye is acted on.
    lock.unlock();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(s.opts.timeout_ms);
    for (;;) {
      const uint32_t seen = s.mailbox->doorbell();
      if (auto a = s.mailbox->Pop(s.welcome.consumer_id)) return std::optional<BatchAnnouncement>(*a);
      lock.lock();
      if (!s.error.ok()) return s.error;
      if (ready()) {
        // A goodbye (or a Batch message). Announcements pushed before the goodbye may have
        // become visible only after our Pop above: take them first.
        if (!s.mailbox->Empty() && s.mailbox->Owned(s.welcome.consumer_id) && s.queue.empty()) {
          lock.unlock();
          continue;
        }
        break;
      }
      lock.unlock();
      if (!s.mailbox->Owned(s.welcome.consumer_id)) {
        return Status::Disconnected(s.Who() + " gave this consumer's mailbox to another: it was detached");
      }
      int slice = 100;  // ms; the I/O thread rings on any change, this only bounds the wait
      if (s.opts.timeout_ms > 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
        if (left <= 0) {
          return Status::Timeout("no batch from " + s.Who() + " within " + std::to_string(s.opts.timeout_ms) +
                                 " ms (--timeout); it is alive but slow, or waiting for more consumers");
        }
        slice = static_cast<int>(std::min<long long>(slice, left));
      }
      s.mailbox->Wait(seen, slice);
    }
  } else if (s.opts.timeout_ms > 0) {
    if (!s.cv.wait_for(lock, std::chrono::milliseconds(s.opts.timeout_ms), ready)) {
      return Status::Timeout("no batch from " + s.Who() + " within " + std::to_string(s.opts.timeout_ms) +
                             " ms (--timeout); it is alive but slow, or waiting for more consumers");
    }
  } else {
    s.cv.wait(lock, ready);
  }
  if (!s.error.ok()) return s.error;
  if (!s.queue.empty()) {
    BatchAnnouncement a = s.queue.front();
    s.queue.pop_front();
    return std::optional<BatchAnnouncement>(a);
  }
  // Every announcement before the Bye has been taken.
  switch (s.bye->reason) {
    case ByeReason::kFinished:
    case ByeReason::kStopping:
      return std::optional<BatchAnnouncement>();
    case ByeReason::kDetached:
      return Status::Disconnected(s.Who() + " detached this consumer: " + s.bye->message);
    default:
      return Status::Protocol(s.Who() + " dropped this consumer: " + s.bye->message);
  }
}

Status Consumer::SkipRestOfEpoch() {
  // Called when the user starts a new epoch before this one ended: the rest is released
  // unread, as a new iter() over a DataLoader abandons the old one.
  while (!epoch_ended_) {
    if (current_ && (current_->a.flags & kBatchLastInEpoch)) break;
    current_.reset();
    ASSIGN_OR_RETURN(std::optional<BatchAnnouncement> a, Take());
    if (!a) {
      stream_ended_ = true;
      break;
    }
    if (a->epoch != epoch_) {
      pending_ = a;
      break;
    }
    current_ = std::make_shared<SlotLease>(state_, *a, nullptr);
  }
  current_.reset();
  epoch_ended_ = true;
  return Status::OK();
}

Result<bool> Consumer::NextEpoch() {
  if (!state_ || !state_->io.joinable()) return Status::Invalid("the consumer is closed");
  // A batch whose assembly a timeout interrupted belongs to the epoch being left: drop it
  // (releasing its slots first, since the producer may wait on them to reach the next epoch)
  // rather than let its samples open the next one.
  gathering_.clear();
  assembling_.reset();
  if (in_epoch_ && !epoch_ended_) RETURN_NOT_OK(SkipRestOfEpoch());
  current_.reset();
  if (stream_ended_) return false;
  ASSIGN_OR_RETURN(std::optional<BatchAnnouncement> a, Take());
  if (!a) {
    stream_ended_ = true;
    return false;
  }
  pending_ = a;
  epoch_ = a->epoch;
  partial_ = a->first != 0;
  in_epoch_ = true;
  epoch_ended_ = false;
  offset_ = 0;
  return true;
}

Status Consumer::Spill(std::vector<internal::Piece>& pieces, std::optional<Batch>& gathered, void* stream) {
  const SlotTable& t = state_->welcome.slots;
  const uint64_t sample_bytes = t.sample_bytes();
  const uint32_t want = state_->opts.batch_size;
  DeviceMapper* m = state_->mapper.get();
  // Device layout of a gathered batch: labels (room for `want`, 256-aligned), then the tensor.
  const uint64_t labels_bytes = (uint64_t{want} * 8 + 255) / 256 * 256;
  if (!gathered) {
    Batch g;
    g.state_ = state_;
    g.stream_ = stream;
    g.epoch_ = epoch_;
    g.ready_ns_ = pieces.front().lease->a.ready_ns;
    if (m) {
      ASSIGN_OR_RETURN(g.owned_device_, m->Allocate(labels_bytes + uint64_t{want} * sample_bytes, stream));
      g.device_ = m->device();
    } else {
      std::tie(g.owned_, g.owned_capacity_) = state_->TakeBuffer(uint64_t{want} * sample_bytes);
    }
    g.owned_indices_.reserve(want);
    g.owned_labels_.reserve(want);
    gathered = std::move(g);
  }
  Batch& b = *gathered;
  while (!pieces.empty()) {
    const internal::Piece& p = pieces.front();
    const uint64_t done = b.count_;
    if (m) {
      // Stream-ordered: the source slot's ack waits for these copies (its lease is on `stream`).
      const DeviceTable& d = state_->welcome.device;
      RETURN_NOT_OK(m->CopyAsync(b.owned_device_ + 8 * done, p.lease->device_base + d.labels_offset + 8ull * p.offset,
                                 8ull * p.count, stream));
      RETURN_NOT_OK(m->CopyAsync(b.owned_device_ + labels_bytes + done * sample_bytes,
                                 p.lease->device_base + d.data_offset + p.offset * sample_bytes, p.count * sample_bytes,
                                 stream));
    } else {
      std::memcpy(b.owned_.get() + done * sample_bytes, p.lease->base + t.data_offset + p.offset * sample_bytes,
                  p.count * sample_bytes);
    }
    const auto* idx = reinterpret_cast<const int64_t*>(p.lease->base + t.indices_offset) + p.offset;
    const auto* lbl = reinterpret_cast<const int64_t*>(p.lease->base + t.labels_offset) + p.offset;
    b.owned_indices_.insert(b.owned_indices_.end(), idx, idx + p.count);
    b.owned_labels_.insert(b.owned_labels_.end(), lbl, lbl + p.count);
    b.count_ += p.count;
    pieces.erase(pieces.begin());  // its slot goes back as soon as nothing else refers to it
  }
  if (m) {
    b.device_labels_ = reinterpret_cast<const int64_t*>(b.owned_device_);
    b.data_ = b.owned_device_ + labels_bytes;
  } else {
    b.data_ = b.owned_.get();
  }
  b.indices_ = b.owned_indices_.data();
  b.labels_ = b.owned_labels_.data();
  return Status::OK();
}

Result<std::optional<Batch>> Consumer::Next(void* stream) {
  if (!state_->io.joinable()) return Status::Invalid("the consumer is closed");
  if (!in_epoch_) return Status::Invalid("call NextEpoch() before Next()");
  if (epoch_ended_) return std::optional<Batch>();
  const uint32_t want = state_->opts.batch_size;
  using internal::Piece;
  // A batch that straddles slots is gathered as it is read: each slot's samples are copied out
  // and the slot let go at once, so a consumer batch larger than the whole ring never holds
  // more than the slot it is slicing (holding them all would wait forever for a free slot).
  // Resume a batch whose assembly a timeout interrupted: its samples are not lost.
  std::vector<Piece> pieces = std::move(gathering_);
  gathering_.clear();
  std::optional<Batch> gathered = std::move(assembling_);
  assembling_.reset();
  uint32_t collected = gathered ? gathered->count_ : 0;
  for (const Piece& p : pieces) collected += p.count;
  auto keep = [&](Status st) {
    gathering_ = std::move(pieces);
    assembling_ = std::move(gathered);
    return st;
  };
  bool last = false;
  while (collected < want) {
    if (!current_ || offset_ == current_->a.count) {
      if (current_ && (current_->a.flags & kBatchLastInEpoch)) {
        last = true;
        break;
      }
      current_.reset();
      Result<std::optional<BatchAnnouncement>> taken = Take();
      if (!taken.ok()) return keep(taken.status());
      std::optional<BatchAnnouncement> a = std::move(*taken);
      if (!a) {  // the producer finished or stopped: this epoch ends here
        stream_ended_ = true;
        last = true;
        break;
      }
      if (a->epoch != epoch_) {  // a new epoch began (this one was cut short by a skip)
        pending_ = a;
        last = true;
        break;
      }
      const uint8_t* base = state_->slot_memory() + uint64_t{a->slot} * state_->welcome.slots.slot_bytes;
      current_ = std::make_shared<SlotLease>(state_, *a, base);
      offset_ = 0;
      if (state_->mapper) current_->device_base = state_->mapper->slot_base(a->slot);
    }
    const uint32_t take = std::min(want - collected, current_->a.count - offset_);
    if (take > 0 && state_->mapper && !(current_->waited && current_->waited_stream == stream)) {
      // Every stream that reads the slot waits for the producer's work on it first.
      if (Status st = state_->mapper->StreamWaitSlot(current_->a.slot, stream); !st.ok()) return keep(st);
      current_->waited = true;
      current_->waited_stream = stream;
    }
    if (take > 0) {
      pieces.push_back({current_, offset_, take});
      current_->stream = stream;  // its release is ordered after this stream's reads
      current_->on_stream = true;
      if (pieces.size() > 1 || gathered) {
        if (Status st = Spill(pieces, gathered, stream); !st.ok()) return keep(st);
      }
    }
    offset_ += take;
    collected += take;
    if (offset_ == current_->a.count && (current_->a.flags & kBatchLastInEpoch)) {
      last = true;
      break;
    }
    // A slot sliced to its end belongs to the batches taken from it alone: drop the cursor's
    // reference, so that releasing them acks the slot at once (not at the next Next()).
    if (offset_ == current_->a.count) current_.reset();
  }
  if (last) {
    epoch_ended_ = true;
    current_.reset();  // nothing more to slice from it; views keep their own reference
  }
  if (collected == 0 || (collected < want && state_->opts.drop_last)) {
    epoch_ended_ = true;
    return std::optional<Batch>();  // a partly gathered batch gives its buffer back
  }
  if (gathered) return gathered;

  // Within one slot: a view.
  const SlotTable& t = state_->welcome.slots;
  const uint64_t sample_bytes = t.sample_bytes();
  const Piece& p = pieces.front();
  Batch b;
  b.state_ = state_;
  b.count_ = collected;
  b.epoch_ = epoch_;
  b.ready_ns_ = p.lease->a.ready_ns;
  b.stream_ = stream;
  b.indices_ = reinterpret_cast<const int64_t*>(p.lease->base + t.indices_offset) + p.offset;
  b.labels_ = reinterpret_cast<const int64_t*>(p.lease->base + t.labels_offset) + p.offset;
  if (state_->mapper) {
    // Device path: the tensor and labels are device pointers; indices and labels are also
    // readable on the host from the host slot.
    const DeviceTable& d = state_->welcome.device;
    b.device_ = state_->mapper->device();
    b.data_ = p.lease->device_base + d.data_offset + p.offset * sample_bytes;
    b.device_labels_ = reinterpret_cast<const int64_t*>(p.lease->device_base + d.labels_offset) + p.offset;
  } else {
    b.data_ = p.lease->base + t.data_offset + p.offset * sample_bytes;
  }
  b.leases_.push_back(p.lease);
  return std::optional<Batch>(std::move(b));
}

uint64_t Consumer::epoch() const { return epoch_; }
bool Consumer::partial() const { return partial_; }
uint32_t Consumer::batch_size() const { return state_->opts.batch_size; }
const SlotTable& Consumer::slots() const { return state_->welcome.slots; }
const Welcome& Consumer::welcome() const { return state_->welcome; }
uint64_t Consumer::consumer_id() const { return state_->welcome.consumer_id; }
bool Consumer::on_device() const { return state_->mapper != nullptr; }
const std::string& Consumer::fallback_reason() const { return state_->fallback_reason; }
uint64_t Consumer::size() const {
  const uint64_t n = state_->welcome.epoch_samples, b = state_->opts.batch_size;
  return state_->opts.drop_last ? n / b : (n + b - 1) / b;
}

}  // namespace coloader
