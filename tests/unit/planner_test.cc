// The planner and the jobs-file reader: sharing, SM and memory limits, CPU cores, MIG, and
// errors that name the job and field.
#include "placement/planner.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <thread>

#include "placement/launcher.h"
#include "tests/support/test_support.h"

namespace coloader {
namespace {

Result<JobSet> Parse(const std::string& text) {
  COLOADER_ASSIGN_OR_RETURN(JsonValue doc, ParseJson(text, "jobs.json"));
  return ParseJobSet(doc, "jobs.json");
}

std::vector<Gpu> Gpus(int n, double mib = 81920) {
  std::vector<Gpu> g;
  for (int i = 0; i < n; ++i) g.push_back(Gpu{i, "test-gpu", mib, 132, false, {}});
  return g;
}

// n jobs of one pipeline (unless `pipelines` > 1: job i reads pipeline i % pipelines).
std::string JobsJson(const std::vector<std::pair<double, double>>& mem_sm, int pipelines = 1, double cores = 8) {
  std::string s = R"({"jobs": [)";
  for (size_t i = 0; i < mem_sm.size(); ++i) {
    s += std::string(i ? "," : "") + R"({"name": "j)" + std::to_string(i) + R"(", "pipeline": {"data": "/d/)" +
         std::to_string(i % pipelines) + R"("}, "memory_mib": )" + std::to_string(mem_sm[i].first) +
         R"(, "sm_activity": )" + std::to_string(mem_sm[i].second) + R"(, "loader_cores": )" + std::to_string(cores) + "}";
  }
  return s + "]}";
}

// An attempt placed in `mode` under `limit_mib` (what Planner::Recover reads of one).
Attempt AttemptIn(Mode mode, double limit_mib = 1000) {
  Attempt a;
  a.mode = mode;
  a.limit_mib = limit_mib;
  return a;
}

PlannerOptions Opts(Policy p, bool sharing = true, double cores = 64) {
  PlannerOptions o;
  o.policy = p;
  o.sharing = sharing;
  o.cpu_cores = cores;
  o.memory_margin = 0;  // the figures below are the reservations themselves
  o.memory_headroom = false;  // and the limits too (AJobsLimitIsItsReservationPlusItsShareOfWhatIsUnreserved)
  return o;
}

TEST(JobsFile, SamePipelineKeySharesWhateverTheSpelling) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(R"({
    "pipelines": {"in": {"data": "/d/imagenet", "image_size": 224}},
    "jobs": [
      {"name": "a", "pipeline": "in", "memory_mib": 1000},
      {"name": "b", "pipeline": {"data": "/d/imagenet", "augment": "train", "producer_batch": 256}, "memory_mib": 1000},
      {"name": "c", "pipeline": {"data": "/d/imagenet", "image_size": 160}, "memory_mib": 1000},
      {"name": "d", "pipeline": {"data": "/d/places"}, "memory_mib": "auto", "model": "torchvision:resnet18", "batch_size": 64}
    ]})"));
  ASSERT_EQ(set.jobs.size(), 4u);
  EXPECT_EQ(set.jobs[0].pipeline, set.jobs[1].pipeline);  // inline, defaults written out: the same producer
  EXPECT_NE(set.jobs[0].pipeline, set.jobs[2].pipeline);  // image size does
  EXPECT_NE(set.jobs[0].pipeline, set.jobs[3].pipeline);
  EXPECT_EQ(set.pipelines.size(), 3u);
  EXPECT_TRUE(set.jobs[3].memory_auto);
  EXPECT_EQ(EstimatorCommand(set.jobs[3], set.pipelines[set.jobs[3].pipeline], "py"),
            (std::vector<std::string>{"py", "-m", "coloader.estimator", "--model", "torchvision:resnet18", "--batch-size",
                                      "64", "--optimizer", "sgd", "--precision", "fp32", "--image-size", "224",
                                      "--json"}));
  // 6 slots (window 4 + 2 spare) of 256 x 3 x 224 x 224 float32.
  EXPECT_NEAR(set.pipelines[0].RingMiB(), 6 * 256 * 3 * 224 * 224 * 4 / 1048576.0, 1e-6);
}

TEST(JobsFile, ErrorsNameTheJobAndTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"jobs": []})", "field \"jobs\" must be a non-empty array"},
      {R"({"jobs": [{"name": "a", "memory_mib": 1}]})", "jobs[0] (\"a\"): field \"pipeline\" is missing"},
      {R"({"jobs": [{"name": "a", "pipeline": "nope", "memory_mib": 1}]})", "names \"nope\", which \"pipelines\" does not define"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": -1}]})", "field \"memory_mib\" must be a number of MiB > 0 or \"auto\""},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": "auto"}]})", "field \"model\" is needed"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5, "sm_activity": 2}]})", "field \"sm_activity\" must be between 0 and 1"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5, "gpu_count": 2}]})", "unknown field \"gpu_count\""},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "output": "int4"}, "memory_mib": 5}]})", "jobs[0] (\"a\").pipeline: field \"output\""},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5}, {"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5}]})", "two jobs are named \"a\""},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5}], "gpus": [{"sms": 4}]})", "gpus[0]: field \"memory_mib\" is missing"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5}], "gpus": [{"memory_mib": 4, "mig": true}]})", "must list the profiles"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5}], "gpus": [{"memory_mib": 4}, {"index": 0, "memory_mib": 4}]})",
       "gpus[1]: field \"index\" is 0, as gpus[0]'s is: each GPU is listed once"},
  };
  for (const auto& [text, want] : cases) {
    Result<JobSet> r = Parse(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("jobs.json", 0), 0u) << r.status().message();
  }
}

// Numbers that are cast to integers must be whole and in range first: a seed of 2^64, a
// priority of 1e300 or a negative GPU index would be undefined behaviour in the cast.
TEST(JobsFile, IntegersOutOfRangeAreErrorsThatNameTheFieldAndTheRange) {
  const std::string job = R"({"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5})";
  const auto with_gpu = [&](const std::string& gpu) { return R"({"jobs": [)" + job + R"(], "gpus": [)" + gpu + "]}"; };
  const std::pair<std::string, std::string> cases[] = {
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "seed": 18446744073709551616}, "memory_mib": 5}]})",
       "jobs[0] (\"a\").pipeline: field \"seed\" must be an integer in 0..9007199254740992, got 1.84467440737096e+19"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "seed": -1}, "memory_mib": 5}]})", "field \"seed\" must be an integer in 0.."},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5, "priority": 1e300}]})",
       "jobs[0] (\"a\"): field \"priority\" must be an integer in -1000000..1000000, got 1e+300"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5, "priority": 1.5}]})", "field \"priority\" must be an integer"},
      {with_gpu(R"({"index": -1, "memory_mib": 4})"), "gpus[0]: field \"index\" must be an integer in 0..1023, got -1"},
      {with_gpu(R"({"index": 1e10, "memory_mib": 4})"), "gpus[0]: field \"index\" must be an integer in 0..1023"},
      {with_gpu(R"({"memory_mib": 4, "sms": -132})"), "gpus[0]: field \"sms\" must be an integer in 0..1000000, got -132"},
      {with_gpu(R"({"memory_mib": 4, "mig": true, "mig_profiles": [{"name": "1g", "memory_mib": 10, "count": -2}]})"),
       "gpus[0].mig_profiles[0]: field \"count\" must be an integer in 1..1024, got -2"},
      {with_gpu(R"({"memory_mib": 4, "mig": true, "mig_profiles": [{"name": "1g", "memory_mib": 10, "sms": 1e12}]})"),
       "gpus[0].mig_profiles[0]: field \"sms\" must be an integer in 0..1000000"},
      {with_gpu(R"({"memory_mib": 4, "mig": true, "mig_profiles": [{"name": "1g", "memory_mib": 0}]})"),
       "gpus[0].mig_profiles[0]: field \"memory_mib\" must be > 0"},
  };
  for (const auto& [text, want] : cases) {
    Result<JobSet> r = Parse(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  }
  // The edges of each range are accepted.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(with_gpu(R"({"index": 1023, "memory_mib": 4, "sms": 0, "mig": true,
      "mig_profiles": [{"name": "7g", "memory_mib": 10, "count": 1}]})")));
  EXPECT_EQ(set.gpus[0].index, 1023);
  EXPECT_EQ(set.gpus[0].mig_profiles[0].count, 1);
  ASSERT_OK_AND_ASSIGN(set, Parse(R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "seed": 9007199254740992},
      "memory_mib": 5, "priority": -1000000}]})"));
  EXPECT_EQ(set.pipelines[0].seed, 9007199254740992ull);
  EXPECT_EQ(set.jobs[0].priority, -1000000);
}

