// Connecting: find the producer, say Hello, wait for its Welcome, map what it gives; and
// closing. The handshake runs in bounded steps (Connecting::Finish), so that a caller can
// check for Ctrl-C between them.
#include "client/consumer_internal.h"
#include "common/log.h"

namespace coloader {

using internal::ConsumerState;
using internal::Cursor;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Cursor: a connected consumer

Cursor::Cursor(std::shared_ptr<ConsumerState> state) : state_(std::move(state)) {
  resume_pending_ = state_->opts.resume;
  const Welcome& w = state_->welcome;
  producer_ = ProducerInfo{w.producer_pid, w.dataset_size, w.epoch_samples, w.seed, w.data_key,
                           w.node_rank, w.num_nodes, w.classes, w.no_catch_up};
}
Cursor::~Cursor() { Close(); }

void Cursor::Close() {
  if (!state_) return;
  if (state_->io.joinable() && state_->opts.world_size > 1 && in_epoch_ && epoch_ended_ && !stream_epoch_done_ &&
      !stream_ended_) {
    // A member that took its whole share leaves at the epoch's end, not before: its goodbye
    // ends the group, and the others' last batches may lie after where its share ended.
    // (Bounded: the producer's death or another member's departure ends the wait.)
    (void)SkipRestOfEpoch(Clock::time_point::max());
  }
  // At the end of training the ranks of a job finish a moment apart: one that took its whole
  // share says so, and the others still read the rest of the epoch. One that leaves earlier
  // (an error, a kill) ends the group for them, rather than leave their all-reduce waiting.
  if (state_->opts.world_size > 1 && in_epoch_ && epoch_ended_) state_->finished_share.store(true);
  FreeStash();
  current_.reset();
  gathering_.clear();  // their acks go out before the goodbye
  assembling_.reset();
  if (state_->io.joinable()) {
    // Releases still waiting on GPU work would be lost to the goodbye (the producer reclaims
    // everything of ours at once): give them a bounded time to land first.
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (state_->sink->pending.load() > 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    state_->stopping.store(true);
    state_->sink->Wake();  // wake it now, not at its next poll timeout
    state_->io.join();
  }
  state_->sock.Close();
  // The mapper (and its IPC mapping) stays with the state while leases are alive.
}

namespace internal {

// One connection attempt, as a sequence of phases each step moves through: locating the
// producer (waiting for it to start), then awaiting its answer to Hello, then adopting what
// its Welcome describes. Step() waits at most its slice; the deadlines are the options'.
class Handshake {
 public:
  explicit Handshake(ConsumerOptions opts) : state_(std::make_shared<ConsumerState>()) {
    state_->opts = std::move(opts);
    const ConsumerOptions& o = state_->opts;
    producer_deadline_ = Clock::now() + std::chrono::milliseconds(o.wait_for_producer_ms);
  }

  Status Begin() {
    COLOADER_ASSIGN_OR_RETURN(state_->sink->wake, EventFd::Make());
    const ConsumerOptions& o = state_->opts;
    if (o.endpoint.empty()) {
      COLOADER_ASSIGN_OR_RETURN(paths_, PathsFor(o.name));
      state_->endpoint = paths_.endpoint;
      return Status::OK();
    }
    state_->endpoint = o.endpoint;
    if (o.endpoint.rfind("ipc://", 0) == 0) {
      // ZeroMQ would retry a socket it may not open forever, silently: say why now.
      const std::string path = o.endpoint.substr(6);
      if (::access(path.c_str(), R_OK | W_OK) != 0) {
        const int err = errno;
        if (err == EACCES) {
          return Status::Invalid("permission denied for " + path +
                                 ": it belongs to another user's producer (run directories are private, mode 0700)");
        }
        return Status::NotFound("no producer socket at " + path + " (" + std::strerror(err) + ")");
      }
    }
    return Dial();
  }

  // Moves on for at most `wait_ms` (-1: to the end): the consumer, or kNotYet.
  Result<Waited<std::unique_ptr<Consumer>>> Step(int wait_ms) {
    const Clock::time_point slice_end =
        wait_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(wait_ms);
    if (!dialed_) {
      COLOADER_ASSIGN_OR_RETURN(bool live, Locate(slice_end));
      if (!live) return kNotYet;
      COLOADER_RETURN_NOT_OK(Dial());
    }
    COLOADER_ASSIGN_OR_RETURN(std::optional<zmq::message_t> reply, AwaitReply(slice_end));
    if (!reply) return kNotYet;
    COLOADER_ASSIGN_OR_RETURN(std::unique_ptr<Consumer> consumer, Adopt(*reply));
    return consumer;
  }

 private:
  // Waits (polling the path: there is no event to wait on) for a producer of the name to be
  // live; false when the slice ended first.
  Result<bool> Locate(Clock::time_point slice_end) {
    const ConsumerOptions& o = state_->opts;
    struct stat st {};
    auto live = [&] { return ::stat(paths_.socket.c_str(), &st) == 0 && NameLock::IsHeld(paths_.lock); };
    if (!live() && o.wait_for_producer_ms > 0 && !said_waiting_) {
      // Jobs launched together with their producer may come first: say once what we wait for.
      said_waiting_ = true;
      Log(LogLevel::kInfo, "waiting up to " + std::to_string((int64_t{o.wait_for_producer_ms} + 500) / 1000) +
                               " s for producer '" + o.name + "' to start (at " + paths_.socket + ")");
    }
    while (!live()) {
      if (Clock::now() >= producer_deadline_) {
        return Status::NotFound("no producer named '" + o.name + "' is running (nothing live at " + paths_.socket +
                                (o.wait_for_producer_ms > 0
                                     ? " after waiting " + std::to_string(o.wait_for_producer_ms) + " ms"
                                     : std::string()) +
                                ")" + WhatRunsInstead(o.name) + "; start one with: coloader serve --name " + o.name +
                                " --data DIR");
      }
      if (Clock::now() >= slice_end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  // The socket (CURVE keys and a handshake monitor on tcp://), connect, and Hello.
  Status Dial() {
    dialed_ = true;
    ConsumerState& s = *state_;
    const ConsumerOptions& o = s.opts;
    COLOADER_ASSIGN_OR_RETURN(s.sock, Socket::Open(s.ctx, zmq::socket_type::dealer));
    Socket& sock = s.sock;
    COLOADER_RETURN_NOT_OK(sock.Set(zmq::sockopt::linger, 200));
    COLOADER_RETURN_NOT_OK(sock.Set(zmq::sockopt::rcvhwm, 100000));
    tcp_ = s.endpoint.rfind("tcp://", 0) == 0;
    COLOADER_RETURN_NOT_OK(sock.Set(zmq::sockopt::maxmsgsize, tcp_ ? kMaxRemoteBatchBytes : kMaxLocalReplyBytes));
    curve_ = !o.curve_key_file.empty() || !o.curve_server_key.empty();
    if (curve_) {
      if (!tcp_)
        return Status::Invalid("CURVE keys apply to tcp:// endpoints; local producers are reached through the private run directory");
      COLOADER_ASSIGN_OR_RETURN(our_key_, UseCurveClientKeys(sock, o.curve_key_file, o.curve_server_key));
    }
    if (tcp_) {
      // On tcp, a refused key shows only as a failed handshake: watch for it to say so.
      const std::string mon = "inproc://coloader-handshake-" + std::to_string(reinterpret_cast<uintptr_t>(&s));
      if (zmq_socket_monitor(sock.handle(), mon.c_str(),
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
        COLOADER_ASSIGN_OR_RETURN(monitor_, Socket::Open(s.ctx, zmq::socket_type::pair));
        COLOADER_RETURN_NOT_OK(monitor_.Set(zmq::sockopt::linger, 0));
        COLOADER_RETURN_NOT_OK(monitor_.Connect(mon));
      }
    }
    if (Status st = sock.Connect(s.endpoint); !st.ok()) return Status::Invalid(st.message());
    hello_ = Encode(MakeHello());
    reply_deadline_ = Clock::now() + std::chrono::milliseconds(o.connect_timeout_ms);
    return SendHello();
  }

  // The first message of a new connection goes into its empty queue, unless the connection is
  // already gone: on tcp:// a handshake refused for a protocol error (a producer that wants
  // CURVE keys) can end it before this thread sends, and libzmq does not dial again. The Hello
  // is then kept (AwaitReply would send it should a connection come) and the handshake monitor
  // or the deadline says why none did.
  Status SendHello() {
    Result<bool> sent = state_->sock.Send(zmq::buffer(hello_), zmq::send_flags::dontwait);
    if (!sent.ok()) return Status::IOError("saying Hello to " + state_->endpoint + ": " + sent.status().message());
    if (*sent) hello_.clear();
    return Status::OK();
  }

  Hello MakeHello() const {
    const ConsumerOptions& o = state_->opts;
    Hello hello;
    // A remote consumer's pid means nothing to the producer (it is watched by heartbeat).
    hello.pid = tcp_ ? 0 : static_cast<uint32_t>(::getpid());
    const ProcessIdentity self = ThisProcessIdentity();
    hello.pid_ns = self.pid_ns;
    hello.start_time = self.start_time;
    hello.batch_size = o.batch_size;
    hello.flags = static_cast<uint8_t>((o.wait_for_epoch ? kHelloWaitForEpoch : 0) | (o.device ? kHelloDevice : 0));
    hello.client_name = o.client_name;
    hello.group = o.group;
    hello.rank = o.rank;
    hello.world_size = o.world_size;
    hello.node_rank = o.node_rank;
    hello.num_nodes = o.num_nodes;
    if (o.expect_seed) {
      hello.flags |= kHelloExpectSeed;
      hello.expect_seed = *o.expect_seed;
    }
    hello.expect_data_key = o.expect_data_key;
    if (o.device) {
      if (auto uuid = DeviceMapper::CurrentDeviceUuid(); uuid.ok()) hello.device_uuid = *uuid;
    }
    return hello;
  }

  // The producer's answer to Hello, or nullopt when the slice ended first; fails at the
  // deadline, saying what the handshake monitor saw.
  Result<std::optional<zmq::message_t>> AwaitReply(Clock::time_point slice_end) {
    ConsumerState& s = *state_;
    for (;;) {
      const short wanted = static_cast<short>(ZMQ_POLLIN | (hello_.empty() ? 0 : ZMQ_POLLOUT));
      std::vector<zmq::pollitem_t> items = {{s.sock.handle(), 0, wanted, 0}};
      if (monitor_.is_open()) items.push_back({monitor_.handle(), 0, ZMQ_POLLIN, 0});
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(std::min(reply_deadline_, slice_end) -
                                                                              Clock::now());
      // A signal delivered meanwhile (the user's handler, a profiler's timer) ends a poll
      // early: the loop polls again until its deadline.
      if (left.count() > 0) COLOADER_RETURN_NOT_OK(Poll(items, left).status());
      if (!hello_.empty() && (items[0].revents & ZMQ_POLLOUT)) COLOADER_RETURN_NOT_OK(SendHello());
      zmq::message_t reply;
      bool got = false;
      if (items[0].revents & ZMQ_POLLIN) {
        COLOADER_ASSIGN_OR_RETURN(got, s.sock.Recv(&reply, zmq::recv_flags::dontwait));
      }
      if (got) {
        if (monitor_.is_open()) {
          (void)zmq_socket_monitor(s.sock.handle(), nullptr, 0);
          monitor_.Close();
        }
        return std::optional<zmq::message_t>(std::move(reply));
      }
      if (items.size() > 1 && (items[1].revents & ZMQ_POLLIN)) COLOADER_RETURN_NOT_OK(ReadMonitorEvent());
      if (Clock::now() >= reply_deadline_) return NoAnswer();
      if (Clock::now() >= slice_end) return std::optional<zmq::message_t>();
    }
  }

  Status ReadMonitorEvent() {
    // An event is two frames, both there once the poll saw the first.
    zmq::message_t event, where;
    COLOADER_RETURN_NOT_OK(monitor_.Recv(&event, zmq::recv_flags::dontwait).status());
    if (event.more()) COLOADER_RETURN_NOT_OK(monitor_.Recv(&where, zmq::recv_flags::dontwait).status());
    uint16_t id = 0;
    uint32_t value = 0;
    if (event.size() >= 2) std::memcpy(&id, event.data(), 2);
    if (event.size() >= 6) std::memcpy(&value, event.data<uint8_t>() + 2, 4);
    if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      return Status::Invalid("the producer at " + state_->endpoint + " refused this consumer's key" +
                             (our_key_.empty() ? std::string(" (none given: it requires CURVE; pass --curve-key and --server-key)")
                                               : " " + our_key_ + ": its operator must add this consumer's .pub to --authorized-keys"));
    }
    // Mechanisms that differ (CURVE on one side only) end the connection for good: libzmq does
    // not dial again, so there is nothing to wait for.
    if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
      return Status::Invalid(
          "the producer at " + state_->endpoint +
          (curve_ ? " takes no CURVE keys (it was started with --insecure): drop --curve-key and --server-key"
                  : " requires CURVE keys: pass --curve-key (this consumer's key pair) and --server-key (its public key)"));
    }
    // Handshakes that failed for other reasons: a producer restarting mid-handshake looks like
    // this as well as a wrong key, so they are retried to the deadline.
    ++failed_handshakes_;
    if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      char code[16];
      std::snprintf(code, sizeof(code), "0x%08x", value);
      last_failure_ = std::string("a ZMTP protocol error ") + code +
                      (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC ? " (cryptographic)" : "");
    } else {
      last_failure_ = "the connection closed mid-handshake";
    }
    return Status::OK();
  }

  Status NoAnswer() const {
    const std::string& ep = state_->endpoint;
    const int ms = state_->opts.connect_timeout_ms;
    if (failed_handshakes_ > 0) {
      const std::string why =
          curve_ ? "check that --server-key is that producer's public key, and that it was started with --curve-key "
                   "(a producer started with --insecure takes no keys)"
                 : "is the producer restarting, or does it require CURVE keys (--curve-key and --server-key)?";
      return Status::Invalid(std::string(curve_ ? "the CURVE handshake" : "the handshake") + " with " + ep + " failed " +
                             std::to_string(failed_handshakes_) + " time(s) within " + std::to_string(ms) +
                             " ms (last: " + last_failure_ + "): " + why);
    }
    // A refused handshake does not always reach the monitor before the deadline (seen on the
    // GPU machine: no event at all for a keyless consumer of a CURVE producer), so the timeout
    // names the key flags too.
    return Status::Timeout("producer at " + ep + " did not answer the handshake within " + std::to_string(ms) +
                           " ms; is it running and responsive?" +
                           (curve_ ? " (with CURVE: a wrong --server-key looks like this too)"
                                   : tcp_ ? " If it requires CURVE keys, pass --curve-key and --server-key." : ""));
  }

  // The reply: a Welcome is adopted (its ring, mailbox and device memory mapped, the I/O
  // thread started); anything else is why not.
  Result<std::unique_ptr<Consumer>> Adopt(const zmq::message_t& reply) {
    ConsumerState& s = *state_;
    Result<Message> m = Decode(reply.data<uint8_t>(), reply.size());
    if (!m.ok()) {
      auto version = PeekVersion(reply.data<uint8_t>(), reply.size());
      if (version.ok() && *version != kProtocolVersion) {
        return Status::Protocol("the producer speaks protocol version " + std::to_string(*version) +
                                " and this consumer version " + std::to_string(kProtocolVersion) +
                                "; use the same coloader release on both sides");
      }
      return Status::Protocol("malformed handshake reply from " + s.endpoint + ": " + m.status().message());
    }
    if (auto* reject = std::get_if<Reject>(&*m)) {
      if (reject->code == RejectCode::kMismatch)
        return Status::Invalid("the producer refused this consumer: " + reject->reason);
      if (reject->code == RejectCode::kFull)
        return Status::Unavailable("the producer refused this consumer: " + reject->reason);
      return Status::Protocol("the producer refused this consumer: " + reject->reason);
    }
    if (auto* bye = std::get_if<Bye>(&*m))
      return Status::Disconnected("the producer said goodbye at once: " + bye->message);
    auto* welcome = std::get_if<Welcome>(&*m);
    if (!welcome) return Status::Protocol(std::string("expected Welcome from the producer, got ") + MessageTypeName(*m));
    s.welcome = *welcome;
    COLOADER_RETURN_NOT_OK(MapMemory());
    if (s.opts.batch_size == 0) s.opts.batch_size = s.welcome.slots.batch_size;
    COLOADER_RETURN_NOT_OK(CheckBatchFits());
    if ((!s.opts.group.empty() || s.opts.resume) && s.welcome.epoch_samples == 0)
      return Status::Invalid(s.Who() + " does not say how many samples an epoch has, which a group's split needs");
    ConsumerState* raw = state_.get();
    COLOADER_ASSIGN_OR_RETURN(s.io, StartThread("the consumer's I/O thread", [raw] { raw->IoLoop(); }));
    return std::unique_ptr<Consumer>(new Consumer(std::make_unique<Cursor>(std::move(state_))));
  }

  // A batch larger than the producer's is gathered into memory of the consumer's own: one that
  // could not fit in this machine's memory is refused now, by name, not met as an allocation
  // failure mid-epoch.
  Status CheckBatchFits() const {
    const ConsumerState& s = *state_;
    const SlotTable& t = s.welcome.slots;
    const uint64_t want = s.opts.batch_size, sample = t.sample_bytes();
    if (want <= t.batch_size || sample == 0) return Status::OK();
    const uint64_t ram = MachineMemoryBytes();
    if (ram == 0 || want <= ram / sample) return Status::OK();
    const std::string what = !t.fields.empty() ? std::to_string(t.fields.size()) + " fields"
                                               : std::to_string(t.channels) + "x" + std::to_string(t.height) + "x" +
                                                     std::to_string(t.width) + " " + DTypeName(t.dtype);
    return Status::Invalid("a batch of " + std::to_string(want) + " samples of " + what + " takes more than this machine's " + HumanBytes(ram) + " of memory (" +
                           HumanBytes(sample) + " a sample): use a smaller batch size");
  }

  // Maps what the Welcome describes: the host ring (or a local copy for a remote consumer),
  // the mailbox, and the device ring when asked for and possible.
  Status MapMemory() {
    ConsumerState& s = *state_;
    const Welcome& w = s.welcome;
    const SlotTable& t = w.slots;
    if (t.shm_name.empty()) {
      // A remote consumer: the producer sends each batch along with its announcement.
      s.local_slots.reset(new (std::nothrow) uint8_t[t.slot_bytes * t.num_slots]);
      if (!s.local_slots) {
        return Status::IOError("cannot allocate " + std::to_string(t.slot_bytes * t.num_slots) +
                               " bytes for a remote copy of the producer's ring");
      }
    }
    // Watch the producer before mapping what it made: if it exits between its Welcome and our
    // mapping (a restart, a kill), its shared memory is already gone, and that is said as such.
    // A producer in another PID namespace is watched by heartbeat (its pid names another
    // process here); in ours, a pid that is no longer it means it is gone.
    bool producer_gone = false;
    if (s.endpoint.rfind("ipc://", 0) == 0 && w.producer_pid > 0 &&
        w.producer_pid_ns == ThisProcessIdentity().pid_ns) {
      auto watch = ProcessWatch::Open(static_cast<int>(w.producer_pid));
      if (watch.ok() && IsThisProcess(static_cast<int>(w.producer_pid), {w.producer_pid_ns, w.producer_start_time}))
        s.producer_watch = std::move(*watch);
      else
        producer_gone = true;
    }
    auto explain = [&](Status st) {
      // A producer removes its ring and mailboxes as it stops, a moment before its process
      // ends: what is missing right after its Welcome is most likely that. Give it a second.
      if (producer_gone || (s.producer_watch.valid() && s.producer_watch.WaitExited(1000)))
        return Status::Disconnected("the producer stopped while this consumer was connecting (" + st.message() + ")");
      return st;
    };
    if (!t.shm_name.empty()) {
      auto shm = SharedMemory::Open(t.shm_name, t.slot_bytes * t.num_slots, false);
      if (!shm.ok()) return explain(shm.status());
      s.shm = std::move(*shm);
    }
    if (!w.mailbox_name.empty()) {
      auto boxes = MailboxArea::Open(w.mailbox_name, w.mailbox_count, w.mailbox_capacity);
      if (!boxes.ok()) return explain(boxes.status());
      s.mailboxes = std::move(*boxes);
      s.mailbox.emplace(s.mailboxes.at(w.mailbox_index));
    }
    if (s.opts.device) {
      if (tcp_) {
        // The producer offers its device ring to local consumers only (CUDA IPC does not cross
        // machines); it did not even look for one.
        s.fallback_reason = "consumers over tcp:// read the host path: batches arrive as message payload "
                            "(the producer's GPU memory can be mapped only on its own machine)";
      } else if (!w.has_device) {
        s.fallback_reason = "the producer has no device ring (start it with --device cuda:N)";
      } else if (auto mapper = DeviceMapper::Open(w.device); mapper.ok()) {
        s.mapper = std::move(*mapper);
      } else {
        s.fallback_reason = "cannot map the producer's GPU memory: " + mapper.status().message();
      }
    }
    return Status::OK();
  }

  std::shared_ptr<ConsumerState> state_;
  ProducerPaths paths_;
  bool dialed_ = false, said_waiting_ = false, tcp_ = false, curve_ = false;
  Clock::time_point producer_deadline_, reply_deadline_;
  std::vector<uint8_t> hello_;  // the Hello while it waits for a connection to take it
  std::string our_key_, last_failure_;
  Socket monitor_;
  int failed_handshakes_ = 0;
};

}  // namespace internal

// ---------------------------------------------------------------------------------------------
// Connecting

Connecting::Connecting(std::unique_ptr<internal::Handshake> h) : handshake_(std::move(h)) {}
Connecting::~Connecting() = default;

Result<Waited<std::unique_ptr<Consumer>>> Connecting::Finish(int wait_ms) {
  if (!handshake_) return Status::Invalid("this connection attempt has ended");
  Result<Waited<std::unique_ptr<Consumer>>> r = handshake_->Step(wait_ms);
  if (!r.ok() || r->ready()) handshake_.reset();  // over, either way
  return r;
}

Result<std::unique_ptr<Consumer>> Connecting::Finish() {
  if (!handshake_) return Status::Invalid("this connection attempt has ended");
  Result<Waited<std::unique_ptr<Consumer>>> r = handshake_->Step(-1);
  handshake_.reset();
  return internal::Outcome(std::move(r));
}

Result<std::unique_ptr<Connecting>> Consumer::Start(ConsumerOptions opts) {
  if (!opts.group.empty() || opts.world_size != 1 || opts.rank != 0) {
    if (opts.group.empty())
      return Status::Invalid("rank " + std::to_string(opts.rank) + " of " + std::to_string(opts.world_size) +
                             " needs a group name that all ranks of the job share (--group NAME)");
    if (opts.world_size < 1 || opts.world_size > kMaxGroupSize || opts.rank >= opts.world_size)
      return Status::Invalid("rank " + std::to_string(opts.rank) + " is outside a group of " +
                             std::to_string(opts.world_size) + " (ranks are 0 to world size - 1)");
  }
  if (opts.num_nodes < 0 || (opts.num_nodes > 0 && (opts.node_rank < 0 || opts.node_rank >= opts.num_nodes)))
    return Status::Invalid("node " + std::to_string(opts.node_rank) + " of " + std::to_string(opts.num_nodes) +
                           " is not a node of the job");
  const std::string target = opts.endpoint.empty() ? "producer '" + opts.name + "'" : opts.endpoint;
  auto h = std::make_unique<internal::Handshake>(std::move(opts));
  if (Status st = h->Begin(); !st.ok()) {
    if (st.code() != StatusCode::kIOError) return st;
    return Status::IOError("connecting to " + target + ": " + st.message());
  }
  return std::unique_ptr<Connecting>(new Connecting(std::move(h)));
}

Result<std::unique_ptr<Consumer>> Consumer::Connect(ConsumerOptions opts) {
  COLOADER_ASSIGN_OR_RETURN(std::unique_ptr<Connecting> c, Start(std::move(opts)));
  return c->Finish();
}
}  // namespace coloader
