#include "placement/simulator.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace coloader {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// A trace of jobs given as (estimate, actual, sm, duration, arrival) on one pipeline.
struct T {
  double est, actual, sm, duration, arrival;
};
JobSet Trace(const std::vector<T>& jobs, double cores = 4) {
  JobSet set;
  set.pipelines.push_back(JobPipeline{});
  set.pipelines[0].data = "/d";
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job j;
    j.name = "j" + std::to_string(i);
    j.pipeline = 0;
    j.memory_mib = jobs[i].est;
    j.actual_memory_mib = jobs[i].actual;
    j.sm_activity = jobs[i].sm;
    j.duration_s = jobs[i].duration;
    j.arrival_s = jobs[i].arrival;
    j.loader_cores = cores;
    set.jobs.push_back(j);
  }
  return set;
}

std::vector<Gpu> Gpus(int n) {
  std::vector<Gpu> g;
  for (int i = 0; i < n; ++i) g.push_back(Gpu{i, "sim", 40000, 100, false, {}});
  return g;
}

SimOptions Opts(Policy p, bool sharing) {
  SimOptions o;
  o.planner.policy = p;
  o.planner.sharing = sharing;
  o.planner.cpu_cores = 64;
  o.planner.memory_margin = 0;  // the limits are the estimates below
  o.planner.memory_headroom = false;  // (the headroom's own tests turn it on)
  o.planner.recovery.rule = Recovery::kAlone;
  o.dt_s = 1;
  return o;
}

TEST(Simulator, SlowdownModel) {
  CollocationModel o;
  o.interference = 0.03;
  o.sm_saturation = 0.9;
  EXPECT_DOUBLE_EQ(o.Slowdown(1, 0.95), 1.0);
  EXPECT_DOUBLE_EQ(o.Slowdown(2, 0.6), 1.03);
  EXPECT_NEAR(o.Slowdown(3, 1.8), 1.06 * 2.0, 1e-12);
}

TEST(Simulator, DefaultsAreTheCalibratedConstants) {
  // benchmarks/calibrate_collocation.py on the H200 synthetic runs (docs/PLACEMENT.md).
  CollocationModel o = SimOptions().planner.model;
  EXPECT_DOUBLE_EQ(o.interference, 0.003);
  EXPECT_DOUBLE_EQ(o.sm_saturation, 1.0);
  // Two ResNet-18s (0.81 of the GPU each alone) measured 1.66x slower each; the model says 1.62x.
  EXPECT_NEAR(o.Slowdown(2, 2 * 0.807), 1.66, 0.05);
}

TEST(Simulator, CollocationBeatsExclusiveForLightJobs) {
  JobSet set = Trace({{5000, 5000, 0.3, 1000, 0}, {5000, 5000, 0.3, 1000, 0}});
  ASSERT_OK_AND_ASSIGN(SimResult fifo, Simulate(set, Gpus(1), Opts(Policy::kFifoExclusive, true)));
  ASSERT_OK_AND_ASSIGN(SimResult aware, Simulate(set, Gpus(1), Opts(Policy::kSharingAware, true)));
  EXPECT_EQ(fifo.jobs_done, 2);
  EXPECT_NEAR(fifo.makespan_s, 2000, 2);            // one after the other
  EXPECT_NEAR(aware.makespan_s, 1000 * (1 + SimOptions().planner.model.interference), 2);  // together, with interference
  EXPECT_EQ(aware.ooms, 0);
  EXPECT_LT(aware.mean_jct_s, fifo.mean_jct_s);
}