TEST(Planner, SharingAwareKeepsAGroupOnOneGpuAndCountsItsProducerOnce) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{6000, 0.25}, {4000, 0.2}, {20000, 0.3}})));
  Planner planner(Opts(Policy::kSharingAware), Gpus(2), &set);
  Plan plan = MakePlan(set, planner.gpus(), planner.options(), &planner);
  ASSERT_EQ(plan.placements.size(), 3u);
  for (const Placement& p : plan.placements) {
    EXPECT_EQ(p.gpu, plan.placements[0].gpu);
    EXPECT_EQ(planner.ModeOf(p), Mode::kMps);
    EXPECT_EQ(p.producer, 0);
    EXPECT_FALSE(p.host_path);
  }
  const double ring = set.pipelines[0].DeviceMiB();
  const double copies = set.pipelines[0].ConsumerMiB(0);  // each consumer's batch copies
  const GpuLoad& load = planner.loads()[plan.placements[0].gpu];
  EXPECT_DOUBLE_EQ(load.used_mib, 30000 + 3 * copies + ring);  // the ring once, not three times
  EXPECT_DOUBLE_EQ(load.producer_mib, ring);
  EXPECT_NEAR(load.sm, 0.75, 1e-9);
  EXPECT_DOUBLE_EQ(plan.cpu_cores_used, 8);  // one producer's cores
  EXPECT_DOUBLE_EQ(plan.cpu_cores_without_sharing, 24);
  // Its environment: the GPU, the MPS share of SMs and the memory limit, the producer's name.
  std::map<std::string, std::string> env = JobEnvironment(set, planner, plan.placements[0]);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], std::to_string(plan.placements[0].gpu));
  const std::string with_ring =
      std::to_string(static_cast<long long>(std::ceil(6000 + copies + set.pipelines[0].RingMiB())));
  EXPECT_EQ(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=" + with_ring + "M");  // the ring it maps too
  EXPECT_EQ(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");  // 0.25 of the budget, 1.0 by default
  EXPECT_EQ(env["COLOADER_MEMORY_LIMIT_MIB"], std::to_string(static_cast<long long>(std::ceil(6000 + copies))));
  EXPECT_EQ(env["COLOADER_NAME"], ProducerName(set, 0));
}

TEST(Planner, SharingAwareRespectsTheSmLimitTheOthersDoNot) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{10000, 0.6}, {10000, 0.6}})));
  Plan aware = MakePlan(set, Gpus(1), Opts(Policy::kSharingAware));
  EXPECT_EQ(aware.placements.size(), 1u);  // 1.2 is past "auto": the saturation point 1.0, plus 0.15
  EXPECT_EQ(aware.queued, std::vector<int>{1});
  for (Policy p : {Policy::kMostMemory, Policy::kLeastUtilised}) {
    Plan plan = MakePlan(set, Gpus(1), Opts(p));
    EXPECT_EQ(plan.placements.size(), 2u) << PolicyName(p);
  }
  // Two GPUs: the sharing-aware policy spreads them rather than exceed the limit on one.
  Planner planner(Opts(Policy::kSharingAware), Gpus(2), &set);
  Plan two = MakePlan(set, planner.gpus(), planner.options(), &planner);
  ASSERT_EQ(two.placements.size(), 2u);
  EXPECT_NE(two.placements[0].gpu, two.placements[1].gpu);
  EXPECT_EQ(planner.ProducerGpus(0).size(), 2u);  // one ring on each GPU
  // A stated limit replaces the model's: 1.2 takes both; 0.5 + 0.5 fit "auto" but not 0.8.
  PlannerOptions loose = Opts(Policy::kSharingAware);
  loose.sm_limit = 1.2;
  EXPECT_EQ(MakePlan(set, Gpus(1), loose).placements.size(), 2u);
  ASSERT_OK_AND_ASSIGN(JobSet halves, Parse(JobsJson({{10000, 0.5}, {10000, 0.5}})));
  EXPECT_EQ(MakePlan(halves, Gpus(1), Opts(Policy::kSharingAware)).placements.size(), 2u);
  // Past saturation by less than "auto"'s slack: a GPU is not held idle for want of a smaller job.
  ASSERT_OK_AND_ASSIGN(JobSet over, Parse(JobsJson({{10000, 0.55}, {10000, 0.55}})));
  EXPECT_EQ(MakePlan(over, Gpus(1), Opts(Policy::kSharingAware)).placements.size(), 2u);
  PlannerOptions tight = Opts(Policy::kSharingAware);
  tight.sm_limit = 0.8;
  EXPECT_EQ(MakePlan(halves, Gpus(1), tight).placements.size(), 1u);
}

TEST(Planner, EveryJobRunsUnderTheLimitItWasPlannedWith) {
  // Alone on a GPU with room for others, a job has its estimate as its MPS limit from the
  // start; a job on a GPU of its own (FIFO, isolation, recovery) has the GPU less the ring.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{6000, 0.25}})));
  Planner shared(Opts(Policy::kSharingAware), Gpus(1), &set);
  std::optional<Placement> placed = shared.TryPlace(0);
  ASSERT_TRUE(placed.has_value());
  const Placement p = *placed;
  EXPECT_EQ(shared.ModeOf(p), Mode::kExclusive);  // alone, for now
  std::map<std::string, std::string> env = JobEnvironment(set, shared, p);
  const double copies = set.pipelines[0].ConsumerMiB(0);
  EXPECT_DOUBLE_EQ(shared.MemoryLimitMiB(p), 6000 + copies);
  EXPECT_DOUBLE_EQ(shared.MpsLimitMiB(p), 6000 + copies + set.pipelines[0].RingMiB());  // it maps the ring
  EXPECT_EQ(env["COLOADER_MEMORY_LIMIT_MIB"], std::to_string(static_cast<long long>(std::ceil(6000 + copies))));
  PlannerOptions own = Opts(Policy::kSharingAware, false);  // its own loader: no ring to map
  Planner alone_loader(own, Gpus(1), &set);
  std::optional<Placement> r = alone_loader.TryPlace(0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(JobEnvironment(set, alone_loader, *r)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=6000M");
  EXPECT_EQ(env.count("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), 0u);
  Planner fifo(Opts(Policy::kFifoExclusive), Gpus(1), &set);
  placed = fifo.TryPlace(0);
  ASSERT_TRUE(placed.has_value());
  const Placement q = *placed;
  const double ring = set.pipelines[0].DeviceMiB();
  EXPECT_DOUBLE_EQ(fifo.MemoryLimitMiB(q), 81920 - ring);
  env = JobEnvironment(set, fifo, q);
  EXPECT_EQ(env.count("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), 0u);
  EXPECT_EQ(env["COLOADER_MEMORY_LIMIT_MIB"], std::to_string(static_cast<long long>(std::ceil(81920 - ring))));
}

TEST(Planner, AJobsLimitIsItsReservationPlusItsShareOfWhatIsUnreservedUpToHalfOfIt) {
  // The default: a job on a GPU it may share may use, beyond its reservation, an equal share
  // among the GPU's jobs of what no reservation or ring holds as it is placed, up to half its
  // reservation; the limit stays what it was when placed.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{10000, 0.25}, {20000, 0.25}, {25000, 0.25}})));
  PlannerOptions o = Opts(Policy::kSharingAware);
  o.memory_headroom = true;
  EXPECT_TRUE(PlannerOptions{}.memory_headroom);
  Planner planner(o, Gpus(1), &set);
  const double ring = set.pipelines[0].DeviceMiB();
  const std::optional<Placement> first = planner.TryPlace(0);
  ASSERT_TRUE(first.has_value());
  EXPECT_DOUBLE_EQ(first->reserved_mib, 10000 + first->client_mib);
  EXPECT_DOUBLE_EQ(planner.MemoryLimitMiB(*first), 1.5 * first->reserved_mib);  // the GPU has room: the cap
  const std::optional<Placement> second = planner.TryPlace(1);
  ASSERT_TRUE(second.has_value());
  EXPECT_DOUBLE_EQ(planner.MemoryLimitMiB(*second), 1.5 * second->reserved_mib);
  EXPECT_DOUBLE_EQ(planner.MpsLimitMiB(*second), planner.MemoryLimitMiB(*second) + set.pipelines[0].RingMiB());
  std::map<std::string, std::string> env = JobEnvironment(set, planner, *second);
  EXPECT_EQ(env["COLOADER_MEMORY_LIMIT_MIB"],
            std::to_string(static_cast<long long>(std::ceil(1.5 * second->reserved_mib))));
  // The packing is by reservations: a third job fits in memory the first two were given as
  // headroom, and shares what is still unreserved with them (a third each: less than its cap).
  const std::optional<Placement> third = planner.TryPlace(2);
  ASSERT_TRUE(third.has_value());
  EXPECT_DOUBLE_EQ(planner.loads()[0].used_mib,
                   ring + first->reserved_mib + second->reserved_mib + third->reserved_mib);
  const double unreserved = 81920 - planner.loads()[0].used_mib;
  ASSERT_LT(unreserved / 3, 0.5 * third->reserved_mib);
  EXPECT_DOUBLE_EQ(planner.MemoryLimitMiB(*third), third->reserved_mib + unreserved / 3);
  EXPECT_DOUBLE_EQ(planner.MemoryLimitMiB(planner.placed().at(0)), 1.5 * first->reserved_mib);  // fixed when placed
  // --no-headroom: the reservation is the limit.
  o.memory_headroom = false;
  Planner bare(o, Gpus(1), &set);
  const std::optional<Placement> lone = bare.TryPlace(0);
  ASSERT_TRUE(lone.has_value());
  EXPECT_DOUBLE_EQ(bare.MemoryLimitMiB(*lone), lone->reserved_mib);
}

TEST(Planner, ASharingAwareJobBesideOthersGetsAQuarterOfItsReservationAsHeadroomOrWaits) {
  // A 52 GB and a 20 GB job leave under 10 GB unreserved, under 5 GB each: less than a quarter
  // of the 20 GB job's reservation, so it waits (or goes to a GPU that gives more); without
  // headroom there is no floor, and it fits.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{52000, 0.25}, {20000, 0.25}, {8000, 0.25}})));
  PlannerOptions o = Opts(Policy::kSharingAware);
  o.memory_headroom = true;
  Planner planner(o, Gpus(1), &set);
  ASSERT_TRUE(planner.TryPlace(0).has_value());
  const double need = planner.ReservationOf(1) + planner.ClientMiBOf(1, false);
  EXPECT_LT(planner.HeadroomOn(1, 0, need), Planner::kHeadroomFloor * need);
  EXPECT_FALSE(planner.TryPlace(1).has_value());
  // A smaller job still gets its quarter there, and is placed.
  const std::optional<Placement> small = planner.TryPlace(2);
  ASSERT_TRUE(small.has_value());
  EXPECT_GE(planner.MemoryLimitMiB(*small), (1 + Planner::kHeadroomFloor) * small->reserved_mib);
  o.memory_headroom = false;
  Planner bare(o, Gpus(1), &set);
  ASSERT_TRUE(bare.TryPlace(0).has_value());
  EXPECT_TRUE(bare.TryPlace(1).has_value());
}

TEST(Planner, ASharingAwareJobGoesWhereItsHeadroomIsWholeBeforeWhereSmsAreLeastBusy) {
  // GPU 0 holds a 52 GB job of little SM activity, GPU 1 a small busy one (one pipeline each,
  // and a third for the job placed last, so that no producer draws it). On GPU 0 a 15 GB job
  // would get less than its cap of headroom (but more than the floor); on GPU 1 the whole cap,
  // at more SM activity: it goes to GPU 1. Without headroom, where SMs are least busy: GPU 0.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{52000, 0.1}, {5000, 0.5}, {15000, 0.1}}, 3)));
  for (bool headroom : {true, false}) {
    PlannerOptions o = Opts(Policy::kSharingAware);
    o.memory_headroom = headroom;
    Planner planner(o, Gpus(2), &set);
    const std::optional<Placement> big = planner.TryPlace(0), busy = planner.TryPlace(1);
    ASSERT_TRUE(big && busy);
    ASSERT_EQ(big->gpu, 0);
    ASSERT_EQ(busy->gpu, 1);
    const double need = planner.ReservationOf(2) + planner.ClientMiBOf(2, false);
    if (headroom) {
      ASSERT_LT(planner.HeadroomOn(2, 0, need), Planner::kHeadroomShare * need);
      ASSERT_GE(planner.HeadroomOn(2, 0, need), Planner::kHeadroomFloor * need);
      ASSERT_DOUBLE_EQ(planner.HeadroomOn(2, 1, need), Planner::kHeadroomShare * need);
    }
    const std::optional<Placement> last = planner.TryPlace(2);
    ASSERT_TRUE(last.has_value());
    EXPECT_EQ(last->gpu, headroom ? 1 : 0) << "with headroom: " << headroom;
  }
}

TEST(Planner, AMigInstanceCountsOnlyTheHeadroomItHolds) {
  // GPU 0 in MIG mode, GPU 1 not. A 9 GB job fits a 2g.10gb instance (856 MiB beyond its
  // estimate, a fifth of its cap) or GPU 1 beside a 66 GB job (3,460 MiB, more than its floor):
  // it goes to GPU 1, whose SMs are also the less busy. Scored as if an instance had a share of
  // the whole MIG GPU's memory, it went to the instance.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(std::string(R"({"jobs": [
      {"name": "big", "pipeline": {"data": "/d/0"}, "memory_mib": 66000, "sm_activity": 0.1},
      {"name": "busy", "pipeline": {"data": "/d/1"}, "memory_mib": 4000, "sm_activity": 0.5, "isolation": true},
      {"name": "nine", "pipeline": {"data": "/d/2"}, "memory_mib": 9000, "sm_activity": 0.1}],
      "gpus": [{"memory_mib": 40960, "mig": true, "mig_profiles": [
        {"name": "1g.5gb", "memory_mib": 4864, "count": 7}, {"name": "2g.10gb", "memory_mib": 9856, "count": 3},
        {"name": "3g.20gb", "memory_mib": 19968, "count": 2}, {"name": "7g.40gb", "memory_mib": 40192, "count": 1}]},
        {"memory_mib": 81920}]})")));
  PlannerOptions o = Opts(Policy::kSharingAware, /*sharing=*/false);
  o.memory_headroom = true;
  Planner planner(o, set.gpus, &set);
  const std::optional<Placement> big = planner.TryPlace(0), busy = planner.TryPlace(1);
  ASSERT_TRUE(big && busy);
  ASSERT_EQ(big->gpu, 1);  // no MIG instance holds it
  ASSERT_EQ(busy->gpu, 0);  // isolated: a MIG instance (GPU 1 is not empty)
  ASSERT_EQ(busy->mode, Mode::kMig);
  ASSERT_GE(planner.HeadroomOn(2, 1, 9000), Planner::kHeadroomFloor * 9000);
  const std::optional<Placement> nine = planner.TryPlace(2);
  ASSERT_TRUE(nine.has_value());
  EXPECT_EQ(nine->gpu, 1) << "placed in " << nine->mig_profile;
}

TEST(Planner, GrowThenAloneGrowsTheFirstTimeAndRunsAloneTheSecond) {
  // CARMA's rule, the default: requeued with the grown estimate where that still fits a GPU;
  // after a second OOM, or when no GPU holds the grown estimate, alone.
  EXPECT_EQ(OomRecovery{}.rule, Recovery::kGrowThenAlone);
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{6000, 0.25}, {60000, 0.25}})));
  PlannerOptions o = Opts(Policy::kSharingAware);
  o.recovery = OomRecovery{Recovery::kGrowThenAlone, 3, 1.5};
  Planner planner(o, Gpus(1), &set);
  EXPECT_TRUE(planner.Recover(0, 1, AttemptIn(Mode::kMps), &set.jobs[0].memory_mib));
  EXPECT_DOUBLE_EQ(set.jobs[0].memory_mib, 9000);
  EXPECT_FALSE(planner.RunsAlone(0));
  EXPECT_TRUE(planner.Recover(0, 2, AttemptIn(Mode::kMps), &set.jobs[0].memory_mib));
  EXPECT_TRUE(planner.RunsAlone(0));
  EXPECT_DOUBLE_EQ(set.jobs[0].memory_mib, 9000);  // alone, its limit is the GPU's: no more growth
  EXPECT_FALSE(planner.Recover(0, 3, AttemptIn(Mode::kExclusive), &set.jobs[0].memory_mib));  // out of memory alone
  // With a limit as large as any GPU could give it, another attempt cannot help: failed, as
  // it was.
  EXPECT_FALSE(planner.Recover(1, 1, AttemptIn(Mode::kMps, planner.AloneLimitMiB(1)), &set.jobs[1].memory_mib));
  EXPECT_DOUBLE_EQ(set.jobs[1].memory_mib, 60000);
  EXPECT_FALSE(planner.RunsAlone(1));
  // 60,000 x 1.5 fits no 81,920 MiB GPU: alone at once, as it was.
  EXPECT_TRUE(planner.Recover(1, 1, AttemptIn(Mode::kMps), &set.jobs[1].memory_mib));
  EXPECT_TRUE(planner.RunsAlone(1));
  EXPECT_DOUBLE_EQ(set.jobs[1].memory_mib, 60000);
}

