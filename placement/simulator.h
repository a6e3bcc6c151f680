// A trace-driven simulator of a shared GPU machine: replays jobs (arrival, run time alone,
// real and estimated memory, SM activity, loader cores) through the Planner - the same code
// that `plan` and `launch` use - and a stated model of how collocated jobs slow each other
// down and when they run out of memory (docs/PLACEMENT.md, "The simulator's model").
#pragma once

#include <string>
#include <vector>

#include "placement/planner.h"

namespace coloader {

struct SimOptions {
  PlannerOptions planner;
  double dt_s = 5;            // time step
  double sample_s = 60;       // utilisation sampling period
  // A job runs out of memory when what it really uses passes its limit where it is placed
  // (Planner::MemoryLimitMiB, the MPS limit launch gives it); planner.recovery says what then.
  double oom_after_s = 60;    // an OOM strikes at the first steps' peak: this long after start
  // Collocated jobs slow each other down as planner.model says.
};

struct SimSample {
  double t = 0;
  int gpu = 0;
  double memory_mib = 0;  // what the running jobs and rings really use
  double sm = 0;          // busy fraction of the SMs, min(1, combined activity)
  double cores = 0;       // CPU cores the machine's loaders want at that moment
  int running = 0;
};

struct SimJobReport {
  std::string name;
  std::string outcome;  // done, failed, impossible (as launch reports them)
  std::string why;      // impossible: why no GPU can hold it (WhyItCannotRun)
  std::vector<Attempt> runs;
};

struct SimResult {
  std::string policy;
  bool sharing = false;
  double makespan_s = 0;
  double mean_jct_s = 0;
  int jobs_done = 0;
  int ooms = 0;
  int pressure_ooms = 0;  // of which jobs within their limits, on a GPU neighbours had filled (real pressure)
  int retries = 0;        // OOMs after which the job was queued again (Planner::Recover)
  double lost_gpu_s = 0;  // the run time of attempts that ended in an OOM, summed over attempts
  int failed = 0;      // ran out of memory more than max_ooms times, or no GPU can hold it any more
  int impossible = 0;
  double mean_memory_util = 0;  // over GPUs and time until the makespan
  double mean_sm_util = 0;
  double peak_cores = 0;
  double mean_cores = 0;
  std::vector<double> speedup;  // per GPU: CollocationSpeedup of the jobs finished on it
  double mean_speedup = 0;      // over the GPUs that ran anything
  std::vector<SimJobReport> jobs;
  std::vector<SimSample> samples;
};

Result<SimResult> Simulate(const JobSet& trace, const std::vector<Gpu>& gpus, const SimOptions& opts);

// CSV writers: one row per run; one row per (run, sample); one row per (run, job, attempt):
// where each attempt ran, under which limit, from when to when, and whether it ran out of
// memory (launch's --json "runs", for the simulator).
std::string SimSummaryCsv(const std::vector<SimResult>& runs);
std::string SimTimeseriesCsv(const std::vector<SimResult>& runs);
std::string SimAttemptsCsv(const std::vector<SimResult>& runs);

}  // namespace coloader
