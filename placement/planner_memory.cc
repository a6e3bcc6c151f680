// The planner's memory rules: the limit a job gets where it is placed, the headroom it would get
// on a GPU before it is placed, and what an out-of-memory restart asks for (docs/PLACEMENT.md,
// "Memory limits with headroom"). The simulator and the launcher both apply them, through
// Planner, so what one predicts is what the other does.
#include "placement/planner.h"

#include <algorithm>

namespace coloader {

bool Planner::Recover(int j, int ooms, const Attempt& run, double* estimate_mib) {
  if (ooms > opts_.recovery.max_ooms) return false;
  // It had all a GPU can give it (a GPU of its own, or a limit as large): no restart can help.
  if (run.mode == Mode::kExclusive || (run.mode == Mode::kMps && run.limit_mib >= AloneLimitMiB(j) - 0.5)) return false;
  const double before = *estimate_mib;
  const double grown = before * opts_.recovery.growth;
  if (opts_.recovery.rule == Recovery::kGrowThenAlone && ooms == 1) {
    *estimate_mib = grown;
    if (FitsEmpty(j)) return true;
    *estimate_mib = before;  // no GPU holds the grown estimate: alone, as it is
  }
  if (opts_.recovery.rule != Recovery::kGrow) {
    alone_.insert(j);
    if (FitsEmpty(j)) return true;
    alone_.erase(j);  // no whole GPU here (MIG only, or too small): grow instead
  }
  *estimate_mib = grown;
  if (FitsEmpty(j)) return true;
  *estimate_mib = before;  // failed: the estimate stays what the job last ran with
  return false;
}

double Planner::AloneLimitMiB(int j) const {
  const Job& job = set_->jobs[j];
  const double ring = SharesProducer(j) && !PipelineOnHostPath(job.pipeline) && !opts_.host_path
                          ? set_->pipelines[job.pipeline].DeviceMiB()
                          : 0.0;
  double most = 0;
  for (const Gpu& g : gpus_) {
    if (!g.mig) most = std::max(most, g.memory_mib - ring);
  }
  return most;
}

double Planner::LimitWhenPlaced(const Placement& p) const {
  if (p.mode == Mode::kMig) return p.reserved_mib;
  const double gpu = gpus_[p.gpu].memory_mib;
  const GpuLoad& load = loads_[p.gpu];
  if (p.mode == Mode::kExclusive) return gpu - load.producer_mib;
  if (!opts_.memory_headroom) return p.reserved_mib;
  return p.reserved_mib + std::min(UnreservedShare(p.gpu, 0, 0), kHeadroomShare * p.reserved_mib);
}

double Planner::HeadroomShortOfCap(const Placement& p) const {
  if (p.mode == Mode::kExclusive) return 0;  // the GPU less its producer's ring
  // A MIG instance's headroom is what it holds beyond the estimate; a shared GPU's, HeadroomOn.
  const double need = p.mode == Mode::kMig ? ReservationOf(p.job) : p.reserved_mib;
  const double headroom = p.mode == Mode::kMig ? p.reserved_mib - need : HeadroomOn(p.job, p.gpu, need);
  const double cap = kHeadroomShare * need;
  return cap > 0 ? 1.0 - std::clamp(headroom / cap, 0.0, 1.0) : 0.0;
}

double Planner::HeadroomOn(int j, int g, double need_mib) const {
  return std::min(UnreservedShare(g, need_mib + RingCostOn(j, g), 1), kHeadroomShare * need_mib);
}

double Planner::UnreservedShare(int g, double adding_mib, size_t adding_jobs) const {
  const GpuLoad& load = loads_[g];
  const double unreserved = std::max(0.0, gpus_[g].memory_mib - load.used_mib - adding_mib);
  return unreserved / static_cast<double>(std::max<size_t>(1, load.jobs.size() + adding_jobs));
}

double Planner::MpsLimitMiB(const Placement& p) const {
  const bool maps_ring = p.producer >= 0 && !p.host_path && !gpus_[p.gpu].mig;
  return MemoryLimitMiB(p) + (maps_ring ? set_->pipelines[p.producer].RingMiB() : 0.0);
}

}  // namespace coloader