TEST(Planner, RecoveryRunsAJobAloneOrGrowsItsEstimateAndIsCapped) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{6000, 0.25}, {6000, 0.25}})));
  PlannerOptions o = Opts(Policy::kSharingAware);
  o.recovery = OomRecovery{Recovery::kAlone, 2, 1.5};
  Planner alone(o, Gpus(1), &set);
  ASSERT_TRUE(alone.TryPlace(0).has_value());
  double estimate = 6000;
  EXPECT_TRUE(alone.Recover(1, 1, AttemptIn(Mode::kMps), &estimate));
  EXPECT_DOUBLE_EQ(estimate, 6000);
  EXPECT_TRUE(alone.RunsAlone(1));
  EXPECT_EQ(alone.QueueOrder({0, 1}), (std::vector<int>{1, 0}));  // the recovery queue first
  EXPECT_TRUE(alone.HoldsTheQueue(1));
  EXPECT_FALSE(alone.TryPlace(1).has_value());  // not beside job 0
  alone.Release(0);
  std::optional<Placement> p = alone.TryPlace(1);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->mode, Mode::kExclusive);
  EXPECT_FALSE(alone.TryPlace(0).has_value());  // nothing joins it
  EXPECT_FALSE(alone.Recover(1, 2, AttemptIn(Mode::kExclusive), &estimate));  // out of memory with a whole GPU: failed
  o.recovery = OomRecovery{Recovery::kGrow, 2, 1.5};
  Planner grow(o, Gpus(1), &set);
  EXPECT_FALSE(grow.Recover(1, 1, AttemptIn(Mode::kExclusive), &set.jobs[1].memory_mib));  // had a GPU of its own
  EXPECT_DOUBLE_EQ(set.jobs[1].memory_mib, 6000);
  EXPECT_TRUE(grow.Recover(1, 1, AttemptIn(Mode::kMps), &set.jobs[1].memory_mib));
  EXPECT_DOUBLE_EQ(set.jobs[1].memory_mib, 9000);
  EXPECT_FALSE(grow.RunsAlone(1));
  EXPECT_TRUE(grow.Recover(1, 2, AttemptIn(Mode::kMps), &set.jobs[1].memory_mib));
  EXPECT_FALSE(grow.Recover(1, 3, AttemptIn(Mode::kMps), &set.jobs[1].memory_mib));  // past max_ooms
}

TEST(Planner, MemoryMustFitWithTheRing) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{50000, 0.1}, {30000, 0.1}, {90000, 0.1}})));
  for (Policy p : AllPolicies()) {
    Plan plan = MakePlan(set, Gpus(1, 80000), Opts(p));
    EXPECT_EQ(plan.impossible, std::vector<int>{2}) << PolicyName(p);  // 90000 > 80000
    EXPECT_EQ(plan.placements.size(), 1u) << PolicyName(p);  // 50000 + 30000 + ring > 80000
  }
  // Without sharing there is no ring on the GPU, and both fit exactly.
  Plan no_ring = MakePlan(set, Gpus(1, 80000), Opts(Policy::kMostMemory, false));
  EXPECT_EQ(no_ring.placements.size(), 2u);
}

// A job that fits a GPU alone but not beside its producer's ring runs with its own loader (it
// used to wait for ever, "impossible"); one larger than every GPU is told why.
// A job of a pipeline with its own loader is none of its producer's readers: releasing a reader
// first gives back the reader's cores alone, and nothing is left once both have gone.
TEST(Planner, AnOwnLoaderIsNotCountedAsItsPipelinesProducer) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(R"({"jobs": [
    {"name": "reader", "pipeline": {"data": "/d/0"}, "memory_mib": 30000, "sm_activity": 0.1, "loader_cores": 2},
    {"name": "big", "pipeline": {"data": "/d/0"}, "memory_mib": 79990, "sm_activity": 0.1, "loader_cores": 8}]})"));
  Planner planner(Opts(Policy::kSharingAware), Gpus(2, 80000), &set);
  ASSERT_TRUE(planner.TryPlace(0));
  ASSERT_TRUE(planner.TryPlace(1));
  EXPECT_EQ(planner.placed().at(1).producer, -1);
  EXPECT_NEAR(planner.cores_used(), 10, 1e-9);
  EXPECT_NEAR(planner.ProducerCores(0), 2, 1e-9);
  planner.Release(0);
  EXPECT_NEAR(planner.cores_used(), 8, 1e-9);
  planner.Release(1);
  EXPECT_NEAR(planner.cores_used(), 0, 1e-9);
}

TEST(Planner, AJobTooLargeOnlyBesideTheRingRunsWithItsOwnLoader) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{79990, 0.1}, {90000, 0.1}, {30000, 0.1}}, 2)));
  Planner planner(Opts(Policy::kSharingAware), Gpus(2, 80000), &set);
  EXPECT_FALSE(planner.SharesProducer(0));
  EXPECT_TRUE(planner.SharesProducer(2));
  const Plan plan = MakePlan(set, Gpus(2, 80000), Opts(Policy::kSharingAware), &planner);
  ASSERT_EQ(plan.impossible, (std::vector<int>{1}));
  ASSERT_EQ(plan.impossible_why.size(), 1u);
  EXPECT_NE(plan.impossible_why[0].find("needs 90000 MiB (its estimate and the 0% margin), more than any GPU has "
                                        "(the largest: 80000 MiB)"),
            std::string::npos)
      << plan.impossible_why[0];
  ASSERT_EQ(plan.placements.size(), 2u);
  std::map<int, Placement> by_job;
  for (const Placement& p : plan.placements) by_job[p.job] = p;
  EXPECT_EQ(by_job.at(0).producer, -1);  // its own loader: no ring, no consumer copies
  EXPECT_EQ(by_job.at(0).client_mib, 0);
  EXPECT_EQ(by_job.at(2).producer, set.jobs[2].pipeline);  // the other reads the producer
  EXPECT_NE(by_job.at(0).gpu, by_job.at(2).gpu);
  const std::string table = PlanTable(set, planner, plan);
  EXPECT_NE(table.find("(own loader)"), std::string::npos) << table;
  EXPECT_NE(table.find("cannot run on these GPUs: j1: needs 90000 MiB"), std::string::npos) << table;
  EXPECT_NE(table.find("of 64 (the default;"), std::string::npos) << table;
  // Its loader's cores are its own; released, they are given back.
  const double cores = planner.cores_used();
  planner.Release(0);
  EXPECT_NEAR(planner.cores_used(), cores - set.jobs[0].loader_cores, 1e-9);
}

