// Reading: announcements from the mailbox or the I/O thread, epochs, and how a stream ends.
#include "client/consumer_internal.h"
#include "common/log.h"

namespace coloader {

using internal::ConsumerState;
using internal::Cursor;
using internal::SlotLease;
using Clock = std::chrono::steady_clock;

namespace {

Clock::time_point SliceEnd(int wait_ms) {
  return wait_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(wait_ms);
}

}  // namespace

Result<Waited<std::optional<BatchAnnouncement>>> Cursor::Take(Clock::time_point slice_end) {
  if (pending_) {
    std::optional<BatchAnnouncement> a = pending_;
    pending_.reset();
    return a;
  }
  ConsumerState& s = *state_;
  const uint64_t id = s.welcome.consumer_id;
  for (;;) {
    // The mailbox road: its doorbell is read before looking, so a push after the look wakes
    // the wait below (the producer rings it for a batch, our I/O thread for anything else).
    const uint32_t seen = s.mailbox ? s.mailbox->doorbell() : 0;
    std::optional<BatchAnnouncement> a;
    if (s.mailbox) a = s.mailbox->Pop(id);
    if (!a) {
      std::unique_lock<std::mutex> lock(s.mu);
      if (!s.queue.empty()) {
        a = s.queue.front();
        s.queue.pop_front();
      } else if (s.end || s.bye || !s.error.ok()) {
        // Announcements pushed before the End or goodbye may have become visible only after
        // our Pop above: take them first.
        if (s.mailbox && !s.mailbox->Empty() && s.mailbox->Owned(id)) continue;
        lock.unlock();
        wait_since_ns_ = 0;
        COLOADER_ASSIGN_OR_RETURN(std::optional<BatchAnnouncement> last, Ending());
        return last;
      }
    }
    if (a) {
      wait_since_ns_ = 0;
      last_taken_ = a;
      return a;
    }
    if (s.mailbox && !s.mailbox->Owned(id)) {
      // The producer let go of our mailbox right after sending its goodbye, which says why
      // (detached, or the group broken): give the goodbye a moment to arrive first.
      std::unique_lock<std::mutex> lock(s.mu);
      if (s.cv.wait_for(lock, std::chrono::milliseconds(s.welcome.heartbeat_ms + 200),
                        [&s] { return s.bye || !s.error.ok(); }))
        continue;
      return Status::Detached(s.Who() + " gave this consumer's mailbox to another: it was detached");
    }
    COLOADER_ASSIGN_OR_RETURN(const bool go_on, WaitOver(slice_end));
    if (!go_on) return kNotYet;
    // At most 100 ms at a time: the I/O thread rings on any change, this only bounds the wait.
    Clock::time_point until = std::min(slice_end, Clock::now() + std::chrono::milliseconds(100));
    if (s.opts.timeout_ms > 0) {
      const auto waited = std::chrono::nanoseconds(MonotonicNs() - wait_since_ns_);
      until = std::min(until, Clock::now() + std::chrono::milliseconds(s.opts.timeout_ms) - waited);
    }
    if (s.mailbox) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      s.mailbox->Wait(seen, static_cast<int>(std::max<long long>(ms, 1)));
    } else {
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait_until(lock, until, [&s] { return !s.queue.empty() || s.end || s.bye || !s.error.ok(); });
    }
  }
}

Result<bool> Cursor::WaitOver(Clock::time_point slice_end) {
  const ConsumerOptions& o = state_->opts;
  const uint64_t now = MonotonicNs();
  if (wait_since_ns_ == 0) wait_since_ns_ = now;
  const uint64_t waited_ms = (now - wait_since_ns_) / 1000000;
  if (!o.group.empty() && !last_taken_ && !group_checked_ && waited_ms >= static_cast<uint64_t>(o.group_wait_ms)) {
    group_checked_ = true;
    COLOADER_RETURN_NOT_OK(CheckGroupComplete());
  }
  if (o.timeout_ms > 0 && waited_ms >= static_cast<uint64_t>(o.timeout_ms)) {
    wait_since_ns_ = 0;
    return Status::Timeout("no batch from " + state_->Who() + " within " + std::to_string(o.timeout_ms) +
                           " ms (timeout): " + ExplainWait());
  }
  return Clock::now() < slice_end;
}

Status Cursor::StreamStopped(Status st) {
  if (st.code() != StatusCode::kDisconnected) return st;
  const uint64_t n = state_->welcome.epoch_samples;
  std::string where;
  if (!last_taken_) {
    where = "before this consumer's first batch";
  } else {
    const BatchAnnouncement& a = *last_taken_;
    where = "at epoch " + std::to_string(a.epoch) + ", sample " + std::to_string(a.first + a.count) +
            (n ? " of " + std::to_string(n) : std::string());
  }
  if (in_epoch_ && !epoch_ended_) partial_ = true;  // the epoch was cut
  return Status::Disconnected(st.message() + "; this consumer's stream stopped " + where +
                              " (the batches delivered before are valid); restart the producer (serve --resume "
                              "STATE resumes a checkpointed job) and reconnect");
}

