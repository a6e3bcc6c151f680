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
  double oom_growth = 1.5;    // a job that ran out of memory is requeued with its estimate times this
  int max_ooms = 3;           // ... this many times, as `launch --max-ooms`; then it counts as failed
  double oom_after_s = 60;    // an OOM strikes at the first steps' peak: this long after start
  // Calibrated (benchmarks/calibrate_collocation.py) on ResNet-18/50 copies under MPS on an
  // H200, with a job's SM activity = its share of the GPU's throughput alone; docs/PLACEMENT.md.
  double interference = 0.003;  // per extra job on a GPU, fractional slowdown (caches, memory bandwidth)
  double sm_saturation = 1.0;   // combined SM activity beyond which collocated jobs share SMs in proportion
};

struct SimSample {
  double t = 0;
  int gpu = 0;
  double memory_mib = 0;  // what the running jobs and rings really use
  double sm = 0;          // busy fraction of the SMs, min(1, combined activity)
  double cores = 0;       // CPU cores the machine's loaders want at that moment
  int running = 0;
};

struct SimResult {
  std::string policy;
  bool sharing = false;
  double makespan_s = 0;
  double mean_jct_s = 0;
  int jobs_done = 0;
  int ooms = 0;
  int failed = 0;      // ran out of memory more than max_ooms times, or its grown estimate fits no GPU
  int impossible = 0;
  double mean_memory_util = 0;  // over GPUs and time until the makespan
  double mean_sm_util = 0;
  double peak_cores = 0;
  double mean_cores = 0;
  std::vector<SimSample> samples;
};

// The slowdown factor (>= 1) of each job on a GPU running `n` jobs with combined SM activity `sm`.
double CollocationSlowdown(int n, double sm, const SimOptions& o);

Result<SimResult> Simulate(const JobSet& trace, const std::vector<Gpu>& gpus, const SimOptions& opts);

// CSV writers: one row per run; one row per (run, sample).
std::string SimSummaryCsv(const std::vector<SimResult>& runs);
std::string SimTimeseriesCsv(const std::vector<SimResult>& runs);

}  // namespace coloader
