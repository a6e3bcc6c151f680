// A consumer group member's side of the split (common/split.h): every member reads the whole
// stream in order and acks every slot; it keeps the positions of its own batches, and copies
// of the few padding positions its last batch repeats. A member batch within one producer
// slot is a view, as for a plain consumer; one that straddles slots, or holds padding, is
// gathered.

#include "client/consumer_internal.h"
#include "common/log.h"

namespace coloader {

using internal::ConsumerState;
using internal::Cursor;
using internal::Piece;
using internal::SlotLease;

Result<bool> Cursor::StartSplit(const BatchAnnouncement& a) {
  const ConsumerOptions& o = state_->opts;
  FreeStash();
  // The producer serves a resumed group's saved epoch's rest to every rank (SavedGroupRest): this
  // is its first batch, wherever the shared stream is, in the saved epoch's order.
  const coloader::Attach& asked = state_->sink->attach_request;
  const bool served_rest =
      resume_pending_ && served_resume_ && a.epoch == asked.resume_epoch && asked.resume_from < asked.resume_to;
  // A group that joined mid-epoch and is caught up (the shared stream's rest, flagged
  // kBatchMadeWhole, then what came before): the epoch's order runs from a.first round its end,
  // and the split is of that whole order. Otherwise the split is of the epoch's rest from a.first.
  // (Stored once: split_origin() reads it on other threads.)
  const uint64_t origin = served_rest ? o.resume_origin : (a.flags & kBatchMadeWhole) && a.first > 0 ? a.first : 0;
  origin_ = origin;
  split_ = SplitSpec{origin > 0 ? 0 : a.first,
                     state_->welcome.epoch_samples,
                     o.group.empty() ? 1 : o.world_size,
                     o.group.empty() ? 0 : o.rank,
                     o.batch_size,
                     o.drop_last};
  group_batch_ = 0;
  samples_seen_ = 0;
  walked_ = 0;
  stream_epoch_done_ = false;
  if (resume_pending_ && served_resume_) {
    // The split is the saved one, from the member's next batch on.
    resume_pending_ = false;
    if (served_rest) {
      SplitSpec saved = split_;
      saved.begin = o.resume_origin > 0 ? 0 : o.resume_begin;
      COLOADER_ASSIGN_OR_RETURN(plan_, PlanSavedPosition(saved, o.resume_epoch, o.resume_samples));
      split_ = saved;
      group_batch_ = BatchesTaken(split_, plan_, o.resume_samples);
      if (const uint64_t at = ResumePosition(split_, plan_, group_batch_); Coord(a.first) != at)
        return Status::Invalid(state_->Who() + " began the saved epoch's rest at position " + std::to_string(a.first) +
                               ", not at " + std::to_string(asked.resume_from % state_->welcome.epoch_samples) +
                               " where this group resumes");
      samples_seen_ = o.resume_samples;
      padding_ = PaddingSegments(split_, plan_);
      partial_ = group_batch_ > 0;  // the rest of an epoch begun before; a state at its start is whole
      return true;
    }
  } else if (resume_pending_) {
    const std::string where = "epoch " + std::to_string(o.resume_epoch);
    if (a.epoch < o.resume_epoch) {
      // The producer (shared, or restarted without --resume) is behind: the state's epoch is
      // still to come. Pass over this one whole.
      resume_note_ = "the producer served epoch " + std::to_string(a.epoch) + " before the saved " + where +
                     "; it was skipped";
      Log(LogLevel::kWarning, state_->Who() + " " + resume_note_);
      return false;
    }
    resume_pending_ = false;
    const uint64_t n = state_->welcome.epoch_samples;
    if (a.epoch == o.resume_epoch && o.group.empty() && o.resume_begin < n && o.resume_samples > n - o.resume_begin) {
      // Saved in a caught-up epoch, past its end and round (this producer does not catch up).
      resume_note_ = "does not serve the rest of " + where + ", which this consumer had been caught up on (" +
                     state_->welcome.no_catch_up + "): it is skipped; continuing at the next whole epoch";
      Log(LogLevel::kWarning, state_->Who() + " " + resume_note_);
      return false;
    }
    if (a.epoch == o.resume_epoch && o.resume_origin > 0) {
      SplitSpec saved = split_;
      saved.begin = 0;
      auto plan = PlanSavedPosition(saved, o.resume_epoch, o.resume_samples);
      if (!plan.ok()) return plan.status();
      if (BatchesTaken(saved, *plan, o.resume_samples) >= plan->batches) {
        resume_note_.clear();  // it had finished the epoch: the next one is the resume point
        return false;
      }
      // Its order ran from the origin round the epoch's end: not a walk of a stream that does not
      // catch up (this producer's: SavedGroupRest serves it otherwise).
      resume_note_ = "does not serve the rest of " + where + ", which this group had been caught up on (" +
                     std::to_string(plan->per_rank - std::min(plan->per_rank, o.resume_samples)) +
                     " samples of this rank; " + state_->welcome.no_catch_up +
                     "): it is skipped; continuing at the next whole epoch";
      Log(LogLevel::kWarning, state_->Who() + " " + resume_note_);
      return false;
    }
    if (a.epoch == o.resume_epoch) {
      SplitSpec saved = split_;
      saved.begin = o.resume_begin;
      // As Resume checks it (a state given on reconnecting, mid-run, reaches only this).
      auto plan = PlanSavedPosition(saved, o.resume_epoch, o.resume_samples);
      if (!plan.ok()) return plan.status();
      const uint64_t done = BatchesTaken(saved, *plan, o.resume_samples);  // batches this member had taken
      if (done >= plan->batches) {
        resume_note_.clear();  // it had finished the epoch: the next one is the resume point
        return false;
      }
      const uint64_t at = ResumePosition(saved, *plan, done);
      if (a.first <= at) {  // (positions before the saved split's begin are passed over)
        // Exactly the rest: the saved split, from the member's next batch on. Every member
        // sees this same first batch (the group starts together) and decides alike.
        split_ = saved;
        plan_ = *plan;
        group_batch_ = done;
        samples_seen_ = o.resume_samples;
        padding_ = PaddingSegments(split_, plan_);
        partial_ = done > 0;  // the rest of an epoch begun before; a state at its start is whole
        return true;
      }
      const uint64_t lost = plan->per_rank > o.resume_samples ? plan->per_rank - o.resume_samples : 0;
      resume_note_ = "was at position " + std::to_string(a.first) + " of " + where + ", past this group's resume point " +
                     std::to_string(at) + ": the rest of " + where + " (" + std::to_string(lost) +
                     " samples of this rank) is skipped; continuing at the next whole epoch";
      Log(LogLevel::kWarning, state_->Who() + " " + resume_note_ +
                                  " (restart the producer with `coloader serve --resume STATE` to resume exactly)");
      return false;
    }
    // Past the saved epoch: exact if that epoch's share was all taken and this is the next
    // one from its start (a state saved at an epoch's end), else its rest is lost.
    SplitSpec saved = split_;
    saved.begin = o.resume_origin > 0 ? 0 : o.resume_begin;
    auto saved_plan = PlanSplit(saved);
    const bool complete = saved_plan.ok() && BatchesTaken(saved, *saved_plan, o.resume_samples) >= saved_plan->batches;
    if (!(complete && a.epoch == o.resume_epoch + 1 && a.first == 0)) {
      resume_note_ = "had moved on to epoch " + std::to_string(a.epoch) + " past the saved " + where +
                     ": its rest is skipped";
      Log(LogLevel::kWarning, state_->Who() + " " + resume_note_);
    }
  }
  auto plan = PlanSplit(split_);
  if (!plan.ok()) return plan.status();
  plan_ = *plan;
  padding_ = PaddingSegments(split_, plan_);
  return true;
}

void Cursor::FreeStash() {
  stash_.clear();
  padding_.clear();
  if (stash_device_ && state_->mapper) state_->mapper->Free(stash_device_, stash_stream_);
  stash_device_ = nullptr;
}

Status Cursor::Stash(uint32_t from, uint32_t n, void* stream) {
  if (padding_.empty()) return Status::OK();
  const BatchAnnouncement& a = current_->a;
  const SlotTable& t = state_->welcome.slots;
  const uint64_t sample_bytes = t.sample_bytes();
  DeviceMapper* m = state_->mapper.get();
  uint64_t slots = 0;
  for (const Segment& seg : padding_) slots += seg.size();
  const uint64_t labels_bytes = (slots * 8 + 255) / 256 * 256;
  const std::vector<uint64_t> slot_regions = FieldOffsets(t.fields, t.batch_size);
  for (uint32_t i = from; i < from + n; ++i) {
    const uint64_t pos = Coord(a.first) + i;
    uint64_t slot = 0;
    bool wanted = false;
    for (const Segment& seg : padding_) {
      if (pos >= seg.begin && pos < seg.end) {
        slot += pos - seg.begin;
        wanted = true;
        break;
      }
      slot += seg.size();
    }
    if (!wanted || stash_.count(pos)) continue;
    internal::PadSample p;
    p.index = reinterpret_cast<const int64_t*>(current_->base + t.indices_offset)[i];
    p.label = reinterpret_cast<const int64_t*>(current_->base + t.labels_offset)[i];
    if (m) {
      // On the device: the copy is ordered on `stream` after the producer's work on the
      // slot, and the slot's release after the copy.
      if (!(current_->waited && current_->waited_stream == stream)) {
        COLOADER_RETURN_NOT_OK(m->StreamWaitSlot(a.slot, stream));
        current_->waited = true;
        current_->waited_stream = stream;
      }
      if (!stash_device_) {
        COLOADER_ASSIGN_OR_RETURN(stash_device_, m->Allocate(labels_bytes + slots * sample_bytes, stream));
        stash_stream_ = stream;
      }
      const DeviceTable& d = state_->welcome.device;
      COLOADER_RETURN_NOT_OK(m->CopyAsync(stash_device_ + 8 * slot, current_->device_base + d.labels_offset + 8ull * i, 8, stream));
      uint64_t at = labels_bytes + slot * sample_bytes;
      for (const internal::ByteRange& r : internal::SampleRanges(t, t.batch_size, i)) {
        COLOADER_RETURN_NOT_OK(m->CopyAsync(stash_device_ + at, current_->device_base + d.data_offset + r.offset, r.bytes, stream));
        at += r.bytes;
      }
      current_->stream = stream;
      current_->on_stream = true;
      p.device_slot = static_cast<uint32_t>(slot);
      for (size_t f = 0; f < t.fields.size(); ++f) {  // and the host copy of the kFieldOnHost fields
        if (!(t.fields[f].flags & kFieldOnHost)) continue;
        const uint64_t bytes = t.fields[f].sample_bytes();
        const uint8_t* v = current_->base + t.data_offset + slot_regions[f] + i * bytes;
        p.on_host.insert(p.on_host.end(), v, v + bytes);
      }
    } else {
      for (const internal::ByteRange& r : internal::SampleRanges(t, t.batch_size, i)) {
        const uint8_t* px = current_->base + t.data_offset + r.offset;
        p.pixels.insert(p.pixels.end(), px, px + r.bytes);
      }
    }
    stash_.emplace(pos, std::move(p));
  }
  return Status::OK();
}

Result<bool> Cursor::Advance(uint64_t upto, uint64_t take_from, std::vector<Piece>* pieces, std::optional<Batch>* gathered,
                         void* stream, std::chrono::steady_clock::time_point slice_end) {
  for (;;) {
    if (!current_ || offset_ == current_->a.count) {
      if (current_ && (current_->a.flags & kBatchLastInEpoch)) {
        stream_epoch_done_ = true;
        return true;
      }
      current_.reset();
      // There: the next batch is not looked at before it is needed. A step's first rank would
      // otherwise wait for it holding its own while the last rank still needs the batches
      // before it, and a group's catch-up batches come a step's worth at a time.
      if (walked_ >= upto) return true;
      COLOADER_ASSIGN_OR_RETURN(Waited<std::optional<BatchAnnouncement>> taken, Take(slice_end));
      if (!taken.ready()) return false;
      std::optional<BatchAnnouncement> a = *std::move(taken);
      if (!a) {  // the producer served every epoch
        stream_ended_ = true;
        stream_epoch_done_ = true;
        return true;
      }
      if (a->epoch != epoch_) {  // this epoch was cut short (a skip): the next one begins
        pending_ = a;
        stream_epoch_done_ = true;
        return true;
      }
      COLOADER_ASSIGN_OR_RETURN(current_, OpenSlot(*a));
      offset_ = 0;
      walked_ = Coord(a->first);
      continue;
    }
    // Positions within a batch are consecutive (no batch crosses the epoch's end, where a caught-up
    // epoch's order wraps round); skipped bad files leave a gap at its end.
    const uint64_t pos = Coord(current_->a.first) + offset_;
    if (pos >= upto) return true;
    uint64_t n = std::min<uint64_t>(current_->a.count - offset_, upto - pos);
    const bool take = pieces != nullptr && pos >= take_from;
    if (pieces != nullptr && pos < take_from) n = std::min<uint64_t>(n, take_from - pos);
    const auto count = static_cast<uint32_t>(n);
    COLOADER_RETURN_NOT_OK(Stash(offset_, count, stream));
    if (take) {
      if (state_->mapper && !(current_->waited && current_->waited_stream == stream)) {
        COLOADER_RETURN_NOT_OK(state_->mapper->StreamWaitSlot(current_->a.slot, stream));
        current_->waited = true;
        current_->waited_stream = stream;
      }
      pieces->push_back({current_, offset_, count});
      current_->stream = stream;
      current_->on_stream = true;
      if (pieces->size() > 1 || *gathered || copies_every_batch()) COLOADER_RETURN_NOT_OK(Spill(*pieces, *gathered, stream));
    }
    offset_ += count;
    walked_ = pos + count;
    // A slot passed to its end is let go by the cursor (the last one of the epoch is kept
    // to tell where the epoch ends): its ack goes as soon as no batch refers to it.
    if (offset_ == current_->a.count && !(current_->a.flags & kBatchLastInEpoch)) current_.reset();
  }
}

Status Cursor::AppendPadding(Batch& b, void* stream) {
  const SlotTable& t = state_->welcome.slots;
  const uint64_t sample_bytes = t.sample_bytes();
  DeviceMapper* m = state_->mapper.get();
  const uint32_t want = state_->opts.batch_size;
  const uint64_t labels_bytes = (uint64_t{want} * 8 + 255) / 256 * 256;
  uint64_t slots = 0;
  for (const Segment& seg : padding_) slots += seg.size();
  const uint64_t stash_labels = (slots * 8 + 255) / 256 * 256;
  const std::vector<uint64_t> to_host = OnHostOffsets(t.fields, want);
  for (const Segment& seg : padding_) {
    for (uint64_t pos = seg.begin; pos < seg.end; ++pos) {
      auto it = stash_.find(pos);
      if (it == stash_.end()) continue;  // a bad file the producer skipped: one sample fewer
      const internal::PadSample& p = it->second;
      const uint64_t at = b.count_;
      uint64_t from = 0;  // within the stashed sample: its ranges one after another
      if (m) {
        COLOADER_RETURN_NOT_OK(m->CopyAsync(b.owned_device_.get() + 8 * at, stash_device_ + 8ull * p.device_slot, 8, stream));
        for (const internal::ByteRange& r : internal::SampleRanges(t, want, at)) {
          COLOADER_RETURN_NOT_OK(m->CopyAsync(b.owned_device_.get() + labels_bytes + r.offset,
                                     stash_device_ + stash_labels + p.device_slot * sample_bytes + from, r.bytes, stream));
          from += r.bytes;
        }
        uint64_t kept = 0;  // within p.on_host
        for (size_t f = 0; f < t.fields.size(); ++f) {
          if (!(t.fields[f].flags & kFieldOnHost)) continue;
          const uint64_t n = t.fields[f].sample_bytes();
          std::memcpy(b.owned_on_host_.data() + to_host[f] + at * n, p.on_host.data() + kept, n);
          kept += n;
        }
      } else {
        for (const internal::ByteRange& r : internal::SampleRanges(t, want, at)) {
          std::memcpy(b.owned_.get() + r.offset, p.pixels.data() + from, r.bytes);
          from += r.bytes;
        }
      }
      b.owned_indices_.push_back(p.index);
      b.owned_labels_.push_back(p.label);
      ++b.count_;
    }
  }
  b.indices_ = b.owned_indices_.data();
  b.labels_ = b.owned_labels_.data();
  return Status::OK();
}

Result<Waited<std::optional<Batch>>> Cursor::NextInGroup(void* stream,
                                                         std::chrono::steady_clock::time_point slice_end) {
  if (epoch_ended_ || group_batch_ >= plan_.batches) {
    epoch_ended_ = true;
    return std::optional<Batch>();
  }
  // Resume a batch whose assembly a timeout interrupted: the cursor is past what it took.
  std::vector<Piece> pieces = std::move(gathering_);
  gathering_.clear();
  std::optional<Batch> gathered = std::move(assembling_);
  assembling_.reset();
  // Keeps what was gathered for the next call (an error or the wait's end interrupted it).
  auto keep = [&]() {
    gathering_ = std::move(pieces);
    assembling_ = std::move(gathered);
  };
  auto advance = [&](uint64_t upto, uint64_t take_from, bool taking) -> Result<bool> {
    Result<bool> there = taking ? Advance(upto, take_from, &pieces, &gathered, stream, slice_end)
                                : Advance(upto, take_from, nullptr, nullptr, stream, slice_end);
    if (!there.ok() || !*there) keep();
    return there;
  };
  const std::vector<Segment> segs = BatchSegments(split_, plan_, group_batch_);
  const bool last = group_batch_ + 1 == plan_.batches;
  const size_t from_stream = segs.size() - (last ? padding_.size() : 0);
  for (size_t i = 0; i < from_stream && !stream_epoch_done_; ++i) {
    COLOADER_ASSIGN_OR_RETURN(const bool there, advance(segs[i].end, segs[i].begin, true));
    if (!there) return kNotYet;
  }
  if (last && !padding_.empty()) {
    // Padding lies in the last round: pass it (keeping copies) before the batch is complete.
    uint64_t upto = 0;
    for (const Segment& seg : padding_) upto = std::max(upto, seg.end);
    if (!stream_epoch_done_) {
      COLOADER_ASSIGN_OR_RETURN(const bool there, advance(upto, upto, false));
      if (!there) return kNotYet;
    }
    if (Status st = Spill(pieces, gathered, stream); !st.ok()) {
      keep();
      return st;
    }
    if (Status st = AppendPadding(*gathered, stream); !st.ok()) {
      keep();
      return st;
    }
  }
  ++group_batch_;
  if (group_batch_ == plan_.batches) {
    epoch_ended_ = true;
    // Nothing more of this slot is ours: the cursor's reference goes, unless it holds the
    // epoch's end (kept to tell where it ends when the epoch is drained).
    if (current_ && !(current_->a.flags & kBatchLastInEpoch)) current_.reset();
  }
  uint32_t collected = gathered ? gathered->count_ : 0;
  for (const Piece& p : pieces) collected += p.count;
  if (collected == 0) {
    // The stream ended before this batch (the producer stopped, or every one of its samples
    // was a skipped bad file): the epoch ends here for this member.
    epoch_ended_ = true;
    return std::optional<Batch>();
  }
  samples_seen_ += collected;
  COLOADER_ASSIGN_OR_RETURN(std::optional<Batch> batch, Deliver(pieces, gathered, collected, stream));
  return batch;
}

Result<Cursor::GroupRest> Cursor::SavedGroupRest() const {
  const ConsumerOptions& o = state_->opts;
  const uint64_t n = state_->welcome.epoch_samples;
  if (o.resume_origin >= n && o.resume_origin > 0)
    return Status::Invalid("the saved state's split origin " + std::to_string(o.resume_origin) +
                           " is outside an epoch of " + std::to_string(n) + " samples: a state of another dataset?");
  const SplitSpec saved{o.resume_origin > 0 ? 0 : o.resume_begin, n, o.world_size, o.rank, o.batch_size, o.drop_last};
  COLOADER_ASSIGN_OR_RETURN(const SplitPlan plan, PlanSavedPosition(saved, o.resume_epoch, o.resume_samples));
  const uint64_t done = BatchesTaken(saved, plan, o.resume_samples);
  if (done >= plan.batches) return GroupRest{o.resume_epoch + 1, 0, 0};  // the next epoch, whole
  // From the round where every rank's next batch begins (each rank had taken `done`), in the
  // epoch's order: from the origin round its end for a group that had been caught up.
  const uint64_t at = ResumePosition(saved, plan, done);
  return GroupRest{o.resume_epoch, o.resume_origin + at, o.resume_origin + n};
}

uint64_t Cursor::Coord(uint64_t pos) const {
  const uint64_t n = state_->welcome.epoch_samples, origin = origin_.load();
  return origin == 0 || n == 0 ? pos : (pos + n - origin) % n;
}

Status Cursor::Resume(uint64_t epoch, uint64_t begin, uint64_t samples, uint64_t origin) {
  if (in_epoch_ || stream_ended_)
    return Status::Invalid("resume a saved state before the first epoch begins (load_state_dict before iterating)");
  ConsumerOptions& o = state_->opts;  // read by this (the user's) thread only
  // The checks `serve --resume` makes of the same state: a position past the epoch is another
  // data set's or shard's, not the start of the next epoch.
  if (const uint64_t n = state_->welcome.epoch_samples; n > 0) {
    SplitSpec spec{begin, n, o.world_size, o.rank, batch_size(), o.drop_last};
    // A consumer alone: a caught-up epoch's positions run on from `begin` round the epoch's
    // end, so a whole epoch's samples may follow any begin.
    // A group caught up: its split was of the whole epoch, from `origin` round.
    if ((o.group.empty() && begin < n) || origin > 0) spec.begin = 0;
    if (origin >= n)
      return Status::Invalid("the saved state's split origin " + std::to_string(origin) + " is outside an epoch of " +
                             std::to_string(n) + " samples");
    COLOADER_RETURN_NOT_OK(PlanSavedPosition(spec, epoch, samples).status());
  }
  o.resume = true;
  o.resume_epoch = epoch;
  o.resume_begin = begin;
  o.resume_samples = samples;
  o.resume_origin = origin;
  resume_pending_ = true;
  return Status::OK();
}

bool Cursor::split_mode() const { return !state_->opts.group.empty() || (state_->opts.resume && !served_resume_); }

}  // namespace coloader
