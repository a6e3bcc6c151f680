// DecodeSplit against a model of the pipeline it steers: per batch, the lane decodes the
// engines' share, the workers read everything and decode the CPU's share, consumers take a
// batch every n / demand seconds, and the three run side by side (the slowest sets the pace). A
// lane busy for the whole cycle is saturated; otherwise it waits the rest. The model is what the
// GPU measured (docs/GPU_DECODE.md): engines at ~8.9k images/s for an MPS client, a worker at
// ~600 images/s decoding, ~30k reading and routing.
#include "pipeline/decode/decode_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace coloader {
namespace {

struct Model {
  double engine_rate = 8900;  // images/s of the engines (one lane)
  double cpu_rate = 600;      // images/s of one worker decoding
  double route_rate = 30000;  // images/s of one worker reading and routing
  int workers = 15;
  int stages = 1;             // decoding GPUs: batch k to GPU k mod stages (one is modelled)
  double demand = 12000;      // images/s the consumers take
  uint32_t n = 128;
  double only_cpu = 0;        // the share of files only the CPU can decode (CMYK, PNG, ...)

  // One batch at the split's current count; returns its throughput in images/s.
  double Step(DecodeSplit& split, SplitMeasure* out = nullptr) const {
    const uint32_t cpu = split.CpuCount(n);
    const double others = n - cpu;
    const double engine = others * (1 - only_cpu);
    const double lane = engine / engine_rate + 0.0002;  // plus the lane's fixed cost
    const double work = (cpu / cpu_rate + others * only_cpu / cpu_rate + engine / route_rate) / workers;
    // The GPUs work side by side, each on every stages-th batch; the workers serve them all.
    const double cycle = std::max({lane / stages, work, n / demand});
    SplitMeasure m;
    m.samples = n;
    m.cpu = cpu;
    m.engine = static_cast<uint32_t>(engine);
    m.lane_busy_s = lane;
    m.lane_idle_s = stages * cycle - lane;
    m.cpu_s = cpu / cpu_rate;
    m.other_s = others * only_cpu / cpu_rate + engine / route_rate;
    split.Observe(m);
    if (out) *out = m;
    return n / cycle;
  }
  // Runs `batches` and returns the throughput of the last ten.
  double Run(DecodeSplit& split, int batches = 200) const {
    double sum = 0;
    for (int b = 0; b < batches; ++b) {
      const double x = Step(split);
      if (b >= batches - 10) sum += x;
    }
    return sum / 10;
  }
};

DecodeSplit::Options Auto(int workers = 15) {
  DecodeSplit::Options o;
  o.workers = workers;
  return o;
}

TEST(DecodeSplit, EnginesAloneWhileTheyKeepUp) {
  Model m;
  m.demand = 6900;  // two ResNet-18 jobs: every batch read twice
  DecodeSplit split(Auto());
  const double x = m.Run(split);
  EXPECT_EQ(split.CpuCount(m.n), 0u) << split.Describe();
  EXPECT_NEAR(x, m.demand, 1);
}

TEST(DecodeSplit, TheCpuTakesWhatTheEnginesCannot) {
  Model m;  // one ResNet-18 job: 12k against the engines' 8.9k
  DecodeSplit split(Auto());
  const double x = m.Run(split);
  // The demand is met, and the CPU takes no more than it needs to: the engines stay busy at the
  // target load (a share of 1 - 0.85 * 8.9 / 12 = 0.37, a little more for the lane's fixed cost).
  EXPECT_GE(x, 0.99 * m.demand) << split.Describe();
  const double target = Auto().target_load;
  const double want = 1 - target * m.n / (m.n / m.engine_rate + 0.0002) / m.demand;
  EXPECT_NEAR(split.share(), want, 0.04) << split.Describe();
}

TEST(DecodeSplit, FollowsDemandDownAndUp) {
  Model m;
  DecodeSplit split(Auto());
  m.Run(split);
  const double busy = split.share();
  m.demand = 5000;  // a job ends; the others are slower
  m.Run(split);
  EXPECT_EQ(split.CpuCount(m.n), 0u) << split.Describe();
  m.demand = 12000;  // and comes back
  EXPECT_GE(m.Run(split), 0.99 * m.demand);
  EXPECT_NEAR(split.share(), busy, 0.03);
}

TEST(DecodeSplit, NeverGivesTheCpuMoreThanItCanFinish) {
  // Demand far beyond both: the best this split can do is the balance point, where the
  // engines and the workers finish a batch together. Past it the workers hold the lane up;
  // the feedback alone would find that only after overshooting, batch after batch (measured
  // with the cap removed: 0.89 of the best with 2 workers, 0.96 with 4, 0.98 with 15).
  for (auto [workers, stages] : {std::pair{2, 1}, {4, 1}, {15, 1}, {8, 2}, {15, 2}}) {
    SCOPED_TRACE(std::to_string(workers) + " workers, " + std::to_string(stages) + " GPU(s)");
    Model m;
    m.workers = workers;
    m.stages = stages;
    m.demand = 40000;
    DecodeSplit::Options o = Auto(workers);
    o.stages = stages;
    DecodeSplit split(o);
    const double x = m.Run(split);
    double best = 0;  // the model's own optimum, found by trying every count
    for (uint32_t c = 0; c <= m.n; ++c) {
      const double others = m.n - c;
      const double lane = others / m.engine_rate + 0.0002;
      const double work = (c / m.cpu_rate + others / m.route_rate) / m.workers;
      best = std::max(best, m.n / std::max({lane / stages, work, m.n / m.demand}));
    }
    EXPECT_GE(x, 0.99 * best) << split.Describe();
    EXPECT_GT(x, m.engine_rate * stages) << "the CPU added nothing: " << split.Describe();
  }
}

TEST(DecodeSplit, FilesOnlyTheCpuTakesCountAsWorkersTime) {
  Model m;
  m.only_cpu = 0.05;  // a dataset with many grayscale and CMYK files
  DecodeSplit split(Auto());
  EXPECT_GE(m.Run(split), 0.99 * m.demand) << split.Describe();
}

TEST(DecodeSplit, AFixedShareIsTheSameCountEveryBatch) {
  DecodeSplit::Options o;
  o.share = CpuShare{false, 0.25};
  DecodeSplit split(o);
  Model m;
  for (int b = 0; b < 20; ++b) {
    m.Step(split);
    ASSERT_EQ(split.CpuCount(128), 32u);
  }
  EXPECT_EQ(split.CpuCount(7), 2u);  // a short last batch: 1.75 rounds to 2
  EXPECT_DOUBLE_EQ(split.mean_share(), 0.25);
  EXPECT_EQ(split.batches(), 20u);
  EXPECT_NE(split.Describe().find("--cpu-share 0.25"), std::string::npos) << split.Describe();
  o.share = CpuShare{false, 0};
  EXPECT_EQ(DecodeSplit(o).Describe(), "the JPEG engines only (--cpu-share 0)");
}

TEST(DecodeSplit, SaysWhatItMeasured) {
  Model m;
  DecodeSplit split(Auto());
  EXPECT_EQ(split.Describe(), "cpu 0% of each batch (--cpu-share auto)");
  m.Run(split);
  const std::string d = split.Describe();
  EXPECT_NE(d.find("demand at 1"), std::string::npos) << d;  // ~135% of the engines
  EXPECT_NE(d.find("cpu at most"), std::string::npos) << d;
}

TEST(CpuShare, ParsesAutoAndAShareAndRefusesTheRest) {
  auto a = ParseCpuShare("auto");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->adaptive);
  auto f = ParseCpuShare("0.3");
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->adaptive);
  EXPECT_DOUBLE_EQ(f->fixed, 0.3);
  EXPECT_EQ(CpuShareName(*f), "0.3");
  for (const char* bad : {"", "1.5", "-0.1", "half", "0.3x", "nan"}) {
    auto r = ParseCpuShare(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--cpu-share"), std::string::npos);
  }
}

}  // namespace
}  // namespace coloader
