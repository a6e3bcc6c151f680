// Sessions: handshakes, consumers' messages and flood control (liveness and stalls: liveness.cc).
#include "producer/producer_internal.h"

#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "common/log.h"
#include "producer/slot_layout.h"

namespace coloader {

bool Producer::Impl::Send(const std::string& identity, const Message& m) {
  std::vector<uint8_t> bytes = Encode(m);
  // Fails when the peer's queue is full or its connection is gone (EHOSTUNREACH).
  return Queued(router.Send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) &&
         Queued(router.Send(zmq::buffer(bytes), zmq::send_flags::dontwait));
}

void Producer::Impl::SendToSession(Session& s, const Message& m) {
  if (Send(s.identity, m)) {
    s.last_sent_ns = MonotonicNs();
  }
  // A failed send means the connection is gone or its queue is full; liveness checks drop it.
}

void Producer::Impl::DropSession(const std::string& identity, const char* why,
                                 std::optional<Bye> bye, bool finished) {
  auto it = sessions.find(identity);
  if (it == sessions.end()) return;
  Session& s = it->second;
  if (bye) Send(identity, *bye);
  if (bye && bye->reason == ByeReason::kRejected) ++dropped_clients;
  uint32_t freed = ring.DropConsumer(s.id);
  if (s.mailbox >= 0) {
    mailboxes.at(static_cast<uint32_t>(s.mailbox)).Reset(0);
    mailbox_used[static_cast<size_t>(s.mailbox)] = false;
  }
  LogLine("[coloader %s] consumer %llu (pid %u) %s%s\n", opts.name.c_str(),
               static_cast<unsigned long long>(s.id), s.pid, why,
               freed ? ("; " + std::to_string(freed) + " slot(s) reclaimed").c_str() : "");
  Session gone = std::move(s);
  sessions.erase(it);
  if (gone.group.empty()) return;
  if (finished) {
    FinishInGroup(gone);
  } else {
    BreakGroup(gone, why);
  }
}

void Producer::Impl::FinishInGroup(const Session& gone) {
  auto g = groups.find(gone.group);
  if (g == groups.end() || gone.rank >= g->second.members.size() || g->second.members[gone.rank] != gone.identity)
    return;
  if (!g->second.running) {  // not started: its rank is free for a member that comes
    BreakGroup(gone, "left");
    return;
  }
  g->second.members[gone.rank].clear();
  if (std::all_of(g->second.members.begin(), g->second.members.end(), [](const std::string& m) { return m.empty(); }))
    groups.erase(g);
}

void Producer::Impl::BreakGroup(const Session& gone, const char* why) {
  auto g = groups.find(gone.group);
  if (g == groups.end() || gone.rank >= g->second.members.size() || g->second.members[gone.rank] != gone.identity)
    return;
  if (!g->second.running) {
    // The group had not started: the rank is free again for a member that comes (back).
    g->second.members[gone.rank].clear();
    if (std::all_of(g->second.members.begin(), g->second.members.end(), [](const std::string& m) { return m.empty(); }))
      groups.erase(g);
    return;
  }
  // A data-parallel job cannot go on without one of its ranks (its all-reduce would hang):
  // end it for every member, now and with the reason, rather than let them wait.
  const uint64_t batch = (published_position + opts.batch_size - 1) / opts.batch_size;
  const std::string message = "rank " + std::to_string(gone.rank) + " of group " + gone.group + " left at epoch " +
                              std::to_string(published_epoch) + ", batch " + std::to_string(batch) + " (it " + why +
                              "); the group is over: restart all its ranks";
  std::vector<std::string> others;
  for (const std::string& m : g->second.members)
    if (!m.empty() && m != gone.identity) others.push_back(m);
  groups.erase(g);  // before dropping the others: their own departure breaks nothing more
  for (const std::string& m : others) DropSession(m, "ended with its group", Bye{ByeReason::kGroupBroken, message});
}

void Producer::Impl::MaybeStartGroup(const std::string& name) {
  auto g = groups.find(name);
  if (g == groups.end() || g->second.running) return;
  bool wait_for_epoch = false;
  for (const std::string& m : g->second.members) {
    auto it = sessions.find(m);
    if (m.empty() || it == sessions.end() || it->second.pending) return;
    wait_for_epoch = wait_for_epoch || it->second.waiting_for_epoch;
  }
  // Resumed ranks are served their saved epoch's rest together: they must have saved one state.
  const Session& first = sessions.at(g->second.members[0]);
  for (const std::string& m : g->second.members) {
    const Session& s = sessions.at(m);
    if (s.catch_up == first.catch_up && s.owed_epoch == first.owed_epoch && s.owed_next == first.owed_next &&
        s.owed_end == first.owed_end)
      continue;
    auto rest = [](const Session& r) {
      return "rank " + std::to_string(r.rank) + ": epoch " + std::to_string(r.owed_epoch) + " [" +
             std::to_string(r.owed_next) + ", " + std::to_string(r.owed_end) + ")";
    };
    const std::string why = "the ranks of group " + name + " resume different states (" + rest(first) + ", " + rest(s) +
                            "): restart every rank from one checkpoint";
    const std::vector<std::string> members = g->second.members;
    for (const std::string& each : members)
      DropSession(each, "resumed another state than its group", Bye{ByeReason::kRejected, why});
    return;
  }
  // Resumed ranks read on from the shared stream if it is exactly where their rest begins, all
  // alike: decided now that the last is there (the stream may have moved since the first came).
  for (const std::string& m : g->second.members) ReadOnWhereThere(sessions.at(m));
  // Between two publications: every member gets the same next batch, so they agree on where
  // their split begins. One member asking to join at an epoch boundary holds for them all.
  g->second.running = true;
  for (const std::string& m : g->second.members) {
    Session& s = sessions.at(m);
    s.group_waiting = false;
    s.waiting_for_epoch = wait_for_epoch;
  }
  LogLine("[coloader %s] group %s: all %u rank(s) attached, serving them from the next batch\n",
               opts.name.c_str(), name.c_str(), g->second.world_size);
}

std::optional<std::string> Producer::Impl::Refusal(const Hello& hello) const {
  const std::string who = "producer '" + opts.name + "'";
  if (hello.num_nodes > 0 && (hello.num_nodes != opts.dataset.world_size || hello.node_rank != opts.dataset.rank)) {
    return "this consumer is node " + std::to_string(hello.node_rank) + " of " + std::to_string(hello.num_nodes) +
           ", but " + who + " serves shard " + std::to_string(opts.dataset.rank) + " of " + std::to_string(opts.dataset.world_size) +
           " (--rank " + std::to_string(opts.dataset.rank) + " --world-size " + std::to_string(opts.dataset.world_size) +
           "): start one producer per node with --rank NODE --world-size NODES, and give each node's ranks its name";
  }
  if ((hello.flags & kHelloExpectSeed) && hello.expect_seed != opts.dataset.seed) {
    return "this consumer's state was saved from a producer with --seed " + std::to_string(hello.expect_seed) +
           ", but " + who + " uses --seed " + std::to_string(opts.dataset.seed) + ": its epochs hold other samples";
  }
  if (!hello.expect_data_key.empty() && hello.expect_data_key != data_key) {
    return "this consumer's state was saved from data key " + hello.expect_data_key + ", but " + who +
           " has data key " + data_key + " (another dataset, or other --image-size/--augment/--output/--layout settings)";
  }
  if (hello.group.empty()) return std::nullopt;
  if (epoch_samples() == 0) {
    return who + " does not know its epoch's size (a caller-fed producer without epoch_samples), which a "
           "consumer group's split needs";
  }
  if (hello.world_size > 1) {
    // Within one training step the last rank's block lies (W-1)*b samples past the first
    // rank's, and the first rank reads nothing more until DDP's all-reduce lets it go: the
    // producer must be allowed that far ahead of it, or the step never completes.
    const uint64_t b = hello.batch_size ? hello.batch_size : opts.batch_size;
    const uint64_t need = (uint64_t{hello.world_size - 1} * b + opts.batch_size - 1) / opts.batch_size;
    if (opts.window < need) {
      return "a group of " + std::to_string(hello.world_size) + " ranks with batches of " + std::to_string(b) +
             " needs the producer to run " + std::to_string(need) + " batches of " + std::to_string(opts.batch_size) +
             " ahead of its first rank within a step, but " + who + " runs with --window " + std::to_string(opts.window) +
             ": restart it with --window " + std::to_string(need) + " or more (or use smaller batches)";
    }
  }
  auto g = groups.find(hello.group);
  if (g == groups.end()) return std::nullopt;
  if (g->second.world_size != hello.world_size) {
    return "group " + hello.group + " has " + std::to_string(g->second.world_size) + " ranks on " + who +
           ", but this consumer says " + std::to_string(hello.world_size) +
           ": all ranks of a group must give the same world size (or use another group name)";
  }
  const std::string& holder = g->second.members[hello.rank];
  if (holder.empty() && g->second.running) {
    return "group " + hello.group + " is running without rank " + std::to_string(hello.rank) +
           ", which finished and left: a group starts with all its ranks; restart them all, or use another "
           "group name";
  }
  if (!holder.empty()) {
    auto it = sessions.find(holder);
    return "rank " + std::to_string(hello.rank) + " of group " + hello.group + " is already attached" +
           (it != sessions.end() ? " (pid " + std::to_string(it->second.pid) + ")" : std::string()) +
           ": each rank connects once (is the same rank given to two processes, e.g. LOCAL_RANK for RANK?)";
  }
  return std::nullopt;
}

std::string Producer::Impl::ComputeDataKey() const {
  // FNV-1a over what decides each sample's content: the files (relative to the dataset's
  // root, so nodes that mount it elsewhere agree) with their labels, and the settings.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // a separator, so ("ab","c") differs from ("a","bc")
  };
  source->MixDataKey(mix);
  mix(std::to_string(opts.dataset.image_size));
  mix(opts.dataset.recipe ? opts.dataset.recipe->Describe() : std::to_string(static_cast<int>(opts.dataset.augment)));
  mix(DTypeName(opts.dataset.output));
  mix(TensorLayoutName(opts.dataset.layout));
  mix(opts.dataset.shuffle ? "shuffle" : "sequential");
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

Session Producer::Impl::SessionFor(const std::string& identity, const Hello& hello, bool remote) {
  Session s;
  s.id = next_consumer_id++;
  s.identity = identity;
  s.pid = hello.pid;
  s.pid_ns = hello.pid_ns;
  s.batch_size = hello.batch_size;
  s.name = hello.client_name;
  s.waiting_for_epoch = (hello.flags & kHelloWaitForEpoch) != 0;
  s.remote = remote;
  s.group = hello.group;
  s.rank = hello.rank;
  s.world_size = hello.world_size;
  s.group_waiting = !s.group.empty();
  if ((hello.flags & kHelloDevice) != 0 && !remote) {
    // The ring on the consumer's own GPU; with no UUID given, the first ring.
    for (size_t i = 0; i < device_rings.size(); ++i) {
      if (hello.device_uuid.empty() || device_rings[i]->table().device_uuid == hello.device_uuid) {
        s.device = true;
        s.ring = i;
        break;
      }
    }
  }
  // Nobody is counted, gets batches or holds anyone back until it starts reading (Attach): a
  // consumer offered device memory first tries to map it (so a fallback loses nothing), and a
  // job checks a resume state against the Welcome before it takes anything.
  s.pending = true;
  s.last_heard_ns = MonotonicNs();
  return s;
}

void Producer::Impl::WatchProcess(Session& s, const Hello& hello) {
  if (hello.pid == 0 || s.remote) return;  // a remote pid names a process on another machine
  // Local consumers are watched through a pidfd, so their death is seen at once; but only a
  // pid that names the consumer here: one from another PID namespace (a container with
  // --ipc=host, not --pid=host) names some other process, whose exit would detach a live
  // consumer. Those, and pids already gone, are watched by heartbeat.
  // (The pidfd first, then the identity: a pidfd names one process, so one that passes the
  // check after it was opened is the consumer's, even if the pid is reused meanwhile.)
  auto w = ProcessWatch::Open(static_cast<int>(hello.pid));
  if (w.ok() && IsThisProcess(static_cast<int>(hello.pid), {hello.pid_ns, hello.start_time})) {
    s.watch = std::move(*w);
  } else if (!w.ok() && w.status().code() != StatusCode::kNotFound &&
             (::kill(static_cast<pid_t>(hello.pid), 0) == 0 || errno == EPERM)) {
    // The pid is there, but no pidfd came: the machine's fault (out of descriptors), not a namespace.
    LogLineAt(LogLevel::kWarning, "[coloader %s] cannot watch consumer pid %u (%s): watched by heartbeat\n",
              opts.name.c_str(), hello.pid, w.status().message().c_str());
  } else {
    LogLineAt(LogLevel::kWarning,
              "[coloader %s] consumer pid %u is not that process here (another PID namespace?): watched by heartbeat\n",
              opts.name.c_str(), hello.pid);
  }
}

Welcome Producer::Impl::WelcomeFor(const Session& s) const {
  Welcome w;
  w.consumer_id = s.id;
  w.producer_pid = static_cast<uint32_t>(::getpid());
  const ProcessIdentity self = ThisProcessIdentity();
  w.producer_pid_ns = self.pid_ns;
  w.producer_start_time = self.start_time;
  w.heartbeat_ms = opts.heartbeat_ms;
  w.heartbeat_timeout_ms = opts.heartbeat_timeout_ms;
  w.dataset_size = dataset_size();
  w.epoch_samples = epoch_samples();
  w.slots = table;
  w.seed = opts.dataset.seed;
  w.data_key = data_key;
  w.classes = source->classes();
  w.no_catch_up = WhyNoCatchUp(s);
  w.node_rank = opts.dataset.rank;
  w.num_nodes = opts.dataset.world_size;
  if (s.remote) w.slots.shm_name.clear();  // no shared memory: batches come with their payload
  if (s.device) {
    w.has_device = true;
    w.device = device_rings[s.ring]->table();
  }
  return w;
}

void Producer::Impl::GiveMailbox(Session& s, Welcome& w) {
  // Only to a local process (it shares our /dev/shm; a pid of 0 asks for announcements as
  // messages).
  if (s.remote || s.pid == 0) return;
  for (uint32_t i = 0; i < kMailboxes; ++i) {
    if (mailbox_used[i]) continue;
    mailbox_used[i] = true;
    mailboxes.at(i).Reset(s.id);
    s.mailbox = static_cast<int>(i);
    w.mailbox_name = mailboxes.name();
    w.mailbox_index = i;
    w.mailbox_count = mailboxes.count();
    w.mailbox_capacity = mailboxes.capacity();
    return;
  }
}

std::optional<std::string> Producer::Impl::SessionRoom(const Hello& hello, bool remote) const {
  if (!remote && hello.pid != 0) {
    uint32_t mine = 0;
    // A process is its pid in its PID namespace: containers' processes may share a pid.
    for (const auto& [id, s] : sessions) mine += !s.remote && s.pid == hello.pid && s.pid_ns == hello.pid_ns ? 1 : 0;
    if (mine >= kMaxSessionsPerProcess)
      return "process " + std::to_string(hello.pid) + " already has " + std::to_string(mine) +
             " consumers of this producer, the most one process may have: close the Loaders it no longer reads "
             "(are Loaders made in a loop, or never closed?)";
  }
  if (sessions.size() >= max_sessions)
    return "the producer serves at most " + std::to_string(max_sessions) +
           " consumers at once, as its descriptor limit allows (each is a connection and a process watch): give "
           "`coloader serve` a higher ulimit -n, or start another producer";
  return std::nullopt;
}

void Producer::Impl::TrimAfterChurn() {
  sessions_high = std::max(sessions_high, sessions.size());
  if (sessions_high < sessions.size() + 32 && refused_full < refused_at_trim + 32) return;
  const uint64_t now = MonotonicNs();
  if (now - trimmed_ns < 1'000'000'000) return;  // it walks every arena: once a second at most
  trimmed_ns = now;
  ::malloc_trim(0);
  sessions_high = sessions.size();
  refused_at_trim = refused_full;
}

void Producer::Impl::HandleHello(const std::string& identity, const Hello& hello, bool remote) {
  if (sessions.count(identity)) {
    ++rejected_messages;
    DropSession(identity, "sent a second Hello", Bye{ByeReason::kRejected, "duplicate Hello"});
    return;
  }
  if (std::optional<std::string> full = SessionRoom(hello, remote)) {
    // Said once in a thousand: a flood of Hellos must not become a flood of log lines.
    if (refused_full++ % 1000 == 0)
      LogLineAt(LogLevel::kWarning, "[coloader %s] refused a consumer (pid %u; %llu refused so far): %s\n",
                opts.name.c_str(), hello.pid, static_cast<unsigned long long>(refused_full), full->c_str());
    Send(identity, Reject{RejectCode::kFull, *full});
    return;
  }
  if (std::optional<std::string> why = Refusal(hello)) {
    LogLineAt(LogLevel::kWarning, "[coloader %s] refused a consumer (pid %u): %s\n", opts.name.c_str(), hello.pid,
              why->c_str());
    Send(identity, Reject{RejectCode::kMismatch, *why});
    return;
  }
  Session s = SessionFor(identity, hello, remote);
  if (!s.device) {  // host path: a GPU ring's host tensor areas must be reserved first
    if (Status r = ReserveHostTensors(); !r.ok()) {
      Send(identity, Bye{ByeReason::kRejected, r.message()});
      return;
    }
  }
  WatchProcess(s, hello);
  Welcome w = WelcomeFor(s);
  GiveMailbox(s, w);
  if (!Send(identity, w)) {
    if (s.mailbox >= 0) mailbox_used[static_cast<size_t>(s.mailbox)] = false;
    return;
  }
  s.last_sent_ns = MonotonicNs();
  LogLine("[coloader %s] consumer %llu connected (pid %u, batch size %u, %s path offered%s%s)\n", opts.name.c_str(),
          static_cast<unsigned long long>(s.id), s.pid, s.batch_size, s.device ? "device" : "host",
          s.waiting_for_epoch ? ", waits for the next epoch" : "",
          s.group.empty() ? ""
                          : (", rank " + std::to_string(s.rank) + " of group " + s.group + " (" +
                             std::to_string(s.world_size) + " ranks)").c_str());
  if (!s.group.empty()) {
    Group& g = groups[s.group];
    if (g.members.empty()) {
      g.world_size = s.world_size;
      g.members.resize(s.world_size);
    }
    g.members[s.rank] = identity;
  }
  sessions.emplace(identity, std::move(s));
}

void Producer::Impl::HandleAttach(const std::string& identity, const Attach& attach) {
  auto it = sessions.find(identity);
  Session& s = it->second;
  if (!s.pending) {
    ++rejected_messages;
    DropSession(identity, "sent Attach twice", Bye{ByeReason::kRejected, "unexpected Attach"});
    return;
  }
  if (attach.device && !s.device) {
    ++rejected_messages;
    DropSession(identity, "asked for a device ring it was not offered",
                Bye{ByeReason::kRejected, "Attach asks for the device ring, which the Welcome did not offer"});
    return;
  }
  const bool owed_a_rest = (attach.flags & kAttachResume) && attach.resume_from < attach.resume_to;
  if (AllSubmitted() && done.empty() && InFlight() == 0 && !owed_a_rest) {
    // Nothing more will be produced: say so at once rather than let it wait.
    DropSession(identity, "attached after the last epoch",
                Bye{ByeReason::kFinished, "the producer has delivered every epoch"});
    return;
  }
  if ((attach.flags & kAttachResume) && attach.resume_from == attach.resume_to && !opts.forever &&
      attach.resume_epoch >= opts.epochs) {
    // Its saved state had read the last epoch whole.
    DropSession(identity, "resumed after the last epoch",
                Bye{ByeReason::kFinished,
                    "the saved state had read every epoch this producer serves (" + std::to_string(opts.epochs) + ")"});
    return;
  }
  if (attach.flags & kAttachResume) {
    if (Status r = ServeResume(s, attach); !r.ok()) {
      DropSession(identity, "asked for a resume it cannot serve", Bye{ByeReason::kRejected, r.message()});
      return;
    }
  }
  s.pending = false;
  s.device = attach.device != 0;
  if (attach.flags & kAttachNoCatchUp) s.resuming = true;
  s.last_read_ns = MonotonicNs();
  if (Status r = s.device ? Status::OK() : ReserveHostTensors(); !r.ok()) {
    DropSession(identity, "reads the host path, which /dev/shm cannot hold", Bye{ByeReason::kRejected, r.message()});
    return;
  }
  LogLine("[coloader %s] consumer %llu attached: reads the %s path%s\n", opts.name.c_str(),
               static_cast<unsigned long long>(s.id), s.device ? "device" : "host",
               s.device ? (" (cuda:" + std::to_string(device_rings[s.ring]->device()) + ")").c_str() : "");
  if (!s.group.empty()) MaybeStartGroup(s.group);
}

bool Producer::Impl::Flooding(Session& s, uint64_t now) {
  // What a consumer needs per second: an ack per batch it was given (at most the ring's worth
  // outstanding, plus what it was given this second) and a heartbeat per interval. Allowing
  // several times that keeps a busy consumer far from the limit; a peer sending thousands of
  // messages a second is not reading batches.
  if (s.rate.count == 0 || now - s.rate.start_ns >= 1'000'000'000) s.received_at_rate = s.received;
  const uint64_t needed = (s.received - s.received_at_rate) + table.num_slots + 1000 / opts.heartbeat_ms;
  return s.rate.Add(now) > 4 * needed + 100;
}

void Producer::Impl::HandleMessage(const std::string& identity, const uint8_t* data, size_t size, bool remote) {
  auto it = sessions.find(identity);
  const uint64_t now = MonotonicNs();
  if (it != sessions.end()) {
    it->second.last_heard_ns = now;
    if (Flooding(it->second, now)) {
      ++rejected_messages;
      DropSession(identity, "flooded the producer with messages",
                  Bye{ByeReason::kRejected, "more than " + std::to_string(it->second.rate.count - 1) +
                                                " messages in one second: far more than a consumer needs"});
      return;
    }
  } else {
    // Peers without a session (status queries, stragglers of dropped consumers, garbage) get
    // a bounded share of the loop each: beyond it they are neither answered nor logged.
    if (now - strangers_since_ns >= 1'000'000'000) {
      stranger_rates.clear();
      strangers_since_ns = now;
    }
    if (stranger_rates[identity].Add(now) > kStrangerMessagesPerSecond) {
      ++rejected_messages;
      return;
    }
  }
  Result<Message> decoded = Decode(data, size);
  if (!decoded.ok()) {
    ++rejected_messages;
    auto version = PeekVersion(data, size);
    if (version.ok() && *version != kProtocolVersion) {
      // A consumer built for another protocol version: tell it in a Reject it can read the
      // header of, then forget it.
      Send(identity, Reject{RejectCode::kVersion, decoded.status().message()});
    }
    // A stream of garbage is logged in samples, not line for line.
    if (rejected_messages <= 20 || rejected_messages % 1000 == 0)
      LogLineAt(LogLevel::kWarning, "[coloader %s] rejected a message (%llu so far): %s\n", opts.name.c_str(),
                static_cast<unsigned long long>(rejected_messages), decoded.status().message().c_str());
    if (it != sessions.end()) {
      DropSession(identity, "broke the protocol", Bye{ByeReason::kRejected, decoded.status().message()});
    }
    return;
  }
  Message& m = *decoded;
  if (auto* hello = std::get_if<Hello>(&m)) {
    HandleHello(identity, *hello, remote);
  } else if (std::holds_alternative<StatusRequest>(m)) {
    Send(identity, MakeStatus());
  } else if (it == sessions.end()) {
    // Heartbeats and acks from a consumer we dropped are expected stragglers; anything else
    // from a stranger is counted.
    if (!std::holds_alternative<Heartbeat>(m) && !std::holds_alternative<Ack>(m) &&
        !std::holds_alternative<Bye>(m))
      ++rejected_messages;
  } else if (auto* ack = std::get_if<Ack>(&m)) {
    if (ring.Release(it->second.id, ack->seq)) {
      last_release_ns = now;
      ++it->second.acked;
      if (!IsPrivateSeq(ack->seq)) it->second.acked_upto = std::max(it->second.acked_upto, ack->seq + 1);
    } else {
      ++rejected_messages;
      DropSession(identity, "acked a batch it did not hold",
                  Bye{ByeReason::kRejected, "ack for batch " + std::to_string(ack->seq) + " that you do not hold"});
    }
  } else if (auto* attach = std::get_if<Attach>(&m)) {
    HandleAttach(identity, *attach);
  } else if (std::holds_alternative<Heartbeat>(m)) {
    // last_heard_ns is already updated
  } else if (auto* bye = std::get_if<Bye>(&m)) {
    const bool finished = bye->reason == ByeReason::kFinished;
    DropSession(identity, finished ? "left after taking its share of the epoch" : "left", std::nullopt, finished);
  } else {
    ++rejected_messages;
    DropSession(identity, "sent a message only a producer sends",
                Bye{ByeReason::kRejected, std::string("unexpected ") + MessageTypeName(m)});
  }
}

}  // namespace coloader