TEST(Simulator, TheJobOverItsLimitIsTheOneThatRunsOutOfMemoryThenRunsAlone) {
  // As under launch's MPS limits: j0 (18,000 estimated, 19,500 real) fails at its limit though
  // the GPU has room; j1, placed beside it later and within its estimate, runs on. j0 then
  // waits in the recovery queue for a GPU of its own and runs there without a limit but the
  // GPU's.
  // Together they really use 40,500 MiB of 40,000: a model that blames by the GPU's total would
  // fail j1, the newcomer.
  JobSet set = Trace({{18000, 19500, 0.2, 500, 0}, {21000, 21000, 0.2, 500, 10}});
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(set, Gpus(1), Opts(Policy::kMostMemory, false)));
  EXPECT_EQ(r.ooms, 1);
  EXPECT_EQ(r.jobs_done, 2);
  ASSERT_EQ(r.jobs[0].runs.size(), 2u);
  ASSERT_EQ(r.jobs[1].runs.size(), 1u);
  EXPECT_TRUE(r.jobs[0].runs[0].oom);
  EXPECT_DOUBLE_EQ(r.jobs[0].runs[0].limit_mib, 18000);
  EXPECT_FALSE(r.jobs[1].runs[0].oom);
  EXPECT_EQ(r.jobs[0].runs[1].mode, Mode::kExclusive);
  EXPECT_DOUBLE_EQ(r.jobs[0].runs[1].limit_mib, 40000);
  EXPECT_GE(r.jobs[0].runs[1].start_s, r.jobs[1].runs[0].end_s);  // alone: after j1
  EXPECT_EQ(r.jobs[0].outcome, "done");
  // attempts.csv (simulate --out) has every attempt: j0's two, the first out of memory under its
  // estimate, the second alone under the GPU's memory; j1's one.
  const std::vector<std::string> lines = Lines(SimAttemptsCsv({r}));
  ASSERT_EQ(lines.size(), 4u) << SimAttemptsCsv({r});
  EXPECT_EQ(lines[0], "policy,sharing,job,outcome,attempt,gpu,mode,mig_profile,limit_mib,start_s,end_s,oom");
  EXPECT_EQ(lines[1].substr(0, lines[1].find(",1,0,mps,,18000,")), r.policy + ",0,j0,done");
  EXPECT_EQ(lines[1].back(), '1');
  EXPECT_NE(lines[2].find(",j0,done,2,0,exclusive,,40000,"), std::string::npos) << lines[2];
  EXPECT_EQ(lines[2].back(), '0');
  EXPECT_NE(lines[3].find(",j1,done,1,0,"), std::string::npos) << lines[3];
}

TEST(Simulator, WithHeadroomAnEstimatesErrorIsAnOomOnlyUnderRealPressure) {
  // The trace above under the default limits (LimitWhenPlaced): j0, 1,500 MiB over its
  // estimate, runs on within the headroom it was given alone (half its reservation: 27,000);
  // j1 then reserves 21,000 of what j0 left (40,000 - 18,000 reserved), with half of the 1,000
  // still unreserved as its headroom, and is placed, but the GPU really holds 19,500 + 21,000: j1's
  // allocations fail (real pressure, counted apart), and its recovery (grow-then-alone)
  // requeues it grown 1.5x, which waits for j0 to end.
  JobSet set = Trace({{18000, 19500, 0.2, 500, 0}, {21000, 21000, 0.2, 500, 10}});
  SimOptions o = Opts(Policy::kMostMemory, false);
  o.planner.memory_headroom = true;
  o.planner.recovery.rule = Recovery::kGrowThenAlone;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(set, Gpus(1), o));
  EXPECT_EQ(r.jobs_done, 2);
  ASSERT_EQ(r.jobs[0].runs.size(), 1u);
  EXPECT_FALSE(r.jobs[0].runs[0].oom);
  EXPECT_DOUBLE_EQ(r.jobs[0].runs[0].limit_mib, 27000);
  ASSERT_EQ(r.jobs[1].runs.size(), 2u);
  EXPECT_TRUE(r.jobs[1].runs[0].oom);
  EXPECT_DOUBLE_EQ(r.jobs[1].runs[0].limit_mib, 21000 + 1000 / 2.0);
  EXPECT_GE(r.jobs[1].runs[1].start_s, r.jobs[0].runs[0].end_s);
  EXPECT_EQ(r.ooms, 1);
  EXPECT_EQ(r.pressure_ooms, 1);
  EXPECT_EQ(r.retries, 1);
  EXPECT_DOUBLE_EQ(r.lost_gpu_s, r.jobs[1].runs[0].end_s - r.jobs[1].runs[0].start_s);
  const std::vector<std::string> summary = Lines(SimSummaryCsv({r}));
  ASSERT_EQ(summary.size(), 2u);
  EXPECT_NE(summary[0].find(",retries,pressure_ooms,lost_gpu_s"), std::string::npos) << summary[0];
  // Where the GPU has room for both, nobody runs out of memory: j1 is smaller.
  set.jobs[1].memory_mib = set.jobs[1].actual_memory_mib = 20000;
  ASSERT_OK_AND_ASSIGN(SimResult roomy, Simulate(set, Gpus(1), o));
  EXPECT_EQ(roomy.ooms, 0);
  EXPECT_EQ(roomy.jobs_done, 2);
}

