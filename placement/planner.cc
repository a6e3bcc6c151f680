#include "placement/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace coloader {

const char* PolicyName(Policy p) {
  switch (p) {
    case Policy::kFifoExclusive: return "fifo-exclusive";
    case Policy::kMostMemory: return "most-memory";
    case Policy::kLeastUtilised: return "least-utilised";
    case Policy::kSharingAware: return "sharing-aware";
  }
  return "?";
}

std::vector<Policy> AllPolicies() {
  return {Policy::kFifoExclusive, Policy::kMostMemory, Policy::kLeastUtilised, Policy::kSharingAware};
}

Result<Policy> ParsePolicy(const std::string& name) {
  for (Policy p : AllPolicies()) {
    if (name == PolicyName(p)) return p;
  }
  return Status::Invalid("unknown policy '" + name + "' (fifo-exclusive, most-memory, least-utilised, sharing-aware)");
}

const char* RecoveryName(Recovery r) {
  switch (r) {
    case Recovery::kAlone:
      return "alone";
    case Recovery::kGrow:
      return "grow";
    case Recovery::kGrowThenAlone:
      return "grow-then-alone";
  }
  return "?";
}

Result<Recovery> ParseRecovery(const std::string& name) {
  for (Recovery r : {Recovery::kAlone, Recovery::kGrow, Recovery::kGrowThenAlone}) {
    if (name == RecoveryName(r)) return r;
  }
  return Status::Invalid("unknown recovery rule '" + name + "' (grow-then-alone, grow, alone)");
}

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kExclusive: return "exclusive";
    case Mode::kMps: return "mps";
    case Mode::kMig: return "mig";
  }
  return "?";
}

Planner::Planner(PlannerOptions opts, std::vector<Gpu> gpus, const JobSet* set)
    : opts_(opts), gpus_(std::move(gpus)), set_(set), loads_(gpus_.size()), host_path_pipeline_(set->pipelines.size(), 0) {
  // A pipeline with a job that needs isolation keeps its ring in host memory (MIG instances
  // cannot map CUDA IPC memory); fixed for the planner's life, and asked for every placement.
  for (const Job& job : set->jobs) {
    if (job.isolation && job.pipeline >= 0) host_path_pipeline_[job.pipeline] = 1;
  }
}

Planner::Planner(const Planner& like, std::vector<Gpu> gpus)
    : opts_(like.opts_),
      gpus_(std::move(gpus)),
      set_(like.set_),
      loads_(gpus_.size()),
      alone_(like.alone_),
      host_path_pipeline_(like.host_path_pipeline_) {}

double Planner::SmOf(int j) const {
  const double sm = set_->jobs[j].sm_activity;
  return sm >= 0 ? sm : opts_.default_sm;
}

double Planner::ReservationOf(int j) const { return set_->jobs[j].memory_mib * (1.0 + opts_.memory_margin); }

int Planner::MigSlicesUsed(int gpu) const {
  int used = 0;
  for (const MigProfile& m : gpus_[gpu].mig_profiles) {
    auto it = loads_[gpu].mig_used.find(m.name);
    if (it != loads_[gpu].mig_used.end()) used += it->second * ComputeSlicesOf(m);
  }
  return used;
}

double Planner::ClientMiBOf(int j, bool host_path) const {
  const Job& job = set_->jobs[j];
  if (!SharesProducer(j) || host_path) return 0;
  return set_->pipelines[job.pipeline].ConsumerMiB(job.batch_size);
}

double Planner::ProducerCores(int pipeline) const {
  auto it = producer_cores_.find(pipeline);
  return it == producer_cores_.end() ? 0.0 : it->second;
}

double Planner::CoresToAdd(int j) const {
  const Job& job = set_->jobs[j];
  if (!SharesProducer(j)) return job.loader_cores;
  // One producer makes one stream at the pace of its group: the cores of the most demanding
  // member's own loader serve all of them.
  return std::max(0.0, job.loader_cores - ProducerCores(job.pipeline));
}

