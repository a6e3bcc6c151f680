// The consumer's I/O thread: heartbeats, acks, announcements sent as messages, the
// producer's goodbye or death.
#include "client/consumer_internal.h"

namespace coloader {
namespace internal {

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
                                          {nullptr, sink->wake.fd(), ZMQ_POLLIN, 0}};
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
    send(Bye{finished_share.load() ? ByeReason::kFinished : ByeReason::kLeaving, ""});
  }
}

}  // namespace internal
}  // namespace coloader