TEST(Simulator, AJobAloneOnItsGpuIsLimitedToo) {
  // Alone on a 40,000 MiB GPU, with room for others: its estimate is its limit, as launch sets it.
  JobSet set = Trace({{18000, 19000, 0.2, 500, 0}});
  SimOptions o = Opts(Policy::kMostMemory, false);
  o.planner.recovery.rule = Recovery::kGrow;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(set, Gpus(1), o));
  EXPECT_EQ(r.ooms, 1);
  ASSERT_EQ(r.jobs[0].runs.size(), 2u);
  EXPECT_DOUBLE_EQ(r.jobs[0].runs[1].limit_mib, 27000);  // grown 1.5x, collocated as before
  EXPECT_EQ(r.jobs[0].runs[1].mode, Mode::kMps);
}

TEST(Simulator, TheRecoveryQueueGoesFirstAndNothingOvertakesIt) {
  // j1 runs out of memory beside j0 and waits for a GPU of its own; j2, arriving later, would
  // fit beside j0 but waits behind j1 (otherwise j1 could wait for ever for an empty GPU).
  JobSet set = Trace({{10000, 10000, 0.2, 1000, 0}, {5000, 6000, 0.2, 100, 0}, {5000, 5000, 0.2, 100, 100}});
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(set, Gpus(1), Opts(Policy::kMostMemory, false)));
  ASSERT_EQ(r.jobs[1].runs.size(), 2u);
  EXPECT_GE(r.jobs[1].runs[1].start_s, r.jobs[0].runs[0].end_s);
  EXPECT_GE(r.jobs[2].runs[0].start_s, r.jobs[1].runs[1].end_s);
  EXPECT_EQ(r.jobs_done, 3);
}

TEST(Simulator, OutOfMemoryAloneOnAWholeGpuFailsAtOnce) {
  // Estimated at 10,000 MiB, really 50,000 on a 40,000 MiB GPU: alone it still fails, and no
  // restart can help.
  JobSet set = Trace({{10000, 50000, 0.2, 100, 0}});
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(set, Gpus(1), Opts(Policy::kMostMemory, false)));
  EXPECT_EQ(r.ooms, 2);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.jobs[0].outcome, "failed");
}

TEST(Simulator, AJobThatKeepsRunningOutOfMemoryFailsAfterMaxOomsAsLaunchSays) {
  // With --recovery grow, a job estimated at 1,000 MiB that really needs 200,000 runs out of
  // memory at each limit (1,000, 1,500, 2,250 MiB); after max_ooms = 2 restarts it has failed.
  JobSet set = Trace({{890000, 890000, 0.2, 100, 0}, {1000, 200000, 0.2, 100, 0}});
  std::vector<Gpu> gpus = {Gpu{0, "sim", 1000000, 100, false, {}}};
  SimOptions o = Opts(Policy::kMostMemory, false);
  o.planner.recovery = OomRecovery{Recovery::kGrow, 2, 1.5};
  o.oom_after_s = 10;
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(set, gpus, o));
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.ooms, 3);  // the first run and two restarts
  EXPECT_EQ(r.jobs_done, 1);
}

