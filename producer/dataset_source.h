// `serve`'s batches: a dataset (ImageFolder, file list, WebDataset shards), the sampler's
// order for each epoch, and the decode pipeline's workers filling the slots.
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "pipeline/source/dataset.h"
#include "pipeline/decode/gpu_decode.h"
#include "pipeline/source/sampler.h"
#include "producer/batch_source.h"
#include "producer/options.h"
#include "producer/slot_layout.h"

namespace coloader {

class DatasetSource : public BatchSource {
 public:
  // Opens the dataset and makes the sampler (what set-up checks need: sizes, the data key);
  // what was skipped while listing is logged.
  static Result<std::unique_ptr<DatasetSource>> Open(const ProducerOptions& opts);
  // Starts the decode workers: they write the ring's staging slots, decoding on the GPUs it asks for.
  Status Attach(const SourceRing& ring) override;

  uint64_t epoch_samples() const override { return sampler_->epoch_size(); }
  uint64_t dataset_size() const override { return dataset_.size(); }
  const std::vector<std::string>& classes() const override { return dataset_.classes(); }
  void MixDataKey(const std::function<void(const std::string&)>& mix) const override;
  bool resumable() const override { return true; }

  void Start(uint64_t epoch, uint64_t position) override;
  bool exhausted() const override { return exhausted_; }
  void Fill(uint32_t slot, uint8_t* base, uint64_t seq) override;
  std::string WhyNoRefill() const override { return ""; }
  void FillAt(uint32_t slot, uint8_t* base, uint64_t seq, uint64_t epoch, uint64_t first, uint32_t count,
              bool last) override;
  std::vector<std::unique_ptr<BatchJob>> TakeCompleted() override { return pipeline_->TakeCompleted(); }
  int event_fd() const override { return pipeline_->event_fd(); }
  size_t in_flight() const override { return pipeline_->in_flight(); }
  std::string DecodeSplitSummary() const override { return pipeline_ ? pipeline_->DecodeSplitSummary() : ""; }
  std::vector<double> CpuShares() const override { return pipeline_ ? pipeline_->CpuShares() : std::vector<double>{}; }
  uint32_t FillFailed(BatchJob& job) const override { return pipeline_->FillFailed(job); }
  bool Resubmit(std::unique_ptr<BatchJob>& job) override { return pipeline_->Resubmit(job); }
  const uint8_t* DeviceStaging(const BatchJob& job) const override { return pipeline_->DeviceStaging(job); }
  int DecodeDevice(const BatchJob& job) const override { return pipeline_->DecodeDevice(job); }
  const std::vector<EraseBox>* EraseBoxes(const BatchJob& job) const override { return pipeline_->EraseBoxes(job); }
  const std::vector<PixelProgram>* PixelPrograms(const BatchJob& job) const override {
    return pipeline_->PixelPrograms(job);
  }

 private:
  explicit DatasetSource(ProducerOptions opts) : opts_(std::move(opts)) {}

  ProducerOptions opts_;
  Dataset dataset_;
  std::optional<Sampler> sampler_;
  std::unique_ptr<Pipeline> pipeline_;
  // Where submitting stands.
  uint64_t epoch_ = 0;
  uint64_t position_ = 0;  // samples handed out in that epoch
  std::vector<int64_t> epoch_indices_;
  bool exhausted_ = false;
  // FillAt's epoch orders, the oldest first (catch-up mostly reads other epochs than the run's).
  std::vector<std::pair<uint64_t, std::vector<int64_t>>> refill_;
};

}  // namespace coloader
