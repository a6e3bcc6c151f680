#include "pipeline/assemble/pool.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "common/process.h"
#include "pipeline/stage_times.h"

namespace coloader {

Pipeline::Pipeline(const Dataset* dataset, TransformOptions opts, uint64_t seed, SlotTable layout)
    : dataset_(dataset), opts_(std::move(opts)), seed_(seed), layout_(std::move(layout)) {}

Result<std::unique_ptr<Pipeline>> Pipeline::Make(const Dataset* dataset, TransformOptions opts,
                                                 int workers, uint64_t seed, SlotTable layout,
                                                 GpuDecode gpu) {
  if (workers < 1) return Status::Invalid("--workers must be at least 1, got " + std::to_string(workers));
  std::unique_ptr<Pipeline> p(new Pipeline(dataset, std::move(opts), seed, std::move(layout)));
  p->gpu_ = std::move(gpu.stages);
  p->gpu_jobs_.resize(p->gpu_.size());
  for (const auto& stage : p->gpu_) {
    DecodeSplit::Options so;
    so.share = gpu.share;
    so.workers = workers;
    so.lanes = stage->lanes();
    so.stages = static_cast<int>(p->gpu_.size());
    p->split_.push_back(std::make_unique<DecodeSplit>(so));
  }
  COLOADER_ASSIGN_OR_RETURN(p->events_, EventFd::Make());
  // A thread that cannot start ends the start with its reason; those started are joined by
  // the destructor.
  for (int w = 0; w < workers; ++w) {
    COLOADER_ASSIGN_OR_RETURN(std::thread t, StartThread("decode worker " + std::to_string(w + 1) + " of " + std::to_string(workers),
                                                [raw = p.get(), w] { raw->WorkerLoop(w); }));
    p->threads_.push_back(std::move(t));
  }
  for (uint32_t s = 0; s < p->gpu_.size(); ++s) {
    for (int l = 0; l < p->gpu_[s]->lanes(); ++l) {
      COLOADER_ASSIGN_OR_RETURN(std::thread t, StartThread("GPU decode lane " + std::to_string(l + 1),
                                                  [raw = p.get(), s, l] { raw->GpuLaneLoop(s, l); }));
      p->lanes_.push_back(std::move(t));
    }
  }
  return p;
}

Pipeline::~Pipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    tasks_.clear();
    for (auto& q : gpu_jobs_) q.clear();
  }
  cv_.notify_all();
  gpu_cv_.notify_all();
  for (auto& t : threads_) t.join();
  for (auto& t : lanes_) t.join();
  for (size_t s = 0; s < gpu_.size(); ++s) {
    if (split_[s]->batches() == 0) continue;
    LogLine("[coloader] decode split on cuda:%d: the CPU workers took %.1f%% of each batch on average over %llu "
            "batches; at the end %s\n",
            gpu_[s]->device(), 100.0 * split_[s]->mean_share(), static_cast<unsigned long long>(split_[s]->batches()),
            split_[s]->Describe().c_str());
  }
  gpu_.clear();  // their log lines and device memory go before the eventfd
  if (StageTimes::enabled()) std::fprintf(stderr, "%s", StageTimes::Report().c_str());
}

void Pipeline::Submit(std::unique_ptr<BatchJob> job) {
  const uint32_t n = static_cast<uint32_t>(job->indices.size());
  job->remaining.store(n);
  in_flight_.fetch_add(1);
  // Streamed shards: what this batch reads is fetched while the batches before it decode.
  dataset_->WillRead(job->indices);
  if (opts_.erase.p > 0 && opts_.erase_on_device) job->erase.assign(n, EraseBox{});
  if (!opts_.pixel_ops.empty() && opts_.pixel_ops_on_device) job->pixel.assign(n, PixelProgram{});
  if (!gpu_.empty()) {
    BatchJob::GpuPart& g = job->gpu;
    g.samples.assign(n, GpuSample{});
    g.decoder = static_cast<uint32_t>(job->seq % gpu_.size());
    g.cpu_from = n - split_[g.decoder]->CpuCount(n);  // the batch's last positions
    g.decoded = 0;
    g.cpu_ns = 0;
    g.other_ns = 0;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n == 0) {
      completed_.push_back(std::move(job));
      events_.Signal();
    } else {
      for (uint32_t i = 0; i < n; ++i) tasks_.emplace_back(job.get(), i);
      running_.push_back(std::move(job));
    }
  }
  cv_.notify_all();
}

