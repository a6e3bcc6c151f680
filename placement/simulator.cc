#include "placement/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>

namespace coloader {

double CollocationSlowdown(int n, double sm, const SimOptions& o) {
  if (n <= 1) return 1.0;
  return (1.0 + o.interference * (n - 1)) * std::max(1.0, sm / o.sm_saturation);
}

namespace {

enum class State { kPending, kQueued, kRunning, kDone, kImpossible };

struct SimJob {
  State state = State::kPending;
  double progress_s = 0;  // seconds of work done (at speed 1 = alone on a GPU)
  double started_at = 0;
  double finished_at = 0;
  bool will_oom = false;
};

double ActualMemory(const Job& j) { return j.actual_memory_mib > 0 ? j.actual_memory_mib : j.memory_mib; }

// What really runs on GPU g: producers, the jobs' actual memory, and their consumers' own buffers.
double RealMemoryOn(const Planner& planner, const JobSet& set, int g) {
  double mib = planner.loads()[g].producer_mib;
  for (int k : planner.loads()[g].jobs) mib += ActualMemory(set.jobs[k]) + planner.placed().at(k).client_mib;
  return mib;
}

}  // namespace

Result<SimResult> Simulate(const JobSet& trace, const std::vector<Gpu>& gpus, const SimOptions& opts) {
  if (gpus.empty()) return Status::Invalid("no GPUs (give --gpus N or \"gpus\" in the trace)");
  for (const Job& j : trace.jobs) {
    if (!(j.duration_s > 0)) return Status::Invalid("job \"" + j.name + "\" has no duration_s (seconds alone on a GPU)");
    if (j.memory_auto) return Status::Invalid("job \"" + j.name + "\" has memory_mib \"auto\"; a trace states the estimate");
  }
  JobSet set = trace;  // OOM requeues raise estimates in this copy
  Planner planner(opts.planner, gpus, &set);
  const int n = static_cast<int>(set.jobs.size());
  std::vector<SimJob> jobs(n);
  SimResult r;
  r.policy = PolicyName(opts.planner.policy);
  r.sharing = opts.planner.sharing;
  std::vector<int> queue;
  double t = 0, next_sample = 0;
  int finished = 0;
  double mem_util_sum = 0, sm_util_sum = 0, cores_sum = 0;
  long samples_taken = 0;
  const double kMaxTime = 3600.0 * 24 * 60;

  while (finished < n) {
    if (t > kMaxTime) return Status::Internal("not finished after 60 simulated days (a job that never fits?)");
    // Arrivals.
    for (int j = 0; j < n; ++j) {
      if (jobs[j].state != State::kPending || set.jobs[j].arrival_s > t) continue;
      if (!planner.FitsEmpty(j)) {
        jobs[j].state = State::kImpossible;
        ++r.impossible;
        ++finished;
        continue;
      }
      jobs[j].state = State::kQueued;
      queue.push_back(j);
    }
    // Placement, in queue order; FIFO lets nothing overtake a waiting job.
    for (int j : planner.QueueOrder(queue)) {
      std::optional<Placement> p = planner.TryPlace(j);
      if (!p) {
        if (opts.planner.policy == Policy::kFifoExclusive) break;
        continue;
      }
      queue.erase(std::find(queue.begin(), queue.end(), j));
      SimJob& sj = jobs[j];
      sj.state = State::kRunning;
      sj.started_at = t;
      sj.progress_s = 0;
      // Out of memory when what really runs on the GPU exceeds it, or a MIG instance's size.
      const double real = RealMemoryOn(planner, set, p->gpu);
      const double cap = p->mode == Mode::kMig ? p->reserved_mib : gpus[p->gpu].memory_mib;
      sj.will_oom = p->mode == Mode::kMig ? ActualMemory(set.jobs[j]) > cap : real > cap;
    }
    // Speeds: GPU contention, CPU starvation, and a shared producer's pace.
    const double cores_wanted = planner.cores_used();
    const double cpu_factor = cores_wanted > opts.planner.cpu_cores ? opts.planner.cpu_cores / cores_wanted : 1.0;
    std::map<int, double> speed;
    for (const auto& [j, p] : planner.placed()) {
      const GpuLoad& load = planner.loads()[p.gpu];
      const double slow = p.mode == Mode::kMig ? 1.0 : CollocationSlowdown(static_cast<int>(load.jobs.size()), load.sm, opts);
      speed[j] = cpu_factor / slow;
    }
    if (opts.planner.sharing) {  // a producer moves at the pace of its slowest reader
      std::map<int, double> pace;
      for (const auto& [j, s] : speed) {
        const int pl = set.jobs[j].pipeline;
        pace[pl] = pace.count(pl) ? std::min(pace[pl], s) : s;
      }
      for (auto& [j, s] : speed) s = pace[set.jobs[j].pipeline];
    }
    // Sampling.
    if (t >= next_sample) {
      double busy_mem = 0, busy_sm = 0;
      for (size_t g = 0; g < gpus.size(); ++g) {
        SimSample s;
        s.t = t;
        s.gpu = static_cast<int>(g);
        s.memory_mib = RealMemoryOn(planner, set, static_cast<int>(g));
        s.sm = std::min(1.0, planner.loads()[g].sm);
        s.cores = cores_wanted;
        s.running = static_cast<int>(planner.loads()[g].jobs.size());
        busy_mem += std::min(1.0, s.memory_mib / gpus[g].memory_mib);
        busy_sm += s.sm;
        r.samples.push_back(s);
      }
      mem_util_sum += busy_mem / gpus.size();
      sm_util_sum += busy_sm / gpus.size();
      cores_sum += cores_wanted;
      ++samples_taken;
      r.peak_cores = std::max(r.peak_cores, cores_wanted);
      next_sample += opts.sample_s;
    }
    // Progress, completions and OOMs at the end of the step.
    t += opts.dt_s;
    std::vector<int> ended;
    for (const auto& [j, s] : speed) {
      SimJob& sj = jobs[j];
      sj.progress_s += opts.dt_s * s;
      if (sj.will_oom && t - sj.started_at >= std::min(opts.oom_after_s, set.jobs[j].duration_s)) {
        ended.push_back(j);
      } else if (sj.progress_s >= set.jobs[j].duration_s) {
        ended.push_back(j);
      }
    }
    for (int j : ended) {
      planner.Release(j);
      SimJob& sj = jobs[j];
      if (sj.will_oom) {
        ++r.ooms;
        set.jobs[j].memory_mib *= opts.oom_growth;
        sj.state = State::kQueued;
        sj.will_oom = false;
        queue.push_back(j);
      } else {
        sj.state = State::kDone;
        sj.finished_at = t;
        ++finished;
        ++r.jobs_done;
      }
    }
  }
  double jct = 0;
  for (int j = 0; j < n; ++j) {
    if (jobs[j].state != State::kDone) continue;
    r.makespan_s = std::max(r.makespan_s, jobs[j].finished_at);
    jct += jobs[j].finished_at - set.jobs[j].arrival_s;
  }
  r.mean_jct_s = r.jobs_done ? jct / r.jobs_done : 0;
  if (samples_taken) {
    r.mean_memory_util = mem_util_sum / samples_taken;
    r.mean_sm_util = sm_util_sum / samples_taken;
    r.mean_cores = cores_sum / samples_taken;
  }
  return r;
}

std::string SimSummaryCsv(const std::vector<SimResult>& runs) {
  std::string out =
      "policy,sharing,makespan_s,mean_jct_s,jobs_done,ooms,impossible,mean_memory_util,mean_sm_util,peak_cores,mean_cores\n";
  char line[256];
  for (const SimResult& r : runs) {
    std::snprintf(line, sizeof(line), "%s,%d,%.0f,%.0f,%d,%d,%d,%.4f,%.4f,%.1f,%.1f\n", r.policy.c_str(), r.sharing ? 1 : 0,
                  r.makespan_s, r.mean_jct_s, r.jobs_done, r.ooms, r.impossible, r.mean_memory_util, r.mean_sm_util,
                  r.peak_cores, r.mean_cores);
    out += line;
  }
  return out;
}

std::string SimTimeseriesCsv(const std::vector<SimResult>& runs) {
  std::string out = "policy,sharing,t_s,gpu,memory_mib,sm,cores,running\n";
  char line[256];
  for (const SimResult& r : runs) {
    for (const SimSample& s : r.samples) {
      std::snprintf(line, sizeof(line), "%s,%d,%.0f,%d,%.0f,%.3f,%.1f,%d\n", r.policy.c_str(), r.sharing ? 1 : 0, s.t,
                    s.gpu, s.memory_mib, s.sm, s.cores, s.running);
      out += line;
    }
  }
  return out;
}

}  // namespace coloader
