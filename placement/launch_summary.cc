// What `coloader launch` prints when it is done: the summary as a table a person reads and as
// one JSON object (placement/launcher.h).
#include <cstdio>

#include "placement/launcher.h"
#include "toolbox/json.h"

namespace coloader {

std::string LaunchSummaryText(const LaunchSummary& s) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "\n%-20s %-11s %8s %5s %9s %4s %-9s %10s\n", "job", "outcome", "attempts", "OOMs",
                "runtime s", "gpu", "mode", "final MiB");
  out += line;
  for (const LaunchJobReport& j : s.jobs) {
    std::snprintf(line, sizeof(line), "%-20s %-11s %8d %5d %9.1f %4d %-9s %10.0f\n", j.name.c_str(), j.outcome.c_str(),
                  j.attempts, j.ooms, j.runtime_s, j.gpu, j.mode.c_str(), j.memory_mib);
    out += line;
  }
  std::snprintf(
      line, sizeof(line),
      "\n%d job(s) done, %d failed, %d OOM(s) (%d retried, %.1f s of runs lost)%s; %d producer(s); %.1f s wall\n"
      "loading CPU: producers used %.1f core-seconds; per-job loaders would use %.1f "
      "(each job's loader_cores x its runtime)\nlogs: %s\n",
      s.done, s.failed, s.ooms, s.retries, s.lost_gpu_s, s.stopped ? ", stopped by a signal" : "", s.producers_started,
      s.wall_s, s.producer_cpu_s, s.per_job_loader_cpu_s, s.run_dir.c_str());
  out += line;
  if (!s.speedup.empty()) {
    out += "co-location speedup (delta: the jobs' time alone, duration_s, over the GPU's busy time):";
    for (const auto& [gpu, d] : s.speedup) {
      std::snprintf(line, sizeof(line), " GPU %d %.2f", gpu, d);
      out += line;
    }
    out += "\n";
  }
  return out;
}

std::string LaunchSummaryJson(const LaunchSummary& s) {
  JsonWriter w;
  w.BeginObject()
      .Field("done", s.done)
      .Field("failed", s.failed)
      .Field("ooms", s.ooms)
      .Field("retries", s.retries)
      .Field("lost_gpu_s", s.lost_gpu_s)
      .Field("stopped", s.stopped)
      .Field("producers", s.producers_started)
      .Field("producer_cpu_s", s.producer_cpu_s)
      .Field("per_job_loader_cpu_s", s.per_job_loader_cpu_s)
      .Field("wall_s", s.wall_s)
      .Field("run_dir", s.run_dir);
  w.BeginArray("jobs");
  for (const LaunchJobReport& j : s.jobs) {
    w.BeginObject()
        .Field("name", j.name)
        .Field("outcome", j.outcome)
        .Field("exit_code", j.exit_code)
        .Field("attempts", j.attempts)
        .Field("ooms", j.ooms)
        .Field("runtime_s", j.runtime_s)
        .Field("gpu", j.gpu)
        .Field("mode", j.mode)
        .Field("memory_mib", j.memory_mib);
    w.BeginArray("runs");
    for (const Attempt& a : j.runs) {
      w.BeginObject().Field("gpu", a.gpu).Field("mode", ModeName(a.mode));
      if (!a.mig_profile.empty()) w.Field("mig_profile", a.mig_profile);
      w.Field("limit_mib", a.limit_mib).Field("start_s", a.start_s).Field("end_s", a.end_s).Field("oom", a.oom);
      w.EndObject();
    }
    w.EndArray().EndObject();
  }
  w.EndArray();
  w.Key("speedup").BeginObject();
  for (const auto& [gpu, d] : s.speedup) w.Field(std::to_string(gpu).c_str(), d);
  w.EndObject().EndObject();
  return w.str();
}

}  // namespace coloader
