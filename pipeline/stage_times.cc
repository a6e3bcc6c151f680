#include "pipeline/stage_times.h"

#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace coloader {

namespace {
bool EnabledByEnvironment() {
  const char* v = std::getenv("COLOADER_STAGE_TIMES");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}
uint64_t ClockNs(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
}  // namespace

std::array<StageTimes::Slot, static_cast<size_t>(Stage::kCount)> StageTimes::slots_;
std::atomic<bool> StageTimes::enabled_{EnabledByEnvironment()};

const char* StageName(Stage s) {
  switch (s) {
    case Stage::kWorkerRead: return "worker.read";
    case Stage::kWorkerRoute: return "worker.route";
    case Stage::kWorkerCpuTransform: return "worker.cpu_transform";
    case Stage::kWorkerCpuShare: return "worker.cpu_share";
    case Stage::kLaneQueueWait: return "lane.queue_wait";
    case Stage::kLaneRoute: return "lane.nvjpeg_route";
    case Stage::kLaneReserve: return "lane.reserve";
    case Stage::kLaneDecodeInit: return "lane.decode_init";
    case Stage::kLaneDecodeHardware: return "lane.decode_hardware";
    case Stage::kLaneDecodeHybrid: return "lane.decode_hybrid";
    case Stage::kLaneCpuFallback: return "lane.cpu_fallback";
    case Stage::kLaneCopyCpuSamples: return "lane.h2d_cpu_samples";
    case Stage::kLaneResize: return "lane.resize";
    case Stage::kLaneSync: return "lane.sync";
    case Stage::kUploadEnqueue: return "upload.enqueue";
    case Stage::kUploadWaitIdle: return "upload.wait_idle";
    case Stage::kCount: break;
  }
  return "?";
}

void StageTimes::Enable(bool on) { enabled_.store(on, std::memory_order_relaxed); }

void StageTimes::Add(Stage s, uint64_t images, uint64_t wall_ns, uint64_t cpu_ns) {
  Slot& slot = slots_[static_cast<size_t>(s)];
  slot.calls.fetch_add(1, std::memory_order_relaxed);
  slot.images.fetch_add(images, std::memory_order_relaxed);
  slot.wall_ns.fetch_add(wall_ns, std::memory_order_relaxed);
  slot.cpu_ns.fetch_add(cpu_ns, std::memory_order_relaxed);
}

StageTotals StageTimes::Get(Stage s) {
  const Slot& slot = slots_[static_cast<size_t>(s)];
  return {slot.calls.load(std::memory_order_relaxed), slot.images.load(std::memory_order_relaxed),
          slot.wall_ns.load(std::memory_order_relaxed), slot.cpu_ns.load(std::memory_order_relaxed)};
}

void StageTimes::Reset() {
  for (Slot& slot : slots_) {
    slot.calls.store(0, std::memory_order_relaxed);
    slot.images.store(0, std::memory_order_relaxed);
    slot.wall_ns.store(0, std::memory_order_relaxed);
    slot.cpu_ns.store(0, std::memory_order_relaxed);
  }
}

std::string StageTimes::Report() {
  std::string out;
  char line[256];
  for (int i = 0; i < static_cast<int>(Stage::kCount); ++i) {
    const Stage s = static_cast<Stage>(i);
    const StageTotals t = Get(s);
    if (t.calls == 0) continue;
    // Per image of the stage's own images; a stage that saw none (a batch of CPU samples
    // only) is reported per call instead.
    const double per = static_cast<double>(t.images ? t.images : t.calls);
    std::snprintf(line, sizeof(line),
                  "[stage] %-22s calls %9llu images %10llu wall_ms %11.1f cpu_ms %11.1f wall_us/img %8.2f "
                  "cpu_us/img %8.2f\n",
                  StageName(s), static_cast<unsigned long long>(t.calls), static_cast<unsigned long long>(t.images),
                  t.wall_ns / 1e6, t.cpu_ns / 1e6, t.wall_ns / 1e3 / per, t.cpu_ns / 1e3 / per);
    out += line;
  }
  return out;
}

uint64_t StageTimes::ThreadCpuNs() { return ClockNs(CLOCK_THREAD_CPUTIME_ID); }
uint64_t StageTimes::WallNs() { return ClockNs(CLOCK_MONOTONIC); }

}  // namespace coloader