std::vector<std::unique_ptr<BatchJob>> Pipeline::TakeCompleted() {
  // Drained and taken under the lock that Complete signals under: the eventfd is readable
  // exactly while completed_ holds something (before, a worker could signal between another
  // thread's drain and its take, leaving a wake-up with nothing behind it).
  std::lock_guard<std::mutex> lock(mu_);
  events_.Drain();
  std::vector<std::unique_ptr<BatchJob>> out;
  out.swap(completed_);
  in_flight_.fetch_sub(out.size());
  return out;
}

void Pipeline::WorkerLoop(int worker) {
  NameThisThread("cl-worker-" + std::to_string(worker));
  SampleTransform transform(opts_);
  std::vector<uint8_t> file_buf;  // the sample's file bytes, reused
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
    if (!job->erase.empty()) job->erase[pos] = transform.EraseFor(seed_, job->epoch, static_cast<uint64_t>(index));
    if (!job->pixel.empty()) job->pixel[pos] = transform.PixelFor(seed_, job->epoch, static_cast<uint64_t>(index));
    Status st;
    uint8_t* dst = job->slot_base + layout_.data_offset + pos * sample_bytes;
    const bool cpu_share = !gpu_.empty() && pos >= job->gpu.cpu_from;
    const uint64_t start_ns = gpu_.empty() ? 0 : StageTimes::WallNs();
    try {
      if (!gpu_.empty() && !cpu_share) {
        std::vector<uint8_t> bytes;
        {
          ScopedStage timer(Stage::kWorkerRead);
          st = dataset_->Read(sample, &bytes);
        }
        if (st.ok()) {
          ScopedStage timer(Stage::kWorkerRoute);
          const uint64_t epoch = job->epoch, at = static_cast<uint64_t>(index);
          st = gpu_[job->gpu.decoder]->Prepare(
              std::move(bytes), [&](int w, int h) { return transform.Crop(w, h, seed_, epoch, at); },
              [&](const uint8_t* data, size_t size, void* out) {
                return transform.RunBytes(data, size, sample.where(), seed_, epoch, at, out);
              },
              &job->gpu.samples[pos], dst);
        }
      } else {
        // --decode cpu, or this sample is of the CPU's share of a GPU batch: the same path.
        ScopedStage timer(cpu_share ? Stage::kWorkerCpuShare : Stage::kWorkerCpuTransform);
        st = dataset_->Read(sample, &file_buf);
        if (st.ok())
          st = transform.RunBytes(file_buf.data(), file_buf.size(), sample.where(), seed_, job->epoch,
                                  static_cast<uint64_t>(index), dst);
      }
    } catch (const std::exception& e) {  // a bad file must never end the producer
      st = Status::Invalid(sample.where() + ": " + e.what());
    }
    if (!gpu_.empty()) (cpu_share ? job->gpu.cpu_ns : job->gpu.other_ns).fetch_add(StageTimes::WallNs() - start_ns);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(job->failures_mu);
      // The machine's fault (out of descriptors or memory, a failing device) is no bad file:
      // the run stops with it rather than skip good data and report whole epochs.
      if (st.code() == StatusCode::kUnavailable) {
        if (job->fatal.ok()) job->fatal = st;
      } else {
        job->failures.emplace_back(pos, st.message());
      }
    }
    if (job->remaining.fetch_sub(1) == 1) {
      // Last sample of the batch: on to a GPU lane, or back to the producer thread.
      if (!gpu_.empty()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          gpu_jobs_[job->gpu.decoder].push_back(job);
        }
        gpu_cv_.notify_all();  // one condition for every stage's lanes: wake the right one
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
    events_.Signal();
  }
}

