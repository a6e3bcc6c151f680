#include "placement/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>

namespace coloader {

namespace {

enum class State { kPending, kQueued, kRunning, kDone, kImpossible, kFailed };

struct SimJob {
  State state = State::kPending;
  double progress_s = 0;  // seconds of work done (at speed 1 = alone on a GPU)
  double started_at = 0;
  double finished_at = 0;
  bool will_oom = false;
  int ooms = 0;
};

double ActualMemory(const Job& j) { return j.actual_memory_mib > 0 ? j.actual_memory_mib : j.memory_mib; }

// What really runs on GPU g: producers, the jobs' actual memory, and their consumers' own buffers.
double RealMemoryOn(const Planner& planner, const JobSet& set, int g) {
  double mib = planner.loads()[g].producer_mib;
  for (int k : planner.loads()[g].jobs) mib += ActualMemory(set.jobs[k]) + planner.placed().at(k).client_mib;
  return mib;
}

// One run of the trace: the state of every job and GPU, advanced by dt_s a step.
class Simulation {
 public:
  Simulation(const JobSet& trace, const std::vector<Gpu>& gpus, const SimOptions& opts)
      : gpus_(gpus),
        opts_(opts),
        set_(trace),
        planner_(opts.planner, gpus, &set_),
        jobs_(set_.jobs.size()),
        alone_s_(gpus.size(), 0.0),
        busy_s_(gpus.size(), 0.0) {
    r_.policy = PolicyName(opts.planner.policy);
    r_.sharing = opts.planner.sharing;
    r_.jobs.resize(set_.jobs.size());
    for (size_t j = 0; j < set_.jobs.size(); ++j) r_.jobs[j].name = set_.jobs[j].name;
    arrival_order_.resize(set_.jobs.size());
    std::iota(arrival_order_.begin(), arrival_order_.end(), 0);
    std::stable_sort(arrival_order_.begin(), arrival_order_.end(),
                     [this](int a, int b) { return set_.jobs[a].arrival_s < set_.jobs[b].arrival_s; });
  }
  Simulation(const Simulation&) = delete;  // the planner holds a pointer to set_
  Simulation& operator=(const Simulation&) = delete;

  Result<SimResult> Run() {
    const double kMaxTime = 3600.0 * 24 * 60;
    const int n = static_cast<int>(jobs_.size());
    while (finished_ < n) {
      if (t_ > kMaxTime) return Status::Internal("not finished after 60 simulated days (a job that never fits?)");
      Arrive();
      Place();
      const double cores_wanted = planner_.cores_used();
      const std::map<int, double> speed = Speeds(cores_wanted);
      if (t_ >= next_sample_) Sample(cores_wanted);
      Advance(speed);
    }
    return Summary();
  }

 private:
  // Jobs whose arrival time has come join the queue, or are impossible on any GPU.
  void Arrive() {
    for (; next_arrival_ < arrival_order_.size(); ++next_arrival_) {
      const int j = arrival_order_[next_arrival_];
      if (set_.jobs[j].arrival_s > t_) break;
      if (!planner_.FitsEmpty(j)) {
        r_.jobs[j].outcome = "impossible";
        r_.jobs[j].why = WhyItCannotRun(set_, planner_.gpus(), opts_.planner, j);
        jobs_[j].state = State::kImpossible;
        ++r_.impossible;
        ++finished_;
        continue;
      }
      jobs_[j].state = State::kQueued;
      queue_.push_back(j);
      queue_changed_ = true;
    }
  }