Result<bool> Cursor::SkipRestOfEpoch(Clock::time_point slice_end) {
  // Called when the user starts a new epoch before this one ended: the rest is released
  // unread, as a new iter() over a DataLoader abandons the old one. A group member whose
  // share ended before the stream's epoch did passes (and acks) the rest the same way.
  while (!epoch_ended_ || (split_mode() && !stream_epoch_done_)) {
    if (current_ && (current_->a.flags & kBatchLastInEpoch)) break;
    current_.reset();
    COLOADER_ASSIGN_OR_RETURN(Waited<std::optional<BatchAnnouncement>> taken, Take(slice_end));
    if (!taken.ready()) return false;
    std::optional<BatchAnnouncement> a = *std::move(taken);
    if (!a) {
      stream_ended_ = true;
      break;
    }
    if (a->epoch != epoch_) {
      pending_ = a;
      break;
    }
    current_ = std::make_shared<SlotLease>(state_, *a, nullptr);  // acked unread as it goes
  }
  current_.reset();
  epoch_ended_ = true;
  stream_epoch_done_ = true;
  return true;
}

Status Cursor::Attach() {
  if (attached_) return Status::OK();
  // The producer counts us, and sends batches, from here on: a refused resume state or an
  // idle consumer changed nothing before.
  const ConsumerOptions& o = state_->opts;
  coloader::Attach& m = state_->sink->attach_request;
  m = coloader::Attach{};
  m.device = state_->mapper ? 1 : 0;
  // A resumed state, where the producer catches consumers up: it serves the saved epoch's rest
  // itself (to every rank of a group alike), whatever the shared stream has passed meanwhile.
  served_resume_ = o.resume && state_->welcome.no_catch_up.empty();
  if (served_resume_ && !o.group.empty()) {
    COLOADER_ASSIGN_OR_RETURN(const GroupRest rest, SavedGroupRest());
    m.flags = kAttachResume;
    m.resume_epoch = rest.epoch;
    m.resume_from = rest.from;
    m.resume_to = rest.to;
  } else if (served_resume_) {
    const uint64_t n = state_->welcome.epoch_samples;
    if (o.resume_begin >= n || o.resume_samples > n)
      return Status::Invalid("the saved state's position (begin " + std::to_string(o.resume_begin) + ", " +
                             std::to_string(o.resume_samples) + " samples) is outside an epoch of " +
                             std::to_string(n) + " samples: a state of another dataset?");
    // It had taken positions begin, begin + 1, ... (modulo n) of its epoch: the rest follow on.
    // With drop_last, fewer than a batch left was the epoch's end.
    const uint64_t left = n - o.resume_samples;
    m.flags = kAttachResume;
    if (left == 0 || (o.drop_last && left < o.batch_size)) {
      m.resume_epoch = o.resume_epoch + 1;  // complete: the next epoch, whole
    } else {
      m.resume_epoch = o.resume_epoch;
      m.resume_from = o.resume_begin + o.resume_samples;
      m.resume_to = o.resume_begin + n;
    }
  } else if (o.resume) {
    m.flags = kAttachNoCatchUp;  // a resumed state walks the epoch by positions
  }
  attached_ = true;
  state_->sink->attach_wanted.store(true);
  state_->sink->Wake();
  return Status::OK();
}

