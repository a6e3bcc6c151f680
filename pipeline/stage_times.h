// Per-stage timers for the producer's data path (issue 16): where the CPU goes and where a
// batch waits. Each stage accumulates calls, images, wall time (steady clock) and the calling
// thread's CPU time (CLOCK_THREAD_CPUTIME_ID): CPU close to wall means the thread worked (or
// spun), CPU far below wall means it slept on something.
//
// Off by default, and then a timer is one relaxed load and a branch. On when the environment
// has COLOADER_STAGE_TIMES=1 (read once) or after StageTimes::Enable: `coloader serve` prints
// the table when it ends, and the collocated benchmark reads it from the producer's log.
// A timed scope costs two clock_gettime pairs (about 1 us in all: the thread CPU clock is a
// system call) and four relaxed atomic adds; stages are per batch or per image, never finer.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace coloader {

enum class Stage : int {
  // Workers, per image.
  kWorkerRead,         // read the whole file (--decode gpu)
  kWorkerRoute,        // JPEG frame scan, crop box, or the CPU decode for what the GPU refuses
  kWorkerCpuTransform, // --decode cpu: read + decode + augment of one image
  kWorkerCpuShare,     // --decode gpu/auto: the same, for an image of the CPU's share of a batch
  // A GPU lane, per batch (images = the batch's GPU samples).
  kLaneQueueWait,      // waiting for a routed batch (idle, not work)
  kLaneRoute,          // nvJPEG header parse + batched-support check of every GPU sample
  kLaneReserve,        // growing the decode arena (cudaMalloc, after a sync)
  kLaneDecodeInit,     // nvjpegDecodeBatchedInitialize (on a batch-size change)
  kLaneDecodeHardware, // nvjpegDecodeBatched, hardware backend
  kLaneDecodeHybrid,   // nvjpegDecodeBatched, GPU hybrid backend
  kLaneCpuFallback,    // CPU decode on the lane of what both backends refused
  kLaneCopyCpuSamples, // H2D copies of the CPU-decoded samples
  kLaneResize,         // task table upload + resize/crop kernel launch
  kLaneSync,           // waiting for the lane's stream (the batch's GPU work)
  // The producer thread, per batch.
  kUploadEnqueue,      // DeviceRing::Upload: copies, normalise kernel, event record
  kUploadWaitIdle,     // DeviceRing::WaitIdle before a slot is refilled
  kCount
};
const char* StageName(Stage s);

struct StageTotals {
  uint64_t calls = 0, images = 0, wall_ns = 0, cpu_ns = 0;
};

class StageTimes {
 public:
  static bool enabled() { return enabled_.load(std::memory_order_relaxed); }
  static void Enable(bool on);
  static void Add(Stage s, uint64_t images, uint64_t wall_ns, uint64_t cpu_ns);
  static StageTotals Get(Stage s);
  static void Reset();
  // One line per stage that was called: name, calls, images, wall ms, CPU ms, and wall and
  // CPU microseconds per image. Lines start with "[stage]" so a log can be grepped for them.
  static std::string Report();

  static uint64_t ThreadCpuNs();
  static uint64_t WallNs();

 private:
  struct Slot {
    std::atomic<uint64_t> calls{0}, images{0}, wall_ns{0}, cpu_ns{0};
  };
  static std::array<Slot, static_cast<size_t>(Stage::kCount)> slots_;
  static std::atomic<bool> enabled_;
};

// Times its scope into `stage` when the timers are on. `images` may be set before it ends
// (a lane knows its batch's GPU count only after routing).
class ScopedStage {
 public:
  explicit ScopedStage(Stage s, uint64_t images = 1) : stage_(s), images_(images), on_(StageTimes::enabled()) {
    if (on_) {
      wall0_ = StageTimes::WallNs();
      cpu0_ = StageTimes::ThreadCpuNs();
    }
  }
  ~ScopedStage() { Stop(); }
  ScopedStage(const ScopedStage&) = delete;
  ScopedStage& operator=(const ScopedStage&) = delete;
  void set_images(uint64_t n) { images_ = n; }
  // Ends the measurement early (the destructor then does nothing).
  void Stop() {
    if (!on_) return;
    on_ = false;
    const uint64_t cpu1 = StageTimes::ThreadCpuNs();
    const uint64_t wall1 = StageTimes::WallNs();
    StageTimes::Add(stage_, images_, wall1 - wall0_, cpu1 - cpu0_);
  }

 private:
  Stage stage_;
  uint64_t images_;
  bool on_;
  uint64_t wall0_ = 0, cpu0_ = 0;
};

}  // namespace coloader