TEST(Simulator, AJobWhoseGrownEstimateFitsNoGpuFailsInsteadOfWaitingForever) {
  // Estimated at 10,000 MiB, really 50,000 on a 40,000 MiB GPU: 15,000, 22,500, 33,750, then
  // 50,625 fits no GPU. Before, it waited in the queue until "not finished after 60 days".
  JobSet set = Trace({{10000, 50000, 0.2, 100, 0}});
  SimOptions o = Opts(Policy::kMostMemory, false);
  o.planner.recovery = OomRecovery{Recovery::kGrow, 100, 1.5};
  ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(set, Gpus(1), o));
  EXPECT_EQ(r.ooms, 4);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.jobs_done, 0);
}

TEST(Simulator, CoLocationSpeedupPerGpu) {
  // Two 1,000 s jobs together on one GPU: 2,000 s of work in 1,003 s busy (interference).
  JobSet set = Trace({{5000, 5000, 0.3, 1000, 0}, {5000, 5000, 0.3, 1000, 0}});
  ASSERT_OK_AND_ASSIGN(SimResult aware, Simulate(set, Gpus(1), Opts(Policy::kSharingAware, true)));
  ASSERT_OK_AND_ASSIGN(SimResult fifo, Simulate(set, Gpus(1), Opts(Policy::kFifoExclusive, true)));
  ASSERT_EQ(aware.speedup.size(), 1u);
  EXPECT_NEAR(aware.speedup[0], 2000.0 / 1003, 0.01);
  EXPECT_NEAR(fifo.speedup[0], 1.0, 0.01);
  EXPECT_DOUBLE_EQ(aware.mean_speedup, aware.speedup[0]);
}

TEST(Simulator, AMigSliceRunsAJobAtTheSpeedOfItsShareOfTheSms) {
  // Seven jobs that each need 0.9 of an A100's SMs, one hour alone: on 1g.10gb slices (1/7 of
  // the SMs each, by compute slices) each runs at (1/7) / 0.9 of its speed, 6.3 h; under MPS on
  // the whole GPU they share it in proportion, 6.3 h as well plus interference, and a job that
  // fits its slice (0.1 of the SMs) keeps its speed.
  std::vector<T> seven(7, T{5000, 5000, 0.9, 3600, 0});
  JobSet set = Trace(seven);
  for (Job& j : set.jobs) j.isolation = true;  // MIG instances
  Gpu a100{0, "A100", 81920, 0, true, {MigProfile{"1g.10gb", 9856, 0, 7}, MigProfile{"7g.80gb", 81920, 0, 1}}};
  ASSERT_OK_AND_ASSIGN(SimResult mig, Simulate(set, {a100}, Opts(Policy::kMostMemory, false)));
  EXPECT_EQ(mig.jobs_done, 7);
  EXPECT_NEAR(mig.makespan_s, 3600 * 0.9 * 7, 10);
  for (const SimJobReport& j : mig.jobs) EXPECT_EQ(j.runs[0].mig_profile, "1g.10gb");
  JobSet shared = Trace(seven);
  ASSERT_OK_AND_ASSIGN(SimResult mps, Simulate(shared, {Gpu{0, "A100", 81920, 108, false, {}}},
                                               Opts(Policy::kMostMemory, false)));
  EXPECT_NEAR(mps.makespan_s, 3600 * 0.9 * 7 * (1 + 6 * 0.003), 10);
  JobSet light = Trace({{5000, 5000, 0.1, 3600, 0}});
  light.jobs[0].isolation = true;
  ASSERT_OK_AND_ASSIGN(SimResult fits, Simulate(light, {a100}, Opts(Policy::kMostMemory, false)));
  EXPECT_NEAR(fits.makespan_s, 3600, 2);
}

