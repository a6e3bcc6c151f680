// Slicing: producer batches cut to the consumer's batch size; a batch that straddles two
// producer slots is gathered into a private buffer (host or device).
#include "client/consumer_internal.h"

namespace coloader {

using internal::ConsumerState;
using internal::Cursor;
using internal::SlotLease;

std::vector<internal::ByteRange> internal::SampleRanges(const SlotTable& t, uint64_t capacity, uint64_t i) {
  if (t.fields.empty()) return {{i * t.sample_bytes(), t.sample_bytes()}};
  std::vector<ByteRange> out;
  const std::vector<uint64_t> offsets = FieldOffsets(t.fields, capacity);
  for (size_t f = 0; f < t.fields.size(); ++f) {
    const uint64_t n = t.fields[f].sample_bytes();
    out.push_back({offsets[f] + i * n, n});
  }
  return out;
}

Status Cursor::Spill(std::vector<internal::Piece>& pieces, std::optional<Batch>& gathered, void* stream) {
  const SlotTable& t = state_->welcome.slots;
  const uint64_t sample_bytes = t.sample_bytes();
  const uint32_t want = state_->opts.batch_size;
  const uint64_t data_bytes = t.data_bytes(want);
  DeviceMapper* m = state_->mapper.get();
  // Device layout of a gathered batch: labels (room for `want`, 256-aligned), then the tensor
  // (or the schema's fields, laid out for `want` samples).
  const uint64_t labels_bytes = (uint64_t{want} * 8 + 255) / 256 * 256;
  // Where each field's samples go in the gathered batch and come from in a slot.
  const std::vector<uint64_t> to = FieldOffsets(t.fields, want), from = FieldOffsets(t.fields, t.batch_size);
  const std::vector<uint64_t> to_host = m ? OnHostOffsets(t.fields, want) : std::vector<uint64_t>();
  if (!gathered) {
    Batch g;
    g.state_ = state_;
    g.stream_ = stream;
    g.epoch_ = epoch_;
    g.ready_ns_ = pieces.empty() ? 0 : pieces.front().lease->a.ready_ns;  // empty: padding only
    g.fields_ = !t.fields.empty();
    g.capacity_ = want;
    if (m) {
      COLOADER_ASSIGN_OR_RETURN(uint8_t* device, m->Allocate(labels_bytes + data_bytes, stream));
      g.owned_device_ = internal::DeviceBuffer(device, internal::FreeOnStream{state_, stream});
      g.device_ = m->device();
      g.owned_on_host_.resize(OnHostBytes(t.fields, want));
    } else {
      auto [buffer, capacity] = state_->TakeBuffer(data_bytes);
      if (!buffer)
        return Status::IOError("cannot allocate " + HumanBytes(data_bytes) + " for a batch of " +
                               std::to_string(want) + " samples: out of memory; use a smaller batch size");
      g.owned_ = internal::HostBuffer(buffer.release(), internal::ReturnToPool{state_, capacity});
    }
    g.owned_indices_.reserve(want);
    g.owned_labels_.reserve(want);
    gathered = std::move(g);
  }
  Batch& b = *gathered;
  while (!pieces.empty()) {
    const internal::Piece& p = pieces.front();
    const uint64_t done = b.count_;
    // (dst, src, bytes) for each copy of this piece: the tensor's, or one per field.
    uint8_t* dst_data = m ? b.owned_device_.get() + labels_bytes : b.owned_.get();
    const uint8_t* src_data = m ? p.lease->device_base + state_->welcome.device.data_offset : p.lease->base + t.data_offset;
    auto copy = [&](uint8_t* dst, const uint8_t* src, uint64_t n) -> Status {
      if (m) return m->CopyAsync(dst, src, n, stream);
      std::memcpy(dst, src, n);
      return Status::OK();
    };
    if (m) {
      // Stream-ordered: the source slot's ack waits for these copies (its lease is on `stream`).
      const DeviceTable& d = state_->welcome.device;
      COLOADER_RETURN_NOT_OK(m->CopyAsync(b.owned_device_.get() + 8 * done, p.lease->device_base + d.labels_offset + 8ull * p.offset,
                                 8ull * p.count, stream));
    }
    if (t.fields.empty()) {
      COLOADER_RETURN_NOT_OK(copy(dst_data + done * sample_bytes, src_data + p.offset * sample_bytes, p.count * sample_bytes));
    }
    for (size_t f = 0; f < t.fields.size(); ++f) {
      const uint64_t n = t.fields[f].sample_bytes();
      COLOADER_RETURN_NOT_OK(copy(dst_data + to[f] + done * n, src_data + from[f] + p.offset * n, p.count * n));
      if (m && (t.fields[f].flags & kFieldOnHost))  // and its host copy, from the host slot
        std::memcpy(b.owned_on_host_.data() + to_host[f] + done * n,
                    p.lease->base + t.data_offset + from[f] + p.offset * n, p.count * n);
    }
    const auto* idx = reinterpret_cast<const int64_t*>(p.lease->base + t.indices_offset) + p.offset;
    const auto* lbl = reinterpret_cast<const int64_t*>(p.lease->base + t.labels_offset) + p.offset;
    b.owned_indices_.insert(b.owned_indices_.end(), idx, idx + p.count);
    b.owned_labels_.insert(b.owned_labels_.end(), lbl, lbl + p.count);
    b.count_ += p.count;
    pieces.erase(pieces.begin());  // its slot goes back as soon as nothing else refers to it
  }
  if (m) {
    b.device_labels_ = reinterpret_cast<const int64_t*>(b.owned_device_.get());
    b.data_ = b.owned_device_.get() + labels_bytes;
  } else {
    b.data_ = b.owned_.get();
  }
  b.indices_ = b.owned_indices_.data();
  b.labels_ = b.owned_labels_.data();
  return Status::OK();
}

bool Cursor::copies_every_batch() const { return state_->mapper != nullptr && !state_->opts.zero_copy; }

Result<std::shared_ptr<SlotLease>> Cursor::OpenSlot(const BatchAnnouncement& a) {
  ConsumerState& s = *state_;
  const uint64_t offset = uint64_t{a.slot} * s.welcome.slots.slot_bytes;
  auto lease = std::make_shared<SlotLease>(state_, a, s.slot_memory() + offset);
  if (s.mapper) {
    // Device path: the tensor is on the GPU (copied out per batch unless zero_copy); the host
    // slot is read for indices and labels only.
    lease->device_base = s.mapper->slot_base(a.slot);
  } else if (!s.opts.zero_copy && !s.local_slots) {
    // Host path: this consumer's own copy-on-write view of the slot. Reading it is zero-copy;
    // a page the job writes becomes its own; a Reclaim copies the rest and gives the slot back.
    COLOADER_ASSIGN_OR_RETURN(lease->view, PrivateView::Map(s.shm, offset, s.welcome.slots.slot_bytes));
    lease->base = lease->view.data();
    std::lock_guard<std::mutex> lock(s.leases_mu);
    s.leases[a.seq] = lease;
  }
  return lease;
}

Result<std::optional<Batch>> Cursor::Deliver(std::vector<internal::Piece>& pieces, std::optional<Batch>& gathered,
                                               uint32_t count, void* stream) {
  if (gathered) return std::move(gathered);
  // Within one slot: a view.
  const SlotTable& t = state_->welcome.slots;
  const uint64_t sample_bytes = t.sample_bytes();
  const internal::Piece& p = pieces.front();
  Batch b;
  b.state_ = state_;
  b.count_ = count;
  b.epoch_ = epoch_;
  b.ready_ns_ = p.lease->a.ready_ns;
  b.stream_ = stream;
  b.indices_ = reinterpret_cast<const int64_t*>(p.lease->base + t.indices_offset) + p.offset;
  b.labels_ = reinterpret_cast<const int64_t*>(p.lease->base + t.labels_offset) + p.offset;
  // With a schema, data_ is where the slot's field regions begin and first_ the first sample.
  b.fields_ = !t.fields.empty();
  b.capacity_ = t.batch_size;
  b.first_ = p.offset;
  const uint64_t skip = b.fields_ ? 0 : p.offset * sample_bytes;
  if (state_->mapper) {
    // Device path (zero_copy): the tensor and labels are device pointers; indices and labels
    // are also readable on the host from the host slot.
    const DeviceTable& d = state_->welcome.device;
    b.device_ = state_->mapper->device();
    b.data_ = p.lease->device_base + d.data_offset + skip;
    b.host_data_ = p.lease->base + t.data_offset;  // host_field(): the kFieldOnHost fields
    b.device_labels_ = reinterpret_cast<const int64_t*>(p.lease->device_base + d.labels_offset) + p.offset;
  } else {
    b.data_ = p.lease->base + t.data_offset + skip;
  }
  b.leases_.push_back(p.lease);
  return std::optional<Batch>(std::move(b));
}

Result<Waited<bool>> Cursor::NextSlot(std::chrono::steady_clock::time_point slice_end, bool have_samples) {
  if (current_ && (current_->a.flags & kBatchLastInEpoch)) return false;
  current_.reset();
  Result<Waited<std::optional<BatchAnnouncement>>> taken = Take(slice_end);
  if (!taken.ok() && taken.status().code() == StatusCode::kDisconnected && have_samples) {
    // The producer stopped with a batch half gathered: what came is delivered, and the next
    // call says how the stream ended (the epoch was cut).
    stopped_ = taken.status();
    partial_ = true;
    return false;
  }
  if (!taken.ok()) return taken.status();
  if (!taken->ready()) return kNotYet;
  std::optional<BatchAnnouncement> a = **std::move(taken);
  if (!a) {  // the producer served every epoch: this epoch ends here
    stream_ended_ = true;
    return false;
  }
  if (a->epoch != epoch_) {  // a new epoch began (this one was cut short by a skip)
    pending_ = a;
    return false;
  }
  COLOADER_ASSIGN_OR_RETURN(current_, OpenSlot(*a));
  offset_ = 0;
  return true;
}

Result<Waited<std::optional<Batch>>> Cursor::NextSliced(void* stream,
                                                        std::chrono::steady_clock::time_point slice_end) {
  if (!stopped_.ok()) return stopped_;
  if (epoch_ended_) return std::optional<Batch>();
  const uint32_t want = state_->opts.batch_size;
  using internal::Piece;
  // A batch that straddles slots is gathered as it is read: each slot's samples are copied out
  // and the slot let go at once, so a consumer batch larger than the whole ring never holds
  // more than the slot it is slicing (holding them all would wait forever for a free slot).
  // Resume a batch whose assembly a timeout (or a wait_ms) interrupted: its samples are not lost.
  std::vector<Piece> pieces = std::move(gathering_);
  gathering_.clear();
  std::optional<Batch> gathered = std::move(assembling_);
  assembling_.reset();
  uint32_t collected = gathered ? gathered->count_ : 0;
  for (const Piece& p : pieces) collected += p.count;
  // Keeps what was gathered for the next call (an error or the wait's end interrupted it).
  auto keep = [&]() {
    gathering_ = std::move(pieces);
    assembling_ = std::move(gathered);
  };
  bool last = false;
  while (collected < want) {
    if (!current_ || offset_ == current_->a.count) {
      Result<Waited<bool>> more = NextSlot(slice_end, collected > 0);
      if (!more.ok() || !more->ready()) {
        keep();
        if (!more.ok()) return more.status();
        return kNotYet;
      }
      if (!**more) {
        last = true;
        break;
      }
    }
    const uint32_t take = std::min(want - collected, current_->a.count - offset_);
    if (take > 0 && state_->mapper && !(current_->waited && current_->waited_stream == stream)) {
      // Every stream that reads the slot waits for the producer's work on it first.
      if (Status st = state_->mapper->StreamWaitSlot(current_->a.slot, stream); !st.ok()) {
        keep();
        return st;
      }
      current_->waited = true;
      current_->waited_stream = stream;
    }
    if (take > 0) {
      pieces.push_back({current_, offset_, take});
      current_->stream = stream;  // its release is ordered after this stream's reads
      current_->on_stream = true;
      if (pieces.size() > 1 || gathered || copies_every_batch()) {
        if (Status st = Spill(pieces, gathered, stream); !st.ok()) {
          keep();
          return st;
        }
      }
    }
    offset_ += take;
    collected += take;
    if (offset_ == current_->a.count && (current_->a.flags & kBatchLastInEpoch)) {
      last = true;
      break;
    }
    // A slot sliced to its end belongs to the batches taken from it alone: drop the cursor's
    // reference, so that releasing them acks the slot at once (not at the next Next()).
    if (offset_ == current_->a.count) current_.reset();
  }
  if (last) {
    epoch_ended_ = true;
    current_.reset();  // nothing more to slice from it; views keep their own reference
  }
  if (collected == 0 || (collected < want && state_->opts.drop_last)) {
    epoch_ended_ = true;
    return std::optional<Batch>();  // a partly gathered batch gives its buffer back
  }
  samples_seen_ += collected;
  COLOADER_ASSIGN_OR_RETURN(std::optional<Batch> batch, Deliver(pieces, gathered, collected, stream));
  return batch;
}
}  // namespace coloader
