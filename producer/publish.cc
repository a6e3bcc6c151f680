// Back-pressure and publishing: submitting work while the window allows, publishing finished
// batches in sequence order with one upload per GPU that has readers.
#include "producer/producer_internal.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common/log.h"
#include "common/split.h"

namespace coloader {

void Producer::Impl::SubmitWork() {
  if (!started) {
    if (ActiveSessions() < opts.min_consumers) return;
    started = true;
    start_ns = rate_mark_ns = MonotonicNs();
    // --resume: the epoch and position a checkpointed group resumes from (CheckStart).
    source->Start(start_epoch, start_position);
  }
  for (uint32_t slot : source->TakeReturned()) {  // handed out and never filled
    ring.Abandon(slot);
    --next_submit_seq;
  }
  // A consumer catching up with nothing of its own on the way gets a slot first, and one stays
  // free for each such consumer: the shared stream, whose readers free slots all the time, would
  // otherwise take every one of them (and a lone catching-up reader would wait for ever).
  SubmitCatchUp(/*first_only=*/true);
  // Hand the source a slot while the window allows; each batch is published in order later.
  while (!source->exhausted() && fatal.ok() && WithinWindow()) {
    std::optional<uint32_t> slot = ring.free_slots() > CatchUpWaiting() ? AcquireSlot() : std::nullopt;
    if (!slot) {
      if (fatal.ok() && ring.free_slots() == 0) ReclaimOldest();  // not for the slot kept for catch-up
      break;
    }
    source->Fill(*slot, shm.data() + uint64_t{*slot} * table.slot_bytes, next_submit_seq++);
  }
  SubmitCatchUp(/*first_only=*/false);
  all_submitted = source->exhausted();
}

std::optional<uint32_t> Producer::Impl::AcquireSlot() {
  std::optional<uint32_t> slot = ring.Acquire();
  if (!slot) return std::nullopt;
  // The slot's previous uploads may still be reading its staging area.
  Status idle;
  for (auto& r : device_rings)
    if (idle.ok()) idle = r->WaitIdle(*slot);
  if (!idle.ok()) {
    fatal = idle;
    ring.Abandon(*slot);
    return std::nullopt;
  }
  return slot;
}

void Producer::Impl::ReclaimAgainIfDue(Session& s, uint64_t now) {
  if (s.reclaim_sent_ns == 0 || now - s.reclaim_sent_ns < kReclaimAgainNs) return;
  s.reclaim_asked = s.reclaim_asked_private = 0;  // what it still holds is asked for again
  s.reclaim_sent_ns = 0;
}

void Producer::Impl::SendReclaim(Session& s, uint64_t seq, uint64_t now) {
  (IsPrivateSeq(seq) ? s.reclaim_asked_private : s.reclaim_asked) = seq + 1;
  s.reclaim_sent_ns = now;
  SendToSession(s, Reclaim{seq});
}

void Producer::Impl::ReclaimOldest() {
  // Within the window and yet no free slot: consumers keep batches they have read past (a
  // list of tensors, a logger). The oldest one's keepers are asked to copy it and let go.
  const uint64_t now = MonotonicNs();
  for (auto& [identity, s] : sessions) ReclaimAgainIfDue(s, now);
  for (const RingAccounting::Held& h : ring.Published()) {
    bool asked = false;
    for (auto& [identity, s] : sessions) {
      if (std::find(h.holders.begin(), h.holders.end(), s.id) == h.holders.end()) continue;
      // Asked already? (catch-up batches are numbered apart: counted apart)
      const uint64_t done = IsPrivateSeq(h.seq) ? s.reclaim_asked_private : s.reclaim_asked;
      if (!ReadPast(s, h.seq) || done > h.seq) continue;  // still reading it, or asked
      SendReclaim(s, h.seq, now);
      asked = true;
    }
    if (asked) return;
  }
}

void Producer::Impl::ReclaimAtEnd() {
  const uint64_t now = MonotonicNs();
  for (auto& [identity, s] : sessions) ReclaimAgainIfDue(s, now);
  for (const RingAccounting::Held& h : ring.Published()) {  // oldest first: reclaim_asked grows in a pass
    for (auto& [identity, s] : sessions) {
      const uint64_t asked = IsPrivateSeq(h.seq) ? s.reclaim_asked_private : s.reclaim_asked;
      if (asked > h.seq || std::find(h.holders.begin(), h.holders.end(), s.id) == h.holders.end()) continue;
      // Only a consumer that has taken every batch: one still reading releases as it goes (and
      // is asked once it is through; the loop calls again). Without a mailbox, what was
      // announced to it is what it has.
      if (s.mailbox >= 0 ? Unread(s) > 0 : s.catch_up != Session::CatchUp::kNone &&
                                               s.catch_up != Session::CatchUp::kDone)
        continue;
      SendReclaim(s, h.seq, now);
    }
  }
}

void Producer::Impl::AnnounceEnd() {
  const uint64_t epochs = batches_published > 0 ? published_epoch + 1 : start_epoch;
  for (auto& [identity, s] : sessions) {
    if (s.pending || s.end_sent || (s.catch_up != Session::CatchUp::kNone && s.catch_up != Session::CatchUp::kDone))
      continue;  // one still catching up hears it when it is through
    s.end_sent = true;
    SendToSession(s, End{epochs});
  }
}

Status Producer::Impl::CheckStart() {
  const DatasetOptions::ResumePoint& r = opts.dataset.resume;
  if (!r.set) return Status::OK();
  if (!source->resumable()) return Status::Invalid("--resume applies to a producer that reads a dataset, not a caller-fed one");
  if (!r.data_key.empty() && r.data_key != data_key) {
    return Status::Invalid("--resume: the state was saved from data key " + r.data_key + ", but this producer's is " +
                           data_key + " (another dataset, or other --image-size/--augment/--output/--layout/--no-shuffle)");
  }
  SplitSpec spec{r.begin, epoch_samples(), r.world_size, 0, r.batch_size, r.drop_last};
  // A consumer alone whose epoch was caught up: its positions ran on from `begin` round the
  // epoch's end. Saved past that end, its rest ([begin + k - N, begin)) is served to it alone
  // (ServeResume) and this run starts at the next epoch.
  const bool wrapped = r.world_size == 1 && r.begin < spec.end && r.samples > spec.end - r.begin;
  if (wrapped && !(opts.catch_up && source->WhyNoRefill().empty()))
    return Status::Invalid("--resume: the state was saved in an epoch its job had been caught up on (positions from " +
                           std::to_string(r.begin) +
                           " round the epoch's end); serving its rest needs catch-up, "
                           "which this producer does not do (drop --no-catch-up)");
  if (wrapped || r.origin > 0) spec.begin = 0;  // (checked as a whole epoch's samples)
  if (r.origin >= spec.end && r.origin > 0)
    return Status::Invalid("--resume: the state's split_origin " + std::to_string(r.origin) +
                           " is outside an epoch of " + std::to_string(spec.end) +
                           " samples: a state of another dataset?");
  Result<SplitPlan> plan = PlanSavedPosition(spec, r.epoch, r.samples);
  if (!plan.ok()) return Status::Invalid("--resume: " + plan.status().message());
  const uint64_t done = BatchesTaken(spec, *plan, r.samples);  // batches each rank had taken
  // A group's state saved in an epoch it was caught up on: its order ran from the origin round
  // the epoch's end. Its rest, [origin + R, origin + N) modulo N, begins within this run's first
  // epoch (the ranks read on from there, then [0, origin) decoded for them: ServeResume), or past
  // its end (all of it served to them alone, and the run starts at the next epoch). Without
  // catch-up it is not served (the ranks say so too).
  const bool rotated = r.origin > 0 && done < plan->batches;
  const bool can_serve = opts.catch_up && source->WhyNoRefill().empty();
  const uint64_t from = rotated ? r.origin + ResumePosition(spec, *plan, done) : 0;
  if (rotated && !can_serve)
    LogLineAt(LogLevel::kWarning,
              "[coloader %s] --resume: the state was saved in epoch %llu, which its group had been caught up on "
              "(its order from position %llu round the epoch's end): the rest of it (%llu samples per rank) is not "
              "served without catch-up; starting at epoch %llu\n",
              opts.name.c_str(), static_cast<unsigned long long>(r.epoch), static_cast<unsigned long long>(r.origin),
              static_cast<unsigned long long>(plan->per_rank - std::min(plan->per_rank, r.samples)),
              static_cast<unsigned long long>(r.epoch + 1));
  if (done >= plan->batches || wrapped || (rotated && (!can_serve || from >= spec.end))) {
    start_epoch = r.epoch + 1;  // that epoch was complete (or its rest is served alone): the next one
    start_position = 0;
  } else {
    start_epoch = r.epoch;
    start_position = rotated ? from : ResumePosition(spec, *plan, done);
  }
  if (!opts.forever && start_epoch >= opts.epochs) {
    return Status::Invalid("--resume: the state resumes at epoch " + std::to_string(start_epoch) + ", but --epochs " +
                           std::to_string(opts.epochs) + " ends before it: give --epochs beyond it (they count from "
                           "epoch 0 of the whole run) or --forever");
  }
  LogLine("[coloader %s] resuming at epoch %llu, position %llu (a group of %u resuming after %llu "
               "batch(es) of %u per rank)\n", opts.name.c_str(), static_cast<unsigned long long>(start_epoch),
               static_cast<unsigned long long>(start_position), r.world_size, static_cast<unsigned long long>(done),
               r.batch_size);
  return Status::OK();
}

std::optional<uint32_t> Producer::Impl::Settle(std::unique_ptr<BatchJob>& job) {
  if (!job->fatal.ok()) {
    if (fatal.ok()) fatal = job->fatal;
    ring.Abandon(job->slot);
    return std::nullopt;
  }
  uint32_t count = static_cast<uint32_t>(job->indices.size());
  if (job->failures.empty()) return count;
  std::sort(job->failures.begin(), job->failures.end());
  for (const auto& [pos, reason] : job->failures) {
    ++bad_events;
    const int64_t index = job->indices[pos];
    const bool first_time = bad_indices.insert(index).second;
    if (opts.dataset.on_bad_file == OnBadFile::kFail) {
      if (fatal.ok()) fatal = Status::Invalid(reason + " (stopping: --on-bad-file fail)");
    } else if (first_time) {
      LogLineAt(LogLevel::kWarning, "[coloader %s] skipped bad file: %s\n", opts.name.c_str(), reason.c_str());
    }
  }
  if (!fatal.ok()) {
    ring.Abandon(job->slot);
    return std::nullopt;
  }
  const std::string example = job->failures.front().second;
  count = source->FillFailed(*job);
  // Nothing of it decoded: it comes back in its place in the sequence with other files,
  // so that it keeps its size too (a group's ranks stay in step even with batches of 1).
  if (count == 0 && source->Resubmit(job)) return std::nullopt;
  if (count == 0) {
    // Neither its files nor any of their substitutes decoded: the data is unreadable, and an
    // empty batch would report whole epochs of nothing.
    fatal = Status::Invalid("no file of batch " + std::to_string(job->seq & ~kPrivateSeq) + " (epoch " +
                            std::to_string(job->epoch) + ") nor any of its substitutes decoded (" +
                            std::to_string(job->substitutions) + " tries), e.g. " + example +
                            ": the data set looks unreadable; check --data");
    ring.Abandon(job->slot);
    return std::nullopt;
  }
  return count;
}

Status Producer::Impl::Upload(const BatchJob& job, uint32_t count, const std::vector<const Session*>& readers) {
  if (device_rings.empty()) return Status::OK();
  // One upload per GPU that has a reader; a host copy if one reads the host path.
  std::vector<bool> in_use(device_rings.size(), false);
  bool host_readers = false;
  for (const Session* s : readers) {
    if (s->device)
      in_use[s->ring] = true;
    else
      host_readers = true;
  }
  if (host_readers) in_use[0] = true;  // the host copy comes down from the first ring
  Status st;
  for (size_t i = 0; i < device_rings.size() && st.ok(); ++i)
    if (in_use[i])
      st = device_rings[i]->Upload(job.slot, count, source->DeviceStaging(job), source->DecodeDevice(job),
                                   source->EraseBoxes(job), source->PixelPrograms(job));
  if (st.ok() && host_readers) st = device_rings[0]->DownloadToHost(job.slot, count);
  return st;
}

std::optional<BatchAnnouncement> Producer::Impl::Ready(const BatchJob& job, uint32_t count,
                                                      const std::vector<const Session*>& readers) {
  if (Status st = Upload(job, count, readers); !st.ok()) {
    fatal = st;
    ring.Abandon(job.slot);
    return std::nullopt;
  }
  BatchAnnouncement a;
  a.seq = job.seq;
  a.slot = job.slot;
  a.epoch = job.epoch;
  a.first = job.first;
  a.count = count;
  a.flags = job.last_in_epoch ? kBatchLastInEpoch : 0;
  a.ready_ns = MonotonicNs();
  return a;
}

bool Producer::Impl::Announce(Session& s, const BatchAnnouncement& a) {
  if (s.mailbox >= 0) {
    Mailbox box = mailboxes.at(static_cast<uint32_t>(s.mailbox));
    if (!box.Push(a)) return false;
    // Forget what it has taken: ReadUpto looks from there on.
    const uint64_t taken = box.taken();
    while (!s.unread.empty() && s.pushed - s.unread.size() + 1 < taken) s.unread.pop_front();
    s.unread.push_back({a.seq, a.epoch, a.first});
    ++s.pushed;
  }
  if (s.received++ == 0 && !IsPrivateSeq(a.seq)) s.first_seq = a.seq;
  if (s.remote)
    SendWithPayload(s, a);
  else if (s.mailbox < 0)
    SendToSession(s, a);
  return true;
}

void Producer::Impl::PublishReady() {
  for (auto& job : source->TakeCompleted()) {
    if (IsPrivateSeq(job->seq))
      done_private.emplace(job->seq, std::move(job));
    else
      done.emplace(job->seq, std::move(job));
  }
  PublishCatchUp();
  // Publish strictly in sequence order, and only when someone is there to take it: a batch
  // with no consumer at all waits in its slot (back-pressure) instead of being thrown away.
  // Members waiting for the rest of their group are not there yet either, nor consumers
  // reading their catch-up batches. (Unless a catch-up needs its slot while nobody reads the
  // shared stream: let_go_shared, set by SubmitCatchUp, lets the next one go to nobody.)
  while (fatal.ok() && !done.empty() && done.begin()->first == next_publish_seq &&
         (Receivers() > 0 || std::exchange(let_go_shared, false))) {
    std::unique_ptr<BatchJob> job = std::move(done.begin()->second);
    done.erase(done.begin());
    const std::optional<uint32_t> count = Settle(job);
    if (!count) return;
    ++next_publish_seq;

    // Who takes it: every consumer reading the shared stream, a group member too (it reads
    // every batch, acks it, and keeps its own share: common/split.h).
    std::vector<Session*> readers;
    for (auto& [identity, s] : sessions) {
      if (s.pending || s.group_waiting || !s.reads_shared()) continue;
      if (s.waiting_for_epoch) {
        if (job->first != 0) continue;
        s.waiting_for_epoch = false;  // joins at this epoch's start
      }
      if (TakesShared(s, *job)) readers.push_back(&s);
    }
    std::optional<BatchAnnouncement> ready = Ready(*job, *count, {readers.begin(), readers.end()});
    if (!ready) return;
    BatchAnnouncement a = *ready;
    std::vector<uint64_t> holders;
    std::vector<std::string> stuck;
    for (Session* s : readers) {
      a.flags = ready->flags;
      if (s->catch_up == Session::CatchUp::kTail) {
        // Its epoch goes on with the positions it missed, decoded again for it alone.
        a.flags = s->owed_whole ? kBatchMadeWhole : 0;
        if (job->last_in_epoch) s->catch_up = Session::CatchUp::kPrivate;
      }
      if (!Announce(*s, a)) {
        stuck.push_back(s->identity);  // more outstanding than the window allows: not ours to fix
        continue;
      }
      holders.push_back(s->id);
    }
    ring.Publish(job->slot, job->seq, holders);
    for (const std::string& identity : stuck)
      DropSession(identity, "let its mailbox fill up", Bye{ByeReason::kRejected, "mailbox overflow"});
    ++batches_published;
    samples_published += *count;
    published_epoch = job->epoch;
    published_position = job->first + job->indices.size();
  }
}

}  // namespace coloader
