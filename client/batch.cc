#include "client/consumer_internal.h"

namespace coloader {

using internal::ConsumerState;
using internal::SlotLease;

// ---------------------------------------------------------------------------------------------
// Batch

namespace internal {

void ReturnToPool::operator()(uint8_t* p) const noexcept {
  state->GiveBuffer(std::unique_ptr<uint8_t[]>(p), capacity);
}

void FreeOnStream::operator()(uint8_t* p) const noexcept {
  state->mapper->Free(p, stream);  // stream-ordered: after the reads queued on `stream`
}

}  // namespace internal

void Batch::Release() {
  owned_device_.reset();  // stream-ordered: after our reads
  leases_.clear();        // the last reference to a slot acks it
  owned_.reset();
  owned_on_host_ = {};
  data_ = host_data_ = nullptr;
  indices_ = labels_ = device_labels_ = nullptr;
  count_ = 0;
}

const void* Batch::field(size_t i) const {
  const std::vector<FieldSpec>& fields = state_->welcome.slots.fields;
  if (!fields_ || !data_ || i >= fields.size()) return nullptr;
  return static_cast<const uint8_t*>(data_) + FieldOffsets(fields, capacity_)[i] + uint64_t{first_} * fields[i].sample_bytes();
}

size_t Batch::num_fields() const { return state_ ? state_->welcome.slots.fields.size() : 0; }

void Batch::field_pointers(const void** out) const {
  const std::vector<FieldSpec>& fields = state_->welcome.slots.fields;
  const std::vector<uint64_t> offsets = (fields_ && data_) ? FieldOffsets(fields, capacity_) : std::vector<uint64_t>();
  for (size_t i = 0; i < fields.size(); ++i)
    out[i] = offsets.empty()
                 ? nullptr
                 : static_cast<const uint8_t*>(data_) + offsets[i] + uint64_t{first_} * fields[i].sample_bytes();
}

const void* Batch::host_field(size_t i) const {
  if (device_ < 0) return field(i);
  const std::vector<FieldSpec>& fields = state_->welcome.slots.fields;
  if (!fields_ || !data_ || i >= fields.size() || !(fields[i].flags & kFieldOnHost)) return nullptr;
  const uint64_t skip = uint64_t{first_} * fields[i].sample_bytes();
  if (owned_device_) return owned_on_host_.data() + OnHostOffsets(fields, capacity_)[i] + skip;
  return host_data_ + FieldOffsets(fields, capacity_)[i] + skip;
}

Status Batch::CopyTo(void* host_dst) const {
  if (!data_) return Status::Invalid("the batch was released");
  if (fields_) return Status::Invalid("a batch with a schema is read field by field (Batch::field)");
  if (device_ >= 0) return state_->mapper->CopyToHost(host_dst, data_, bytes(), stream_);
  std::memcpy(host_dst, data_, bytes());
  return Status::OK();
}

DType Batch::dtype() const { return state_->welcome.slots.dtype; }
TensorLayout Batch::layout() const { return state_->welcome.slots.layout; }
uint64_t Batch::bytes() const { return uint64_t{count_} * state_->welcome.slots.sample_bytes(); }
std::vector<int64_t> Batch::shape() const {
  const SlotTable& t = state_->welcome.slots;
  if (t.layout == TensorLayout::kNCHW) return {count_, t.channels, t.height, t.width};
  return {count_, t.height, t.width, t.channels};
}
}  // namespace coloader