TEST(Planner, PoliciesChooseDifferentGpus) {
  // Two running jobs: a big one with little SM activity on GPU 0, a small busy one on GPU 1.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{60000, 0.1}, {5000, 0.6}, {5000, 0.1}}, 3)));
  std::vector<int> where;
  for (Policy p : {Policy::kMostMemory, Policy::kLeastUtilised}) {
    Planner planner(Opts(p), Gpus(2), &set);
    ASSERT_TRUE(planner.TryPlace(0));
    ASSERT_TRUE(planner.TryPlace(1));
    ASSERT_NE(planner.placed().at(0).gpu, planner.placed().at(1).gpu);
    std::optional<Placement> third = planner.TryPlace(2);
    ASSERT_TRUE(third);
    where.push_back(third->gpu);
    // Most memory: next to the busy small one. Least utilised: next to the big idle one.
    EXPECT_EQ(third->gpu, planner.placed().at(p == Policy::kMostMemory ? 1 : 0).gpu) << PolicyName(p);
  }
  EXPECT_NE(where[0], where[1]);
}

TEST(Planner, FifoExclusiveIsOneJobPerGpuInStrictOrder) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{1000, 0.1}, {1000, 0.1}, {1000, 0.1}})));
  Planner planner(Opts(Policy::kFifoExclusive), Gpus(2), &set);
  Plan plan = MakePlan(set, planner.gpus(), planner.options(), &planner);
  ASSERT_EQ(plan.placements.size(), 2u);
  EXPECT_EQ(plan.queued, std::vector<int>{2});
  for (const Placement& p : plan.placements) EXPECT_EQ(planner.ModeOf(p), Mode::kExclusive);
  planner.Release(0);
  std::optional<Placement> p = planner.TryPlace(2);
  ASSERT_TRUE(p);
  EXPECT_EQ(planner.ModeOf(*p), Mode::kExclusive);
}

TEST(Planner, CpuCoresArePackedAndSharingSavesThem) {
  // Four jobs of two pipelines, 10 loader cores each, 25 cores on the machine.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{1000, 0.1}, {1000, 0.1}, {1000, 0.1}, {1000, 0.1}}, 2, 10)));
  Plan own = MakePlan(set, Gpus(4), Opts(Policy::kSharingAware, false, 25));
  EXPECT_EQ(own.placements.size(), 2u);  // 3 x 10 > 25
  Plan shared = MakePlan(set, Gpus(4), Opts(Policy::kSharingAware, true, 25));
  EXPECT_EQ(shared.placements.size(), 4u);  // two producers, 20 cores
  EXPECT_DOUBLE_EQ(shared.cpu_cores_used, 20);
}

TEST(Planner, ReleaseGivesEverythingBack) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{1000, 0.2}, {2000, 0.2}, {3000, 0.2}}, 2)));
  for (Policy p : AllPolicies()) {
    for (bool sharing : {false, true}) {
      Planner planner(Opts(p, sharing), Gpus(3), &set);
      for (int j = 0; j < 3; ++j) ASSERT_TRUE(planner.TryPlace(j)) << PolicyName(p);
      for (int j : {1, 0, 2}) planner.Release(j);
      EXPECT_EQ(planner.cores_used(), 0) << PolicyName(p);
      for (const GpuLoad& l : planner.loads()) {
        EXPECT_EQ(l.used_mib, 0);
        EXPECT_EQ(l.sm, 0);
        EXPECT_TRUE(l.jobs.empty());
      }
      EXPECT_FALSE(planner.ProducerRunning(0));
    }
  }
}

TEST(Planner, IsolationGetsAMigInstanceOnTheHostPathOrAGpuOfItsOwn) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(R"({"jobs": [
      {"name": "iso", "pipeline": {"data": "/d"}, "memory_mib": 15000, "isolation": true},
      {"name": "other", "pipeline": {"data": "/d"}, "memory_mib": 1000}]})"));
  Gpu mig{0, "mig-gpu", 81920, 132, true, {{"1g.10gb", 9984, 16, 7}, {"2g.20gb", 19968, 32, 3}, {"7g.80gb", 80000, 132, 1}}};
  Planner planner(Opts(Policy::kSharingAware), {mig}, &set);
  std::optional<Placement> iso = planner.TryPlace(0);
  ASSERT_TRUE(iso);
  EXPECT_EQ(iso->mode, Mode::kMig);
  EXPECT_EQ(iso->mig_profile, "2g.20gb");  // the smallest that holds 15000 MiB
  EXPECT_TRUE(iso->host_path);             // no CUDA IPC across MIG instances
  EXPECT_EQ(JobEnvironment(set, planner, *iso).count("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), 0u);
  EXPECT_EQ(planner.loads()[0].used_mib, 19968);  // the instance; no ring on a MIG GPU
  std::optional<Placement> other = planner.TryPlace(1);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->mig_profile, "1g.10gb");
  EXPECT_TRUE(other->host_path);
  EXPECT_EQ(planner.loads()[0].producer_mib, 0);
  planner.Release(0);
  planner.Release(1);
  EXPECT_EQ(planner.loads()[0].used_mib, 0);
  // Without MIG: a GPU of its own, which nobody joins.
  Planner plain(Opts(Policy::kSharingAware), Gpus(1), &set);
  std::optional<Placement> alone = plain.TryPlace(0);
  ASSERT_TRUE(alone);
  EXPECT_EQ(plain.ModeOf(*alone), Mode::kExclusive);
  EXPECT_FALSE(plain.TryPlace(1));
}

TEST(Planner, MigInstancesNeverTakeMoreComputeSlicesThanTheGpuHas) {
  // An A100 40GB: 7 compute slices, 8 of memory. Three 2g.10gb and two 1g.5gb instances fit
  // its memory (39,296 of 40,960 MiB) but would take 8 compute slices: the fifth job waits.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(R"({"jobs": [
      {"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 8000, "isolation": true},
      {"name": "b", "pipeline": {"data": "/d"}, "memory_mib": 8000, "isolation": true},
      {"name": "c", "pipeline": {"data": "/d"}, "memory_mib": 8000, "isolation": true},
      {"name": "d", "pipeline": {"data": "/d"}, "memory_mib": 4000, "isolation": true},
      {"name": "e", "pipeline": {"data": "/d"}, "memory_mib": 4000, "isolation": true}],
      "gpus": [{"memory_mib": 40960, "mig": true, "mig_profiles": [
        {"name": "1g.5gb", "memory_mib": 4864, "count": 7}, {"name": "2g.10gb", "memory_mib": 9856, "count": 3},
        {"name": "3g.20gb", "memory_mib": 19968, "count": 2}, {"name": "7g.40gb", "memory_mib": 40192, "count": 1}]}]})"));
  ASSERT_EQ(ComputeSlicesOf(set.gpus[0]), 7);  // the largest profile's
  PlannerOptions o = Opts(Policy::kSharingAware);
  o.memory_margin = 0;
  Planner planner(o, set.gpus, &set);
  for (int j = 0; j < 4; ++j) ASSERT_TRUE(planner.TryPlace(j)) << j;
  EXPECT_EQ(planner.MigSlicesUsed(0), 7);
  EXPECT_FALSE(planner.TryPlace(4)) << "an eighth compute slice was handed out";
  planner.Release(3);  // a 1g instance goes: its slice is free again
  EXPECT_EQ(planner.MigSlicesUsed(0), 6);
  std::optional<Placement> e = planner.TryPlace(4);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->mig_profile, "1g.5gb");
}

TEST(JobsFile, AMigProfileWhoseNameDoesNotSayItsSlicesMustStateThem) {
  const std::string gpu = R"(, "gpus": [{"memory_mib": 40960, "mig": true, "mig_profiles": [)";
  const std::string job = R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5}])";
  auto bad = Parse(job + gpu + R"({"name": "small", "memory_mib": 4864}]}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("compute_slices\" must be given"), std::string::npos) << bad.status().message();
  ASSERT_OK_AND_ASSIGN(JobSet ok, Parse(job + gpu + R"({"name": "small", "memory_mib": 4864, "compute_slices": 1}],
      "compute_slices": 4}]})"));
  EXPECT_EQ(ComputeSlicesOf(ok.gpus[0].mig_profiles[0]), 1);
  EXPECT_EQ(ComputeSlicesOf(ok.gpus[0]), 4);
  auto fewer = Parse(job + gpu + R"({"name": "3g.20gb", "memory_mib": 19968}], "compute_slices": 2}]})");
  ASSERT_FALSE(fewer.ok());
  EXPECT_NE(fewer.status().message().find("fewer than profile 3g.20gb takes (3)"), std::string::npos)
      << fewer.status().message();
}

// An A100 40GB in MIG mode as the jobs file states it (NVIDIA's MIG user guide): 7 compute
// slices; of the 1g profiles only 1g.5gb+me (one instance) has a JPEG engine, 7g.40gb the GPU's.
constexpr const char* kA100Mig = R"("gpus": [{"name": "A100-SXM4-40GB", "memory_mib": 40960, "sms": 108, "mig": true,
    "mig_profiles": [{"name": "1g.5gb+me", "memory_mib": 4864, "sms": 14, "count": 1},
                     {"name": "1g.5gb", "memory_mib": 4864, "sms": 14, "count": 7},
                     {"name": "2g.10gb", "memory_mib": 9856, "sms": 28, "count": 3},
                     {"name": "3g.20gb", "memory_mib": 19968, "sms": 42, "count": 2},
                     {"name": "7g.40gb", "memory_mib": 40192, "sms": 98, "count": 1}]}])";

// Jobs that need isolation (so MIG instances), job i reading pipeline i % decodes.size(), whose
// decode is decodes[that].
std::string MigJobs(int n, double mib, const std::vector<std::string>& decodes, const std::string& gpus = kA100Mig) {
  std::string s = R"({"jobs": [)";
  for (int i = 0; i < n; ++i) {
    const size_t pl = static_cast<size_t>(i) % decodes.size();
    s += std::string(i ? "," : "") + R"({"name": "j)" + std::to_string(i) + R"(", "isolation": true, "memory_mib": )" +
         std::to_string(mib) + R"(, "pipeline": {"data": "/d/)" + std::to_string(pl) + R"(", "decode": ")" +
         decodes[pl] + R"("}})";
  }
  return s + "], " + gpus + "}";
}