bool Planner::SharesProducer(int j) const {
  if (!opts_.sharing) return false;
  const Job& job = set_->jobs[j];
  if (PipelineOnHostPath(job.pipeline)) return true;  // no ring on any GPU
  const JobPipeline& pl = set_->pipelines[job.pipeline];
  const double alone = ReservationOf(j);
  const double beside = alone + pl.ConsumerMiB(job.batch_size) + pl.DeviceMiB();
  bool fits_alone = false;
  for (const Gpu& g : gpus_) {
    if (g.mig) continue;  // its instances read the host ring: they do not decide
    if (beside <= g.memory_mib) return true;
    fits_alone = fits_alone || alone <= g.memory_mib;
  }
  return !fits_alone;  // fits no whole GPU either way: as the pipeline's other jobs
}

bool Planner::PipelineOnHostPath(int pipeline) const {
  return opts_.host_path || host_path_pipeline_[pipeline] != 0;
}

std::set<int> Planner::ProducerGpus(int pipeline) const {
  std::set<int> out;
  auto it = producer_members_.find(pipeline);
  if (it == producer_members_.end() || PipelineOnHostPath(pipeline)) return out;
  for (const auto& [g, n] : it->second) {
    if (n > 0 && !gpus_[g].mig) out.insert(g);
  }
  return out;
}

double Planner::RingCostOn(int j, int g) const {
  const int p = set_->jobs[j].pipeline;
  // MIG consumers read the host-memory ring: nothing of the producer lives on a MIG GPU.
  if (!SharesProducer(j) || PipelineOnHostPath(p) || gpus_[g].mig) return 0;
  auto it = producer_members_.find(p);
  if (it != producer_members_.end() && it->second.count(g) && it->second.at(g) > 0) return 0;
  return set_->pipelines[p].DeviceMiB();
}

void Planner::LockProducer(int pipeline) {
  const std::set<int> gpus = ProducerGpus(pipeline);
  if (!gpus.empty()) locked_[pipeline] = gpus;
  if (decoders_.count(pipeline)) decoder_locked_.insert(pipeline);
}
void Planner::UnlockProducer(int pipeline) {
  locked_.erase(pipeline);
  if (decoder_locked_.erase(pipeline) && !ProducerRunning(pipeline)) FreeDecoder(pipeline);
}

bool Planner::MigInstanceFree(int g, const MigProfile& m) const {
  const GpuLoad& load = loads_[g];
  auto used = load.mig_used.find(m.name);
  const int in_use = used == load.mig_used.end() ? 0 : used->second;
  return in_use < m.count && load.used_mib + m.memory_mib <= gpus_[g].memory_mib &&
         MigSlicesUsed(g) + ComputeSlicesOf(m) <= ComputeSlicesOf(gpus_[g]);
}

double Planner::DecoderMiBOn(int g) const {
  double mib = 0;
  for (const auto& [pipeline, d] : decoders_) {
    if (d.gpu == g) mib += d.reserved_mib;
  }
  return mib;
}