TEST(Simulator, AGpuDecodingProducerOnMigTakesASliceFromTheJobs) {
  // Seven light one-hour jobs on an A100's seven 1g slices, sharing one producer. Decoding on the
  // CPU, all seven run at once; decoding on the GPU, the producer holds the 1g.5gb+me (a compute
  // slice), so six run and the seventh waits an hour.
  Gpu a100{0, "A100-SXM4-40GB", 40960, 108, true,
           {MigProfile{"1g.5gb", 4864, 14, 7}, MigProfile{"1g.5gb+me", 4864, 14, 1}, MigProfile{"7g.40gb", 40192, 98, 1}}};
  std::map<std::string, double> makespan;
  for (const char* decode : {"cpu", "gpu"}) {
    JobSet set = Trace(std::vector<T>(7, T{4000, 4000, 0.1, 3600, 0}));
    set.pipelines[0].decode = decode;
    for (Job& j : set.jobs) j.isolation = true;
    ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(set, {a100}, Opts(Policy::kSharingAware, true)));
    EXPECT_EQ(r.jobs_done, 7) << decode;
    for (const SimJobReport& j : r.jobs) EXPECT_EQ(j.runs[0].mig_profile, "1g.5gb") << decode;
    makespan[decode] = r.makespan_s;
  }
  EXPECT_NEAR(makespan["cpu"], 3600, 2);
  EXPECT_NEAR(makespan["gpu"], 7200, 4);
}

TEST(Simulator, AReaderOfASharedProducerGoesAtItsSlowestReadersSamplesPerSecond) {
  // Two light jobs on one GPU and one pipeline, each 100 s alone: a fast one reading 100,000
  // samples (1,000/s) and a slow one reading 20,000 (200/s). Together the fast one is held to
  // 200 samples/s until the slow one ends (about 100 s, 20,000 read), then reads its other
  // 80,000 alone in 80 s. Without `samples` the two paces are taken as equal: both end near 100 s.
  JobSet set = Trace({{1000, 1000, 0.05, 100, 0}, {1000, 1000, 0.05, 100, 0}});
  SimOptions o = Opts(Policy::kSharingAware, true);
  ASSERT_OK_AND_ASSIGN(SimResult unknown, Simulate(set, Gpus(1), o));
  set.jobs[0].samples = 100000;
  set.jobs[1].samples = 20000;
  ASSERT_OK_AND_ASSIGN(SimResult paced, Simulate(set, Gpus(1), o));
  auto end = [](const SimResult& r, int j) { return r.jobs[j].runs.back().end_s; };
  EXPECT_NEAR(end(unknown, 0), 100, 3);
  EXPECT_NEAR(end(unknown, 1), 100, 3);
  EXPECT_NEAR(end(paced, 1), 100, 3);  // the slow reader is not slowed by the fast one's wait
  EXPECT_NEAR(end(paced, 0), 180, 4);
  // On two pipelines nobody waits for anybody.
  set.pipelines.push_back(set.pipelines[0]);
  set.pipelines[1].data = "/e";
  set.jobs[1].pipeline = 1;
  ASSERT_OK_AND_ASSIGN(SimResult apart, Simulate(set, Gpus(1), o));
  EXPECT_NEAR(end(apart, 0), 100, 3);
}