TEST(JobsFile, AMigProfileHasTheJpegEnginesItStatesOrThoseItsNameSays) {
  ASSERT_OK_AND_ASSIGN(JobSet a100, Parse(MigJobs(1, 1000, {"gpu"})));
  const Gpu& g = a100.gpus[0];
  std::map<std::string, int> want = {{"1g.5gb", 0}, {"1g.5gb+me", 1}, {"2g.10gb", 0}, {"3g.20gb", 0}, {"7g.40gb", 1}};
  for (const MigProfile& m : g.mig_profiles) EXPECT_EQ(JpegEnginesOf(m, g), want[m.name]) << m.name;
  // A Hopper GPU has an NVJPG in every compute slice.
  Gpu h100{0, "NVIDIA H100 80GB HBM3", 81559, 132, true, {{"1g.10gb", 9984, 16, 7}, {"3g.40gb", 40448, 60, 2}}};
  EXPECT_EQ(JpegEnginesOf(h100.mig_profiles[0], h100), 1);
  EXPECT_EQ(JpegEnginesOf(h100.mig_profiles[1], h100), 3);
  // A stated count (the file's jpeg_engines, NVML's jpegCount) wins over the name.
  ASSERT_OK_AND_ASSIGN(JobSet stated, Parse(R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5}],
      "gpus": [{"memory_mib": 40960, "mig": true, "mig_profiles": [
        {"name": "1g.5gb", "memory_mib": 4864, "jpeg_engines": 2}, {"name": "1g.5gb+me", "memory_mib": 4864, "jpeg_engines": 0}]}]})"));
  EXPECT_EQ(JpegEnginesOf(stated.gpus[0].mig_profiles[0], stated.gpus[0]), 2);
  EXPECT_EQ(JpegEnginesOf(stated.gpus[0].mig_profiles[1], stated.gpus[0]), 0);
  EXPECT_EQ(a100.pipelines[0].decode, "gpu");
  ASSERT_OK_AND_ASSIGN(JobSet plain, Parse(JobsJson({{1000, 0.1}})));
  EXPECT_EQ(plain.pipelines[0].decode, "auto");  // as coloader serve
}

TEST(JobsFile, ABadDecodeOrJpegEngineCountOrTwoSpellingsOfOneProducerAreErrorsThatNameThePipeline) {
  const std::string gpu = R"(, "gpus": [{"memory_mib": 40960, "mig": true, "mig_profiles": [)";
  const std::string job = R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5}])";
  const std::pair<std::string, const char*> cases[] = {
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "decode": "nvjpeg"}, "memory_mib": 5}]})",
       "jobs[0] (\"a\").pipeline: field \"decode\" must be cpu, gpu or auto (as coloader serve --decode), got \"nvjpeg\""},
      {R"({"pipelines": {"in": {"data": "/d", "decode": "GPU"}}, "jobs": [{"name": "a", "pipeline": "in", "memory_mib": 5}]})",
       "pipelines.in: field \"decode\" must be cpu, gpu or auto (as coloader serve --decode), got \"GPU\""},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "decode": 1}, "memory_mib": 5}]})",
       "jobs[0] (\"a\").pipeline: field \"decode\" must be a string"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "serve_args": ["--decode=gpu"]}, "memory_mib": 5}]})",
       "field \"serve_args\" must not hold --decode: give it as the pipeline's \"decode\""},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "decode": "cpu", "serve_args": ["--cpu-share=0.3"]},
                    "memory_mib": 5}]})",
       "field \"serve_args\" holds --cpu-share, which splits each batch between the JPEG engines and the CPU, but "
       "the pipeline's decode is cpu"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "decode": "gpu"}, "memory_mib": 5},
                    {"name": "b", "pipeline": {"data": "/d", "decode": "cpu"}, "memory_mib": 5}]})",
       "jobs[1] (\"b\"): field \"pipeline\" has decode \"cpu\", but an earlier job's pipeline with the same data"},
      // The other fields that say how the one shared producer runs must agree too.
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5},
                    {"name": "b", "pipeline": {"data": "/d", "producer_batch": 128}, "memory_mib": 5}]})",
       "jobs[1] (\"b\"): field \"pipeline\" has producer_batch 128, but an earlier job's pipeline with the same "
       "data, augment, image_size, output and seed has 256: they share one producer, so give them the same "
       "producer_batch"},
      {R"({"pipelines": {"in": {"data": "/d", "window": 8}},
           "jobs": [{"name": "a", "pipeline": "in", "memory_mib": 5},
                    {"name": "b", "pipeline": {"data": "/d"}, "memory_mib": 5}]})",
       "jobs[1] (\"b\"): field \"pipeline\" has window 4, but an earlier job's pipeline with the same data, "
       "augment, image_size, output and seed has 8"},
      {R"({"jobs": [{"name": "a", "pipeline": {"data": "/d", "serve_args": ["--workers", "4"]}, "memory_mib": 5},
                    {"name": "b", "pipeline": {"data": "/d"}, "memory_mib": 5}]})",
       "jobs[1] (\"b\"): field \"pipeline\" has serve_args [], but an earlier job's pipeline with the same data, "
       "augment, image_size, output and seed has [\"--workers\", \"4\"]"},
      {job + gpu + R"({"name": "1g.5gb", "memory_mib": 4864, "jpeg_engines": -1}]}]})",
       "gpus[0].mig_profiles[0]: field \"jpeg_engines\" must be an integer in 0..64, got -1"},
  };
  for (const auto& [text, want] : cases) {
    Result<JobSet> r = Parse(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  }
}

TEST(Planner, AGpuDecodingProducerOfMigJobsGetsAnInstanceWithAJpegEngine) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(MigJobs(7, 4000, {"gpu"})));
  Planner planner(Opts(Policy::kSharingAware), set.gpus, &set);
  std::optional<Placement> first = planner.TryPlace(0);
  ASSERT_TRUE(first);
  // The job takes a plain 1g.5gb (of two the same size, the one without the engine), and its
  // producer the one 1g instance with a JPEG engine, counted on the GPU like a job's instance.
  EXPECT_EQ(first->mig_profile, "1g.5gb");
  EXPECT_TRUE(first->host_path);
  const ProducerDecode d = planner.DecodeOf(0);
  EXPECT_EQ(d.decode, "gpu");
  EXPECT_EQ(d.gpu, 0);
  EXPECT_EQ(d.mig_profile, "1g.5gb+me");
  EXPECT_EQ(d.reserved_mib, 4864);
  EXPECT_EQ(planner.MigSlicesUsed(0), 2);
  EXPECT_EQ(planner.loads()[0].used_mib, 2 * 4864);
  EXPECT_EQ(planner.loads()[0].producer_mib, 4864);
  // Its instance takes one of the 7 compute slices: six jobs run, the seventh waits.
  for (int j = 1; j < 6; ++j) {
    ASSERT_TRUE(planner.TryPlace(j)) << j;
    EXPECT_LE(planner.MigSlicesUsed(0), 7);
  }
  EXPECT_EQ(planner.MigSlicesUsed(0), 7);
  EXPECT_FALSE(planner.TryPlace(6)) << "an eighth compute slice was handed out";
  EXPECT_EQ(planner.DecodeOf(0).mig_profile, "1g.5gb+me");  // once, for the producer
  // It goes with the producer: when the last of its jobs goes, unless its process runs on.
  for (int j = 0; j < 6; ++j) planner.Release(j);
  EXPECT_EQ(planner.MigSlicesUsed(0), 0);
  EXPECT_EQ(planner.loads()[0].used_mib, 0);
  ASSERT_TRUE(planner.TryPlace(0));
  planner.LockProducer(0);
  planner.Release(0);
  EXPECT_EQ(planner.MigSlicesUsed(0), 1) << "the running producer's instance was handed back";
  EXPECT_EQ(planner.loads()[0].used_mib, 4864);
  planner.UnlockProducer(0);
  EXPECT_EQ(planner.MigSlicesUsed(0), 0);
  EXPECT_EQ(planner.loads()[0].used_mib, 0);
}

TEST(Planner, AnAutoPipelineOfMigJobsLeavesEveryComputeSliceToItsJobs) {
  // Seven isolated jobs of one pipeline that states no decode (auto, the default) on a 7-slice
  // A100: all seven run, none waits for a slice given to a decoder (found in review: the default
  // used to take the 1g.5gb+me and leave one job queued).
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(R"({"jobs": [)" + [] {
    std::string jobs;
    for (int i = 0; i < 7; ++i)
      jobs += std::string(i ? "," : "") + R"({"name": "j)" + std::to_string(i) +
              R"(", "isolation": true, "memory_mib": 4000, "pipeline": {"data": "/d"}})";
    return jobs;
  }() + "], " + kA100Mig + "}"));
  Planner planner(Opts(Policy::kSharingAware), set.gpus, &set);
  const Plan plan = MakePlan(set, set.gpus, Opts(Policy::kSharingAware), &planner);
  EXPECT_EQ(plan.placements.size(), 7u);
  EXPECT_EQ(planner.MigSlicesUsed(0), 7);
  EXPECT_EQ(planner.DecodeOf(0).decode, "cpu");
  EXPECT_NE(planner.DecodeOf(0).why.find("as serve's auto without --device"), std::string::npos)
      << planner.DecodeOf(0).why;
}