void Planner::UpdateDecoder(int pipeline, int near) {
  const JobPipeline& pl = set_->pipelines[pipeline];
  const bool ring_gpu = !ProducerGpus(pipeline).empty();
  if (decoders_.count(pipeline)) {
    // A job of its pipeline now reads a device ring: the producer decodes on that GPU, unless its
    // process already runs on the instance.
    if (ring_gpu && !decoder_locked_.count(pipeline)) FreeDecoder(pipeline);
    return;
  }
  // auto decodes on the CPU without a ring, as serve's auto does without --device: a MIG instance
  // would cost a job's compute slice, which only a pipeline that asks for gpu decoding pays.
  if (ring_gpu || opts_.host_path || pl.decode != "gpu") return;  // DecodeOf says where
  // Its jobs read host memory, so it has no GPU of its own. nvJPEG needs one, and on a MIG GPU only
  // some instances have a JPEG engine: it takes the smallest free one that holds its ring and
  // context (the ring is in device memory with --device), its GPU's compute slices and memory
  // counted as for a job's instance; next to its first job at equal size. Never the instance of a
  // whole GPU, which would hold every compute slice there for a decoder.
  ProducerDecode d;
  const MigProfile* best = nullptr;
  std::set<std::string> with_engine;
  bool any_mig = false;
  for (int g = 0; g < static_cast<int>(gpus_.size()); ++g) {
    const Gpu& gpu = gpus_[g];
    if (!gpu.mig) continue;
    any_mig = true;
    for (const MigProfile& m : gpu.mig_profiles) {
      if (JpegEnginesOf(m, gpu) == 0 || ComputeSlicesOf(m) >= ComputeSlicesOf(gpu)) continue;
      with_engine.insert(m.name);
      if (m.memory_mib < pl.DeviceMiB() || !MigInstanceFree(g, m)) continue;
      if (!best || m.memory_mib < best->memory_mib || (m.memory_mib == best->memory_mib && g == near && d.gpu != near)) {
        best = &m;
        d.gpu = g;
      }
    }
  }
  char why[400];
  if (best) {
    d.decode = pl.decode;
    d.mig_profile = best->name;
    d.reserved_mib = best->memory_mib;
    GpuLoad& load = loads_[d.gpu];
    load.used_mib += d.reserved_mib;
    load.producer_mib += d.reserved_mib;
    load.mig_used[d.mig_profile]++;
    std::snprintf(why, sizeof why, "decode %s: its jobs read host memory, so nvJPEG runs on a MIG instance of its own "
                  "(%s, %d JPEG engine(s))", pl.decode.c_str(), best->name.c_str(), JpegEnginesOf(*best, gpus_[d.gpu]));
  } else {
    d.gpu = -1;
    std::string names;
    for (const std::string& n : with_engine) names += (names.empty() ? "" : ", ") + n;
    if (!any_mig) {
      std::snprintf(why, sizeof why, "decode %s, but its jobs read host memory (isolated on GPUs of their own) and no "
                    "GPU here is in MIG mode to give it an instance: on the CPU (--decode cpu)", pl.decode.c_str());
    } else if (names.empty()) {
      std::snprintf(why, sizeof why, "decode %s, but its jobs read host memory and no MIG profile here (but a whole "
                    "GPU's) has a JPEG engine: on the CPU (--decode cpu)", pl.decode.c_str());
    } else {
      std::snprintf(why, sizeof why, "decode %s, but its jobs read host memory and no MIG instance with a JPEG engine "
                    "(%s) that holds its ring (%.0f MiB) is free: on the CPU (--decode cpu)",
                    pl.decode.c_str(), names.c_str(), pl.DeviceMiB());
    }
  }
  d.why = why;
  decoders_[pipeline] = d;
}

void Planner::FreeDecoder(int pipeline) {
  auto it = decoders_.find(pipeline);
  if (it == decoders_.end()) return;
  const ProducerDecode d = it->second;
  decoders_.erase(it);
  if (d.gpu < 0) return;
  GpuLoad& load = loads_[d.gpu];
  load.mig_used[d.mig_profile]--;
  load.used_mib -= d.reserved_mib;
  load.producer_mib -= d.reserved_mib;
  if (load.jobs.empty()) load.used_mib = load.producer_mib = DecoderMiBOn(d.gpu);  // no drift
}

ProducerDecode Planner::DecodeOf(int pipeline) const {
  const JobPipeline& pl = set_->pipelines[pipeline];
  ProducerDecode d;
  if (pl.decode == "cpu") {
    d.why = "its pipeline's decode is cpu";
    return d;
  }
  // A running process stays on the instance it started on, whatever its jobs read now.
  if (auto it = decoders_.find(pipeline); it != decoders_.end() && decoder_locked_.count(pipeline)) return it->second;
  if (const std::set<int> gpus = ProducerGpus(pipeline); !gpus.empty()) {
    d.decode = pl.decode;
    d.gpu = *gpus.begin();
    d.why = pl.decode == "gpu" ? "decode gpu: nvJPEG on the GPU(s) of its ring"
                               : "decode auto: the JPEG engines of its ring's GPU(s) where they have them, else the "
                                 "CPU (serve decides at start)";
    return d;
  }
  if (auto it = decoders_.find(pipeline); it != decoders_.end()) return it->second;
  if (opts_.host_path) {
    d.why = "decode " + pl.decode + ", but this plan has no GPU (none found, or --host-path): on the CPU (--decode cpu)";
  } else if (pl.decode == "auto" && ProducerRunning(pipeline)) {
    d.why = "decode auto, and its jobs read host memory, so it has no GPU of its own: on the CPU, as serve's auto "
            "without --device (decode gpu would give it a MIG instance with a JPEG engine)";
  } else {
    d.why = "its producer is not running";
  }
  return d;
}

