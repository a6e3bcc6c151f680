#include "server/pipeline.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/process.h"

namespace coloader {

Pipeline::Pipeline(const Dataset* dataset, TransformOptions opts, uint64_t seed, SlotTable layout)
    : dataset_(dataset), opts_(std::move(opts)), seed_(seed), layout_(std::move(layout)) {}

Result<std::unique_ptr<Pipeline>> Pipeline::Make(const Dataset* dataset, TransformOptions opts,
                                                 int workers, uint64_t seed, SlotTable layout,
                                                 std::unique_ptr<GpuDecodeStage> gpu) {
  if (workers < 1) return Status::Invalid("--workers must be at least 1, got " + std::to_string(workers));
  std::unique_ptr<Pipeline> p(new Pipeline(dataset, std::move(opts), seed, std::move(layout)));
  p->gpu_ = std::move(gpu);
  p->event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->event_fd_ < 0) return Status::FromErrno("eventfd", errno);
  for (int w = 0; w < workers; ++w) p->threads_.emplace_back([raw = p.get(), w] { raw->WorkerLoop(w); });
  const int lanes = p->gpu_ ? p->gpu_->lanes() : 0;
  for (int l = 0; l < lanes; ++l) p->lanes_.emplace_back([raw = p.get(), l] { raw->GpuLaneLoop(l); });
  return p;
}

Pipeline::~Pipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    tasks_.clear();
    gpu_jobs_.clear();
  }
  cv_.notify_all();
  gpu_cv_.notify_all();
  for (auto& t : threads_) t.join();
  for (auto& t : lanes_) t.join();
  gpu_.reset();  // its log line and device memory go before the eventfd
  if (event_fd_ >= 0) ::close(event_fd_);
}

void Pipeline::Submit(std::unique_ptr<BatchJob> job) {
  const uint32_t n = static_cast<uint32_t>(job->indices.size());
  job->remaining.store(n);
  in_flight_.fetch_add(1);
  if (gpu_) job->gpu.assign(n, GpuSample{});
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n == 0) {
      completed_.push_back(std::move(job));
    } else {
      for (uint32_t i = 0; i < n; ++i) tasks_.emplace_back(job.get(), i);
      running_.push_back(std::move(job));
    }
  }
  if (n == 0) {
    uint64_t one = 1;
    (void)!::write(event_fd_, &one, sizeof(one));
  }
  cv_.notify_all();
}

std::vector<std::unique_ptr<BatchJob>> Pipeline::TakeCompleted() {
  uint64_t counter = 0;
  (void)!::read(event_fd_, &counter, sizeof(counter));  // reset; EAGAIN when nothing is pending
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::unique_ptr<BatchJob>> out;
  out.swap(completed_);
  in_flight_.fetch_sub(out.size());
  return out;
}

void Pipeline::WorkerLoop(int worker) {
  NameThisThread("cl-worker-" + std::to_string(worker));
  SampleTransform transform(opts_);
  const uint64_t sample_bytes = layout_.sample_bytes();
  for (;;) {
    BatchJob* job = nullptr;
    uint32_t pos = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (stopping_) return;
      std::tie(job, pos) = tasks_.front();
      tasks_.pop_front();
    }
    const int64_t index = job->indices[pos];
    const Sample& sample = (*dataset_)[static_cast<size_t>(index)];
    auto* idx_out = reinterpret_cast<int64_t*>(job->slot_base + layout_.indices_offset);
    auto* lbl_out = reinterpret_cast<int64_t*>(job->slot_base + layout_.labels_offset);
    idx_out[pos] = index;
    lbl_out[pos] = sample.label;
    Status st;
    uint8_t* dst = job->slot_base + layout_.data_offset + pos * sample_bytes;
    try {
      if (gpu_) {
        std::vector<uint8_t> bytes;
        st = ReadWholeFile(sample.path, &bytes);
        if (st.ok())
          st = GpuDecodeStage::Prepare(transform, opts_.augment, std::move(bytes), sample.path, seed_, job->epoch,
                                       static_cast<uint64_t>(index), &job->gpu[pos], dst);
      } else {
        st = transform.Run(sample.path, seed_, job->epoch, static_cast<uint64_t>(index), dst);
      }
    } catch (const std::exception& e) {  // a bad file must never end the producer
      st = Status::Invalid(sample.path + ": " + e.what());
    }
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(job->failures_mu);
      job->failures.emplace_back(pos, st.message());
    }
    if (job->remaining.fetch_sub(1) == 1) {
      // Last sample of the batch: on to a GPU lane, or back to the producer thread.
      if (gpu_) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          gpu_jobs_.push_back(job);
        }
        gpu_cv_.notify_one();
      } else {
        Complete(job);
      }
    }
  }
}

void Pipeline::Complete(BatchJob* job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(running_.begin(), running_.end(),
                           [job](const std::unique_ptr<BatchJob>& j) { return j.get() == job; });
    completed_.push_back(std::move(*it));
    running_.erase(it);
  }
  uint64_t one = 1;
  (void)!::write(event_fd_, &one, sizeof(one));
}

void Pipeline::GpuLaneLoop(int lane) {
  NameThisThread("cl-gpulane-" + std::to_string(lane));
  SampleTransform transform(opts_);  // for the files both GPU backends refuse
  for (;;) {
    BatchJob* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      gpu_cv_.wait(lock, [this] { return stopping_ || !gpu_jobs_.empty(); });
      if (stopping_) return;
      job = gpu_jobs_.front();
      gpu_jobs_.pop_front();
    }
    std::vector<std::string> paths(job->indices.size());
    for (size_t i = 0; i < paths.size(); ++i) paths[i] = (*dataset_)[static_cast<size_t>(job->indices[i])].path;
    Status st;
    try {
      st = gpu_->Finish(lane, *job, job->slot_base + layout_.data_offset, paths, transform, seed_);
    } catch (const std::exception& e) {
      st = Status::Internal(std::string("GPU decode: ") + e.what());
    }
    // The GPU itself failed (not a file): the producer stops with this error, whatever
    // --on-bad-file says, rather than publish a half-written batch.
    if (!st.ok()) job->fatal = Status::IOError("GPU decode on cuda:" + std::to_string(gpu_->device()) + ": " + st.message());
    Complete(job);
  }
}

uint32_t Pipeline::Compact(BatchJob& job) const {
  const uint32_t n = static_cast<uint32_t>(job.indices.size());
  if (job.failures.empty()) return n;
  std::vector<bool> bad(n, false);
  for (const auto& f : job.failures) bad[f.first] = true;
  const uint64_t sample_bytes = layout_.sample_bytes();
  auto* idx = reinterpret_cast<int64_t*>(job.slot_base + layout_.indices_offset);
  auto* lbl = reinterpret_cast<int64_t*>(job.slot_base + layout_.labels_offset);
  uint8_t* data = job.slot_base + layout_.data_offset;
  uint32_t out = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (bad[i]) continue;
    if (out != i) {
      idx[out] = idx[i];
      lbl[out] = lbl[i];
      if (!gpu_) std::memmove(data + out * sample_bytes, data + i * sample_bytes, sample_bytes);
    }
    ++out;
  }
  return out;
}

}  // namespace coloader
