// How much of each batch the CPU workers decode beside a GPU's JPEG engines (`--cpu-share`,
// issue 24). The engines of one GPU give a fixed rate (an MPS client of an H200 gets ~8.5-9k
// images/s); one ResNet-18 job asks for ~12k, four jobs for less than the engines give. A fixed
// share is wrong as soon as the model, the number of jobs or the data changes, so by default the
// share follows what the producer measures as it runs:
//
//  - the lane's load: of each cycle of a decoding GPU's lane (waiting for its next batch, then
//    finishing it), the part it was busy. The engines work only while a lane is busy, so that
//    is their load. A lane that waits had nothing to do: the ring was full (consumers are
//    slower than the engines) or the workers were behind (they have too much to decode). Both
//    mean fewer samples for the CPU. A lane that finds its next batch already waiting is the
//    bottleneck: consumers wait for batches, and the CPU takes more.
//  - the rates behind the cap: the workers' time per sample they decode against the lanes'
//    time per sample the engines decode, so that the CPU is never given more than it can
//    finish while the engines finish the rest (the balance point, beyond which adding to the
//    CPU slows the batch down).
//
// The share aims at the engines busy `target_load` of the time (0.85): the lane's time per batch
// varies, and at a mean load of 0.95 two ResNet-18 jobs on an H200 got 0.96 of their ceiling where
// the CPU path gave 0.99 (docs/GPU_DECODE.md); a load nearer 1 would also leave no idle time to
// tell "enough" from "not enough" by. Each batch's CPU samples are its
// last positions (a function of the count only), so a fixed share gives bitwise-repeatable
// epochs; an adaptive one decides which decoder takes which sample by timing.
//
// No GPU and no clock here: the pipeline reports what each batch measured (Observe) and asks
// how many of the next batch's samples go to the CPU (CpuCount). Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "common/status.h"

namespace coloader {

// `--cpu-share`: "auto" follows demand; a number in [0, 1] fixes the share of every batch.
struct CpuShare {
  bool adaptive = true;
  double fixed = 0;  // when not adaptive
};
Result<CpuShare> ParseCpuShare(const std::string& s);
std::string CpuShareName(const CpuShare& s);  // "auto" or "0.25"

// What one batch measured, reported when its lane has finished it.
struct SplitMeasure {
  uint32_t samples = 0;       // the batch's size
  uint32_t cpu = 0;           // its samples the split gave the workers
  uint32_t engine = 0;        // its samples the GPU decoded (the rest of the batch's files, less
                              // the ones only the CPU can take and those that failed)
  double lane_busy_s = 0;     // the lane's wall time on it
  double lane_idle_s = 0;     // the lane's wait before it (nothing to do)
  double cpu_s = 0;           // the workers' wall time on the split's samples (read, decode)
  double other_s = 0;         // the workers' wall time on its other samples (read, route)
};

class DecodeSplit {
 public:
  struct Options {
    CpuShare share;
    int workers = 1;   // decode workers, shared by every decoding GPU
    int lanes = 1;     // lanes of this GPU
    int stages = 1;    // decoding GPUs (each its own DecodeSplit)
    double target_load = 0.85;
    double saturated_load = 0.98;  // at or above: the lane is the bottleneck
    double step = 0.04;            // the share's rise per batch while it is
  };
  explicit DecodeSplit(Options o);

  // Of a batch of `n`, how many samples the workers decode (its last ones).
  uint32_t CpuCount(uint32_t n) const;
  void Observe(const SplitMeasure& m);

  double share() const;
  // "cpu 22% of each batch (--cpu-share auto: demand at 128% of the engines, cpu at most 48%)",
  // or "cpu 25% of each batch (--cpu-share 0.25)".
  std::string Describe() const;
  // The mean share over every batch observed, and how many were observed.
  double mean_share() const;
  uint64_t batches() const;

 private:
  double BalanceShare() const;  // the share at which workers and engines finish together

  const Options o_;
  mutable std::mutex mu_;
  double share_;
  double load_ = 0;        // the lanes' load, smoothed
  double engine_s_ = 0;    // lane seconds per engine sample (per lane), smoothed
  double cpu_s_ = 0;       // worker seconds per split sample, smoothed (0: none seen yet)
  double other_s_ = 0;     // worker seconds per other sample, smoothed
  double share_sum_ = 0;   // over the observed batches, for mean_share
  uint64_t batches_ = 0;
};

}  // namespace coloader