TEST(Planner, WithNoJpegInstanceLeftAGpuDecodingProducerDecodesOnTheCpuAndSaysWhy) {
  // Three pipelines: the first producer takes the 1g.5gb+me; the second (gpu) finds none and
  // decodes on the CPU, saying why; the third (auto) asks for no instance, as serve's auto
  // without --device; none takes the whole GPU's 7g.40gb.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(MigJobs(3, 4000, {"gpu", "gpu", "auto"})));
  Plan plan;
  Planner planner(Opts(Policy::kSharingAware), set.gpus, &set);
  plan = MakePlan(set, set.gpus, Opts(Policy::kSharingAware), &planner);
  ASSERT_EQ(plan.placements.size(), 3u);
  EXPECT_EQ(planner.DecodeOf(0).mig_profile, "1g.5gb+me");
  for (int pl : {1, 2}) {
    const ProducerDecode d = planner.DecodeOf(pl);
    EXPECT_EQ(d.decode, "cpu") << pl;
    EXPECT_EQ(d.gpu, -1) << pl;
    EXPECT_TRUE(d.mig_profile.empty()) << pl;
    EXPECT_NE(d.why.find(pl == 1 ? "decode gpu, but its jobs read host memory and no MIG instance with a JPEG engine "
                                   "(1g.5gb+me) that holds its ring"
                                 : "decode auto, and its jobs read host memory, so it has no GPU of its own: on the CPU"),
              std::string::npos)
        << d.why;
  }
  EXPECT_EQ(planner.MigSlicesUsed(0), 4);  // three jobs and one producer
  const std::string json = PlanJson(set, planner, plan);
  EXPECT_NE(json.find(R"("decode":{"mode":"gpu","gpu":0,"mig_profile":"1g.5gb+me")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("decode":{"mode":"cpu","why":"decode auto, and)"), std::string::npos) << json;
  const std::string table = PlanTable(set, planner, plan);
  EXPECT_NE(table.find("producer plan-d-0-0 decodes: gpu on gpu 0 (mig 1g.5gb+me); "), std::string::npos) << table;
  EXPECT_NE(table.find("producer plan-d-1-1 decodes: cpu; decode gpu, but"), std::string::npos) << table;

  // A ring too large for any instance with a JPEG engine, a GPU whose only engine is the whole
  // GPU's, and a pipeline that asks for the CPU: no instance is taken.
  ASSERT_OK_AND_ASSIGN(JobSet big, Parse(R"({"jobs": [{"name": "a", "isolation": true, "memory_mib": 4000,
      "pipeline": {"data": "/d", "decode": "gpu", "producer_batch": 1024, "window": 8}}], )" + std::string(kA100Mig) + "}"));
  Planner big_planner(Opts(Policy::kSharingAware), big.gpus, &big);
  ASSERT_TRUE(big_planner.TryPlace(0));
  EXPECT_EQ(big_planner.DecodeOf(0).decode, "cpu");
  EXPECT_NE(big_planner.DecodeOf(0).why.find("that holds its ring (7656 MiB) is free"), std::string::npos)
      << big_planner.DecodeOf(0).why;
  EXPECT_EQ(big_planner.MigSlicesUsed(0), 1);
  ASSERT_OK_AND_ASSIGN(JobSet no_me, Parse(MigJobs(1, 4000, {"gpu"}, R"("gpus": [{"memory_mib": 40960, "mig": true,
      "mig_profiles": [{"name": "1g.5gb", "memory_mib": 4864, "count": 7}, {"name": "7g.40gb", "memory_mib": 40192}]}])")));
  Planner no_me_planner(Opts(Policy::kSharingAware), no_me.gpus, &no_me);
  ASSERT_TRUE(no_me_planner.TryPlace(0));
  EXPECT_NE(no_me_planner.DecodeOf(0).why.find("no MIG profile here (but a whole GPU's) has a JPEG engine"),
            std::string::npos) << no_me_planner.DecodeOf(0).why;
  EXPECT_EQ(no_me_planner.MigSlicesUsed(0), 1);
  ASSERT_OK_AND_ASSIGN(JobSet cpu, Parse(MigJobs(1, 4000, {"cpu"})));
  Planner cpu_planner(Opts(Policy::kSharingAware), cpu.gpus, &cpu);
  ASSERT_TRUE(cpu_planner.TryPlace(0));
  EXPECT_EQ(cpu_planner.DecodeOf(0).decode, "cpu");
  EXPECT_EQ(cpu_planner.DecodeOf(0).why, "its pipeline's decode is cpu");
  EXPECT_EQ(cpu_planner.MigSlicesUsed(0), 1);
}

TEST(Planner, DecodeChangesNothingOnGpusWithoutMig) {
  // The same jobs with each decode: the same GPUs, modes, reservations and loads; a GPU-decoding
  // producer decodes on its ring's GPU, and without CUDA (--host-path) on the CPU.
  const std::string jobs = JobsJson({{20000, 0.3}, {30000, 0.4}, {25000, 0.5}, {10000, 0.2}}, 2);
  std::vector<std::string> plans;
  for (const char* decode : {"cpu", "gpu", "auto"}) {
    std::string text = jobs;
    for (size_t at = 0; (at = text.find(R"("/d/)", at)) != std::string::npos; at += 4)
      text.insert(text.find('}', at), std::string(R"(, "decode": ")") + decode + "\"");
    ASSERT_OK_AND_ASSIGN(JobSet set, Parse(text));
    ASSERT_EQ(set.pipelines[0].decode, decode);
    Planner planner(Opts(Policy::kSharingAware), Gpus(2), &set);
    Plan plan = MakePlan(set, planner.gpus(), Opts(Policy::kSharingAware), &planner);
    std::string summary;
    for (const Placement& p : plan.placements) {
      summary += std::to_string(p.job) + "@" + std::to_string(p.gpu) + ":" + ModeName(planner.ModeOf(p)) + ":" +
                 std::to_string(p.reserved_mib) + " ";
    }
    for (const GpuLoad& l : planner.loads()) summary += std::to_string(l.used_mib) + "/" + std::to_string(l.producer_mib) + " ";
    plans.push_back(summary);
    const ProducerDecode d = planner.DecodeOf(0);
    EXPECT_EQ(d.decode, decode);
    EXPECT_EQ(d.gpu, std::string(decode) == "cpu" ? -1 : *planner.ProducerGpus(0).begin());
    EXPECT_TRUE(d.mig_profile.empty());

    PlannerOptions no_cuda = Opts(Policy::kSharingAware);
    no_cuda.host_path = true;
    Planner host(no_cuda, Gpus(2), &set);
    ASSERT_TRUE(host.TryPlace(0));
    EXPECT_EQ(host.DecodeOf(0).decode, "cpu");
    if (std::string(decode) != "cpu") {
      EXPECT_NE(host.DecodeOf(0).why.find("--host-path"), std::string::npos) << host.DecodeOf(0).why;
    }
  }
  EXPECT_EQ(plans[0], plans[1]);
  EXPECT_EQ(plans[0], plans[2]);
}

// The launch check's group (examples/jobs_gpu.json): ResNet-18 jobs of batch 128, 64 and 96
// reading one producer of 128 x 224^2 x 3 float32 samples on the device path.
constexpr const char* kConsumerJobs = R"({
    "pipelines": {"in": {"data": "/d/in", "image_size": 224, "output": "float32", "producer_batch": 128}},
    "jobs": [
      {"name": "b128", "pipeline": "in", "batch_size": 128, "memory_mib": 6113, "sm_activity": 0.25},
      {"name": "b64", "pipeline": "in", "batch_size": 64, "memory_mib": 3496, "sm_activity": 0.2},
      {"name": "b96", "pipeline": "in", "batch_size": 96, "memory_mib": 2774, "sm_activity": 0.2},
      {"name": "unstated", "pipeline": "in", "memory_mib": 1000, "sm_activity": 0.1}]})";

TEST(Planner, AConsumerHoldsItsBatchCopiesInItsReservationAndMpsLimit) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(kConsumerJobs));
  Planner planner(Opts(Policy::kSharingAware), Gpus(1), &set);
  Plan plan = MakePlan(set, planner.gpus(), planner.options(), &planner);
  ASSERT_EQ(plan.placements.size(), 4u);
  std::map<std::string, Placement> by_name;
  for (const Placement& p : plan.placements) by_name[set.jobs[p.job].name] = p;
  // Every batch is copied out of the ring (gathered when it straddles slots): two live buffers
  // of labels (8 bytes each, 256-aligned) and B x 224 x 224 x 3 x 4 bytes of images. Unstated:
  // the producer's 128.
  const auto copies = [](double b) { return 2 * (std::ceil(b * 8 / 256) * 256 + b * 224 * 224 * 3 * 4) / (1 << 20); };
  EXPECT_NEAR(copies(96), 110.25, 0.01);
  const double ring = set.pipelines[0].RingMiB();
  EXPECT_NEAR(ring, 441, 1);
  double reserved = 0;
  for (const auto& [name, b] : std::vector<std::pair<std::string, double>>{{"b128", 128}, {"b64", 64}, {"b96", 96},
                                                                           {"unstated", 128}}) {
    const Placement& p = by_name[name];
    const double estimate = set.jobs[p.job].memory_mib;
    EXPECT_DOUBLE_EQ(p.client_mib, copies(b)) << name;
    EXPECT_DOUBLE_EQ(p.reserved_mib, estimate + copies(b)) << name;
    reserved += p.reserved_mib;
    // MPS's limit also holds the producer's ring, which it charges to every client that maps it;
    // the job's own figure does not.
    std::map<std::string, std::string> env = JobEnvironment(set, planner, p);
    EXPECT_EQ(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
              "0=" + std::to_string(static_cast<long long>(std::ceil(estimate + copies(b) + ring))) + "M") << name;
    EXPECT_EQ(env["COLOADER_MEMORY_LIMIT_MIB"], std::to_string(static_cast<long long>(std::ceil(estimate + copies(b)))))
        << name;
  }
  // The GPU's packing counts them, and the ring once.
  EXPECT_DOUBLE_EQ(planner.loads()[0].used_mib, reserved + set.pipelines[0].DeviceMiB());
  // And the plan shows it.
  EXPECT_NE(PlanJson(set, planner, plan).find("\"client_mib\":"), std::string::npos);
  EXPECT_NE(PlanTable(set, planner, plan).find("client"), std::string::npos);
  planner.Release(by_name["b96"].job);
  EXPECT_DOUBLE_EQ(planner.loads()[0].used_mib, reserved - 2774 - copies(96) + set.pipelines[0].DeviceMiB());
}

TEST(Planner, NoConsumerTermOffTheDevicePath) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(kConsumerJobs));
  const int b96 = 2;
  ASSERT_EQ(set.jobs[b96].name, "b96");
  // Host-memory ring (no CUDA): the copies are host buffers.
  PlannerOptions host = Opts(Policy::kSharingAware);
  host.host_path = true;
  Planner on_host(host, Gpus(1), &set);
  std::optional<Placement> p = on_host.TryPlace(b96);
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->host_path);
  EXPECT_EQ(p->client_mib, 0);
  EXPECT_DOUBLE_EQ(p->reserved_mib, 2774);
  // Its own loader (no sharing).
  Planner own(Opts(Policy::kSharingAware, /*sharing=*/false), Gpus(1), &set);
  p = own.TryPlace(b96);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->client_mib, 0);
  // A MIG instance reads the host ring.
  Gpu mig{0, "mig-gpu", 81920, 132, true, {{"1g.10gb", 9984, 16, 7}}};
  Planner on_mig(Opts(Policy::kSharingAware), {mig}, &set);
  p = on_mig.TryPlace(b96);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->mode, Mode::kMig);
  EXPECT_EQ(p->client_mib, 0);
}