std::optional<Placement> Planner::PlaceOnGpu(int j, int g) const {
  const Job& job = set_->jobs[j];
  const Gpu& gpu = gpus_[g];
  const GpuLoad& load = loads_[g];
  Placement p;
  p.job = j;
  p.gpu = g;
  const bool shares = SharesProducer(j);
  p.producer = shares ? job.pipeline : -1;
  p.host_path = shares && PipelineOnHostPath(job.pipeline);
  // The estimate is of the training step; MPS's pinned-memory limit also counts what our own
  // consumer allocates, so that is held too.
  p.client_mib = gpu.mig ? 0 : ClientMiBOf(j, p.host_path);
  const double need = ReservationOf(j) + p.client_mib;
  if (load.exclusive) return std::nullopt;
  if (gpu.mig && RunsAlone(j)) return std::nullopt;  // alone means a whole GPU, not an instance
  if (gpu.mig) {
    // The smallest free profile that holds the estimate, within the profile's count, the GPU's
    // memory and its compute slices. (Where on the GPU each slice goes is left to the driver.)
    const MigProfile* best = nullptr;
    for (const MigProfile& m : gpu.mig_profiles) {
      if (m.memory_mib < need || !MigInstanceFree(g, m)) continue;
      // Of two the same size, the one without a JPEG engine: those with one are few (an A100 has
      // one 1g.5gb+me), and a GPU-decoding producer needs one (UpdateDecoder).
      if (!best || m.memory_mib < best->memory_mib ||
          (m.memory_mib == best->memory_mib && JpegEnginesOf(m, gpu) < JpegEnginesOf(*best, gpu)))
        best = &m;
    }
    if (!best) return std::nullopt;
    p.mode = Mode::kMig;
    p.mig_profile = best->name;
    p.reserved_mib = best->memory_mib;
    p.host_path = shares;  // CUDA IPC does not cross MIG instances
    return p;
  }
  const bool empty = load.jobs.empty();
  if (job.isolation || RunsAlone(j) || opts_.policy == Policy::kFifoExclusive) {
    if (!empty) return std::nullopt;
    p.mode = Mode::kExclusive;
  }
  if (load.used_mib + need + RingCostOn(j, g) > gpu.memory_mib) return std::nullopt;
  if (opts_.policy == Policy::kSharingAware && !empty && !SmAdmits(j, g)) return std::nullopt;
  if (opts_.policy == Policy::kSharingAware && opts_.memory_headroom && !empty &&
      HeadroomOn(j, g, need) < kHeadroomFloor * need)
    return std::nullopt;
  p.reserved_mib = need;
  return p;
}

