// Reading: announcements from the mailbox or the I/O thread, epochs and their ends.
#include "client/consumer_internal.h"

namespace coloader {

using internal::ConsumerState;
using internal::SlotLease;

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
        // The producer let go of our mailbox right after sending its goodbye, which says why
        // (detached, or the group broken): give the goodbye a moment to arrive first.
        lock.lock();
        if (s.cv.wait_for(lock, std::chrono::milliseconds(s.welcome.heartbeat_ms + 200), ready)) break;
        lock.unlock();
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
    case ByeReason::kGroupBroken:
      return Status::GroupBroken(s.Who() + ": " + s.bye->message);
    default:
      return Status::Protocol(s.Who() + " dropped this consumer: " + s.bye->message);
  }
}

Status Consumer::SkipRestOfEpoch() {
  // Called when the user starts a new epoch before this one ended: the rest is released
  // unread, as a new iter() over a DataLoader abandons the old one. A group member whose
  // share ended before the stream's epoch did passes (and acks) the rest the same way.
  while (!epoch_ended_ || (split_mode() && !stream_epoch_done_)) {
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
  stream_epoch_done_ = true;
  return Status::OK();
}

Result<bool> Consumer::NextEpoch() {
  if (!state_ || !state_->io.joinable()) return Status::Invalid("the consumer is closed");
  // A batch whose assembly a timeout interrupted belongs to the epoch being left: drop it
  // (releasing its slots first, since the producer may wait on them to reach the next epoch)
  // rather than let its samples open the next one.
  gathering_.clear();
  assembling_.reset();
  if (in_epoch_ && (!epoch_ended_ || (split_mode() && !stream_epoch_done_))) RETURN_NOT_OK(SkipRestOfEpoch());
  current_.reset();
  for (;;) {
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
    if (!split_mode()) return true;
    ASSIGN_OR_RETURN(bool take, StartSplit(*a));
    if (take) return true;
    // A resume passes over this epoch whole (the saved one is still to come, or is gone).
    stream_epoch_done_ = false;
    RETURN_NOT_OK(SkipRestOfEpoch());
    current_.reset();
  }
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
  const ConsumerOptions& o = state_->opts;
  const uint64_t n = state_->welcome.epoch_samples, b = o.batch_size;
  if (!o.group.empty()) {
    auto plan = PlanSplit(SplitSpec{0, n, o.world_size, o.rank, o.batch_size, o.drop_last});
    return plan.ok() ? plan->batches : 0;
  }
  return o.drop_last ? n / b : (n + b - 1) / b;
}
}  // namespace coloader