TEST(Planner, TheConsumerTermCanKeepAJobOffAFullGpu) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(kConsumerJobs));
  const double ring = set.pipelines[0].DeviceMiB();
  // Room for b96's estimate and the ring, but not for its batch copies too: it runs with a
  // loader of its own (no ring, no copies) rather than beside the producer.
  Planner tight(Opts(Policy::kSharingAware), Gpus(1, 2774 + ring + 100), &set);
  std::optional<Placement> own = tight.TryPlace(2);
  ASSERT_TRUE(own);
  EXPECT_EQ(own->producer, -1);
  EXPECT_EQ(own->client_mib, 0);
  Planner roomy(Opts(Policy::kSharingAware), Gpus(1, 2774 + ring + 111), &set);
  std::optional<Placement> shared = roomy.TryPlace(2);
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->producer, 0);
  EXPECT_GT(shared->client_mib, 100);
}

TEST(Planner, ALockedProducerKeepsItsLaterJobsOnItsGpu) {
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(JobsJson({{1000, 0.3}, {1000, 0.3}, {1000, 0.3}})));
  Planner planner(Opts(Policy::kMostMemory), Gpus(2), &set);
  std::optional<Placement> first = planner.TryPlace(0);
  ASSERT_TRUE(first);
  planner.LockProducer(0);
  for (int j : {1, 2}) {
    std::optional<Placement> p = planner.TryPlace(j);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->gpu, first->gpu);  // most-memory alone would pick the empty GPU
  }
}

TEST(Planner, AutoMemoryRunsTheEstimatorAndNamesTheJobWhenItFails) {
  // Two identical jobs (the estimator runs once for both) and one at 448 px (its own run).
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(R"({"jobs": [{"name": "r50", "pipeline": {"data": "/d"},
      "memory_mib": "auto", "model": "torchvision:resnet50", "batch_size": 128, "precision": "bf16-amp"},
      {"name": "r50b", "pipeline": {"data": "/d"}, "memory_mib": "auto", "model": "torchvision:resnet50",
       "batch_size": 128, "precision": "bf16-amp"},
      {"name": "big", "pipeline": {"data": "/d", "image_size": 448}, "memory_mib": "auto",
       "model": "torchvision:resnet50", "batch_size": 128, "precision": "bf16-amp"}]})"));
  Status missing = EstimateAutoJobs(&set, "/nonexistent/python3");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("job \"r50\""), std::string::npos) << missing.message();
  // A stand-in estimator module with the documented interface: argv in, one JSON object out.
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/coloader/estimator");
  testing::WriteFile(dir.path() + "/coloader/__init__.py", "");
  testing::WriteFile(dir.path() + "/coloader/estimator/__init__.py", "");
  testing::WriteFile(dir.path() + "/coloader/estimator/__main__.py",
                     "import json, sys\n"
                     "a = sys.argv[1:]\n"
                     "assert a[a.index('--precision') + 1] == 'bf16-amp' and '--json' in a\n"
                     "if a[a.index('--batch-size') + 1] != '128': sys.exit('bad batch')\n"
                     "open('" + dir.path() + "/runs', 'a').write('run\\n')\n"
                     "print(json.dumps({'total_mib': 9876.5 * int(a[a.index('--image-size') + 1]) / 224, 'parts': {},\n"
                     "                  'sm_activity': 0.42}))\n");
  const char* old = std::getenv("PYTHONPATH");
  const std::string saved = old ? old : "";
  ::setenv("PYTHONPATH", dir.path().c_str(), 1);
  Status ok = EstimateAutoJobs(&set, "/usr/bin/python3");
  if (old) ::setenv("PYTHONPATH", saved.c_str(), 1); else ::unsetenv("PYTHONPATH");
  ASSERT_OK(ok);
  EXPECT_DOUBLE_EQ(set.jobs[0].memory_mib, 9876.5);
  EXPECT_DOUBLE_EQ(set.jobs[1].memory_mib, 9876.5);
  EXPECT_DOUBLE_EQ(set.jobs[2].memory_mib, 2 * 9876.5);  // its image size reached the estimator
  EXPECT_DOUBLE_EQ(set.jobs[0].sm_activity, 0.42);  // no sm_activity stated: the same run gives it
  EXPECT_EQ(set.jobs[0].sm_source, Job::SmSource::kEstimated);
  EXPECT_EQ(testing::ReadFile(dir.path() + "/runs"), "run\nrun\n");  // not once per job
}

// A stand-in estimator whose answer depends on the model: "bad" is refused (exit 2, as the real
// one refuses an unknown model), "old" prints memory but no sm_activity (an estimator from before
// the activity model), "junk" prints no JSON, "nomod" fails as a Python without the package does;
// an optimizer other than sgd, adam or adamw is refused (exit 2) as the real one refuses it.
// Every run appends its model to <dir>/runs.
void WriteStandInEstimator(const std::string& dir) {
  std::filesystem::create_directories(dir + "/coloader/estimator");
  testing::WriteFile(dir + "/coloader/__init__.py", "");
  testing::WriteFile(dir + "/coloader/estimator/__init__.py", "");
  testing::WriteFile(dir + "/coloader/estimator/__main__.py",
                     "import json, sys\n"
                     "a = sys.argv[1:]\n"
                     "m = a[a.index('--model') + 1].split(':')[1]\n"
                     "open('" + dir + "/runs', 'a').write(m + '\\n')\n"
                     "o = a[a.index('--optimizer') + 1]\n"
                     "if o not in ('sgd', 'adam', 'adamw'):\n"
                     "    print(f\"error: unknown optimizer '{o}'\", file=sys.stderr); sys.exit(2)\n"
                     "if m == 'bad':\n"
                     "    print(\"error: unknown model 'torchvision:bad'\", file=sys.stderr); sys.exit(2)\n"
                     "if m == 'nomod':\n"
                     "    print(\"ModuleNotFoundError: No module named 'coloader'\", file=sys.stderr); sys.exit(1)\n"
                     "if m == 'junk':\n"
                     "    print('not json'); sys.exit(0)\n"
                     "out = {'total_mib': 2000.0, 'parts': {}}\n"
                     "if m != 'old': out['sm_activity'] = 0.42\n"
                     "print(json.dumps(out))\n");
}

Status EstimateWithPythonPath(JobSet* set, const std::string& path, std::string* err = nullptr) {
  const char* old = std::getenv("PYTHONPATH");
  const std::string saved = old ? old : "";
  ::setenv("PYTHONPATH", path.c_str(), 1);
  ::testing::internal::CaptureStderr();
  Status st = EstimateAutoJobs(set, "/usr/bin/python3");
  const std::string printed = ::testing::internal::GetCapturedStderr();
  if (err) *err = printed;
  if (old) ::setenv("PYTHONPATH", saved.c_str(), 1); else ::unsetenv("PYTHONPATH");
  return st;
}

std::string ModelJob(const std::string& name, const std::string& model, const std::string& memory,
                     const std::string& extra = "") {
  return R"({"name": ")" + name + R"(", "pipeline": {"data": "/d"}, "batch_size": 32, "memory_mib": )" + memory +
         R"(, "model": "torchvision:)" + model + "\"" + extra + "}";
}

TEST(Planner, AJobThatWantsOnlyItsSmActivityKeepsTheDefaultWhenTheEstimatorGivesNoneAndThePlanSaysWhy) {
  testing::TempDir dir;
  WriteStandInEstimator(dir.path());
  // "old-auto" runs the estimator for its memory only (its SM activity is stated), so "old" reuses
  // that run: the reused run must be judged as a fresh one (it printed no sm_activity). "bad2"
  // reuses "bad"'s refusal. "lion"'s optimizer is one the estimator does not know: with its memory
  // stated that is no error in the jobs file; the estimator refuses it, and it keeps the default.
  ASSERT_OK_AND_ASSIGN(JobSet set,
                       Parse(R"({"jobs": [)" + ModelJob("old-auto", "old", "\"auto\"", R"(, "sm_activity": 0.5)") + "," +
                             ModelJob("old", "old", "3000") + "," + ModelJob("bad", "bad", "3000") + "," +
                             ModelJob("bad2", "bad", "3000") + "," + ModelJob("junk", "junk", "3000") + "," +
                             ModelJob("nomod", "nomod", "3000") + "," + ModelJob("good", "good", "3000") + "," +
                             ModelJob("lion", "good", "3000", R"(, "optimizer": "lion")") + "]}"));
  std::string err;
  ASSERT_OK(EstimateWithPythonPath(&set, dir.path(), &err));
  std::map<std::string, const Job*> job;
  for (const Job& j : set.jobs) job[j.name] = &j;
  EXPECT_DOUBLE_EQ(job["old-auto"]->memory_mib, 2000);
  EXPECT_EQ(job["old-auto"]->sm_source, Job::SmSource::kStated);
  EXPECT_EQ(job["good"]->sm_source, Job::SmSource::kEstimated);
  EXPECT_DOUBLE_EQ(job["good"]->sm_activity, 0.42);
  EXPECT_DOUBLE_EQ(job["good"]->memory_mib, 3000);
  const std::map<std::string, std::string> why = {{"old", "printed no \"sm_activity\""},
                                                  {"bad", "failed (exit 2): error: unknown model 'torchvision:bad'"},
                                                  {"bad2", "failed (exit 2): error: unknown model 'torchvision:bad'"},
                                                  {"lion", "failed (exit 2): error: unknown optimizer 'lion'"},
                                                  {"junk", "not a JSON object"},
                                                  {"nomod", "No module named 'coloader'"}};
  for (const auto& [name, text] : why) {
    EXPECT_EQ(job[name]->sm_source, Job::SmSource::kDefault) << name;
    EXPECT_LT(job[name]->sm_activity, 0) << name;  // the planner's default, not -1 as an estimate
    EXPECT_NE(job[name]->sm_why.find(text), std::string::npos) << name << ": " << job[name]->sm_why;
    EXPECT_DOUBLE_EQ(job[name]->memory_mib, 3000) << name;
  }
  // One run per distinct command, a failed one included.
  EXPECT_EQ(testing::ReadFile(dir.path() + "/runs"), "old\nbad\njunk\nnomod\ngood\ngood\n");
  // One warning line per distinct reason, naming its jobs and what to do.
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 5) << err;
  EXPECT_NE(err.find("jobs bad, bad2 (the estimator failed (exit 2)"), std::string::npos) << err;
  EXPECT_NE(err.find("refused the job's figures: check its model"), std::string::npos) << err;
  EXPECT_NE(err.find("job nomod (the estimator failed (exit 1): ModuleNotFoundError: No module named 'coloader')"),
            std::string::npos) << err;
  EXPECT_NE(err.find("Install the coloader Python package"), std::string::npos) << err;

  // The plan goes on with the default and says why, in the JSON and in the table.
  PlannerOptions o = Opts(Policy::kSharingAware);
  o.default_sm = 0.25;
  Planner planner(o, Gpus(8), &set);
  const Plan plan = MakePlan(set, Gpus(8), o, &planner);
  ASSERT_EQ(plan.placements.size(), set.jobs.size());
  EXPECT_DOUBLE_EQ(planner.SmOf(1), 0.25);
  ASSERT_OK_AND_ASSIGN(JsonValue doc, ParseJson(PlanJson(set, planner, plan), "plan"));
  std::map<std::string, std::string> plan_why;
  for (const JsonValue& j : doc.Find("jobs")->items()) {
    if (const JsonValue* w = j.Find("sm_why")) {
      plan_why[j.Find("name")->string()] = w->string();
      EXPECT_EQ(j.Find("sm_source")->string(), "default");
    }
  }
  EXPECT_EQ(plan_why.size(), why.size());
  EXPECT_NE(plan_why["junk"].find("not a JSON object"), std::string::npos) << plan_why["junk"];
  const std::string table = PlanTable(set, planner, plan);
  EXPECT_NE(table.find("job old: SM activity 0.25 (--default-sm), because the estimator printed no"),
            std::string::npos) << table;
  EXPECT_EQ(table.find("job good: SM activity"), std::string::npos) << table;
}

