#include "placement/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>

#include "common/process.h"
#include "placement/launcher_internal.h"

namespace coloader {

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

bool LooksLikeOom(int exit_code, bool killed_by_us, const std::string& stderr_tail) {
  if (exit_code == 0) return false;
  if (exit_code == 128 + SIGKILL && !killed_by_us) return true;
  return Lower(stderr_tail).find("out of memory") != std::string::npos;
}

namespace internal {

volatile sig_atomic_t g_stop_signal = 0;

namespace {

void OnStopSignal(int sig) { g_stop_signal = sig; }

}  // namespace

std::string FileTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > static_cast<std::streamoff>(max_bytes) ? size - static_cast<std::streamoff>(max_bytes) : 0;
  in.seekg(start);
  std::string out(static_cast<size_t>(size - start), '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  return out;
}

Result<std::unique_ptr<Proc>> Spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                                    const std::string& log_base) {
  if (argv.empty()) return Status::Invalid("empty command");
  auto p = std::make_unique<Proc>();
  p->out_path = log_base + ".out";
  p->err_path = log_base + ".err";
  SpawnArgs spawn(argv, env);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, p->out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, p->err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  const int rc = ::posix_spawnp(&p->pid, argv[0].c_str(), &fa, &attr, spawn.argv(), spawn.envp());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::NotFound("cannot start " + argv[0] + ": " + std::strerror(rc));
  p->start_ns = MonotonicNs();
  Result<ProcessWatch> w = ProcessWatch::Open(p->pid);
  if (!w.ok()) {
    ::kill(p->pid, SIGKILL);
    ::waitpid(p->pid, nullptr, 0);
    return w.status();
  }
  p->watch = std::move(*w);
  return p;
}

std::string Join(const std::vector<int>& v, const char* sep) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : sep) + std::to_string(x);
  return out;
}

