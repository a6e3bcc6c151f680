// The per-stage timers (pipeline/stage_times.h): what they add up, that they cost nothing
// when off, that CPU time separates work from sleep, and the report's lines.
#include "pipeline/stage_times.h"

#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace coloader {
namespace {

uint64_t ThreadCpuNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

class StageTimesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    was_on_ = StageTimes::enabled();
    StageTimes::Reset();
  }
  void TearDown() override {
    StageTimes::Enable(was_on_);
    StageTimes::Reset();
  }
  bool was_on_ = false;
};

TEST_F(StageTimesTest, OffRecordsNothing) {
  StageTimes::Enable(false);
  { ScopedStage t(Stage::kLaneSync, 128); }
  EXPECT_EQ(StageTimes::Get(Stage::kLaneSync).calls, 0u);
  EXPECT_EQ(StageTimes::Report(), "");
}

TEST_F(StageTimesTest, AddsCallsImagesAndTimes) {
  StageTimes::Enable(true);
  StageTimes::Add(Stage::kWorkerRead, 1, 2000, 1000);
  StageTimes::Add(Stage::kWorkerRead, 1, 4000, 3000);
  const StageTotals t = StageTimes::Get(Stage::kWorkerRead);
  EXPECT_EQ(t.calls, 2u);
  EXPECT_EQ(t.images, 2u);
  EXPECT_EQ(t.wall_ns, 6000u);
  EXPECT_EQ(t.cpu_ns, 4000u);
  EXPECT_EQ(StageTimes::Get(Stage::kWorkerRoute).calls, 0u);
  StageTimes::Reset();
  EXPECT_EQ(StageTimes::Get(Stage::kWorkerRead).calls, 0u);
}

TEST_F(StageTimesTest, SleepIsWallTimeAndSpinningIsCpuTime) {
  StageTimes::Enable(true);
  {
    ScopedStage t(Stage::kLaneSync, 4);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  {
    // Spin until this thread has used 20 ms of CPU by its own clock, however long a loaded
    // machine makes that take: the stage must have counted at least that much CPU.
    ScopedStage t(Stage::kLaneDecodeHardware, 4);
    const uint64_t spin_start = ThreadCpuNs();  // after the stage began: it counts all of it
    volatile uint64_t x = 0;
    while (ThreadCpuNs() < spin_start + 20000000u) x = x + 1;
  }
  const StageTotals slept = StageTimes::Get(Stage::kLaneSync);
  const StageTotals spun = StageTimes::Get(Stage::kLaneDecodeHardware);
  EXPECT_EQ(slept.images, 4u);
  EXPECT_GE(slept.wall_ns, 30000000u);
  EXPECT_LT(slept.cpu_ns, 10000000u);  // asleep: a few microseconds of CPU
  EXPECT_GE(spun.cpu_ns, 20000000u);  // busy: the CPU it burnt
  EXPECT_GE(spun.wall_ns, spun.cpu_ns);
}

TEST_F(StageTimesTest, ImagesCanBeSetLateAndStopEndsOnce) {
  StageTimes::Enable(true);
  ScopedStage t(Stage::kLaneRoute, 0);
  t.set_images(96);
  t.Stop();
  t.Stop();
  const StageTotals r = StageTimes::Get(Stage::kLaneRoute);
  EXPECT_EQ(r.calls, 1u);
  EXPECT_EQ(r.images, 96u);
}

TEST_F(StageTimesTest, ThreadsAddUp) {
  StageTimes::Enable(true);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([] {
      for (int k = 0; k < 1000; ++k) ScopedStage t(Stage::kWorkerRoute);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(StageTimes::Get(Stage::kWorkerRoute).calls, 8000u);
  EXPECT_EQ(StageTimes::Get(Stage::kWorkerRoute).images, 8000u);
}

TEST_F(StageTimesTest, ReportHasOneLinePerStageUsed) {
  StageTimes::Enable(true);
  StageTimes::Add(Stage::kLaneDecodeHardware, 128, 12800000, 6400000);  // 100 us, 50 us per image
  StageTimes::Add(Stage::kUploadWaitIdle, 0, 1000, 1000);             // no images: per call
  const std::string r = StageTimes::Report();
  EXPECT_NE(r.find("[stage] lane.decode_hardware"), std::string::npos) << r;
  EXPECT_NE(r.find("wall_us/img   100.00 cpu_us/img    50.00"), std::string::npos) << r;
  EXPECT_NE(r.find("[stage] upload.wait_idle"), std::string::npos) << r;
  size_t lines = 0;
  for (char c : r) lines += c == '\n';
  EXPECT_EQ(lines, 2u);
}

}  // namespace
}  // namespace coloader
