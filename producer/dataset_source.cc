#include "producer/dataset_source.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/log.h"

namespace coloader {

Result<std::unique_ptr<DatasetSource>> DatasetSource::Open(const ProducerOptions& opts) {
  std::unique_ptr<DatasetSource> s(new DatasetSource(opts));
  std::vector<std::string> notes;
  FetchOptions fetch;
  if (opts.dataset.max_shard_bytes > 0) fetch.max_bytes = opts.dataset.max_shard_bytes;
  fetch.deadline_ms = static_cast<int>(opts.dataset.shard_timeout_s * 1000);
  COLOADER_ASSIGN_OR_RETURN(s->dataset_, Dataset::Open(opts.dataset.data, &notes, opts.dataset.label_field, fetch));
  for (const std::string& note : notes) LogLine("[coloader %s] %s\n", opts.name.c_str(), note.c_str());
  if (!s->dataset_.shards().empty())
    LogLine("[coloader %s] %zu samples in %zu WebDataset shard(s)\n", opts.name.c_str(), s->dataset_.size(),
            s->dataset_.shards().size());
  SamplerOptions so;
  so.shuffle = opts.dataset.shuffle;
  so.seed = opts.dataset.seed;
  so.rank = opts.dataset.rank;
  so.world_size = opts.dataset.world_size;
  so.blocks = s->dataset_.stream_blocks();
  COLOADER_ASSIGN_OR_RETURN(Sampler sampler, Sampler::Make(s->dataset_.size(), so));
  s->sampler_.emplace(std::move(sampler));
  return Result<std::unique_ptr<DatasetSource>>(std::move(s));
}

Status DatasetSource::Attach(const SourceRing& ring) {
  COLOADER_ASSIGN_OR_RETURN(GpuDecode gpu, MakeGpuDecode(ring.gpu));
  COLOADER_ASSIGN_OR_RETURN(pipeline_, Pipeline::Make(&dataset_, ring.transform, opts_.dataset.workers, opts_.dataset.seed, ring.staging,
                                                      std::move(gpu)));
  return Status::OK();
}

void DatasetSource::MixDataKey(const std::function<void(const std::string&)>& mix) const {
  // The files (relative to the dataset's root, so nodes that mount it elsewhere agree) with
  // their labels.
  const std::string& root = dataset_.source();
  for (const Sample& smp : dataset_.samples()) {
    if (smp.in_archive()) {  // the shard's file name and the member: wherever the shards are
      const size_t slash = smp.path.rfind('/');
      mix(slash == std::string::npos ? smp.path : smp.path.substr(slash + 1));
      mix(smp.member);
    } else {
      const bool under = smp.path.size() > root.size() && smp.path.compare(0, root.size(), root) == 0;
      mix(under ? smp.path.substr(root.size()) : smp.path);
    }
    mix(std::to_string(smp.label));
  }
  // Node shards over shards read whole take contiguous stretches of each epoch (since the
  // sampler's blocks did): a state saved under the strided order must not resume into this one.
  if (!dataset_.stream_blocks().empty() && opts_.dataset.world_size > 1) mix("node-stretches");
}

void DatasetSource::Start(uint64_t epoch, uint64_t position) {
  epoch_ = epoch;
  position_ = position;
  epoch_indices_ = sampler_->EpochIndices(epoch_);
}

void DatasetSource::FillAt(uint32_t slot, uint8_t* base, uint64_t seq, uint64_t epoch, uint64_t first, uint32_t count,
                           bool last) {
  // The epoch's order: the run's own, or one kept for catching up (a few epochs at once, when
  // consumers catch up on different ones; each is computed once, not per batch).
  const std::vector<int64_t>* found = epoch == epoch_ && !exhausted_ ? &epoch_indices_ : nullptr;
  for (const auto& [e, order] : refill_)
    if (!found && e == epoch) found = &order;
  if (!found) {
    if (refill_.size() >= 4) refill_.erase(refill_.begin());
    refill_.emplace_back(epoch, sampler_->EpochIndices(epoch));
    found = &refill_.back().second;
  }
  const std::vector<int64_t>& order = *found;
  const uint64_t end = std::min<uint64_t>(first + count, order.size());
  auto job = std::make_unique<BatchJob>();
  job->seq = seq;
  job->slot = slot;
  job->epoch = epoch;
  job->first = first;
  job->indices.assign(order.begin() + static_cast<std::ptrdiff_t>(std::min<uint64_t>(first, end)),
                      order.begin() + static_cast<std::ptrdiff_t>(end));
  job->slot_base = base;
  job->last_in_epoch = last;
  pipeline_->Submit(std::move(job));
}

void DatasetSource::Fill(uint32_t slot, uint8_t* base, uint64_t seq) {
  auto job = std::make_unique<BatchJob>();
  job->seq = seq;
  job->slot = slot;
  job->epoch = epoch_;
  job->first = position_;
  const uint64_t count = std::min<uint64_t>(opts_.batch_size, epoch_indices_.size() - position_);
  job->indices.assign(epoch_indices_.begin() + static_cast<std::ptrdiff_t>(position_),
                      epoch_indices_.begin() + static_cast<std::ptrdiff_t>(position_ + count));
  job->slot_base = base;
  position_ += count;
  job->last_in_epoch = position_ == epoch_indices_.size();
  pipeline_->Submit(std::move(job));
  if (position_ == epoch_indices_.size()) {
    ++epoch_;
    position_ = 0;
    const uint64_t wanted = opts_.forever ? UINT64_MAX : opts_.epochs;
    if (epoch_ >= wanted) {
      exhausted_ = true;
    } else {
      epoch_indices_ = sampler_->EpochIndices(epoch_);
    }
  }
}

}  // namespace coloader