TEST(Planner, AnAutoJobsEstimatorFailureIsStillAnErrorThatSaysWhatToDo) {
  testing::TempDir dir;
  WriteStandInEstimator(dir.path());
  for (const std::string model : {"bad", "nomod", "junk", "old"}) {
    // Its SM activity would fall back; its memory has no other source. A run that printed a
    // figure for one job is judged the same for the next.
    ASSERT_OK_AND_ASSIGN(JobSet set, Parse(R"({"jobs": [)" + ModelJob("first", model, "3000") + "," +
                                           ModelJob("auto", model, "\"auto\"") + "]}"));
    Status st = EstimateWithPythonPath(&set, dir.path());
    if (model == "old") {  // memory it printed; no SM activity is no error
      ASSERT_OK(st);
      EXPECT_DOUBLE_EQ(set.jobs[1].memory_mib, 2000);
      EXPECT_EQ(set.jobs[1].sm_source, Job::SmSource::kDefault);
      continue;
    }
    ASSERT_FALSE(st.ok()) << model;
    EXPECT_NE(st.message().find("job \"auto\": memory_mib is \"auto\" but the estimator"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("give memory_mib in MiB"), std::string::npos) << st.message();
    const bool refused = model == "bad";
    EXPECT_EQ(st.message().find("unknown model 'torchvision:bad'") != std::string::npos, refused) << st.message();
    EXPECT_EQ(st.message().find("check its model, batch_size") != std::string::npos, refused) << st.message();
    EXPECT_EQ(st.message().find("Install the coloader Python package") != std::string::npos, model == "nomod")
        << st.message();
  }
  // With no Python at all: the install hint.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(R"({"jobs": [)" + ModelJob("auto", "good", "\"auto\"") + "]}"));
  Status missing = EstimateAutoJobs(&set, "/nonexistent/python3");
  EXPECT_NE(missing.message().find("could not run"), std::string::npos) << missing.message();
  EXPECT_NE(missing.message().find("pip install ./python"), std::string::npos) << missing.message();
}

TEST(Planner, AJobWithAModelButNoSmActivityGetsTheEstimatorsAndThePlanSaysSo) {
  // The real estimator, from the source tree: one run serves "mem" (memory stated) and "auto"
  // (the same command); "stated" keeps its own figure, "none" (no model) the default.
  ASSERT_OK_AND_ASSIGN(JobSet set, Parse(R"({"jobs": [
      {"name": "mem", "pipeline": {"data": "/d", "image_size": 64}, "memory_mib": 3000,
       "model": "torchvision:resnet18", "batch_size": 32, "precision": "bf16-amp"},
      {"name": "auto", "pipeline": {"data": "/d", "image_size": 64}, "memory_mib": "auto",
       "model": "torchvision:resnet18", "batch_size": 32, "precision": "bf16-amp"},
      {"name": "stated", "pipeline": {"data": "/d", "image_size": 64}, "memory_mib": 3000,
       "model": "torchvision:resnet18", "batch_size": 32, "sm_activity": 0.3},
      {"name": "none", "pipeline": {"data": "/d", "image_size": 64}, "memory_mib": 3000}]})"));
  // No Python: "mem" wanted only its SM activity and keeps the default; "auto" has no memory.
  Status missing = EstimateAutoJobs(&set, "/nonexistent/python3");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("job \"auto\": memory_mib is \"auto\" but the estimator"), std::string::npos)
      << missing.message();
  EXPECT_NE(missing.message().find("give memory_mib in MiB"), std::string::npos) << missing.message();
  EXPECT_EQ(set.jobs[0].sm_source, Job::SmSource::kDefault);
  EXPECT_NE(set.jobs[0].sm_why.find("could not run"), std::string::npos) << set.jobs[0].sm_why;

  Result<CommandOutput> torch = RunCommand({"/usr/bin/python3", "-c", "import torch, torchvision"}, 60000);
  if (!torch.ok() || torch->exit_code != 0) GTEST_SKIP() << "/usr/bin/python3 has no torch and torchvision";
  const char* old = std::getenv("PYTHONPATH");
  const std::string saved = old ? old : "";
  ::setenv("PYTHONPATH", (std::string(COLOADER_SOURCE_DIR) + "/python").c_str(), 1);
  Status ok = EstimateAutoJobs(&set, "/usr/bin/python3");
  if (old) ::setenv("PYTHONPATH", saved.c_str(), 1); else ::unsetenv("PYTHONPATH");
  ASSERT_OK(ok);
  EXPECT_EQ(set.jobs[0].sm_source, Job::SmSource::kEstimated);
  EXPECT_TRUE(set.jobs[0].sm_why.empty()) << set.jobs[0].sm_why;
  EXPECT_GT(set.jobs[0].sm_activity, 0);
  EXPECT_LE(set.jobs[0].sm_activity, 1);
  EXPECT_DOUBLE_EQ(set.jobs[0].memory_mib, 3000);  // stated memory stays
  EXPECT_EQ(set.jobs[1].sm_source, Job::SmSource::kEstimated);
  EXPECT_DOUBLE_EQ(set.jobs[1].sm_activity, set.jobs[0].sm_activity);
  EXPECT_GT(set.jobs[1].memory_mib, 0);
  EXPECT_EQ(set.jobs[2].sm_source, Job::SmSource::kStated);
  EXPECT_DOUBLE_EQ(set.jobs[2].sm_activity, 0.3);
  EXPECT_EQ(set.jobs[3].sm_source, Job::SmSource::kDefault);

  Planner planner(Opts(Policy::kSharingAware), Gpus(4), &set);
  const Plan plan = MakePlan(set, Gpus(4), Opts(Policy::kSharingAware), &planner);
  ASSERT_EQ(plan.placements.size(), 4u);
  EXPECT_DOUBLE_EQ(planner.SmOf(0), set.jobs[0].sm_activity);
  EXPECT_DOUBLE_EQ(planner.SmOf(3), planner.options().default_sm);
  ASSERT_OK_AND_ASSIGN(JsonValue doc, ParseJson(PlanJson(set, planner, plan), "plan"));
  std::map<std::string, std::string> source;
  for (const JsonValue& j : doc.Find("jobs")->items()) source[j.Find("name")->string()] = j.Find("sm_source")->string();
  EXPECT_EQ(source, (std::map<std::string, std::string>{
                        {"mem", "estimated"}, {"auto", "estimated"}, {"stated", "stated"}, {"none", "default"}}));
  const std::string table = PlanTable(set, planner, plan);
  EXPECT_NE(table.find("estimated"), std::string::npos) << table;
  EXPECT_NE(table.find("default"), std::string::npos) << table;
}

// When poll itself fails (here: EINVAL, because RLIMIT_NOFILE drops below the two fds it
// watches), the helper command must be killed and reported, not waited for without a timeout.
// The command ignores SIGPIPE and runs for 30 s or more, so the old wait would outlive the
// test's patience. It runs in a forked child (the limit is process-wide); a timer signal lowers
// the limit once the command runs, so RunCommand is polling it (no thread: sanitizer runtimes
// and fork do not mix well), and the parent kills the child if it has not finished within 10 s.
TEST(Launcher, RunCommandStopsTheChildWhenPollFails) {
  // The command's first act is to create this file; the timer lowers the limit only after that
  // (a single timer at a fixed time could fire before the command was spawned, on a slow machine).
  static char started[64];
  std::snprintf(started, sizeof started, "/tmp/coloader-poll-%d", static_cast<int>(::getpid()));
  ::unlink(started);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    struct sigaction sa {};
    sa.sa_handler = [](int) {
      const int saved = errno;  // the interrupted code may be about to read it
      if (::access(started, F_OK) == 0) {
        rlimit rl{};
        ::getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 1;
        ::setrlimit(RLIMIT_NOFILE, &rl);
      }
      errno = saved;
    };
    ::sigaction(SIGALRM, &sa, nullptr);
    itimerval t{};
    t.it_value.tv_usec = 50000;
    t.it_interval.tv_usec = 50000;  // each tick interrupts poll, which RunCommand resumes
    ::setitimer(ITIMER_REAL, &t, nullptr);
    Result<CommandOutput> r = RunCommand({"/bin/sh", "-c",
                                          std::string("touch ") + started +
                                              "; trap '' PIPE; i=0; while [ $i -lt 600 ]; do echo x 2>/dev/null; "
                                              "sleep 0.05; i=$((i+1)); done"},
                                         60000);
    const bool named = !r.ok() && r.status().message().find("poll on the output of /bin/sh") != std::string::npos;
    ::_exit(named ? 0 : 3);
  }
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 1000 && done == 0; ++i) {
    done = ::waitpid(child, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::unlink(started);
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL() << "RunCommand hung after poll failed";
  }
  ASSERT_EQ(done, child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "RunCommand did not report the poll failure";
}

TEST(Launcher, WhatCountsAsOutOfMemory) {
  EXPECT_TRUE(LooksLikeOom(1, false, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"));
  EXPECT_TRUE(LooksLikeOom(1, false, "RuntimeError: CUDA error: OUT OF MEMORY"));
  EXPECT_TRUE(LooksLikeOom(128 + SIGKILL, false, ""));   // the kernel's OOM killer
  EXPECT_FALSE(LooksLikeOom(128 + SIGKILL, true, ""));   // we killed it
  EXPECT_FALSE(LooksLikeOom(0, false, "out of memory")); // it recovered and finished
  EXPECT_FALSE(LooksLikeOom(1, false, "ValueError: bad input"));
}

}  // namespace
}  // namespace coloader
