// Catch-up (DESIGN.md, "Catch-up"): the positions a consumer, or a group as one, missed of its
// epoch, decoded again and published to it alone; a saved state's rest served the same way.
#include <algorithm>

#include "common/log.h"
#include "producer/producer_internal.h"

namespace coloader {

// Catch-up. A consumer that joins mid-epoch (a job started late, or after another) reads the
// shared stream's rest of that epoch, flagged kBatchMadeWhole, then the positions it missed,
// decoded again for it alone; its epoch ends with the last of those. It then reads the shared
// stream from wherever that is, caught up the same way when that is mid-epoch: a job as fast as
// the others stays that far behind them, and that much of each of its epochs is decoded twice.
// The shared stream is not held back for it (it takes no shared batch while it reads its own);
// its own batches take the ring's free slots after the shared stream's, at most its spare slots'
// worth at a time.

std::string Producer::Impl::WhyNoCatchUp(const Session& s) const {
  if (!opts.catch_up) return "the producer was started with --no-catch-up";
  if (std::string why = source->WhyNoRefill(); !why.empty()) return why;
  const uint64_t span = GroupSpan(s), spare = static_cast<uint64_t>(opts.spare_slots);
  if (span > spare)
    return "a step of a group of " + std::to_string(s.world_size) + " ranks with batches of " +
           std::to_string(s.batch_size ? s.batch_size : opts.batch_size) + " takes " + std::to_string(span) +
           " batches of " + std::to_string(opts.batch_size) + " at once, more than the producer's " +
           std::to_string(spare) + " spare slot(s) could hold for catching it up: restart it with --spare-slots " +
           std::to_string(span) + " or more";
  return "";
}

bool Producer::Impl::CanCatchUp(const Session& s) const { return !s.resuming && WhyNoCatchUp(s).empty(); }

uint64_t Producer::Impl::GroupSpan(const Session& s) const {
  if (s.group.empty() || s.world_size <= 1) return 1;
  const uint64_t b = s.batch_size ? s.batch_size : opts.batch_size;
  return (uint64_t{s.world_size} * b + opts.batch_size - 1) / opts.batch_size;
}

uint64_t Producer::Impl::RoundLeft(const Session& s, uint64_t position) const {
  if (s.group.empty() || s.world_size <= 1) return opts.batch_size;
  const uint64_t n = epoch_samples(), round = uint64_t{s.world_size} * (s.batch_size ? s.batch_size : opts.batch_size);
  const uint64_t c = (position % n + n - s.owed_anchor % n) % n;  // in the epoch's order
  return round - c % round;
}

Status Producer::Impl::ServeResume(Session& s, const Attach& attach) {
  if (!CanCatchUp(s))
    return Status::Invalid("this producer does not serve a saved state's rest (" + WhyNoCatchUp(s) + ")");
  const uint64_t n = epoch_samples(), epoch = attach.resume_epoch;
  const uint64_t owed = attach.resume_to - attach.resume_from;
  if (owed > n || attach.resume_to > 2 * n || (owed > 0 && attach.resume_to < n))
    return Status::Invalid("a resume range [" + std::to_string(attach.resume_from) + ", " +
                           std::to_string(attach.resume_to) + ") that is not the rest of an epoch of " +
                           std::to_string(n) + " samples");
  if (!opts.forever && epoch >= opts.epochs) {
    return Status::Invalid("the saved state resumes epoch " + std::to_string(epoch) + ", but this producer serves " +
                           std::to_string(opts.epochs) + " (--epochs counts from epoch 0 of the whole run)");
  }
  s.owed_epoch = epoch;
  s.owed_whole = false;         // the rest of an epoch another process began
  s.waiting_for_epoch = false;  // it continues its own epoch
  s.first_seq = s.acked_upto = next_publish_seq;
  s.owed_next = attach.resume_from;
  s.owed_end = attach.resume_to;
  s.owed_anchor = attach.resume_from;  // (a group's rest begins at a round of its split)
  const char* how = "decoded again for it";
  if (owed == 0) {
    s.catch_up = Session::CatchUp::kRejoin;  // its saved epoch was whole: the next one, whole
    how = "none owed; whole epochs";
  } else {
    s.catch_up = Session::CatchUp::kPrivate;
    // A group's ranks decide together when the last one is there (MaybeStartGroup): the stream
    // may move meanwhile.
    if (s.group.empty() && ReadOnWhereThere(s)) how = "read from the shared stream, which is there";
  }
  LogLine(
      "[coloader %s] consumer %llu resumes a saved state: %llu sample(s) of epoch %llu %s, then the shared "
      "stream\n",
      opts.name.c_str(), static_cast<unsigned long long>(s.id), static_cast<unsigned long long>(owed),
      static_cast<unsigned long long>(epoch), how);
  return Status::OK();
}

bool Producer::Impl::ReadOnWhereThere(Session& s) {
  // Where the shared stream's next batch begins (a run started with --resume: where it resumes).
  const uint64_t n = epoch_samples();
  const bool fresh = !started || batches_published == 0;
  const uint64_t next_epoch = fresh ? start_epoch : published_position >= n ? published_epoch + 1 : published_epoch;
  const uint64_t next_position = fresh ? start_position : published_position >= n ? 0 : published_position;
  if (s.catch_up != Session::CatchUp::kPrivate || next_epoch != s.owed_epoch || next_position != s.owed_next)
    return false;
  // The shared stream is where the state stopped (`serve --resume` with it, or by chance): it
  // reads on from there, then what its epoch began with, if it began mid-way.
  s.catch_up = s.owed_end > n ? Session::CatchUp::kTail : Session::CatchUp::kNone;
  s.owed_next = n;
  s.resuming = true;  // nothing more is owed to it than that
  return true;
}

bool Producer::Impl::TakesShared(Session& s, const BatchJob& job) {
  using CatchUp = Session::CatchUp;
  if (s.catch_up == CatchUp::kRejoin) {
    if (s.parked) return false;  // it stopped reading (LagCatchUp): it rejoins when it waits again (NoteReads)
    if (job.epoch < s.owed_epoch) return false;  // not reached yet (it caught up ahead)
    if (job.epoch > s.owed_epoch) {              // the stream went past that epoch: all of it alone
      s.catch_up = CatchUp::kPrivate;
      s.owed_next = 0;
      s.owed_end = epoch_samples();
      s.owed_anchor = 0;
      s.owed_whole = true;
      return false;
    }
    s.first_seq = job.seq;  // its shared batches begin again here (ReadUpto without a mailbox)
    s.catch_up = job.first == 0 ? CatchUp::kNone : CatchUp::kTail;
    s.owed_next = 0;
    s.owed_end = job.first;
    s.owed_anchor = job.first;
    s.owed_whole = true;
    return true;
  }
  // A run resumed at (start_epoch, start_position) was read up to there before it stopped: a
  // consumer is owed only what this run published before it came, and that epoch stays the
  // rest of the saved one (partial), as for a consumer that came at its start.
  const uint64_t begin = job.epoch == start_epoch ? start_position : 0;
  // A group's members see the same batch first (they start together) and decide alike. A group
  // is caught up only to a whole epoch: its split runs over the epoch's order from where it
  // joined round to there (common/split.h), which the rest of a resumed run's epoch is not.
  const bool whole = begin == 0;
  if (s.catch_up == CatchUp::kNone && s.received == 0 && job.first > begin && CanCatchUp(s) &&
      (s.group.empty() || whole)) {
    s.catch_up = CatchUp::kTail;  // joins mid-epoch: owed what it missed
    s.owed_epoch = job.epoch;
    s.owed_next = begin;
    s.owed_end = job.first;
    s.owed_anchor = job.first;
    s.owed_whole = whole;
    if (s.group.empty()) {
      LogLine(
          "[coloader %s] consumer %llu joined epoch %llu at sample %llu: it reads the rest with the others, then "
          "the %llu it missed, decoded again for it\n",
          opts.name.c_str(), static_cast<unsigned long long>(s.id), static_cast<unsigned long long>(job.epoch),
          static_cast<unsigned long long>(job.first), static_cast<unsigned long long>(job.first - begin));
    } else if (s.rank == 0) {
      LogLine(
          "[coloader %s] group %s joined epoch %llu at sample %llu: its %u ranks read the rest with the others, "
          "then the %llu it missed, decoded again for them once\n",
          opts.name.c_str(), s.group.c_str(), static_cast<unsigned long long>(job.epoch),
          static_cast<unsigned long long>(job.first), s.world_size, static_cast<unsigned long long>(job.first - begin));
    }
  }
  return true;
}

bool Producer::Impl::CatchUpOwed() const {
  for (const auto& [identity, s] : sessions)
    if (s.catch_up == Session::CatchUp::kTail || s.catch_up == Session::CatchUp::kPrivate ||
        s.catch_up == Session::CatchUp::kRejoin)
      return true;
  return false;
}

uint64_t Producer::Impl::PrivateOutstanding(const Session& s) const {
  uint64_t outstanding = s.private_jobs.size();
  if (s.mailbox < 0) return outstanding + ring.HeldBy(s.id);
  const uint64_t taken = mailboxes.at(static_cast<uint32_t>(s.mailbox)).taken();
  const uint64_t base = s.pushed - s.unread.size();
  for (size_t i = taken > base ? taken - base : 0; i < s.unread.size(); ++i)
    outstanding += IsPrivateSeq(s.unread[i].seq) ? 1 : 0;
  return outstanding;
}

uint64_t Producer::Impl::PrivateFootprint(const Session& s) const {
  uint64_t n = s.private_jobs.size();
  for (const RingAccounting::Held& h : ring.Published())
    if (IsPrivateSeq(h.seq) && std::find(h.holders.begin(), h.holders.end(), s.id) != h.holders.end()) ++n;
  return n;
}

uint64_t Producer::Impl::PrivateSlotsInUse() const {
  uint64_t n = private_owner.size();  // with the source, or done and not yet published
  // Not those a parked consumer holds (the batch it reads, or those it was served after the
  // others): counted, they would keep the one served now from its next batch.
  auto parked = [&](uint64_t id) {
    return std::any_of(sessions.begin(), sessions.end(),
                       [&](const auto& kv) { return kv.second.id == id && kv.second.parked; });
  };
  for (const RingAccounting::Held& h : ring.Published())
    if (IsPrivateSeq(h.seq) && !std::all_of(h.holders.begin(), h.holders.end(), parked)) ++n;
  return n;
}

uint64_t Producer::Impl::UnitFootprint(const Session& s) const {
  std::vector<uint64_t> unit;  // s and the members of its group catching up with it
  for (const auto& [identity, t] : sessions)
    if (CatchesUpWith(s, t)) unit.push_back(t.id);
  auto ours = [&](const std::vector<uint64_t>& ids) {
    return std::any_of(ids.begin(), ids.end(),
                       [&](uint64_t id) { return std::find(unit.begin(), unit.end(), id) != unit.end(); });
  };
  uint64_t n = 0;
  for (const auto& [seq, owners] : private_owner) n += ours(owners) ? 1 : 0;
  for (const RingAccounting::Held& h : ring.Published()) n += IsPrivateSeq(h.seq) && ours(h.holders) ? 1 : 0;
  return n;
}

uint64_t Producer::Impl::CatchUpBudget() const {
  // (WhyNoCatchUp: a group's step fits the spare slots, so the budget holds one.)
  const uint64_t spare = ring.num_slots() - std::min(ring.num_slots(), opts.window);
  return std::max<uint64_t>(2, spare);
}

const Session* Producer::Impl::CatchingUp() const {
  // One at a time (a group counts as one): the one already under way (it holds or waits for its
  // own batches), else the first to come. Two, each holding the batch it reads while it waits
  // for its next, would fill a budget of two and wait for each other.
  // A parked one (Park) comes after every other, once it waits for a batch again (not before:
  // what is decoded for a job that does not read would only be taken back again).
  const Session* first = nullptr;
  const Session* parked = nullptr;
  for (const auto& [identity, s] : sessions) {
    if (s.catch_up != Session::CatchUp::kPrivate || s.owed_next >= s.owed_end) continue;
    if (s.pending || s.group_waiting) continue;  // a resumed group's rest waits for all its ranks
    if (s.parked) {
      if (Waits(s) && (!parked || s.id < parked->id)) parked = &s;
      continue;
    }
    if (PrivateFootprint(s) > 0) return &s;
    if (!first || s.id < first->id) first = &s;
  }
  return first ? first : parked;
}

std::vector<Session*> Producer::Impl::CatchUpReaders(const Session& s) {
  std::vector<Session*> readers;
  for (auto& [identity, t] : sessions)
    if (CatchesUpWith(s, t)) readers.push_back(&t);
  return readers;
}

uint32_t Producer::Impl::CatchUpWaiting() const {
  // Free slots the shared stream leaves to the consumer served: one while it has nothing of its
  // own on the way; for a group, as many as a step of it needs at once (its first rank holds its
  // batch in the all-reduce until the last has read its own).
  const Session* s = CatchingUp();
  if (!s) return 0;
  if (GroupSpan(*s) > 1) {
    const uint64_t have = UnitFootprint(*s), span = GroupSpan(*s);
    return have < span ? static_cast<uint32_t>(span - have) : 0;
  }
  if (PrivateOutstanding(*s) > 0) return 0;
  return PrivateSlotsInUse() < CatchUpBudget() ? 1 : 0;
}

void Producer::Impl::SubmitCatchUp(bool first_only) {
  using CatchUp = Session::CatchUp;
  // The shared stream is over (every epoch handed out and published): a consumer waiting to
  // rejoin it reads its next epoch alone, or is done. (Ranks waiting for their group are set
  // so once it starts, all alike.)
  const bool shared_over = source->exhausted() && done.empty() && next_publish_seq == next_submit_seq;
  for (auto& [identity, s] : sessions) {
    if (s.catch_up != CatchUp::kRejoin || !shared_over || s.group_waiting) continue;
    if (!opts.forever && s.owed_epoch >= opts.epochs) {
      s.catch_up = CatchUp::kDone;
    } else {
      s.catch_up = CatchUp::kPrivate;
      s.owed_next = 0;
      s.owed_end = epoch_samples();
      s.owed_anchor = 0;
      s.owed_whole = true;
    }
  }
  // One consumer (or group) at a time is served; all catch-up batches together (with the source,
  // unread, or held) take at most the budget's slots: the shared stream keeps its window.
  const Session* served = CatchingUp();
  if (!served || !fatal.ok()) return;
  Session& s = sessions.at(served->identity);
  // A parked one is served only when it waits again and nobody else is owed (CatchingUp): its
  // turn has come, and its batches count against the budget from here on.
  s.parked = false;
  const std::vector<Session*> readers = CatchUpReaders(s);
  const uint64_t budget = CatchUpBudget(), span = GroupSpan(s);
  uint64_t total = PrivateSlotsInUse();
  while (s.owed_next < s.owed_end && total < budget) {
    // First, before the shared stream: what it has nothing of on the way, or a group's step.
    if (first_only && (span > 1 ? UnitFootprint(s) >= span : PrivateOutstanding(s) > 0)) return;
    std::optional<uint32_t> slot = AcquireSlot();
    if (!slot) {
      // Nobody reads the shared stream now (nor waits to: a member waiting for its group, or a
      // consumer choosing its path, keeps the batches for it), and its finished batches wait in the
      // slots this one needs: let the next go. Else kept batches fill the ring (no slot came back
      // for a while): ask for the oldest back.
      const bool nobody = Receivers() == 0 && std::none_of(sessions.begin(), sessions.end(), [](const auto& kv) {
                            return kv.second.pending || kv.second.group_waiting;
                          });
      if (nobody && !done.empty() && done.begin()->first == next_publish_seq) let_go_shared = true;
      if (fatal.ok() && MonotonicNs() - last_release_ns > 100'000'000) ReclaimOldest();
      return;
    }
    // Positions run on modulo the epoch (a resumed rest may wrap round): no batch crosses its end,
    // nor a round of a group's split.
    const uint64_t n = epoch_samples(), at = s.owed_next % n;
    const uint32_t count = static_cast<uint32_t>(
        std::min<uint64_t>({opts.batch_size, s.owed_end - s.owed_next, n - at, RoundLeft(s, at)}));
    const uint64_t seq = next_private_seq++;
    const bool last = s.owed_next + count == s.owed_end;
    std::vector<uint64_t>& owners = private_owner[seq];
    for (Session* r : readers) {  // a group's members move on together
      owners.push_back(r->id);
      r->private_jobs.push_back(seq);
      r->owed_next += count;
    }
    source->FillAt(*slot, shm.data() + uint64_t{*slot} * table.slot_bytes, seq, s.owed_epoch, at, count, last);
    ++total;
  }
}

void Producer::Impl::PublishCatchUp() {
  using CatchUp = Session::CatchUp;
  for (auto it = done_private.begin(); fatal.ok() && it != done_private.end();) {
    auto owner = private_owner.find(it->first);
    std::vector<Session*> readers;  // its owners still here
    if (owner != private_owner.end())
      for (auto& [identity, t] : sessions)
        if (std::find(owner->second.begin(), owner->second.end(), t.id) != owner->second.end()) readers.push_back(&t);
    if (readers.empty()) {  // they left: the batch is nobody's
      ring.Abandon(it->second->slot);
      if (owner != private_owner.end()) private_owner.erase(owner);
      it = done_private.erase(it);
      continue;
    }
    if (std::any_of(readers.begin(), readers.end(), [&](const Session* r) {
          return r->private_jobs.empty() || r->private_jobs.front() != it->first;
        })) {
      ++it;  // an earlier one of theirs is not done yet
      continue;
    }
    std::unique_ptr<BatchJob> job = std::move(it->second);
    done_private.erase(it);
    const std::optional<uint32_t> count = Settle(job);
    if (!count) {
      if (!fatal.ok()) return;
      it = done_private.begin();  // it went back to be filled again
      continue;
    }
    private_owner.erase(owner);
    for (Session* r : readers) r->private_jobs.pop_front();
    std::optional<BatchAnnouncement> a = Ready(*job, *count, {readers.begin(), readers.end()});
    if (!a) return;
    if (readers.front()->owed_whole) a->flags |= kBatchMadeWhole;
    std::vector<uint64_t> holders;
    std::vector<std::string> stuck;
    for (Session* r : readers) {
      if (!Announce(*r, *a)) {
        stuck.push_back(r->identity);
        continue;
      }
      holders.push_back(r->id);
      if (job->last_in_epoch) {  // its epoch is whole: on to the next, with the shared stream
        r->owed_epoch = job->epoch + 1;
        r->catch_up = !opts.forever && r->owed_epoch >= opts.epochs ? CatchUp::kDone : CatchUp::kRejoin;
        // Counted from here on in the shared stream (ReadUpto without a mailbox; a stall's clock).
        r->first_seq = r->acked_upto = next_publish_seq;
        r->last_read_ns = MonotonicNs();
      }
    }
    ring.Publish(job->slot, job->seq, holders);
    ++private_batches;
    private_samples += *count;
    // (last: dropping a group's member drops the others too)
    for (const std::string& identity : stuck)
      DropSession(identity, "let its mailbox fill up", Bye{ByeReason::kRejected, "mailbox overflow"});
    it = done_private.begin();
  }
}

// Behind the window. A consumer that stops taking batches (an evaluation, a checkpoint, a pause)
// holds the shared stream back once it is `window` batches behind. Where it may be caught up,
// it is not waited for: after --lag-timeout-ms (and 4 of its own steps, so that a slow pace is
// not taken for a pause) with another consumer waiting, the batches it has not taken are taken
// back from its mailbox, and the rest of its epoch is decoded again for it alone, then it reads
// the shared stream like a late joiner. Its epoch stays in the order it began (from where it
// joined round to there), so that its state_dict() still says what it has read.

bool Producer::Impl::CaughtUpWhenBehind(const Session& s) const {
  // Its batches must be in a mailbox (a message on its way cannot be taken back), and it reads
  // alone: a group's ranks are at different points of its step, and are waited for.
  if (s.mailbox < 0 || s.remote || s.pending || !s.group.empty() || !CanCatchUp(s)) return false;
  if (s.catch_up == Session::CatchUp::kNone) return true;
  // Reading the shared rest of an epoch it joined: the rest of it from here on, then what it
  // missed, is one range round the epoch's end (not so for the first epoch of a resumed run,
  // which owes what it missed from where the run began).
  return s.catch_up == Session::CatchUp::kTail && s.owed_next == 0 && s.owed_whole;
}

void Producer::Impl::LagCatchUp(uint64_t now) {
  if (opts.lag_timeout_ms == 0 || !started) return;
  // The window holds back what the source is handed: once it has had every epoch, nobody waits
  // for another (and a consumer told End would take an empty mailbox for the run's end).
  if (!all_submitted) {
    std::vector<Session*> behind;  // holding the shared stream back
    for (auto& [identity, s] : sessions)
      if (HoldsBackWindow(s) && CaughtUpWhenBehind(s) && IdleNs(s, now) >= LagLimitNs(s)) behind.push_back(&s);
    // Only while another reader waits for the shared stream: a stream nobody else reads waits.
    const bool waited = std::any_of(sessions.begin(), sessions.end(), [&](const auto& kv) {
      const Session& t = kv.second;
      return !t.pending && !t.group_waiting && !t.parked && t.reads_shared() && !HoldsBackWindow(t) &&
             std::find(behind.begin(), behind.end(), &t) == behind.end();
    });
    if (waited)
      for (Session* s : behind) TakeBackUnread(*s, now);
  }

  // The one served a catch-up (one at a time) takes none of its batches, and another waits for
  // its own: that one goes first. (Not a group: its ranks each hold their own copies.)
  const Session* served = CatchingUp();
  if (!served || served->parked || !served->group.empty() || served->mailbox < 0 || !served->private_jobs.empty() ||
      PrivateOutstanding(*served) == 0 || IdleNs(*served, now) < LagLimitNs(*served))
    return;
  const bool another = std::any_of(sessions.begin(), sessions.end(),
                                   [&](const auto& kv) { return &kv.second != served && WaitsForCatchUp(kv.second); });
  if (another) Park(sessions.at(served->identity), now);
}

uint64_t Producer::Impl::IdleNs(const Session& s, uint64_t now) const {
  // Counted from when batches began to wait for it, not from a read long before they came.
  if (s.unread_since_ns == 0) return 0;
  return now - std::max(s.last_read_ns, s.unread_since_ns);
}

uint64_t Producer::Impl::LagLimitNs(const Session& s) const {
  return std::max<uint64_t>(uint64_t{opts.lag_timeout_ms} * 1000000, 4 * s.step_ns);
}

bool Producer::Impl::WaitsForCatchUp(const Session& t) const {
  // (A parked one that waits again counts: it is served once the one served now is through.)
  if (t.catch_up != Session::CatchUp::kPrivate || t.owed_next >= t.owed_end || t.pending || t.group_waiting ||
      PrivateOutstanding(t) > 0)
    return false;
  return Waits(t);
}

bool Producer::Impl::Waits(const Session& t) const {
  return t.mailbox < 0 || mailboxes.at(static_cast<uint32_t>(t.mailbox)).Sleeping();
}

void Producer::Impl::NotTaken(Session& s, uint64_t now) {
  // Its mailbox's entries taken back count as taken there: they are not reads (NoteReads).
  s.taken_seen = mailboxes.at(static_cast<uint32_t>(s.mailbox)).taken();
  s.read_upto = ReadUpto(s);
  s.last_read_ns = now;  // the stall clock of what comes next starts here
  s.unread_since_ns = 0;
}

bool Producer::Impl::OnlyUnread(const Session& s, bool catch_up_batches) const {
  const uint64_t base = s.pushed - s.unread.size(), taken = mailboxes.at(static_cast<uint32_t>(s.mailbox)).taken();
  if (taken < base || taken >= s.pushed) return false;  // nothing unread (or forgotten: not expected)
  for (size_t i = taken - base; i < s.unread.size(); ++i) {
    if (IsPrivateSeq(s.unread[i].seq) != catch_up_batches) return false;
    if (catch_up_batches && s.unread[i].epoch != s.owed_epoch) return false;  // of an epoch it finished
  }
  return true;
}

void Producer::Impl::Park(Session& s, uint64_t now) {
  // Only the batches of the range it is served now go back (OnlyUnread): those are the last made
  // for it, and it owes them again from the first. Entries it takes meanwhile are its.
  if (!OnlyUnread(s, true)) return;
  Mailbox box = mailboxes.at(static_cast<uint32_t>(s.mailbox));
  const uint64_t base = s.pushed - s.unread.size();
  const std::optional<uint64_t> from = box.TakeBack();
  if (!from) return;
  const std::vector<Session::Pushed> back(s.unread.begin() + static_cast<ptrdiff_t>(*from - base), s.unread.end());
  s.unread.clear();
  for (const Session::Pushed& b : back)
    if (ring.Release(s.id, b.seq)) last_release_ns = now;
  // It owes them again from the first: the positions from there to where its catch-up stands
  // (nothing of its is with the source), counted by position, not by the samples a batch
  // delivered (fewer where bad files were skipped).
  const uint64_t n = epoch_samples();
  s.owed_next -= (s.owed_next % n + n - back.front().first % n) % n;
  s.parked = true;
  NotTaken(s, now);
  const std::string named = s.name.empty() ? std::string() : ", '" + s.name + "'";
  LogLine(
      "[coloader %s] consumer %llu (pid %u%s) took none of the batches decoded for it while another waited to be "
      "caught up (--lag-timeout-ms): its %zu unread batch(es) go back, and it is caught up after the others\n",
      opts.name.c_str(), static_cast<unsigned long long>(s.id), s.pid, named.c_str(), back.size());
}

void Producer::Impl::TakeBackUnread(Session& s, uint64_t now) {
  using CatchUp = Session::CatchUp;
  // Shared batches only: one that rejoined the shared stream before it took the last batches of
  // its catch-up would owe two ranges (it waits for --stall-timeout-ms as before).
  if (!OnlyUnread(s, false)) return;
  const std::optional<uint64_t> from = mailboxes.at(static_cast<uint32_t>(s.mailbox)).TakeBack();
  if (!from) return;  // it took them meanwhile: it reads again
  // Entries before `unread` were known to be taken when they were forgotten.
  const uint64_t base = s.pushed - s.unread.size();
  const std::vector<Session::Pushed> back(s.unread.begin() + static_cast<ptrdiff_t>(*from - base), s.unread.end());
  s.unread.clear();
  for (const Session::Pushed& b : back)
    if (ring.Release(s.id, b.seq)) last_release_ns = now;
  // In order: its epoch goes on at the first.
  const Session::Pushed& at = back.front();
  const uint64_t n = epoch_samples(), idle_ms = IdleNs(s, now) / 1000000;
  // The first epoch of a resumed run is the rest of the saved one (from start_position): it stays
  // that, partial, and is not rejoined (a rejoin would owe it what came before).
  const bool resumed_rest = at.epoch == start_epoch && start_position > 0;
  const bool none_of_it = s.catch_up == CatchUp::kNone ? at.first == 0 : at.first == s.owed_anchor;
  std::string then;
  s.parked = true;  // nothing more is made or sent for it until it reads again
  if (none_of_it) {
    // It has read nothing of that epoch: it joins it where the shared stream is, as a late joiner.
    s.catch_up = CatchUp::kRejoin;
    s.owed_epoch = at.epoch;
    then = "it joins epoch " + std::to_string(at.epoch) + " where the shared stream is, caught up on what it missed";
  } else {
    // The rest of its epoch, in its order: to the epoch's end, then (joined mid-way) round to where it began.
    const uint64_t end = s.catch_up == CatchUp::kTail ? s.owed_anchor + n : n;
    s.catch_up = CatchUp::kPrivate;
    s.owed_epoch = at.epoch;
    s.owed_next = at.first;
    s.owed_end = end;
    s.owed_whole = !resumed_rest;
    then = "the rest of epoch " + std::to_string(at.epoch) + " (" + std::to_string(end - at.first) +
           " samples from sample " + std::to_string(at.first) + ") is decoded again for it alone";
  }
  NotTaken(s, now);
  const std::string named = s.name.empty() ? std::string() : ", '" + s.name + "'";
  LogLine(
      "[coloader %s] consumer %llu (pid %u%s) took no batch for %.3g s while the others waited (--lag-timeout-ms): "
      "its %zu unread batch(es) go back and %s, then the shared stream\n",
      opts.name.c_str(), static_cast<unsigned long long>(s.id), s.pid, named.c_str(), idle_ms / 1000.0, back.size(),
      then.c_str());
}

}  // namespace coloader