Result<Waited<bool>> Cursor::NextEpoch(int wait_ms) {
  if (!state_ || !state_->io.joinable()) return Status::Invalid("the consumer is closed");
  COLOADER_RETURN_NOT_OK(Attach());
  if (!stopped_.ok()) return StreamStopped(stopped_);
  const Clock::time_point slice_end = SliceEnd(wait_ms);
  // A batch whose assembly a timeout interrupted belongs to the epoch being left: drop it
  // (releasing its slots first, since the producer may wait on them to reach the next epoch)
  // rather than let its samples open the next one.
  gathering_.clear();
  assembling_.reset();
  // Passes the rest of the epoch being left (if any); false when the wait ended first.
  auto skip_rest = [&]() -> Result<bool> {
    Result<bool> skipped = SkipRestOfEpoch(slice_end);
    if (!skipped.ok()) return StreamStopped(skipped.status());
    return skipped;
  };
  if (in_epoch_ && (!epoch_ended_ || (split_mode() && !stream_epoch_done_))) {
    COLOADER_ASSIGN_OR_RETURN(const bool skipped, skip_rest());
    if (!skipped) return kNotYet;
  }
  current_.reset();
  for (;;) {
    if (stream_ended_) return false;
    Result<Waited<std::optional<BatchAnnouncement>>> taken = Take(slice_end);
    if (!taken.ok()) return StreamStopped(taken.status());
    if (!taken->ready()) return kNotYet;
    std::optional<BatchAnnouncement> a = **std::move(taken);
    if (!a) {
      stream_ended_ = true;
      const coloader::Attach& asked = state_->sink->attach_request;
      if (served_resume_ && resume_pending_ && asked.resume_from < asked.resume_to) {
        resume_note_ = "ended its run before the saved epoch's rest came";
        Log(LogLevel::kWarning, state_->Who() + " " + resume_note_);
      }
      return false;
    }
    pending_ = a;
    epoch_ = a->epoch;
    // Joined mid-epoch: the rest of it, unless the producer serves what came before (catch-up).
    partial_ = a->first != 0 && !(a->flags & kBatchMadeWhole);
    epoch_begin_ = a->first;
    samples_seen_ = 0;
    in_epoch_ = true;
    epoch_ended_ = false;
    offset_ = 0;
    if (served_resume_ && resume_pending_ && !split_mode()) {
      resume_pending_ = false;
      const ConsumerOptions& o = state_->opts;
      if (a->epoch == o.resume_epoch &&
          state_->sink->attach_request.resume_from < state_->sink->attach_request.resume_to) {
        // The saved epoch's rest: counted on from the state (a state at its start is whole).
        epoch_begin_ = o.resume_begin;
        samples_seen_ = o.resume_samples;
        partial_ = o.resume_samples > 0;
      }
    }
    if (!split_mode()) return true;
    COLOADER_ASSIGN_OR_RETURN(bool take, StartSplit(*a));
    if (take) return true;
    // A resume passes over this epoch whole (the saved one is still to come, or is gone).
    stream_epoch_done_ = false;
    COLOADER_ASSIGN_OR_RETURN(const bool skipped, skip_rest());
    if (!skipped) return kNotYet;
    current_.reset();
  }
}

Result<Waited<std::optional<Batch>>> Cursor::Next(void* stream, int wait_ms) {
  if (!state_->io.joinable()) return Status::Invalid("the consumer is closed");
  if (!in_epoch_) return Status::Invalid("call NextEpoch() before Next()");
  const Clock::time_point slice_end = SliceEnd(wait_ms);
  Result<Waited<std::optional<Batch>>> next = split_mode() ? NextInGroup(stream, slice_end) : NextSliced(stream, slice_end);
  if (!next.ok()) return StreamStopped(next.status());
  return next;
}

uint64_t Cursor::size() const {
  const ConsumerOptions& o = state_->opts;
  const uint64_t n = state_->welcome.epoch_samples, b = o.batch_size;
  if (!o.group.empty()) {
    auto plan = PlanSplit(SplitSpec{0, n, o.world_size, o.rank, o.batch_size, o.drop_last});
    return plan.ok() ? plan->batches : 0;
  }
  return o.drop_last ? n / b : (n + b - 1) / b;
}

// ---------------------------------------------------------------------------------------------
// Consumer: the public face of its Cursor

Consumer::Consumer(std::unique_ptr<Cursor> cursor) : cursor_(std::move(cursor)) {}
Consumer::~Consumer() = default;  // the cursor says goodbye
void Consumer::Close() { cursor_->Close(); }
Result<bool> Consumer::NextEpoch() { return internal::Outcome(cursor_->NextEpoch(-1)); }
Result<Waited<bool>> Consumer::NextEpoch(int wait_ms) { return cursor_->NextEpoch(wait_ms); }
Result<std::optional<Batch>> Consumer::Next(void* stream) { return internal::Outcome(cursor_->Next(stream, -1)); }
Result<Waited<std::optional<Batch>>> Consumer::Next(void* stream, int wait_ms) {
  return cursor_->Next(stream, wait_ms);
}
Status Consumer::Resume(uint64_t epoch, uint64_t begin, uint64_t samples, uint64_t origin) {
  return cursor_->Resume(epoch, begin, samples, origin);
}
bool Consumer::finished() const { return cursor_->finished(); }
uint64_t Consumer::epoch() const { return cursor_->epoch(); }
bool Consumer::partial() const { return cursor_->partial(); }
uint64_t Consumer::size() const { return cursor_->size(); }
uint64_t Consumer::split_begin() const { return cursor_->split_begin(); }
uint64_t Consumer::split_origin() const { return cursor_->split_origin(); }
uint64_t Consumer::samples_seen() const { return cursor_->samples_seen(); }
const std::string& Consumer::resume_note() const { return cursor_->resume_note(); }
uint32_t Consumer::batch_size() const { return cursor_->batch_size(); }
const SlotTable& Consumer::slots() const { return cursor_->slots(); }
const ProducerInfo& Consumer::producer() const { return cursor_->producer(); }
uint64_t Consumer::consumer_id() const { return cursor_->consumer_id(); }
bool Consumer::on_device() const { return cursor_->on_device(); }
const std::string& Consumer::fallback_reason() const { return cursor_->fallback_reason(); }

}  // namespace coloader