void Launcher::Log(const char* fmt, ...) {
  if (opts_.quiet) return;
  va_list ap;
  va_start(ap, fmt);
  std::fputs("[coloader launch] ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
}

std::map<std::string, std::string> Launcher::BaseEnv() const {
  if (!mps_running_) return {};
  return {{"CUDA_MPS_PIPE_DIRECTORY", mps_pipe_}, {"CUDA_MPS_LOG_DIRECTORY", mps_log_}};
}

Status Launcher::StartMps() {
  mps_pipe_ = run_dir_ + "/mps-pipe";
  mps_log_ = run_dir_ + "/mps-log";
  std::filesystem::create_directories(mps_pipe_);
  std::filesystem::create_directories(mps_log_);
  std::map<std::string, std::string> env = {{"CUDA_MPS_PIPE_DIRECTORY", mps_pipe_}, {"CUDA_MPS_LOG_DIRECTORY", mps_log_}};
  // The daemon sees every planned GPU in index order, so that a client's CUDA_VISIBLE_DEVICES
  // (an NVML index) means the same GPU to the MPS server (it remaps what the daemon was given).
  std::vector<int> all;
  for (const Gpu& g : planner_.gpus()) all.push_back(g.index);
  std::sort(all.begin(), all.end());
  env["CUDA_VISIBLE_DEVICES"] = Join(all, ",");
  Result<CommandOutput> r = RunCommand({"nvidia-cuda-mps-control", "-d"}, 30000, env);
  if (!r.ok() || r->exit_code != 0) {
    return Status::IOError("cannot start the MPS control daemon (nvidia-cuda-mps-control -d): " +
                           (r.ok() ? r->err : r.status().message()) + "; run with --no-mps to launch without MPS");
  }
  mps_running_ = true;
  Log("MPS control daemon started (pipes %s)", mps_pipe_.c_str());
  return Status::OK();
}

void Launcher::StopMps() {
  if (!mps_running_) return;
  Result<CommandOutput> r = RunCommand({"/bin/sh", "-c", "echo quit | nvidia-cuda-mps-control"}, 30000, BaseEnv());
  if (!r.ok() || r->exit_code != 0) Log("stopping the MPS daemon failed: %s", r.ok() ? r->err.c_str() : r.status().message().c_str());
  else Log("MPS control daemon stopped");
  mps_running_ = false;
}

Status Launcher::StartJob(const Placement& pl) {
  const int j = pl.job;
  const Job& job = set_.jobs[j];
  LaunchJobReport& rep = reports_[j];
  std::map<std::string, std::string> env = BaseEnv();
  for (const auto& [k, v] : JobEnvironment(set_, planner_, pl)) {
    if (!mps_running_ && k.rfind("CUDA_MPS_", 0) == 0) continue;
    env[k] = v;
  }
  std::vector<std::string> argv = job.command;
  const std::string producer = pl.producer >= 0 ? ProducerName(set_, pl.producer) : "";
  for (auto& a : argv) {
    for (size_t at; (at = a.find("{producer}")) != std::string::npos;) a.replace(at, 10, producer);
  }
  ++rep.attempts;
  rep.gpu = planner_.gpus()[pl.gpu].index;
  rep.mode = ModeName(planner_.ModeOf(pl));
  rep.memory_mib = pl.reserved_mib;
  Attempt run;
  run.gpu = rep.gpu;
  run.mode = pl.mode;
  run.mig_profile = pl.mig_profile;
  run.limit_mib = planner_.MemoryLimitMiB(pl);
  run.start_s = Now();
  Result<std::unique_ptr<Proc>> p = Spawn(argv, env, run_dir_ + "/job-" + job.name + "." + std::to_string(rep.attempts));
  if (!p.ok()) return Status::Invalid("job \"" + job.name + "\": " + p.status().message());
  (*p)->job = j;
  rep.runs.push_back(run);
  GpuClock& clock = clocks_[run.gpu];
  if (clock.running++ == 0) clock.busy_since = run.start_s;
  Log("job %s started (pid %d) on GPU %d, %s, %.0f MiB%s%s", job.name.c_str(), (*p)->pid, rep.gpu, rep.mode.c_str(),
      pl.reserved_mib, producer.empty() ? "" : ", reads ", producer.c_str());
  procs_.push_back(std::move(*p));
  return Status::OK();
}

Status Launcher::PlaceRound() {
  const std::vector<Placement> placed = planner_.PlaceRound(&queue_);
  for (const Placement& p : placed) {
    if (p.producer < 0 || producer_of_.count(p.producer) || ended_[p.job]) continue;
    if (Status st = StartProducer(p.producer); !st.ok()) {
      // Its jobs cannot run: report them failed rather than retrying a broken pipeline forever.
      Log("%s", st.message().c_str());
      for (const Placement& q : placed) {
        if (q.producer != p.producer || ended_[q.job]) continue;
        planner_.Release(q.job);
        MarkFailed(q.job);
      }
      for (int j : std::vector<int>(queue_)) {
        if (set_.jobs[j].pipeline == p.producer && planner_.SharesProducer(j)) {
          queue_.erase(std::find(queue_.begin(), queue_.end(), j));
          MarkFailed(j);
        }
      }
    }
  }
  for (const Placement& p : placed) {
    if (ended_[p.job]) continue;
    if (Status st = StartJob(p); !st.ok()) {
      Log("%s", st.message().c_str());
      planner_.Release(p.job);
      MarkFailed(p.job);
      // Its pipeline's last job may be this one: a --forever producer would otherwise run on with
      // nothing to end it, and the launch with it (found in review).
      StopProducerIfIdle(set_.jobs[p.job].pipeline);
    }
  }
  return Status::OK();
}

// A job, or a producer, that cannot run (or ran and failed): it is done with, and counted.
// `exit_code` is its last exit status, -1 when it never ran.
void Launcher::MarkFailed(int j, int exit_code) {
  reports_[j].outcome = "failed";
  reports_[j].exit_code = exit_code;
  ended_[j] = 1;
  ++summary_.failed;
}

void Launcher::Reap(Proc* p) {
  if (p->pid <= 0) return;
  // A job's children are in its process group: make sure none outlives it. The group is killed
  // while the leader is an unreaped zombie, which keeps its pid (so the group id) from being
  // reused; after wait4 the id could already name someone else's group.
  siginfo_t info{};
  while (::waitid(P_PID, static_cast<id_t>(p->pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  ::kill(-p->pid, SIGKILL);
  int status = 0;
  rusage ru{};
  while (::wait4(p->pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  p->watch = ProcessWatch();  // its pidfd: one per attempt would otherwise stay open for the run
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  const double runtime_s = static_cast<double>(MonotonicNs() - p->start_ns) * 1e-9;
  const bool by_us = p->term_sent || p->kill_sent;
  const pid_t pid = p->pid;
  p->pid = -1;
  if (p->job >= 0) {
    JobEnded(p->job, code, by_us, runtime_s);
  } else {
    summary_.producer_cpu_s += cpu;
    for (auto it = producer_of_.begin(); it != producer_of_.end(); ++it) {
      if (it->second != p) continue;
      if (!by_us) Log("producer %s (pid %d) ended by itself (exit %d)", ProducerName(set_, it->first).c_str(), pid, code);
      planner_.UnlockProducer(it->first);
      producer_of_.erase(it);
      break;
    }
  }
}

void Launcher::JobEnded(int j, int exit_code, bool by_us, double runtime_s) {
  const Job& job = set_.jobs[j];
  LaunchJobReport& rep = reports_[j];
  rep.runtime_s += runtime_s;
  rep.exit_code = exit_code;
  summary_.per_job_loader_cpu_s += job.loader_cores * runtime_s;
  planner_.Release(j);
  const std::string tail = FileTail(run_dir_ + "/job-" + job.name + "." + std::to_string(rep.attempts) + ".err", 8192);
  Attempt& run = rep.runs.back();
  run.end_s = Now();
  GpuClock& clock = clocks_[run.gpu];
  if (--clock.running == 0) clock.busy_s += run.end_s - clock.busy_since;
  if (exit_code == 0) {
    if (clock.alone_s >= 0) clock.alone_s = job.duration_s > 0 ? clock.alone_s + job.duration_s : -1;
    rep.outcome = "done";
    ended_[j] = 1;
    ++summary_.done;
    Log("job %s done in %.1f s", job.name.c_str(), runtime_s);
  } else if (g_stop_signal || by_us) {
    rep.outcome = "stopped";
    ended_[j] = 1;
  } else if (LooksLikeOom(exit_code, by_us, tail)) {
    run.oom = true;
    ++rep.ooms;
    ++summary_.ooms;
    summary_.lost_gpu_s += run.end_s - run.start_s;
    if (planner_.Recover(j, rep.ooms, run, &set_.jobs[j].memory_mib)) {
      ++summary_.retries;
      if (planner_.RunsAlone(j)) {
        Log("job %s ran out of GPU memory (exit %d); requeued to run alone", job.name.c_str(), exit_code);
      } else {
        Log("job %s ran out of GPU memory (exit %d); requeued with %.0f MiB", job.name.c_str(), exit_code,
            set_.jobs[j].memory_mib);
      }
      queue_.push_back(j);
    } else {
      MarkFailed(j, exit_code);
      Log("job %s ran out of GPU memory (exit %d) %s; not retried", job.name.c_str(), exit_code,
          rep.ooms > opts_.planner.recovery.max_ooms ? "more than --max-ooms times"
          : run.mode == Mode::kExclusive           ? "with a GPU of its own"
                                                   : "and no GPU here can hold it");
    }
  } else {
    MarkFailed(j, exit_code);
    Log("job %s failed (exit %d); its log: %s/job-%s.%d.err", job.name.c_str(), exit_code, run_dir_.c_str(),
        job.name.c_str(), rep.attempts);
  }
  StopProducerIfIdle(job.pipeline);
}

// Drops the processes already reaped (nothing points at them any more: producer_of_ forgets a
// producer when it is reaped), so a long run with many attempts does not grow procs_.
void Launcher::PruneReaped() {
  procs_.erase(std::remove_if(procs_.begin(), procs_.end(), [](const auto& p) { return p->pid <= 0; }), procs_.end());
}

bool Launcher::AllEnded() const {
  return std::all_of(ended_.begin(), ended_.end(), [](int e) { return e != 0; });
}

void Launcher::StopAll() {
  // Jobs first (they hold the producers' slots), then producers; SIGKILL whatever outlives the timeout.
  for (int round = 0; round < 2; ++round) {
    const bool producers = round == 1;
    for (auto& p : procs_) {
      if (p->pid <= 0 || (p->job < 0) != producers || p->term_sent) continue;
      ::kill(-p->pid, SIGTERM);
      p->term_sent = true;
    }
    const uint64_t deadline = MonotonicNs() + static_cast<uint64_t>(std::max(0, opts_.stop_timeout_ms)) * 1000000ull;
    for (auto& p : procs_) {
      if (p->pid <= 0 || (p->job < 0) != producers) continue;
      while (!p->watch.Exited() && MonotonicNs() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!p->watch.Exited()) {
        Log("pid %d did not stop within %d ms: SIGKILL", p->pid, opts_.stop_timeout_ms);
        ::kill(-p->pid, SIGKILL);
        p->kill_sent = true;
      }
      Reap(p.get());
    }
  }
}

Result<LaunchSummary> Launcher::Run() {
  t0_ns_ = MonotonicNs();
  run_dir_ = opts_.run_dir;
  if (run_dir_.empty()) {
    char tmpl[] = "/tmp/coloader-launch-XXXXXX";
    if (!::mkdtemp(tmpl)) return Status::FromErrno("mkdtemp /tmp/coloader-launch-XXXXXX", errno);
    run_dir_ = tmpl;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(run_dir_, ec);
    if (ec) return Status::IOError("cannot create the run directory " + run_dir_ + ": " + ec.message());
  }
  summary_.run_dir = run_dir_;
  reports_.resize(set_.jobs.size());
  ended_.assign(set_.jobs.size(), 0);
  for (size_t j = 0; j < set_.jobs.size(); ++j) {
    reports_[j].name = set_.jobs[j].name;
    reports_[j].memory_mib = set_.jobs[j].memory_mib;
    if (!planner_.FitsEmpty(static_cast<int>(j))) {
      reports_[j].outcome = "impossible";
      ended_[j] = 1;
      ++summary_.failed;
      Log("job %s (%.0f MiB) fits no GPU here; not started", set_.jobs[j].name.c_str(), set_.jobs[j].memory_mib);
    } else {
      queue_.push_back(static_cast<int>(j));
    }
  }

  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_stop_signal = 0;

  Status st = opts_.mps ? StartMps() : Status::OK();
  Log("run directory %s; %zu job(s), %zu pipeline(s), policy %s, data sharing %s", run_dir_.c_str(), set_.jobs.size(),
      set_.pipelines.size(), PolicyName(opts_.planner.policy), opts_.planner.sharing ? "on" : "off");
  while (st.ok() && !g_stop_signal) {
    st = PlaceRound();
    if (!st.ok()) break;
    if (!queue_.empty()) UnlockByStoppingProducers();
    if (AllEnded() && std::all_of(procs_.begin(), procs_.end(), [](const auto& p) { return p->pid <= 0; })) break;
    std::vector<pollfd> fds;
    std::vector<Proc*> who;
    for (auto& p : procs_) {
      if (p->pid <= 0) continue;
      fds.push_back({p->watch.fd(), POLLIN, 0});
      who.push_back(p.get());
    }
    if (fds.empty()) {
      // Nothing runs, yet jobs wait: nothing will free room for them.
      for (int j : queue_) {
        MarkFailed(j);
        Log("job %s cannot be placed and nothing runs that could make room", set_.jobs[j].name.c_str());
      }
      queue_.clear();
      continue;
    }
    const int n = ::poll(fds.data(), fds.size(), 500);
    if (n < 0 && errno != EINTR) {
      st = Status::FromErrno("poll", errno);
      break;
    }
    for (size_t k = 0; n > 0 && k < fds.size(); ++k) {
      if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) Reap(who[k]);
    }
    PruneReaped();
  }
  if (g_stop_signal) {
    summary_.stopped = true;
    Log("stopping (signal %d): jobs, producers%s", static_cast<int>(g_stop_signal), mps_running_ ? ", MPS daemon" : "");
  }
  StopAll();
  StopMps();
  for (size_t j = 0; j < reports_.size(); ++j) {
    if (reports_[j].outcome.empty()) reports_[j].outcome = summary_.stopped ? "stopped" : "not started";
    reports_[j].memory_mib = set_.jobs[j].memory_mib;
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (!st.ok()) return st;
  summary_.jobs = reports_;
  summary_.wall_s = Now();
  for (const auto& [gpu, clock] : clocks_) {
    if (clock.alone_s > 0) summary_.speedup[gpu] = CollocationSpeedup(clock.alone_s, clock.busy_s);
  }
  return summary_;
}

}  // namespace internal

Result<LaunchSummary> Launch(const JobSet& set, const std::vector<Gpu>& gpus, const LaunchOptions& opts) {
  internal::Launcher l(set, gpus, opts);
  return l.Run();
}

}  // namespace coloader
