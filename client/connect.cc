#include "client/consumer_internal.h"

namespace coloader {

using internal::ConsumerState;
using internal::SlotLease;

// ---------------------------------------------------------------------------------------------
// Consumer

Consumer::Consumer(std::shared_ptr<ConsumerState> state) : state_(std::move(state)) {
  resume_pending_ = state_->opts.resume;
}
Consumer::~Consumer() { Close(); }

void Consumer::Close() {
  if (!state_) return;
  if (state_->io.joinable() && state_->opts.world_size > 1 && in_epoch_ && epoch_ended_ && !stream_epoch_done_ &&
      !stream_ended_) {
    // A member that took its whole share leaves at the epoch's end, not before: its goodbye
    // ends the group, and the others' last batches may lie after where its share ended.
    // (Bounded: the producer's death or another member's departure ends the wait.)
    (void)SkipRestOfEpoch();
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

namespace {

// One zmq::poll of the handshake loop. A signal delivered meanwhile (the user's handler, a
// profiler's timer) makes it throw EINTR: not an error, the loop polls again until its deadline.
void PollOnce(std::vector<zmq::pollitem_t>& items, std::chrono::milliseconds timeout) {
  try {
    zmq::poll(items.data(), items.size(), timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
  }
}

}  // namespace

Result<std::unique_ptr<Consumer>> Consumer::Connect(ConsumerOptions opts) {
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
  // ZeroMQ reports failures by throwing (cppzmq); none may cross this Status boundary.
  const std::string target = opts.endpoint.empty() ? "producer '" + opts.name + "'" : opts.endpoint;
  try {
    return Handshake(std::move(opts));
  } catch (const zmq::error_t& e) {
    return Status::IOError("connecting to " + target + ": ZeroMQ failed: " + e.what());
  }
}

Result<std::unique_ptr<Consumer>> Consumer::Handshake(ConsumerOptions opts) {
  auto state = std::make_shared<ConsumerState>();
  ASSIGN_OR_RETURN(state->sink->wake, EventFd::Make());
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
    if (!live() && opts.wait_for_producer_ms > 0) {
      // Jobs launched together with their producer may come first: say once what we wait for.
      std::fprintf(stderr, "coloader: waiting up to %.0f s for producer '%s' to start (at %s)\n",
                   opts.wait_for_producer_ms / 1000.0, opts.name.c_str(), paths.socket.c_str());
    }
    while (!live() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling a path: no event to wait on
    }
    if (!live()) {
      return Status::NotFound("no producer named '" + opts.name + "' is running (nothing live at " +
                              paths.socket + (opts.wait_for_producer_ms > 0
                                                  ? " after waiting " + std::to_string(opts.wait_for_producer_ms) + " ms"
                                                  : std::string()) +
                              "); start one with: coloader serve --name " + opts.name + " --data DIR");
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
    if (left.count() > 0) PollOnce(items, left);
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
      // A refused handshake does not always reach the monitor before the deadline (seen on
      // the GPU machine: no event at all for a keyless consumer of a CURVE producer), so the
      // timeout names the key flags too.
      return Status::Timeout("producer at " + state->endpoint + " did not answer the handshake within " +
                             std::to_string(o.connect_timeout_ms) + " ms; is it running and responsive?" +
                             (curve ? " (with CURVE: a wrong --server-key looks like this too)"
                                    : tcp ? " If it requires CURVE keys, pass --curve-key and --server-key."
                                          : ""));
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
    if (reject->code == RejectCode::kMismatch) return Status::Invalid("the producer refused this consumer: " + reject->reason);
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
    // A producer removes its ring and mailboxes as it stops, a moment before its process
    // ends: what is missing right after its Welcome is most likely that. Give it a second.
    if (producer_gone || (state->producer_watch.valid() && state->producer_watch.WaitExited(1000)))
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
  if ((!state->opts.group.empty() || state->opts.resume) && welcome->epoch_samples == 0) {
    return Status::Invalid(state->Who() + " does not say how many samples an epoch has, which a group's split needs");
  }
  ConsumerState* raw = state.get();
  state->io = std::thread([raw] { raw->IoLoop(); });
  return std::unique_ptr<Consumer>(new Consumer(std::move(state)));
}
}  // namespace coloader