void Pipeline::GpuLaneLoop(uint32_t stage, int lane) {
  GpuDecodeStage& gpu = *gpu_[stage];
  NameThisThread("cl-gpulane-" + std::to_string(gpu.device()) + "-" + std::to_string(lane));
  std::deque<BatchJob*>& queue = gpu_jobs_[stage];
  SampleTransform transform(opts_);  // for the files both GPU backends refuse
  DecodeSplit& split = *split_[stage];
  for (;;) {
    BatchJob* job = nullptr;
    const uint64_t wait_ns = StageTimes::WallNs();
    {
      ScopedStage idle(Stage::kLaneQueueWait, 0);
      std::unique_lock<std::mutex> lock(mu_);
      gpu_cv_.wait(lock, [this, &queue] { return stopping_ || !queue.empty(); });
      if (stopping_) return;
      job = queue.front();
      queue.pop_front();
    }
    const uint64_t start_ns = StageTimes::WallNs();
    GpuBatch batch;
    batch.slot = job->slot;
    batch.samples = &job->gpu.samples;
    batch.failures = &job->failures;  // the workers are done with it: no lock needed
    batch.host_staging = job->slot_base + layout_.data_offset;
    batch.cpu = [&](uint32_t pos, const uint8_t* data, size_t size, void* out) {
      const auto index = static_cast<uint64_t>(job->indices[pos]);
      return transform.RunBytes(data, size, (*dataset_)[index].where(), seed_, job->epoch, index, out);
    };
    Status st;
    try {
      Result<uint32_t> decoded = gpu.Finish(lane, batch);
      st = decoded.status();
      if (decoded.ok()) job->gpu.decoded = *decoded;
    } catch (const std::exception& e) {
      st = Status::Internal(std::string("GPU decode: ") + e.what());
    }
    // The GPU itself failed (not a file): the producer stops with this error, whatever
    // --on-bad-file says, rather than publish a half-written batch.
    if (!st.ok()) job->fatal = Status::IOError("GPU decode on cuda:" + std::to_string(gpu.device()) + ": " + st.message());
    // What the batch measured steers the next batches' split (before Complete hands the job on).
    const uint32_t n = static_cast<uint32_t>(job->indices.size());
    SplitMeasure m;
    m.samples = n;
    m.cpu = n - job->gpu.cpu_from;
    m.engine = job->gpu.decoded;
    m.lane_busy_s = static_cast<double>(StageTimes::WallNs() - start_ns) * 1e-9;
    m.lane_idle_s = static_cast<double>(start_ns - wait_ns) * 1e-9;
    m.cpu_s = static_cast<double>(job->gpu.cpu_ns.load()) * 1e-9;
    m.other_s = static_cast<double>(job->gpu.other_ns.load()) * 1e-9;
    if (st.ok()) split.Observe(m);
    Complete(job);
  }
}

std::vector<double> Pipeline::CpuShares() const {
  std::vector<double> out;
  for (const auto& s : split_) out.push_back(s->share());
  return out;
}

std::string Pipeline::DecodeSplitSummary() const {
  std::string out;
  for (size_t s = 0; s < gpu_.size(); ++s) {
    if (!out.empty()) out += "; ";
    if (gpu_.size() > 1) out += "cuda:" + std::to_string(gpu_[s]->device()) + " ";
    out += split_[s]->Describe();
  }
  return out;
}

bool Pipeline::Resubmit(std::unique_ptr<BatchJob>& job) {
  if (job->substitutions >= kMaxSubstitutions || dataset_->size() < 2) return false;
  ++job->substitutions;
  const auto n = static_cast<int64_t>(dataset_->size());
  for (int64_t& index : job->indices) index = (index + 1) % n;
  job->failures.clear();
  job->fatal = Status::OK();
  Submit(std::move(job));
  return true;
}

uint32_t Pipeline::FillFailed(BatchJob& job) const {
  const uint32_t n = static_cast<uint32_t>(job.indices.size());
  if (job.failures.empty()) return n;
  std::vector<bool> failed(n, false);
  for (const auto& f : job.failures) failed[f.first] = true;
  const uint64_t sample_bytes = layout_.sample_bytes();
  auto* idx = reinterpret_cast<int64_t*>(job.slot_base + layout_.indices_offset);
  auto* lbl = reinterpret_cast<int64_t*>(job.slot_base + layout_.labels_offset);
  uint8_t* data = job.slot_base + layout_.data_offset;
  for (uint32_t i = 0; i < n; ++i) {
    if (!failed[i]) continue;
    const std::optional<uint32_t> r = ReplacementFor(i, failed);
    if (!r) return 0;  // nothing of this batch decoded
    idx[i] = idx[*r];
    lbl[i] = lbl[*r];
    if (!job.erase.empty()) job.erase[i] = job.erase[*r];
    if (!job.pixel.empty()) job.pixel[i] = job.pixel[*r];
    if (gpu_.empty()) std::memcpy(data + i * sample_bytes, data + *r * sample_bytes, sample_bytes);
  }
  return n;
}

}  // namespace coloader