TEST(Simulator, CpuStarvationSlowsJobsAndSharingRelievesIt) {
  // Four jobs of one pipeline whose own loaders would want 32 cores each on a 64-core machine.
  JobSet set = Trace({{1000, 1000, 0.1, 600, 0}, {1000, 1000, 0.1, 600, 0}, {1000, 1000, 0.1, 600, 0},
                      {1000, 1000, 0.1, 600, 0}}, 32);
  ASSERT_OK_AND_ASSIGN(SimResult own, Simulate(set, Gpus(1), Opts(Policy::kMostMemory, false)));
  ASSERT_OK_AND_ASSIGN(SimResult shared, Simulate(set, Gpus(1), Opts(Policy::kMostMemory, true)));
  EXPECT_DOUBLE_EQ(own.peak_cores, 128);
  EXPECT_DOUBLE_EQ(shared.peak_cores, 32);
  EXPECT_GT(own.makespan_s, 1.9 * shared.makespan_s);  // half the cores each
}

TEST(Simulator, SameTraceSameResult) {
  JobSet set = Trace({{5000, 5200, 0.3, 700, 0}, {9000, 8000, 0.5, 900, 30}, {30000, 31000, 0.9, 400, 60}});
  for (Policy p : AllPolicies()) {
    ASSERT_OK_AND_ASSIGN(SimResult a, Simulate(set, Gpus(2), Opts(p, true)));
    ASSERT_OK_AND_ASSIGN(SimResult b, Simulate(set, Gpus(2), Opts(p, true)));
    EXPECT_EQ(SimSummaryCsv({a}), SimSummaryCsv({b}));
    EXPECT_EQ(a.jobs_done, 3) << PolicyName(p);
    EXPECT_FALSE(a.samples.empty());
  }
}

TEST(Simulator, RejectsATraceWithoutDurations) {
  JobSet set = Trace({{5000, 5000, 0.3, 0, 0}});
  Result<SimResult> r = Simulate(set, Gpus(1), Opts(Policy::kSharingAware, true));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("duration_s"), std::string::npos);
}

// The repository's 90-job trace: what docs/PLACEMENT.md reports, as properties.
TEST(Simulator, TheDocumentedTraceKeepsItsProperties) {
  ASSERT_OK_AND_ASSIGN(JobSet trace, LoadJobSet(std::string(COLOADER_SOURCE_DIR) + "/examples/trace90.json"));
  ASSERT_EQ(trace.jobs.size(), 90u);
  std::map<std::pair<Policy, bool>, SimResult> runs;
  SimOptions o;
  o.planner.cpu_cores = trace.cpu_cores;
  o.sample_s = 300;
  std::vector<Gpu> gpus;
  for (int g = 0; g < 4; ++g) gpus.push_back(Gpu{g, "sim", 81559, 132, false, {}});
  for (Policy p : AllPolicies()) {
    for (bool sharing : {false, true}) {
      o.planner.policy = p;
      o.planner.sharing = sharing;
      ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(trace, gpus, o));
      EXPECT_EQ(r.jobs_done, 90) << PolicyName(p);
      runs[std::make_pair(p, sharing)] = r;
    }
  }
  auto run = [&](Policy p, bool sharing) -> const SimResult& { return runs[std::make_pair(p, sharing)]; };
  for (Policy p : AllPolicies()) {
    // Shared producers never want more cores than per-job loaders.
    EXPECT_LE(run(p, true).peak_cores, run(p, false).peak_cores) << PolicyName(p);
    EXPECT_LE(run(p, true).mean_jct_s, run(p, false).mean_jct_s) << PolicyName(p);
  }
  for (bool sharing : {false, true}) {
    const SimResult& aware = run(Policy::kSharingAware, sharing);
    EXPECT_EQ(aware.ooms, 0);
    EXPECT_LE(aware.peak_cores, trace.cpu_cores);  // cores are packed
    EXPECT_LT(aware.makespan_s, run(Policy::kFifoExclusive, sharing).makespan_s);
  }
  // Packing by memory without shared loading starves the CPU: slower than one job per GPU.
  EXPECT_GT(run(Policy::kMostMemory, false).makespan_s, run(Policy::kFifoExclusive, false).makespan_s);
}

}  // namespace
}  // namespace coloader
