// `coloader launch`'s producers: one started per shared pipeline where the plan puts it (its
// GPUs, where it decodes), and stopped once its jobs are done or its lock keeps waiting jobs out.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "placement/launcher_internal.h"

namespace coloader {
namespace internal {

namespace {

std::string SelfBinary() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "coloader" : path.string();
}

}  // namespace

Status Launcher::StartProducer(int pipeline) {
  const JobPipeline& pl = set_.pipelines[pipeline];
  const std::string name = ProducerName(set_, pipeline);
  std::vector<std::string> argv = {opts_.coloader_binary.empty() ? SelfBinary() : opts_.coloader_binary,
                                   "serve", "--data", pl.data, "--name", name, "--augment", pl.augment,
                                   "--image-size", std::to_string(pl.image_size), "--output", pl.output,
                                   "--seed", std::to_string(pl.seed), "--batch-size", std::to_string(pl.producer_batch),
                                   "--window", std::to_string(pl.window), "--forever", "--quiet"};
  std::map<std::string, std::string> env = BaseEnv();
  const std::set<int> gpus = planner_.ProducerGpus(pipeline);
  std::vector<int> physical;
  for (int g : gpus) physical.push_back(planner_.gpus()[g].index);
  if (!physical.empty()) {
    // The producer sees exactly its GPUs, as cuda:0..k-1; consumers find a ring by GPU UUID.
    env["CUDA_VISIBLE_DEVICES"] = Join(physical, ",");
    std::string device;
    for (size_t k = 0; k < physical.size(); ++k) device += (k ? ",cuda:" : "cuda:") + std::to_string(k);
    argv.push_back("--device");
    argv.push_back(device);
  }
  // Where it decodes is the plan's (Planner::DecodeOf): on its ring's GPUs, on a MIG instance of
  // its own when its jobs read host memory, or --decode cpu (also where --decode gpu would fail
  // for want of a --device).
  const ProducerDecode decode = planner_.DecodeOf(pipeline);
  // serve's own default is auto (the CPU without --device): the flag goes where the plan differs
  // from what serve would do anyway, so a pipeline's --cpu-share stays valid wherever it was.
  std::vector<std::string> serve_args = pl.serve_args;
  if (decode.decode != "auto" && !(decode.decode == "cpu" && pl.decode == "auto")) {
    argv.push_back("--decode");
    argv.push_back(decode.decode);
  }
  if (decode.decode == "cpu" && pl.decode == "gpu") {
    // decode gpu that found no place for it: the CPU decodes all, and serve refuses a split of
    // batches it does not split.
    for (size_t k = 0; k < serve_args.size();) {
      const bool joined = serve_args[k].rfind("--cpu-share=", 0) == 0;
      if (serve_args[k] != "--cpu-share" && !joined) {
        ++k;
        continue;
      }
      const size_t n = joined || k + 1 == serve_args.size() ? 1 : 2;
      Log("producer %s: dropped %s from serve_args: it decodes on the CPU (%s)", name.c_str(),
          (serve_args[k] + (n == 2 ? " " + serve_args[k + 1] : "")).c_str(), decode.why.c_str());
      serve_args.erase(serve_args.begin() + static_cast<long>(k), serve_args.begin() + static_cast<long>(k + n));
    }
  }
  std::string decodes_on;
  if (!decode.mig_profile.empty()) {
    // Like a job's instance (JobEnvironment): the GPU and the profile; the instance itself is not
    // created here (docs/PLACEMENT.md, "Not done"). Its ring lives in the instance's memory,
    // which the plan reserved; its consumers read host memory as before.
    const int index = planner_.gpus()[decode.gpu].index;
    env["CUDA_VISIBLE_DEVICES"] = std::to_string(index);
    env["COLOADER_MIG_PROFILE"] = decode.mig_profile;
    argv.push_back("--device");
    argv.push_back("cuda:0");
    decodes_on = ", decodes on GPU " + std::to_string(index) + " MIG " + decode.mig_profile;
  } else if (decode.decode == "cpu" && pl.decode != "cpu") {
    decodes_on = ", decodes on the CPU: " + decode.why;
  }
  for (const auto& a : serve_args) argv.push_back(a);
  COLOADER_ASSIGN_OR_RETURN(std::unique_ptr<Proc> p, Spawn(argv, env, run_dir_ + "/producer-" + name));
  p->pipeline = pipeline;
  Proc* raw = p.get();
  procs_.push_back(std::move(p));
  ++summary_.producers_started;
  Log("producer %s started (pid %d, %s%s)", name.c_str(), raw->pid,
      physical.empty() ? "host memory" : ("GPU " + Join(physical, ",")).c_str(), decodes_on.c_str());
  // Jobs start once it serves: wait for its readiness line, or its early end.
  const uint64_t deadline = MonotonicNs() + 120ull * 1000000000ull;
  while (FileTail(raw->err_path, 1 << 16).find("serving") == std::string::npos) {
    if (raw->watch.Exited() || MonotonicNs() > deadline || g_stop_signal) {
      const std::string tail = FileTail(raw->err_path, 2000);
      if (!raw->watch.Exited()) ::kill(-raw->pid, SIGKILL);
      Reap(raw);
      return Status::IOError("producer " + name + " for " + pl.data + " did not start: " +
                             (tail.empty() ? std::string("no output") : tail));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  producer_of_[pipeline] = raw;
  planner_.LockProducer(pipeline);
  return Status::OK();
}

void Launcher::StopProducerIfIdle(int pipeline) {
  auto it = producer_of_.find(pipeline);
  if (it == producer_of_.end() || !opts_.planner.sharing) return;
  for (size_t k = 0; k < set_.jobs.size(); ++k) {
    if (set_.jobs[k].pipeline != pipeline || ended_[k]) continue;
    // A reader running or queued still needs it; a job of the pipeline with its own loader
    // (Planner::SharesProducer) does not, and the planner no longer counts the ring once its
    // last reader is released: left running, the ring would sit where that job may be placed.
    auto placed = planner_.placed().find(static_cast<int>(k));
    if (placed != planner_.placed().end() ? placed->second.producer == pipeline
                                          : planner_.SharesProducer(static_cast<int>(k)))
      return;
  }
  if (!it->second->term_sent) {
    ::kill(it->second->pid, SIGTERM);
    it->second->term_sent = true;
  }
}

// Jobs wait and none runs, so nothing will free room for them but the producers' locks: a
// running producer keeps its jobs on its GPUs (Planner::LockProducer), and a job requeued after
// an OOM may now fit only elsewhere. Stop the producers; once reaped they are unlocked, and the
// next round places what waits wherever it fits, starting a producer there (or, if nothing fits,
// fails it as the main loop does when nothing runs). On the host path only a MIG decoder's
// instance is locked (Planner::LockProducer); stopping every producer frees that too.
void Launcher::UnlockByStoppingProducers() {
  for (auto& p : procs_) {
    if (p->pid > 0 && p->job >= 0) return;  // a job runs: it will free room when it ends
  }
  for (auto& [pipeline, proc] : producer_of_) {
    if (proc->term_sent) continue;
    Log("no job runs and %zu wait: stopping producer %s so that its jobs may go to other GPUs", queue_.size(),
        ProducerName(set_, pipeline).c_str());
    ::kill(proc->pid, SIGTERM);
    proc->term_sent = true;
  }
}

}  // namespace internal
}  // namespace coloader