  // Placement, in queue order; FIFO, and the recovery queue, let nothing overtake a waiting job.
  // Only when something arrived or ended since the last look: nothing else changes the answer.
  void Place() {
    if (!queue_changed_) return;
    queue_changed_ = false;
    const std::vector<Placement> placed = planner_.PlaceRound(&queue_);
    // What really runs on each GPU before this round's jobs allocate: the rings (this round's
    // too: a producer allocates before its consumers) and the jobs already running, each up to
    // its limit (past it its allocations fail).
    std::set<int> fresh;
    for (const Placement& p : placed) fresh.insert(p.job);
    std::vector<double> real(gpus_.size());
    for (size_t g = 0; g < gpus_.size(); ++g) {
      real[g] = planner_.loads()[g].producer_mib;
      for (int k : planner_.loads()[g].jobs) {
        if (fresh.count(k)) continue;
        const Placement& q = planner_.placed().at(k);
        real[g] += std::min(ActualMemory(set_.jobs[k]) + q.client_mib, planner_.MemoryLimitMiB(q));
      }
    }
    for (const Placement& p : placed) {
      const int j = p.job;
      SimJob& sj = jobs_[j];
      sj.state = State::kRunning;
      sj.started_at = t_;
      sj.progress_s = 0;
      // The job's limit where it is placed, as launch sets it: past it, this job fails. So does
      // a job whose GPU has no memory left for what it really needs, though within its limit
      // (neighbours using their headroom: real pressure), except on a MIG instance of its own.
      const double limit = planner_.MemoryLimitMiB(p);
      const double need = ActualMemory(set_.jobs[j]) + p.client_mib;
      const double room = std::max(0.0, gpus_[p.gpu].memory_mib - real[p.gpu]);
      const bool pressed = p.mode != Mode::kMig && real[p.gpu] + need > gpus_[p.gpu].memory_mib + 1e-6;
      // Past its limit, or past what is free, a job's allocations fail: it holds no more than that.
      real[p.gpu] += p.mode == Mode::kMig ? std::min(need, limit) : std::min({need, limit, room});
      sj.will_oom = need > limit || pressed;
      if (pressed && need <= limit) ++r_.pressure_ooms;
      Attempt a;
      a.gpu = gpus_[p.gpu].index;
      a.mode = p.mode;
      a.mig_profile = p.mig_profile;
      a.limit_mib = limit;
      a.start_s = t_;
      r_.jobs[j].runs.push_back(a);
    }
  }

  // Each running job's speed: GPU contention, CPU starvation, and a shared producer's pace.
  std::map<int, double> Speeds(double cores_wanted) const {
    const double cpu_factor = cores_wanted > opts_.planner.cpu_cores ? opts_.planner.cpu_cores / cores_wanted : 1.0;
    std::map<int, double> speed;
    for (const auto& [j, p] : planner_.placed()) {
      const GpuLoad& load = planner_.loads()[p.gpu];
      speed[j] = cpu_factor * (p.mode == Mode::kMig ? MigSpeed(j, p)
                                                    : 1.0 / opts_.planner.model.Slowdown(static_cast<int>(load.jobs.size()), load.sm));
    }
    if (opts_.planner.sharing) HoldToTheSlowestReader(&speed);
    return speed;
  }

  // A producer moves at the pace of its slowest reader: a faster one waits for it (within the
  // window), so every reader of a pipeline goes no faster than that reader's samples/s. Where
  // every reader of the pipeline states `samples`, paces are compared in samples/s (a job's
  // samples / duration_s alone, times its speed): a ResNet-18 beside a ViT-B/16 on one pipeline
  // runs at the ViT's samples/s, a fraction of its own speed. Otherwise they are compared as
  // fractions of each job's speed alone, which is right only for readers of equal pace.
  void HoldToTheSlowestReader(std::map<int, double>* speed) const {
    auto alone_rate = [this](int j) { return set_.jobs[j].samples / set_.jobs[j].duration_s; };
    // A job with a loader of its own (Planner::SharesProducer) reads no producer.
    auto producer = [this](int j) { return planner_.placed().at(j).producer; };
    std::map<int, bool> in_samples;  // producer -> every reader states its samples
    for (const auto& [j, s] : *speed) {
      const int pl = producer(j);
      if (pl < 0) continue;
      in_samples[pl] = (in_samples.count(pl) ? in_samples[pl] : true) && set_.jobs[j].samples > 0;
    }
    std::map<int, double> pace;  // producer -> its slowest reader's samples/s, or speed
    for (const auto& [j, s] : *speed) {
      const int pl = producer(j);
      if (pl < 0) continue;
      const double rate = in_samples[pl] ? s * alone_rate(j) : s;
      pace[pl] = pace.count(pl) ? std::min(pace[pl], rate) : rate;
    }
    for (auto& [j, s] : *speed) {
      const int pl = producer(j);
      if (pl >= 0) s = std::min(s, in_samples[pl] ? pace[pl] / alone_rate(j) : pace[pl]);
    }
  }

