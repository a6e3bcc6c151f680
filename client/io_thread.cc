// The consumer's I/O thread: heartbeats, acks, the user thread's Attach and status requests,
// announcements sent as messages, Reclaim, End, and the producer's goodbye or death.
#include "client/consumer_internal.h"
#include "common/log.h"

namespace coloader {
namespace internal {

void ConsumerState::GiveBack(uint64_t seq) {
  std::shared_ptr<SlotLease> lease;
  {
    std::lock_guard<std::mutex> lock(leases_mu);
    auto it = leases.find(seq);
    if (it == leases.end()) return;  // not ours to copy: zero-copy, device, or gone already
    lease = it->second.lock();
    leases.erase(it);
  }
  if (!lease) return;  // released meanwhile: its ack is on its way
  // The batch's tensors keep their address and contents: only the pages still shared with the
  // ring are copied (those written already are this process's own).
  if (Status st = lease->view.Detach(); !st.ok()) {
    Log(LogLevel::kWarning, Who() + " asked for batch " + std::to_string(seq) +
                                " back, which this consumer keeps: " + st.message());
    return;
  }
  if (!lease->acked.exchange(true)) QueueAck(seq);
}  // `lease` may be the last reference: its view goes here, and it does not ack again

bool ConsumerState::Receive(const zmq::message_t& msg, bool* said_bye) {
  Result<Message> m = Decode(msg.data<uint8_t>(), msg.size());
  if (!m.ok()) {
    Fail(Status::Protocol(Who() + " sent a malformed message: " + m.status().message()));
    return false;
  }
  if (auto* a = std::get_if<BatchAnnouncement>(&*m)) {
    if (a->slot >= welcome.slots.num_slots || a->count > welcome.slots.batch_size) {
      Fail(Status::Protocol(Who() + " announced slot " + std::to_string(a->slot) + " with " + std::to_string(a->count) +
                            " samples, outside its slot table"));
      return false;
    }
    if (local_slots) {
      if (Status st = TakePayload(msg, *a); !st.ok()) {
        Fail(st);
        return false;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(*a);
    cv.notify_all();
  } else if (auto* r = std::get_if<Reclaim>(&*m)) {
    GiveBack(r->seq);
  } else if (auto* e = std::get_if<End>(&*m)) {
    {
      std::lock_guard<std::mutex> lock(mu);
      end = *e;
      cv.notify_all();
    }
    if (mailbox) mailbox->Wake();
  } else if (auto* st = std::get_if<StatusReply>(&*m)) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(*st);
    cv.notify_all();
  } else if (auto* bye_msg = std::get_if<Bye>(&*m)) {
    {
      std::lock_guard<std::mutex> lock(mu);
      bye = *bye_msg;
      *said_bye = true;
      cv.notify_all();
    }
    if (mailbox) mailbox->Wake();
  } else if (!std::holds_alternative<Heartbeat>(*m)) {
    Fail(Status::Protocol(Who() + " sent an unexpected " + MessageTypeName(*m) + " message"));
    return false;
  }
  return true;
}

bool ConsumerState::ProducerAlive(uint64_t now, uint64_t& last_heard, uint64_t& exit_seen_ns) {
  if (producer_watch.valid() && producer_watch.Exited()) {
    // What it sent before it went may still be on its way through libzmq (a goodbye, or
    // that we were detached while stopped): give it a moment to arrive before concluding.
    if (exit_seen_ns == 0) exit_seen_ns = now;
    if (now - exit_seen_ns > 200'000'000) {
      Fail(Status::Disconnected(Who() + " exited without saying goodbye (it was killed, e.g. SIGKILL or the OOM "
                                "killer, or it crashed)"));
      return false;
    }
    return true;
  }
  if (now - last_heard > uint64_t{welcome.heartbeat_timeout_ms} * 1000000) {
    Fail(Status::Disconnected(Who() + " has not been heard from for " + std::to_string(welcome.heartbeat_timeout_ms) +
                              " ms: it is gone or unreachable"));
    return false;
  }
  return true;
}

void ConsumerState::IoLoop() {
  NameThisThread("cl-consumer-io");
  const uint64_t hb_ns = uint64_t{welcome.heartbeat_ms} * 1000000;
  uint64_t last_heard = MonotonicNs(), last_sent = last_heard;
  auto send = [&](const Message& m) {
    std::vector<uint8_t> bytes = Encode(m);
    // A failed send: the connection is gone, and the liveness checks below report it.
    if (Queued(sock.Send(zmq::buffer(bytes), zmq::send_flags::dontwait))) last_sent = MonotonicNs();
  };
  bool said_bye = false;
  uint64_t exit_seen_ns = 0;  // when the producer's pidfd fired
  uint64_t last_awake = last_heard;
  while (!stopping.load()) {
    std::vector<zmq::pollitem_t> items = {{sock.handle(), 0, ZMQ_POLLIN, 0},
                                          {nullptr, sink->wake.fd(), ZMQ_POLLIN, 0}};
    if (producer_watch.valid() && exit_seen_ns == 0) items.push_back({nullptr, producer_watch.fd(), ZMQ_POLLIN, 0});
    const uint32_t wait_ms = exit_seen_ns ? 10 : std::min<uint32_t>(welcome.heartbeat_ms, 100);
    if (Result<int> polled = Poll(items, std::chrono::milliseconds(wait_ms)); !polled.ok()) {
      Fail(polled.status());
      return;
    }
    // The user thread's requests, then acks: they free the producer.
    if (sink->attach_wanted.exchange(false)) send(sink->attach_request);
    if (sink->status_wanted.exchange(false)) send(StatusRequest{});
    for (uint64_t seq : sink->Take()) send(Ack{seq});

    for (;;) {
      zmq::message_t msg;
      Result<bool> got = sock.Recv(&msg, zmq::recv_flags::dontwait);
      if (!got.ok()) {
        Fail(got.status());
        return;
      }
      if (!*got) break;
      last_heard = MonotonicNs();
      if (!Receive(msg, &said_bye)) return;
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
    if (!ProducerAlive(now, last_heard, exit_seen_ns)) return;
    if (exit_seen_ns == 0 && now - last_sent > hb_ns) send(Heartbeat{});
  }
  if (!said_bye) {
    // Closing: flush the acks of what we still held, then say goodbye so the producer
    // reclaims our slots at once instead of waiting for the pidfd or the heartbeat.
    for (uint64_t seq : sink->Take()) send(Ack{seq});
    send(Bye{finished_share.load() ? ByeReason::kFinished : ByeReason::kLeaving, ""});
  }
}

}  // namespace internal
}  // namespace coloader