std::optional<Placement> Planner::TryPlace(int j) {
  if (placed_.count(j)) return placed_.at(j);
  const Job& job = set_->jobs[j];
  const double cores = CoresToAdd(j);
  if (opts_.policy == Policy::kSharingAware && cores_used_ + cores > opts_.cpu_cores + 1e-9 && cores_used_ > 0) {
    return std::nullopt;
  }
  // A producer whose process already runs cannot grow a ring on another GPU: its jobs go where it is.
  const bool shares = SharesProducer(j);
  std::set<int> allowed;
  if (shares) {
    auto lk = locked_.find(job.pipeline);
    if (lk != locked_.end()) allowed = lk->second;
  }
  std::optional<Placement> best;
  double best_score = 0;
  for (int g = 0; g < static_cast<int>(gpus_.size()); ++g) {
    if (!allowed.empty() && !allowed.count(g)) continue;
    std::optional<Placement> p = PlaceOnGpu(j, g);
    if (!p) continue;
    const GpuLoad& load = loads_[g];
    const double free_after = gpus_[g].memory_mib - load.used_mib - p->reserved_mib - RingCostOn(j, g);
    double score = 0;  // lower is better
    switch (opts_.policy) {
      case Policy::kFifoExclusive: score = g; break;
      case Policy::kMostMemory: score = -free_after; break;
      case Policy::kLeastUtilised: score = load.sm * 1e6 - free_after * 1e-3; break;
      case Policy::kSharingAware: {
        // Next to its producer first (ring already paid, zero-copy), then where its headroom
        // comes closest to the cap (HeadroomOn), then where SMs are least busy, then where most
        // memory is left.
        const double short_of_cap = opts_.memory_headroom ? HeadroomShortOfCap(*p) : 0.0;
        score = (RingCostOn(j, g) == 0 && shares && ProducerRunning(job.pipeline) ? 0 : 1e9) + short_of_cap * 1e8 +
                (load.sm + SmOf(j)) * 1e6 - free_after * 1e-3;
        break;
      }
    }
    if (!best || score < best_score) {
      best = p;
      best_score = score;
    }
  }
  if (!best) return std::nullopt;
  GpuLoad& load = loads_[best->gpu];
  const double ring = RingCostOn(j, best->gpu);
  load.used_mib += best->reserved_mib + ring;
  load.producer_mib += ring;
  load.sm += SmOf(j);
  load.jobs.push_back(j);
  if (best->mode == Mode::kMig) load.mig_used[best->mig_profile]++;
  if (best->mode == Mode::kExclusive && (job.isolation || RunsAlone(j))) load.exclusive = true;
  cores_used_ += cores;
  best->limit_mib = LimitWhenPlaced(*best);
  if (best->producer >= 0) {
    producer_members_[job.pipeline][best->gpu]++;
    producer_cores_[job.pipeline] = std::max(ProducerCores(job.pipeline), job.loader_cores);
    UpdateDecoder(job.pipeline, best->gpu);
  }
  placed_[j] = *best;
  return best;
}

void Planner::Release(int j) {
  auto it = placed_.find(j);
  if (it == placed_.end()) return;
  const Placement p = it->second;
  placed_.erase(it);
  const Job& job = set_->jobs[j];
  GpuLoad& load = loads_[p.gpu];
  load.used_mib -= p.reserved_mib;
  load.sm -= SmOf(j);
  load.jobs.erase(std::remove(load.jobs.begin(), load.jobs.end(), j), load.jobs.end());
  if (p.mode == Mode::kMig) load.mig_used[p.mig_profile]--;
  if (load.jobs.empty()) {
    load.exclusive = false;
    load.sm = 0;  // no drift from repeated float adds
  }
  if (p.producer < 0) {
    cores_used_ -= job.loader_cores;
    return;
  }
  auto& members = producer_members_[job.pipeline];
  if (--members[p.gpu] == 0) {
    members.erase(p.gpu);
    if (!PipelineOnHostPath(job.pipeline) && !gpus_[p.gpu].mig) {
      const double ring = set_->pipelines[job.pipeline].DeviceMiB();
      load.used_mib -= ring;
      load.producer_mib -= ring;
    }
  }
  double still_needed = 0;
  for (const auto& [k, q] : placed_) {  // its readers (a job of it with its own loader is not one)
    if (q.producer == job.pipeline) still_needed = std::max(still_needed, set_->jobs[k].loader_cores);
  }
  cores_used_ -= ProducerCores(job.pipeline) - still_needed;
  if (members.empty()) {
    producer_members_.erase(job.pipeline);
    producer_cores_.erase(job.pipeline);
    if (!decoder_locked_.count(job.pipeline)) FreeDecoder(job.pipeline);  // its process holds it until it stops
  } else {
    producer_cores_[job.pipeline] = still_needed;
  }
  if (load.jobs.empty()) load.used_mib = load.producer_mib = DecoderMiBOn(p.gpu);
  if (cores_used_ < 1e-9) cores_used_ = 0;
}

bool Planner::FitsEmpty(int j) const {
  Planner empty(*this, gpus_);
  if (opts_.policy == Policy::kSharingAware && empty.CoresToAdd(j) > opts_.cpu_cores) {
    // One loader larger than the machine still runs (alone, slower): do not refuse it forever.
    empty.opts_.cpu_cores = empty.CoresToAdd(j);
  }
  return empty.TryPlace(j).has_value();
}