  // A MIG instance is not slowed by its neighbours, but by its size (CollocationModel::MigSpeed).
  double MigSpeed(int j, const Placement& p) const {
    const Gpu& gpu = gpus_[p.gpu];
    for (const MigProfile& m : gpu.mig_profiles) {
      if (m.name == p.mig_profile) return opts_.planner.model.MigSpeed(SmShareOf(m, gpu), planner_.SmOf(j));
    }
    return 1.0;
  }

  void Sample(double cores_wanted) {
    double busy_mem = 0, busy_sm = 0;
    for (size_t g = 0; g < gpus_.size(); ++g) {
      SimSample s;
      s.t = t_;
      s.gpu = static_cast<int>(g);
      s.memory_mib = RealMemoryOn(planner_, set_, static_cast<int>(g));
      s.sm = std::min(1.0, planner_.loads()[g].sm);
      s.cores = cores_wanted;
      s.running = static_cast<int>(planner_.loads()[g].jobs.size());
      busy_mem += std::min(1.0, s.memory_mib / gpus_[g].memory_mib);
      busy_sm += s.sm;
      r_.samples.push_back(s);
    }
    mem_util_sum_ += busy_mem / gpus_.size();
    sm_util_sum_ += busy_sm / gpus_.size();
    cores_sum_ += cores_wanted;
    ++samples_taken_;
    r_.peak_cores = std::max(r_.peak_cores, cores_wanted);
    next_sample_ += opts_.sample_s;
  }

  // Progress, completions and OOMs at the end of the step; an OOM'd job recovers by the
  // planner's rule (Planner::Recover), as in launch.
  void Advance(const std::map<int, double>& speed) {
    for (size_t g = 0; g < gpus_.size(); ++g) {
      if (!planner_.loads()[g].jobs.empty()) busy_s_[g] += opts_.dt_s;
    }
    t_ += opts_.dt_s;
    std::vector<int> ended;
    for (const auto& [j, s] : speed) {
      SimJob& sj = jobs_[j];
      sj.progress_s += opts_.dt_s * s;
      if (sj.will_oom && t_ - sj.started_at >= std::min(opts_.oom_after_s, set_.jobs[j].duration_s)) {
        ended.push_back(j);
      } else if (sj.progress_s >= set_.jobs[j].duration_s) {
        ended.push_back(j);
      }
    }
    if (!ended.empty()) queue_changed_ = true;
    for (int j : ended) {
      const int g = planner_.placed().at(j).gpu;
      planner_.Release(j);
      SimJob& sj = jobs_[j];
      Attempt& run = r_.jobs[j].runs.back();
      run.end_s = t_;
      run.oom = sj.will_oom;
      if (sj.will_oom) {
        ++r_.ooms;
        r_.lost_gpu_s += run.end_s - run.start_s;
        sj.will_oom = false;
        if (planner_.Recover(j, ++sj.ooms, run, &set_.jobs[j].memory_mib)) {
          ++r_.retries;
          sj.state = State::kQueued;
          queue_.push_back(j);
        } else {
          sj.state = State::kFailed;
          r_.jobs[j].outcome = "failed";
          ++finished_;
          ++r_.failed;
        }
      } else {
        sj.state = State::kDone;
        sj.finished_at = t_;
        r_.jobs[j].outcome = "done";
        alone_s_[g] += set_.jobs[j].duration_s;
        ++finished_;
        ++r_.jobs_done;
      }
    }
  }

  SimResult Summary() {
    double jct = 0;
    for (size_t j = 0; j < jobs_.size(); ++j) {
      if (jobs_[j].state != State::kDone) continue;
      r_.makespan_s = std::max(r_.makespan_s, jobs_[j].finished_at);
      jct += jobs_[j].finished_at - set_.jobs[j].arrival_s;
    }
    r_.mean_jct_s = r_.jobs_done ? jct / r_.jobs_done : 0;
    int busy_gpus = 0;
    for (size_t g = 0; g < gpus_.size(); ++g) {
      r_.speedup.push_back(CollocationSpeedup(alone_s_[g], busy_s_[g]));
      if (alone_s_[g] > 0) {  // as launch: GPUs where a job finished
        r_.mean_speedup += r_.speedup.back();
        ++busy_gpus;
      }
    }
    if (busy_gpus) r_.mean_speedup /= busy_gpus;
    if (samples_taken_) {
      r_.mean_memory_util = mem_util_sum_ / samples_taken_;
      r_.mean_sm_util = sm_util_sum_ / samples_taken_;
      r_.mean_cores = cores_sum_ / samples_taken_;
    }
    return r_;
  }

