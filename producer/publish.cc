// Back-pressure and publishing: submitting work while the window allows, publishing finished
// batches in sequence order with one upload per GPU that has readers.
#include "producer/producer_internal.h"

#include <cstdio>

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
  // Hand the source a slot while the window allows; each batch is published in order later.
  while (!source->exhausted() && fatal.ok() && WithinWindow()) {
    std::optional<uint32_t> slot = ring.Acquire();
    if (!slot) {
      ReclaimOldest();
      break;
    }
    // The slot's previous uploads may still be reading its staging area.
    Status idle;
    for (auto& r : device_rings)
      if (idle.ok()) idle = r->WaitIdle(*slot);
    if (!idle.ok()) {
      fatal = idle;
      ring.Abandon(*slot);
      break;
    }
    source->Fill(*slot, shm.data() + uint64_t{*slot} * table.slot_bytes, next_submit_seq++);
  }
  all_submitted = source->exhausted();
}

void Producer::Impl::ReclaimOldest() {
  // Within the window and yet no free slot: consumers keep batches they have read past (a
  // list of tensors, a logger). The oldest one's keepers are asked once to copy it and let go.
  for (const RingAccounting::Held& h : ring.Published()) {
    bool asked = false;
    for (auto& [identity, s] : sessions) {
      if (std::find(h.holders.begin(), h.holders.end(), s.id) == h.holders.end()) continue;
      if (ReadUpto(s) <= h.seq + 1 || s.reclaim_asked > h.seq) continue;  // still reading it, or asked
      s.reclaim_asked = h.seq + 1;
      SendToSession(s, Reclaim{h.seq});
      asked = true;
    }
    if (asked) return;
  }
}

void Producer::Impl::ReclaimAtEnd() {
  for (const RingAccounting::Held& h : ring.Published()) {  // oldest first: reclaim_asked only grows
    for (auto& [identity, s] : sessions) {
      if (s.reclaim_asked > h.seq || std::find(h.holders.begin(), h.holders.end(), s.id) == h.holders.end()) continue;
      // Only a consumer that has taken every batch: one still reading releases as it goes (and
      // is asked once it is through; the loop calls again). Without a mailbox, what was
      // announced to it is what it has.
      const uint64_t taken = s.mailbox >= 0 ? ReadUpto(s) : s.first_seq + s.received;
      if (taken < next_publish_seq) continue;
      s.reclaim_asked = h.seq + 1;
      SendToSession(s, Reclaim{h.seq});
    }
  }
}

void Producer::Impl::AnnounceEnd() {
  const uint64_t epochs = batches_published > 0 ? published_epoch + 1 : start_epoch;
  for (auto& [identity, s] : sessions) {
    if (s.pending || s.end_sent) continue;
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
  const SplitSpec spec{r.begin, epoch_samples(), r.world_size, 0, r.batch_size, r.drop_last};
  Result<SplitPlan> plan = PlanSavedPosition(spec, r.epoch, r.samples);
  if (!plan.ok()) return Status::Invalid("--resume: " + plan.status().message());
  const uint64_t done = BatchesTaken(spec, *plan, r.samples);  // batches each rank had taken
  if (done >= plan->batches) {
    start_epoch = r.epoch + 1;  // that epoch was complete: the next one from its start
    start_position = 0;
  } else {
    start_epoch = r.epoch;
    start_position = ResumePosition(spec, *plan, done);
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

void Producer::Impl::PublishReady() {
  for (auto& job : source->TakeCompleted())
    done.emplace(job->seq, std::move(job));
  // Publish strictly in sequence order, and only when someone is there to take it: a batch
  // with no consumer at all waits in its slot (back-pressure) instead of being thrown away.
  // Members waiting for the rest of their group are not there yet either.
  while (!done.empty() && done.begin()->first == next_publish_seq && Receivers() > 0) {
    std::unique_ptr<BatchJob> job = std::move(done.begin()->second);
    done.erase(done.begin());

    if (!job->fatal.ok()) {
      if (fatal.ok()) fatal = job->fatal;
      ring.Abandon(job->slot);
      return;
    }
    uint32_t count = static_cast<uint32_t>(job->indices.size());
    if (!job->failures.empty()) {
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
        return;
      }
      const std::string example = job->failures.front().second;
      count = source->FillFailed(*job);
      // Nothing of it decoded: it comes back in its place in the sequence with other files,
      // so that it keeps its size too (a group's ranks stay in step even with batches of 1).
      if (count == 0 && source->Resubmit(job)) return;
      if (count == 0) {
        // Neither its files nor any of their substitutes decoded: the data is unreadable, and an
        // empty batch would report whole epochs of nothing.
        fatal = Status::Invalid("no file of batch " + std::to_string(job->seq) + " (epoch " + std::to_string(job->epoch) +
                                ") nor any of its substitutes decoded (" + std::to_string(job->substitutions) +
                                " tries), e.g. " + example + ": the data set looks unreadable; check --data");
        ring.Abandon(job->slot);
        return;
      }
    }
    ++next_publish_seq;

    if (!device_rings.empty()) {
      // One upload per GPU that has a consumer now; a host copy if anyone reads the host path.
      std::vector<bool> in_use(device_rings.size(), false);
      bool host_readers = false;
      for (const auto& [id, s] : sessions) {
        if (s.pending || s.group_waiting) continue;
        if (s.device) in_use[s.ring] = true;
        else host_readers = true;
      }
      if (host_readers) in_use[0] = true;  // the host copy comes down from the first ring
      Status st;
      for (size_t i = 0; i < device_rings.size() && st.ok(); ++i)
        if (in_use[i])
          st = device_rings[i]->Upload(job->slot, count, source->DeviceStaging(*job), source->DecodeDevice(*job),
                                       source->EraseBoxes(*job), source->PixelPrograms(*job));
      if (st.ok() && host_readers) st = device_rings[0]->DownloadToHost(job->slot, count);
      if (!st.ok()) {
        fatal = st;
        ring.Abandon(job->slot);
        return;
      }
    }

    BatchAnnouncement a;
    a.seq = job->seq;
    a.slot = job->slot;
    a.epoch = job->epoch;
    a.first = job->first;
    a.count = count;
    a.flags = job->last_in_epoch ? kBatchLastInEpoch : 0;
    a.ready_ns = MonotonicNs();
    std::vector<uint64_t> holders;
    std::vector<std::string> stuck;
    for (auto& [identity, s] : sessions) {
      // A group member reads every batch (and acks it) and keeps its own share (common/split.h).
      if (s.pending || s.group_waiting) continue;
      if (s.waiting_for_epoch) {
        if (job->first != 0) continue;
        s.waiting_for_epoch = false;  // joins at this epoch's start
      }
      if (s.mailbox >= 0 && !mailboxes.at(static_cast<uint32_t>(s.mailbox)).Push(a)) {
        stuck.push_back(identity);  // more outstanding than the window allows: not ours to fix
        continue;
      }
      holders.push_back(s.id);
      if (s.received++ == 0) s.first_seq = job->seq;
      if (s.remote) SendWithPayload(s, a);
      else if (s.mailbox < 0) SendToSession(s, a);
    }
    ring.Publish(job->slot, job->seq, holders);
    for (const std::string& identity : stuck)
      DropSession(identity, "let its mailbox fill up", Bye{ByeReason::kRejected, "mailbox overflow"});
    ++batches_published;
    samples_published += count;
    published_epoch = job->epoch;
    published_position = job->first + job->indices.size();
  }
}

}  // namespace coloader