std::vector<int> Planner::QueueOrder(std::vector<int> jobs) const {
  std::stable_sort(jobs.begin(), jobs.end(), [&](int a, int b) {
    const Job &x = set_->jobs[a], &y = set_->jobs[b];
    if (RunsAlone(a) != RunsAlone(b)) return RunsAlone(a);
    if (x.priority != y.priority) return x.priority > y.priority;
    if (x.arrival_s != y.arrival_s) return x.arrival_s < y.arrival_s;
    return a < b;
  });
  return jobs;
}

double CollocationSpeedup(double alone_s, double busy_s) { return busy_s > 0 ? alone_s / busy_s : 0; }

double CollocationModel::Slowdown(int n, double sm) const {
  if (n <= 1) return 1.0;
  return (1.0 + interference * (n - 1)) * std::max(1.0, sm / sm_saturation);
}

bool Planner::SmAdmits(int j, int g) const {
  const GpuLoad& load = loads_[g];
  const double limit = opts_.sm_limit > 0 ? opts_.sm_limit : opts_.model.sm_saturation + PlannerOptions::kAutoSmSlack;
  return load.sm + SmOf(j) <= limit + 1e-9;
}

bool Planner::HoldsTheQueue(int j) const { return opts_.policy == Policy::kFifoExclusive || RunsAlone(j); }

std::vector<Placement> Planner::PlaceRound(std::vector<int>* queue) {
  std::vector<Placement> placed;
  for (int j : QueueOrder(*queue)) {
    std::optional<Placement> p = TryPlace(j);
    if (!p) {
      if (HoldsTheQueue(j)) break;
      continue;
    }
    queue->erase(std::find(queue->begin(), queue->end(), j));
    placed.push_back(*p);
  }
  return placed;
}

Mode Planner::ModeOf(const Placement& p) const {
  if (p.mode == Mode::kMig) return Mode::kMig;
  if (p.mode == Mode::kExclusive) return Mode::kExclusive;
  return loads_[p.gpu].jobs.size() <= 1 ? Mode::kExclusive : Mode::kMps;
}

int Planner::MpsThreadPercentage(const Placement& p) const {
  if (ModeOf(p) != Mode::kMps) return 100;
  const double share = SmOf(p.job) / (opts_.sm_limit > 0 ? opts_.sm_limit : opts_.model.sm_saturation);
  return std::clamp(static_cast<int>(std::ceil(share * 100.0)), 10, 100);
}

std::string WhyItCannotRun(const JobSet& set, const std::vector<Gpu>& gpus, const PlannerOptions& opts, int j) {
  // A job that fits a GPU alone but not beside its producer's ring runs with its own loader
  // (Planner::SharesProducer): what cannot run is a job larger than every GPU.
  double largest = 0;
  for (const Gpu& g : gpus) largest = std::max(largest, g.memory_mib);
  char why[240];
  std::snprintf(why, sizeof why,
                "needs %.0f MiB (its estimate and the %.0f%% margin), more than any GPU has (the "
                "largest: %.0f MiB)",
                set.jobs[j].memory_mib * (1.0 + opts.memory_margin), 100.0 * opts.memory_margin, largest);
  return why;
}

Plan MakePlan(const JobSet& set, const std::vector<Gpu>& gpus, const PlannerOptions& opts, Planner* planner_out) {
  Planner local(opts, gpus, &set);
  Planner& planner = planner_out ? *planner_out : local;
  Plan plan;
  std::vector<int> all(set.jobs.size());
  std::iota(all.begin(), all.end(), 0);
  bool blocked = false;
  for (int j : planner.QueueOrder(all)) {
    if (!planner.FitsEmpty(j)) {
      plan.impossible.push_back(j);
      plan.impossible_why.push_back(WhyItCannotRun(set, gpus, opts, j));
      continue;
    }
    std::optional<Placement> p;
    // FIFO is strict: nothing overtakes a job that waits.
    if (!(blocked && opts.policy == Policy::kFifoExclusive)) p = planner.TryPlace(j);
    if (p) {
      plan.placements.push_back(*p);
    } else {
      plan.queued.push_back(j);
      blocked = true;
    }
  }
  plan.cpu_cores_used = planner.cores_used();
  for (const Placement& p : plan.placements) plan.cpu_cores_without_sharing += set.jobs[p.job].loader_cores;
  return plan;
}

}  // namespace coloader