  const std::vector<Gpu>& gpus_;
  const SimOptions& opts_;
  JobSet set_;  // OOM requeues raise estimates in this copy
  Planner planner_;
  std::vector<SimJob> jobs_;
  SimResult r_;
  std::vector<int> queue_;
  bool queue_changed_ = false;      // a job arrived or ended since Place last looked
  std::vector<int> arrival_order_;  // jobs by arrival_s; those before next_arrival_ have arrived
  size_t next_arrival_ = 0;
  double t_ = 0, next_sample_ = 0;
  int finished_ = 0;
  double mem_util_sum_ = 0, sm_util_sum_ = 0, cores_sum_ = 0;
  long samples_taken_ = 0;
  std::vector<double> alone_s_, busy_s_;  // per GPU: finished jobs' seconds alone; seconds busy
};

}  // namespace

Result<SimResult> Simulate(const JobSet& trace, const std::vector<Gpu>& gpus, const SimOptions& opts) {
  if (gpus.empty()) return Status::Invalid("no GPUs (give --gpus N or \"gpus\" in the trace)");
  for (const Job& j : trace.jobs) {
    if (!(j.duration_s > 0)) return Status::Invalid("job \"" + j.name + "\" has no duration_s (seconds alone on a GPU)");
    if (j.memory_auto) return Status::Invalid("job \"" + j.name + "\" has memory_mib \"auto\"; a trace states the estimate");
  }
  Simulation sim(trace, gpus, opts);
  return sim.Run();
}

std::string SimSummaryCsv(const std::vector<SimResult>& runs) {
  std::string out =
      "policy,sharing,makespan_s,mean_jct_s,jobs_done,ooms,impossible,mean_memory_util,mean_sm_util,peak_cores,"
      "mean_cores,failed,mean_speedup,retries,pressure_ooms,lost_gpu_s\n";
  char line[320];
  for (const SimResult& r : runs) {
    std::snprintf(line, sizeof(line), "%s,%d,%.0f,%.0f,%d,%d,%d,%.4f,%.4f,%.1f,%.1f,%d,%.3f,%d,%d,%.0f\n",
                  r.policy.c_str(), r.sharing ? 1 : 0, r.makespan_s, r.mean_jct_s, r.jobs_done, r.ooms, r.impossible,
                  r.mean_memory_util, r.mean_sm_util, r.peak_cores, r.mean_cores, r.failed, r.mean_speedup, r.retries,
                  r.pressure_ooms, r.lost_gpu_s);
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

namespace {

// A CSV field as RFC 4180 has it: quoted where it holds a comma, a quote or a line break.
std::string CsvField(const std::string& v) {
  if (v.find_first_of(",\"\r\n") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

std::string SimAttemptsCsv(const std::vector<SimResult>& runs) {
  std::string out = "policy,sharing,job,outcome,attempt,gpu,mode,mig_profile,limit_mib,start_s,end_s,oom\n";
  char tail[160];
  for (const SimResult& r : runs) {
    for (const SimJobReport& j : r.jobs) {
      for (size_t a = 0; a < j.runs.size(); ++a) {
        const Attempt& t = j.runs[a];
        std::snprintf(tail, sizeof(tail), ",%zu,%d,%s,%s,%.0f,%.1f,%.1f,%d\n", a + 1, t.gpu, ModeName(t.mode),
                      CsvField(t.mig_profile).c_str(), t.limit_mib, t.start_s, t.end_s, t.oom ? 1 : 0);
        out += r.policy + "," + (r.sharing ? "1" : "0") + "," + CsvField(j.name) + "," + j.outcome + tail;
      }
    }
  }
  return out;
}

}  // namespace coloader
