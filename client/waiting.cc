// How a wait ends when nothing comes: the stream's end (finished, or stopped and how), and
// what a long wait is told: who holds the producer back, or which ranks of a group are missing.
#include <algorithm>
#include <cstdio>

#include "client/consumer_internal.h"

namespace coloader {

using internal::ConsumerState;
using internal::Cursor;

Result<std::optional<BatchAnnouncement>> Cursor::Ending() {
  ConsumerState& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.end) {
    // Every epoch was published and taken: the stream is complete, whatever came after (the
    // producer may have been stopped or killed while it waited for the last releases).
    finished_ = true;
    return std::optional<BatchAnnouncement>();
  }
  if (!s.error.ok()) return s.error;
  switch (s.bye->reason) {
    case ByeReason::kFinished:
      finished_ = true;
      return std::optional<BatchAnnouncement>();
    case ByeReason::kStopping:
      return Status::Disconnected(s.Who() + " stopped before serving all its epochs: " + s.bye->message);
    case ByeReason::kDetached:
      return Status::Detached(s.Who() + " detached this consumer: " + s.bye->message);
    case ByeReason::kGroupBroken:
      return Status::GroupBroken(s.Who() + ": " + s.bye->message);
    default:
      return Status::Protocol(s.Who() + " dropped this consumer: " + s.bye->message);
  }
}

Result<StatusReply> Cursor::AskStatus(int wait_ms) {
  ConsumerState& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.status.reset();
  }
  s.sink->status_wanted.store(true);
  s.sink->Wake();
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait_for(lock, std::chrono::milliseconds(wait_ms), [&s] { return s.status || s.bye || !s.error.ok(); });
  if (!s.status) return Status::Timeout(s.Who() + " did not answer a status request within " + std::to_string(wait_ms) + " ms");
  return *s.status;
}

namespace {

std::string Seconds(uint64_t ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(ms) / 1000.0);
  return text;
}

std::string Describe(const ConsumerStatus& c) {
  return "consumer " + std::to_string(c.id) + " (pid " + std::to_string(c.pid) +
         (c.name.empty() ? std::string() : ", '" + c.name + "'") +
         (c.group.empty() ? std::string() : ", rank " + std::to_string(c.rank) + " of group " + c.group) + ")";
}

}  // namespace

std::string Cursor::ExplainWait() {
  Result<StatusReply> st = AskStatus(1000);
  if (!st.ok()) return "it did not answer a status request either (is it hung, or stopped with SIGSTOP?)";
  const StatusReply& r = *st;
  const uint64_t me = state_->welcome.consumer_id;
  if (r.state == 0) return "it has not started: it waits for more consumers to attach (serve --min-consumers)";
  for (const ConsumerStatus& c : r.consumers)
    if (c.id == me && c.waiting) return "this consumer's group waits for its other ranks to attach";
  // The consumer that holds it back: the one furthest behind in reading, else the one holding
  // the most slots (batches kept while it reads on).
  const ConsumerStatus* holder = nullptr;
  for (const ConsumerStatus& c : r.consumers) {
    if (c.id == me) continue;
    if (!holder || std::tie(c.unread, c.held) > std::tie(holder->unread, holder->held)) holder = &c;
  }
  if (holder && holder->unread > 0 && holder->idle_ms >= 500) {
    return Describe(*holder) + " holds it back: it has taken no batch for " + Seconds(holder->idle_ms) + " (" +
           std::to_string(holder->unread) + " unread, " + std::to_string(holder->held) +
           " slot(s) held), and the producer runs at most its window ahead of the slowest reader. That job "
           "stopped reading or is slow; the producer detaches it after its --stall-timeout-ms";
  }
  if (holder && r.slots_in_use == r.num_slots && holder->held > 1) {
    return "its ring is full (" + std::to_string(r.num_slots) + " slots) and " + Describe(*holder) + " holds " +
           std::to_string(holder->held) + " of them: batches it keeps (clone() what you keep)";
  }
  char rate[64];
  std::snprintf(rate, sizeof(rate), "%.0f images/s", r.images_per_s);
  return std::string("it is ") + ProducerStateName(r.state) + " (epoch " + std::to_string(r.epoch) + ", " + rate +
         ") and no consumer holds it back: it is slow to produce (more --workers, or --decode gpu)";
}

Status Cursor::CheckGroupComplete() {
  const ConsumerOptions& o = state_->opts;
  Result<StatusReply> st = AskStatus(1000);
  if (!st.ok()) return Status::OK();  // cannot tell; the timeout (if any) says the rest
  std::vector<const ConsumerStatus*> members;
  for (const ConsumerStatus& c : st->consumers)
    if (c.group == o.group) members.push_back(&c);
  if (members.size() >= o.world_size) return Status::OK();
  std::sort(members.begin(), members.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
  std::string present, missing;
  std::vector<bool> seen(o.world_size, false);
  for (const ConsumerStatus* c : members) {
    if (c->rank < o.world_size) seen[c->rank] = true;
    present += (present.empty() ? "" : ", ") + std::to_string(c->rank) + " (pid " + std::to_string(c->pid) + ")";
  }
  for (uint32_t r = 0; r < o.world_size; ++r)
    if (!seen[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  return Status::Invalid("group '" + o.group + "' on " + state_->Who() + " is incomplete after " +
                         Seconds(static_cast<uint64_t>(o.group_wait_ms)) + ": rank(s) " + present + " of " +
                         std::to_string(o.world_size) + " came, rank(s) " + missing +
                         " did not. This is rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size) +
                         ": are all ranks started, each with the world size the others give (WORLD_SIZE, "
                         "--world-size, torch.distributed)?");
}

}  // namespace coloader
