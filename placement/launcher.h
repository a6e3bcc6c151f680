// `coloader launch`: carries a plan out on this machine. Starts the MPS control daemon (with
// its own pipe and log directories), one producer per shared pipeline, and the jobs with their
// environment; watches every process through a pidfd; requeues a job that ran out of GPU
// memory by the planner's recovery rule (alone, or with a larger estimate); stops everything
// cleanly on SIGINT/SIGTERM; and reports what sharing the loaders saved in CPU time.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "placement/planner.h"

namespace coloader {

struct LaunchOptions {
  PlannerOptions planner;
  bool mps = true;             // run an MPS control daemon (off without a GPU, or by --no-mps)
  std::string run_dir;         // logs and MPS directories; empty: a new directory under /tmp
  std::string coloader_binary; // for the producers; empty: this process's own binary
  int stop_timeout_ms = 10000; // SIGTERM, then SIGKILL after this
  bool quiet = false;
};

struct LaunchJobReport {
  std::string name;
  std::string outcome;  // done, failed, stopped, impossible
  int exit_code = 0;
  int attempts = 0;
  int ooms = 0;
  double runtime_s = 0;      // all attempts
  double memory_mib = 0;     // the final estimate
  int gpu = -1;
  std::string mode;
  std::vector<Attempt> runs;  // each attempt: where, under which limit, when, and whether it ran out of memory
};

struct LaunchSummary {
  std::vector<LaunchJobReport> jobs;
  int done = 0, failed = 0, ooms = 0;
  int retries = 0;                   // OOMs after which the job was queued again (Planner::Recover)
  double lost_gpu_s = 0;             // the run time of attempts that ended in an OOM, summed
  bool stopped = false;              // by a signal
  double producer_cpu_s = 0;         // loading CPU time the producers really used (rusage)
  double per_job_loader_cpu_s = 0;   // sum of each job's loader_cores x its runtime: what per-job loaders would use
  int producers_started = 0;
  double wall_s = 0;
  std::string run_dir;
  // Per GPU index: seed 003's co-location speedup (CollocationSpeedup) of the jobs done there,
  // from their duration_s (time alone); absent for a GPU where a job done states none.
  std::map<int, double> speedup;
};

// Launches `set` on `gpus`. Returns when every job has ended or a stop was requested (then
// everything it started has been stopped). A stop request is SIGINT/SIGTERM to this process.
Result<LaunchSummary> Launch(const JobSet& set, const std::vector<Gpu>& gpus, const LaunchOptions& opts);

std::string LaunchSummaryText(const LaunchSummary& s);
std::string LaunchSummaryJson(const LaunchSummary& s);

// True when a job's end looks like running out of GPU memory: a non-zero exit with "out of
// memory" in the tail of its stderr, or SIGKILL that we did not send (the kernel OOM killer).
bool LooksLikeOom(int exit_code, bool killed_by_us, const std::string& stderr_tail);

}  // namespace coloader
