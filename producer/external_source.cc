#include "producer/external_source.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace coloader {

Result<std::unique_ptr<ExternalSource>> ExternalSource::Make(std::vector<FieldSpec> fields, uint64_t epoch_samples) {
  std::unique_ptr<ExternalSource> s(new ExternalSource(std::move(fields), epoch_samples));
  COLOADER_ASSIGN_OR_RETURN(s->events_, EventFd::Make());
  return Result<std::unique_ptr<ExternalSource>>(std::move(s));
}

Status ExternalSource::Attach(const SourceRing& ring) {
  layout_ = ring.table;
  base_ = ring.base;
  return Status::OK();
}

void ExternalSource::MixDataKey(const std::function<void(const std::string&)>& mix) const {
  for (const FieldSpec& f : fields_) {
    mix(f.path);
    mix(DTypeName(f.dtype));
    for (int64_t d : f.shape) mix(std::to_string(d));
  }
  mix(std::to_string(epoch_samples_));
}

ExternalSource::~ExternalSource() = default;

void ExternalSource::Fill(uint32_t slot, uint8_t*, uint64_t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) {  // the caller finished after the loop last looked: the slot goes straight back
      returned_.push_back(slot);
      events_.Signal();
      return;
    }
    free_.push_back(slot);
  }
  cv_.notify_all();
}

bool ExternalSource::exhausted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

void ExternalSource::Stop(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) why_ = why;  // the first reason is the one
    stopped_ = true;
  }
  cv_.notify_all();
}

Result<Waited<bool>> ExternalSource::WaitForSlot(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_) return Status::Invalid("the producer was finished; open a new one");
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return !free_.empty() || stopped_; }))
    return kNotYet;
  if (!stopped_) return true;
  if (!why_.ok()) return why_;
  return false;
}

std::vector<std::unique_ptr<BatchJob>> ExternalSource::TakeCompleted() {
  events_.Drain();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::unique_ptr<BatchJob>> out;
  out.swap(completed_);
  return out;
}

std::vector<uint32_t> ExternalSource::TakeReturned() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint32_t> out;
  out.swap(returned_);
  return out;
}

void ExternalSource::Complete(std::unique_ptr<BatchJob> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    completed_.push_back(std::move(job));
  }
  events_.Signal();
}

Result<bool> ExternalSource::Publish(const void* const* fields, uint32_t count, const int64_t* indices) {
  if (count == 0 || count > layout_.batch_size) {
    return Status::Invalid("a batch of " + std::to_string(count) + " samples; this producer takes 1 to " +
                           std::to_string(layout_.batch_size) + " per batch (its batch_size)");
  }
  if (!fields) return Status::Invalid("publish needs the batch's fields");
  for (size_t f = 0; f < fields_.size(); ++f)
    if (!fields[f]) return Status::Invalid("publish: no data for field " + std::to_string(f) + " (" + fields_[f].path + ")");
  uint32_t slot = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_) return Status::Invalid("the producer was finished; open a new one");
    cv_.wait(lock, [this] { return !free_.empty() || stopped_; });  // back-pressure
    if (stopped_ && !why_.ok()) return why_;
    if (stopped_) return false;
    slot = free_.front();
    free_.pop_front();
  }
  uint8_t* base = base_ + uint64_t{slot} * layout_.slot_bytes;
  auto job = std::make_unique<BatchJob>();
  job->seq = seq_++;
  job->slot = slot;
  job->epoch = epoch_;
  job->first = position_;
  job->slot_base = base;
  job->indices.resize(count);
  for (uint32_t i = 0; i < count; ++i) job->indices[i] = indices ? indices[i] : static_cast<int64_t>(position_ + i);
  std::memcpy(base + layout_.indices_offset, job->indices.data(), 8ull * count);
  std::fill_n(reinterpret_cast<int64_t*>(base + layout_.labels_offset), count, int64_t{-1});  // labels are fields now
  const std::vector<uint64_t> offsets = FieldOffsets(fields_, layout_.batch_size);
  for (size_t f = 0; f < fields_.size(); ++f)
    std::memcpy(base + layout_.data_offset + offsets[f], fields[f], uint64_t{count} * fields_[f].sample_bytes());
  position_ += count;
  if (held_) Complete(std::move(held_));
  held_ = std::move(job);
  return true;
}

Status ExternalSource::EndEpoch() {
  if (held_) {
    held_->last_in_epoch = true;
    Complete(std::move(held_));
  }
  ++epoch_;
  position_ = 0;
  return Status::OK();
}

Status ExternalSource::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void ExternalSource::Fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok() && !finished_) failure_ = Status::Cancelled(why);
  }
  if (held_) Complete(std::move(held_));  // served, but not as its epoch's last: the epoch was cut
  Finish();
}

void ExternalSource::Finish() {
  // A batch still held back ends its epoch: nothing follows it.
  if (held_) {
    held_->last_in_epoch = true;
    Complete(std::move(held_));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;  // again (a caller finishing in steps): nothing more to give back
    finished_ = true;
    returned_.insert(returned_.end(), free_.begin(), free_.end());
    free_.clear();
  }
  events_.Signal();
}

}  // namespace coloader
