// `coloader launch`'s state, shared by the files that implement it (private to placement/):
//   launcher.cc         the main loop, the MPS daemon, the jobs (start, reap, recover from an OOM),
//                       stopping everything
//   launch_producers.cc the producers: started where the plan puts them, stopped once idle
//   launch_summary.cc   the summary as a table and as JSON (needs only launcher.h)
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/process.h"
#include "placement/launcher.h"

namespace coloader {
namespace internal {

// The signal (SIGINT, SIGTERM) that asked the launch to stop; 0 while none has.
extern volatile sig_atomic_t g_stop_signal;

// The last `max_bytes` of a file; empty when it cannot be read.
std::string FileTail(const std::string& path, size_t max_bytes);

// One child process: its own process group (so a job's children stop with it), stdout and
// stderr in files under the run directory, and a pidfd that the main loop polls.
struct Proc {
  pid_t pid = -1;
  ProcessWatch watch;
  int job = -1;       // or -1 for a producer
  int pipeline = -1;  // for a producer
  uint64_t start_ns = 0;
  bool term_sent = false, kill_sent = false;
  std::string out_path, err_path;
};

// Starts argv with `env` added to this process's environment, its output in log_base.out and
// log_base.err.
Result<std::unique_ptr<Proc>> Spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                                    const std::string& log_base);

// The numbers, separated by `sep`.
std::string Join(const std::vector<int>& v, const char* sep);

class Launcher {
 public:
  Launcher(const JobSet& set, const std::vector<Gpu>& gpus, const LaunchOptions& opts)
      : set_(set), opts_(opts), planner_(opts.planner, gpus, &set_) {}

  Result<LaunchSummary> Run();

 private:
  void Log(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  Status StartMps();
  void StopMps();
  Status PlaceRound();
  Status StartProducer(int pipeline);
  Status StartJob(const Placement& p);
  void Reap(Proc* p);
  void MarkFailed(int j, int exit_code = -1);
  void PruneReaped();
  void JobEnded(int j, int exit_code, bool signalled_by_us, double runtime_s);
  void StopProducerIfIdle(int pipeline);
  void UnlockByStoppingProducers();
  void StopAll();
  std::map<std::string, std::string> BaseEnv() const;
  bool AllEnded() const;

  JobSet set_;
  LaunchOptions opts_;
  Planner planner_;
  std::string run_dir_, mps_pipe_, mps_log_;
  bool mps_running_ = false;
  std::vector<int> queue_;
  std::vector<std::unique_ptr<Proc>> procs_;
  std::map<int, Proc*> producer_of_;  // pipeline -> its running producer
  std::vector<LaunchJobReport> reports_;
  std::vector<int> ended_;            // 1 when a job is done, failed or impossible
  LaunchSummary summary_;
  uint64_t t0_ns_ = 0;
  // Per GPU index: jobs running, since when it is busy, seconds busy, and the time alone of
  // the jobs done there (-1 once one of them does not state it).
  struct GpuClock {
    int running = 0;
    double busy_since = 0, busy_s = 0, alone_s = 0;
  };
  std::map<int, GpuClock> clocks_;
  double Now() const { return static_cast<double>(MonotonicNs() - t0_ns_) * 1e-9; }
};

}  // namespace internal
}  // namespace coloader
