// `coloader launch` driving real processes without a GPU (host path, no MPS): a producer, real
// consumers, a job that runs out of memory once and is requeued, a clean stop on SIGTERM with
// nothing left running, and clear errors for bad input.
#include <signal.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <filesystem>
#include <regex>
#include <set>

#include "common/process.h"
#include "placement/simulator.h"
#include "tests/support/test_support.h"
#include "toolbox/json_reader.h"

namespace coloader {
namespace {

using testing::Child;
using testing::Coloader;
using testing::TempDir;

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = tmp_.path() + "/data";
    ASSERT_EQ(testing::MakeImageFolder(data_, 40, 2), 40);
  }

  std::string Binary() const { return Coloader({})[0]; }

  // A job that runs the reference consumer against the planned producer.
  std::string ConsumerJob(const std::string& name, const std::string& extra) const {
    return R"({"name": ")" + name + R"(", "command": [")" + Binary() +
           R"(", "consume", "--name", "{producer}", "--epochs", "2", "--json")" + extra + R"(],
      "pipeline": "p", "memory_mib": 3000, "sm_activity": 0.2, "loader_cores": 2})";
  }
  std::string ShellJob(const std::string& name, const std::string& script, double mib = 3000) const {
    return R"({"name": ")" + name + R"(", "command": ["/bin/sh", "-c", ")" + script + R"("],
      "pipeline": "p", "memory_mib": )" + std::to_string(mib) + R"(, "sm_activity": 0.2, "loader_cores": 2})";
  }
  std::string WriteJobs(const std::vector<std::string>& jobs, const std::string& data = "") const {
    std::string s = R"({"cpu_cores": 8, "gpus": [{"memory_mib": 16000, "sms": 100}],
      "pipelines": {"p": {"data": ")" + (data.empty() ? data_ : data) +
                    R"(", "image_size": 32, "producer_batch": 8, "serve_args": ["--workers", "1"]}}, "jobs": [)";
    for (size_t i = 0; i < jobs.size(); ++i) s += (i ? "," : "") + jobs[i];
    s += "]}";
    const std::string path = tmp_.path() + "/jobs.json";
    testing::WriteFile(path, s);
    return path;
  }
  // Every pid the launcher reported starting ("(pid N").
  static std::set<int> StartedPids(const std::string& log) {
    std::set<int> pids;
    std::regex re("\\(pid ([0-9]+)");
    for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) pids.insert(std::stoi((*it)[1]));
    return pids;
  }
  // Gone: no such process, or a zombie (dead; an orphan waits for init to reap it).
  static void ExpectGone(const std::set<int>& pids) {
    for (int pid : pids) {
      const std::string stat = testing::ReadFile("/proc/" + std::to_string(pid) + "/stat");
      const size_t paren = stat.rfind(')');
      const char state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 'X';
      EXPECT_TRUE(stat.empty() || state == 'Z') << "pid " << pid << " is still running: " << stat;
    }
  }
  TempDir tmp_;
  std::string data_;
};

TEST_F(LaunchTest, SharedProducerRequeuesAnOomJobAndSummarises) {
  const std::string marker = tmp_.path() + "/oom-once";
  const std::string jobs = WriteJobs({
      ConsumerJob("a", R"(, "--batch-size", "5")"),
      ConsumerJob("b", ""),
      // Fails like a PyTorch job out of GPU memory on its first attempt, succeeds on its second.
      ShellJob("oomy", "if [ ! -e " + marker + " ]; then touch " + marker +
                           "; echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1; fi",
               4000),
      // Killed by SIGKILL that the launcher did not send, as the kernel's OOM killer does.
      ShellJob("oomkilled", "if [ ! -e " + marker + "-kill ]; then touch " + marker + "-kill; kill -KILL $$; fi", 2000),
  });
  const std::string run = tmp_.path() + "/run";
  Child launch(Coloader({"launch", jobs, "--json", "--run-dir", run}));
  ASSERT_EQ(launch.Wait(120000), 0) << launch.Stderr();
  ASSERT_OK_AND_ASSIGN(JsonValue s, ParseJson(launch.Stdout(), "launch summary"));
  EXPECT_EQ(s.Find("done")->number(), 4);
  EXPECT_EQ(s.Find("failed")->number(), 0);
  EXPECT_EQ(s.Find("ooms")->number(), 2);
  EXPECT_EQ(s.Find("retries")->number(), 2);     // both requeued (grow-then-alone's first OOM: grown)
  EXPECT_GT(s.Find("lost_gpu_s")->number(), 0);  // the two attempts that ran out of memory
  EXPECT_EQ(s.Find("producers")->number(), 1);  // three jobs, one pipeline, one producer
  EXPECT_FALSE(s.Find("stopped")->bool_value());
  EXPECT_GT(s.Find("producer_cpu_s")->number(), 0);  // its CPU time, from wait4
  EXPECT_GT(s.Find("per_job_loader_cpu_s")->number(), 0);
  for (const JsonValue& j : s.Find("jobs")->items()) {
    const std::string name = j.Find("name")->string();
    EXPECT_EQ(j.Find("outcome")->string(), "done") << name;
    const bool requeued = name == "oomy" || name == "oomkilled";
    EXPECT_EQ(j.Find("attempts")->number(), requeued ? 2 : 1) << name;
    EXPECT_EQ(j.Find("ooms")->number(), requeued ? 1 : 0) << name;
    const double first = name == "oomy" ? 4000 : (name == "oomkilled" ? 2000 : 3000);
    EXPECT_EQ(j.Find("memory_mib")->number(), requeued ? 1.5 * first : first) << name;  // 1.5x after the OOM
  }
  // The consumers read the shared producer: each one's last epoch is whole.
  for (const char* name : {"a", "b"}) {
    auto epochs = testing::ParseJsonLines(testing::ReadFile(run + "/job-" + std::string(name) + ".1.out"));
    ASSERT_EQ(epochs.size(), 2u) << name;
    testing::ExpectExactEpoch(epochs.back(), 40);
  }
  EXPECT_NE(launch.Stderr().find("job oomy ran out of GPU memory (exit 1); requeued with 6000 MiB"), std::string::npos)
      << launch.Stderr();
  const std::set<int> pids = StartedPids(launch.Stderr());
  EXPECT_EQ(pids.size(), 7u);  // producer, a, b, oomy twice, oomkilled twice
  ExpectGone(pids);
}

TEST_F(LaunchTest, SigtermStopsJobsTheirChildrenAndProducers) {
  const std::string grandchild = tmp_.path() + "/grandchild.pid";
  const std::string jobs = WriteJobs({
      ConsumerJob("reader", R"(, "--step-ms", "200")"),
      ShellJob("sleeper", "sleep 300 & echo $! > " + grandchild + ".tmp; mv " + grandchild + ".tmp " + grandchild + "; wait"),
  });
  Child launch(Coloader({"launch", jobs, "--json", "--run-dir", tmp_.path() + "/run"}));
  ASSERT_TRUE(launch.WaitForStderr("job sleeper started", 30000)) << launch.Stderr();
  ASSERT_TRUE(launch.WaitForStderr("job reader started", 30000)) << launch.Stderr();
  // The sleeper's own child is running once its pid file appears.
  const uint64_t deadline = MonotonicNs() + 20000000000ull;
  while (!std::filesystem::exists(grandchild) && MonotonicNs() < deadline) ::usleep(10000);
  ASSERT_TRUE(std::filesystem::exists(grandchild));
  launch.Signal(SIGTERM);
  ASSERT_EQ(launch.Wait(60000), 130) << launch.Stderr();
  ASSERT_OK_AND_ASSIGN(JsonValue s, ParseJson(launch.Stdout(), "launch summary"));
  EXPECT_TRUE(s.Find("stopped")->bool_value());
  EXPECT_EQ(s.Find("done")->number(), 0);
  for (const JsonValue& j : s.Find("jobs")->items()) EXPECT_EQ(j.Find("outcome")->string(), "stopped");
  std::set<int> pids = StartedPids(launch.Stderr());
  EXPECT_EQ(pids.size(), 3u);
  pids.insert(std::stoi(testing::ReadFile(grandchild)));
  ExpectGone(pids);
}

// Jobs one after another (each needs more than half the GPU): the launcher's own open files
// must not grow with the number of attempts (each one's pidfd is closed once it is reaped), and
// what a job leaves running in its process group is killed when it ends.
TEST_F(LaunchTest, FinishedJobsLeaveNoOpenPidfdsAndNoChildren) {
  const std::string dir = tmp_.path() + "/fds";
  std::filesystem::create_directories(dir);
  const std::string orphan = tmp_.path() + "/orphan.pid";
  // Each job counts the launcher's fds once the launcher holds the pidfd it watches this job
  // through (a pidfd's fdinfo names its pid): counted earlier, the first job could race the
  // launcher's pidfd_open and see one fd fewer than the last.
  // (No double quotes or backslashes: the script goes into the jobs file's JSON as it is.)
  const std::string count = "for i in $(seq 1000); do grep -qsxE 'Pid:[[:space:]]+'$$ /proc/$PPID/fdinfo/* && break; "
                            "sleep 0.01; done; ls /proc/$PPID/fd | wc -l > " + dir + "/";
  std::vector<std::string> jobs = {ShellJob("j0", "sleep 300 & echo $! > " + orphan + "; " + count + "j0", 9000)};
  const int kJobs = 8;
  for (int i = 1; i < kJobs; ++i) {
    const std::string name = "j" + std::to_string(i);
    jobs.push_back(ShellJob(name, count + name, 9000));
  }
  Child launch(Coloader({"launch", WriteJobs(jobs), "--json", "--run-dir", tmp_.path() + "/run", "--policy",
                         "fifo-exclusive"}));
  ASSERT_EQ(launch.Wait(120000), 0) << launch.Stderr();
  const int first = std::stoi(testing::ReadFile(dir + "/j0"));
  const int last = std::stoi(testing::ReadFile(dir + "/j" + std::to_string(kJobs - 1)));
  EXPECT_LE(last, first) << "the launcher holds " << last - first << " more fds after " << kJobs - 1 << " jobs";
  ExpectGone({std::stoi(testing::ReadFile(orphan))});
}

TEST_F(LaunchTest, AProducerThatCannotStartFailsItsJobsWithoutHanging) {
  const std::string jobs = WriteJobs({ConsumerJob("a", "")}, tmp_.path() + "/no-such-dataset");
  Child launch(Coloader({"launch", jobs, "--json", "--run-dir", tmp_.path() + "/run"}));
  ASSERT_EQ(launch.Wait(60000), 1) << launch.Stderr();
  EXPECT_NE(launch.Stderr().find("did not start"), std::string::npos) << launch.Stderr();
  EXPECT_NE(launch.Stderr().find("no-such-dataset"), std::string::npos) << launch.Stderr();
  ExpectGone(StartedPids(launch.Stderr()));
}

// A job whose command cannot start is failed, and its pipeline's producer, with no job left, is
// stopped: the launch ends (found in review: the --forever producer ran on, and launch with it).
TEST_F(LaunchTest, AJobThatCannotStartEndsTheLaunchAndStopsItsProducer) {
  const std::string path = tmp_.path() + "/jobs-nostart.json";
  testing::WriteFile(path, R"({"cpu_cores": 8, "gpus": [{"memory_mib": 16000, "sms": 100}],
    "pipelines": {"p": {"data": ")" + data_ + R"(", "image_size": 32, "producer_batch": 8, "serve_args": ["--workers", "1"]}},
    "jobs": [{"name": "ghost", "command": [")" + tmp_.path() + R"(/no-such-program"], "pipeline": "p",
              "memory_mib": 3000, "sm_activity": 0.2, "loader_cores": 2}]})");
  Child launch(Coloader({"launch", path, "--json", "--run-dir", tmp_.path() + "/run-nostart"}));
  ASSERT_EQ(launch.Wait(60000), 1) << launch.Stderr();
  ASSERT_OK_AND_ASSIGN(JsonValue s, ParseJson(launch.Stdout(), "launch summary"));
  EXPECT_EQ(s.Find("failed")->number(), 1);
  ExpectGone(StartedPids(launch.Stderr()));
}

// A pipeline's --cpu-share in serve_args where the plan decodes on the CPU (no GPU here): with
// the default decode (auto) serve gets no --decode and decodes on the CPU as its own auto does;
// with decode gpu the plan's --decode cpu goes with --cpu-share dropped and said, since serve
// refuses the pair (found in review: the producer did not start, and its jobs failed).
TEST_F(LaunchTest, ACpuShareInServeArgsSurvivesAPlanThatDecodesOnTheCpu) {
  for (const std::string decode : {"", R"(, "decode": "gpu")"}) {
    SCOPED_TRACE(decode.empty() ? "auto" : "gpu");
    const std::string path = tmp_.path() + "/jobs-share.json";
    testing::WriteFile(path, R"({"cpu_cores": 8, "gpus": [{"memory_mib": 16000, "sms": 100}],
      "pipelines": {"p": {"data": ")" + data_ + R"(", "image_size": 32, "producer_batch": 8)" + decode +
                                 R"(, "serve_args": ["--workers", "1", "--cpu-share", "0.3"]}}, "jobs": [)" +
                                 ConsumerJob("a", "") + "]}");
    Child launch(Coloader({"launch", path, "--json", "--run-dir", tmp_.path() + "/run-share" + (decode.empty() ? "a" : "g")}));
    ASSERT_EQ(launch.Wait(120000), 0) << launch.Stderr();
    ASSERT_OK_AND_ASSIGN(JsonValue s, ParseJson(launch.Stdout(), "launch summary"));
    EXPECT_EQ(s.Find("done")->number(), 1) << launch.Stderr();
    EXPECT_EQ(launch.Stderr().find("dropped --cpu-share 0.3") != std::string::npos, !decode.empty()) << launch.Stderr();
    ExpectGone(StartedPids(launch.Stderr()));
  }
}

// `coloader simulate` (same binary, same jobs-file reader): both CSVs are checked as they are
// written (a path it cannot write is an error, even where an earlier run left a summary.csv),
// and GPU counts it cannot simulate are errors, not NaN utilisations or a silently ignored flag.
TEST_F(LaunchTest, SimulateChecksBothOutputsAndItsGpus) {
  const std::string trace = tmp_.path() + "/trace.json";
  testing::WriteFile(trace, R"({"cpu_cores": 16, "jobs": [
      {"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5000, "duration_s": 600},
      {"name": "b", "pipeline": {"data": "/d"}, "memory_mib": 5000, "duration_s": 900, "arrival_s": 60}]})");
  const std::string out = tmp_.path() + "/sim";
  Child ok(Coloader({"simulate", "--trace", trace, "--gpus", "2", "--policy", "sharing-aware", "--out", out}));
  ASSERT_EQ(ok.Wait(60000), 0) << ok.Stderr();
  EXPECT_NE(testing::ReadFile(out + "/summary.csv").find("sharing-aware"), std::string::npos);
  EXPECT_FALSE(testing::ReadFile(out + "/timeseries.csv").empty());

  // A path that cannot be written as a file (here a directory in its place): exit 1, named.
  for (const char* name : {"timeseries.csv", "summary.csv"}) {
    const std::string dir = tmp_.path() + "/sim-" + name;
    std::filesystem::create_directories(dir + "/" + name);
    Child bad(Coloader({"simulate", "--trace", trace, "--gpus", "2", "--policy", "sharing-aware", "--out", dir}));
    EXPECT_EQ(bad.Wait(60000), 1) << name << ": " << bad.Stderr();
    EXPECT_NE(bad.Stderr().find("cannot create " + dir + "/" + name), std::string::npos) << bad.Stderr();
  }

  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--gpus", "-1"}, "--gpus expects a number of GPUs >= 1 (or leave it out for the trace's), got -1"},
      {{"--gpus", "2", "--gpu-sms", "0"}, "--gpu-sms expects SMs per GPU >= 1, got 0"},
      {{}, "no GPUs (give --gpus N or \"gpus\" in the trace)"},  // the trace names none
  };
  for (const auto& [flags, want] : cases) {
    std::vector<std::string> args = {"simulate", "--trace", trace};
    args.insert(args.end(), flags.begin(), flags.end());
    Child bad(Coloader(args));
    EXPECT_EQ(bad.Wait(60000), 2) << want;
    EXPECT_NE(bad.Stderr().find(want), std::string::npos) << bad.Stderr();
    EXPECT_EQ(bad.Stdout().find("nan"), std::string::npos) << bad.Stdout();
  }
}

// One small trace through `simulate` and through `launch`, whose jobs are stand-ins that do
// what the MPS server does at a job's pinned-memory limit: a job whose real peak passes the
// limit it was started with (COLOADER_MEMORY_LIMIT_MIB) fails with CUDA's out-of-memory
// message, at once; one within it runs for its duration_s. Both must take the same decisions:
// where each attempt ran, in which mode, under which limit, which attempts ran out of memory,
// and roughly when each started. b is the job over its limit (beside c, placed after it, which
// runs on); d waits for room under the SM limit. With --recovery grow b comes back at 1.5x its
// estimate beside a; with alone it waits for a's GPU to empty and holds d back until then.
// Limits are the reservations (--no-headroom): the stand-ins see their own limit only, not what
// their neighbours really use, so real pressure (which headroom can cause) is the simulator's
// alone; a last pass checks that with headroom both hand out the same first limits.
TEST_F(LaunchTest, SimulateAndLaunchTakeTheSameDecisions) {
  struct StandIn {
    const char* name;
    double estimate, actual, sm, duration_s;
  };
  // b really needs 9,000: beside c (8,000) GPU 1's total passes its 16,000, which a model that
  // blames by the GPU's total would charge to c, placed last.
  const StandIn jobs[] = {{"a", 6000, 5000, 0.5, 2}, {"b", 6000, 9000, 0.3, 2}, {"c", 8000, 8000, 0.4, 3},
                          {"d", 4000, 4000, 0.7, 1}};
  std::string text = R"({"cpu_cores": 64, "gpus": [{"memory_mib": 16000, "sms": 132}, {"memory_mib": 16000, "sms": 132}],
    "jobs": [)";
  for (const StandIn& j : jobs) {
    char job[1024];
    std::snprintf(job, sizeof job,
                  R"(%s{"name": "%s", "pipeline": {"data": "%s"}, "memory_mib": %.0f, "actual_memory_mib": %.0f,
      "sm_activity": %.2f, "duration_s": %.0f, "loader_cores": 2, "command": ["/bin/sh", "-c",
      "if [ \"$COLOADER_MEMORY_LIMIT_MIB\" -lt %.0f ]; then echo 'CUDA out of memory (stand-in)' >&2; exit 1; fi; sleep %.0f"]})",
                  &j == jobs ? "" : ",", j.name, data_.c_str(), j.estimate, j.actual, j.sm, j.duration_s, j.actual,
                  j.duration_s);
    text += job;
  }
  text += "]}";
  const std::string path = tmp_.path() + "/trace.json";
  testing::WriteFile(path, text);
  ASSERT_OK_AND_ASSIGN(JobSet set, LoadJobSet(path));

  for (Recovery rule : {Recovery::kGrow, Recovery::kAlone}) {
    SCOPED_TRACE(RecoveryName(rule));
    SimOptions so;
    so.planner.sharing = false;
    so.planner.host_path = true;  // as launch without a GPU
    so.planner.cpu_cores = set.cpu_cores;
    so.planner.recovery.rule = rule;
    so.planner.memory_headroom = false;
    so.dt_s = 0.02;
    so.oom_after_s = 0;  // the stand-ins fail at once
    ASSERT_OK_AND_ASSIGN(SimResult sim, Simulate(set, set.gpus, so));

    const std::string run = tmp_.path() + "/run-" + RecoveryName(rule);
    Child launch(Coloader({"launch", path, "--json", "--no-sharing", "--no-headroom", "--recovery", RecoveryName(rule),
                           "--run-dir", run}));
    ASSERT_EQ(launch.Wait(60000), 0) << launch.Stderr();
    ASSERT_OK_AND_ASSIGN(JsonValue summary, ParseJson(launch.Stdout(), "launch summary"));
    const std::vector<JsonValue>& reports = summary.Find("jobs")->items();
    ASSERT_EQ(reports.size(), sim.jobs.size());
    int ooms = 0;
    for (size_t k = 0; k < reports.size(); ++k) {
      const std::string name = reports[k].Find("name")->string();
      SCOPED_TRACE(name);
      EXPECT_EQ(reports[k].Find("outcome")->string(), sim.jobs[k].outcome);
      const std::vector<JsonValue>& runs = reports[k].Find("runs")->items();
      ASSERT_EQ(runs.size(), sim.jobs[k].runs.size());
      for (size_t a = 0; a < runs.size(); ++a) {
        const Attempt& want = sim.jobs[k].runs[a];
        EXPECT_EQ(runs[a].Find("gpu")->number(), want.gpu) << "attempt " << a;
        EXPECT_EQ(runs[a].Find("mode")->string(), ModeName(want.mode)) << "attempt " << a;
        EXPECT_NEAR(runs[a].Find("limit_mib")->number(), want.limit_mib, 1) << "attempt " << a;
        EXPECT_EQ(runs[a].Find("oom")->bool_value(), want.oom) << "attempt " << a;
        EXPECT_NEAR(runs[a].Find("start_s")->number(), want.start_s, 0.75) << "attempt " << a;
        ooms += want.oom;
      }
    }
    // What the scenario is there to show, so that a change to it cannot make the test vacuous.
    EXPECT_EQ(ooms, 1);
    ASSERT_EQ(sim.jobs[1].runs.size(), 2u);
    EXPECT_TRUE(sim.jobs[1].runs[0].oom);
    EXPECT_EQ(sim.jobs[2].runs.size(), 1u);  // c, beside b, is not blamed
    EXPECT_GT(sim.jobs[3].runs[0].start_s, 0);  // d waited for room
    if (rule == Recovery::kGrow) {
      EXPECT_DOUBLE_EQ(sim.jobs[1].runs[1].limit_mib, 6000 * 1.5 * 1.05);  // grown, with the default margin
      EXPECT_EQ(sim.jobs[1].runs[1].mode, Mode::kMps);
    } else {
      EXPECT_EQ(sim.jobs[1].runs[1].mode, Mode::kExclusive);
      EXPECT_DOUBLE_EQ(sim.jobs[1].runs[1].limit_mib, 16000);
      EXPECT_GE(sim.jobs[3].runs[0].start_s, sim.jobs[1].runs[1].start_s);  // behind the recovery queue
    }
  }

  // With headroom (the default), on GPUs of 24,000 MiB: beside a or b, c would get less than a
  // quarter of its reservation as headroom on 16,000 (the floor: it would wait for a GPU to
  // empty, and which empties first is a race between two `sleep 2`), here its whole cap. a, b
  // and c start together and get the same limits from both; b's 9,000 is within its 6,000 + half,
  // so it runs on.
  std::string roomier = text;
  for (size_t at = 0; (at = roomier.find(R"("memory_mib": 16000)", at)) != std::string::npos;)
    roomier.replace(at, 19, R"("memory_mib": 24000)");
  const std::string roomier_path = tmp_.path() + "/trace-24g.json";
  testing::WriteFile(roomier_path, roomier);
  ASSERT_OK_AND_ASSIGN(JobSet roomy, LoadJobSet(roomier_path));
  SimOptions so;
  so.planner.sharing = false;
  so.planner.host_path = true;
  so.planner.cpu_cores = roomy.cpu_cores;
  so.dt_s = 0.02;
  so.oom_after_s = 0;
  ASSERT_OK_AND_ASSIGN(SimResult sim, Simulate(roomy, roomy.gpus, so));
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(sim.jobs[k].runs.at(0).start_s, 0) << sim.jobs[k].name;
  Child launch(Coloader({"launch", roomier_path, "--json", "--no-sharing", "--run-dir", tmp_.path() + "/run-headroom"}));
  ASSERT_EQ(launch.Wait(60000), 0) << launch.Stderr();
  ASSERT_OK_AND_ASSIGN(JsonValue summary, ParseJson(launch.Stdout(), "launch summary"));
  const std::vector<JsonValue>& reports = summary.Find("jobs")->items();
  ASSERT_EQ(reports.size(), sim.jobs.size());
  for (size_t k = 0; k < 3; ++k) {
    SCOPED_TRACE(sim.jobs[k].name);
    const JsonValue& first = reports[k].Find("runs")->items().at(0);
    EXPECT_EQ(first.Find("gpu")->number(), sim.jobs[k].runs.at(0).gpu);
    EXPECT_NEAR(first.Find("limit_mib")->number(), sim.jobs[k].runs.at(0).limit_mib, 1);
  }
  EXPECT_DOUBLE_EQ(sim.jobs[1].runs[0].limit_mib, 6000 * 1.05 * 1.5);
  EXPECT_FALSE(sim.jobs[1].runs[0].oom);
}

TEST_F(LaunchTest, BadInputIsAClearError) {
  Child missing(Coloader({"launch", tmp_.path() + "/nope.json"}));
  EXPECT_EQ(missing.Wait(), 1);
  EXPECT_NE(missing.Stderr().find("nope.json"), std::string::npos) << missing.Stderr();

  testing::WriteFile(tmp_.path() + "/auto.json", R"({"gpus": [{"memory_mib": 1000}], "jobs": [{"name": "r50",
      "command": ["true"], "pipeline": {"data": "/d"}, "memory_mib": "auto", "model": "torchvision:resnet50",
      "batch_size": 8}]})");
  Child estimator(Coloader({"launch", tmp_.path() + "/auto.json", "--python", "/nonexistent/python3"}));
  EXPECT_EQ(estimator.Wait(), 2);
  EXPECT_NE(estimator.Stderr().find("job \"r50\": memory_mib is \"auto\" but the estimator"), std::string::npos)
      << estimator.Stderr();

  // Flags out of range: exit 2 with the flag named and the usage, before anything starts.
  const std::string jobs = WriteJobs({ShellJob("x", "true")});
  for (const auto& [flag, value, want] : std::vector<std::array<std::string, 3>>{
           {"--stop-timeout-ms", "-1", "--stop-timeout-ms expects milliseconds >= 0, got -1"},
           {"--max-ooms", "-3", "--max-ooms expects an integer in [0, 100], got -3"},
           {"--max-ooms", "1000", "--max-ooms expects an integer in [0, 100], got 1000"}}) {
    Child bad(Coloader({"launch", jobs, flag, value, "--run-dir", tmp_.path() + "/run-bad"}));
    EXPECT_EQ(bad.Wait(), 2) << flag << " " << value;
    EXPECT_NE(bad.Stderr().find(want), std::string::npos) << bad.Stderr();
    EXPECT_NE(bad.Stderr().find("usage:"), std::string::npos) << bad.Stderr();
    EXPECT_FALSE(std::filesystem::exists(tmp_.path() + "/run-bad")) << "nothing may start";
  }

  // The plan says which core count it planned with and where that came from.
  Child planned(Coloader({"plan", jobs}));
  EXPECT_EQ(planned.Wait(), 0) << planned.Stderr();
  EXPECT_NE(planned.Stdout().find("of 8 (the jobs file's cpu_cores;"), std::string::npos) << planned.Stdout();
  Child flagged(Coloader({"plan", jobs, "--cpu-cores", "5"}));
  EXPECT_EQ(flagged.Wait(), 0) << flagged.Stderr();
  EXPECT_NE(flagged.Stdout().find("of 5 (--cpu-cores;"), std::string::npos) << flagged.Stdout();
  std::string text = testing::ReadFile(jobs);
  text.replace(text.find("\"cpu_cores\": 8, "), 16, "");
  testing::WriteFile(jobs, text);
  Child here(Coloader({"plan", jobs}));
  EXPECT_EQ(here.Wait(), 0) << here.Stderr();
  EXPECT_NE(here.Stdout().find("(this machine's core count: set cpu_cores in the jobs file"), std::string::npos)
      << here.Stdout();

  testing::WriteFile(tmp_.path() + "/broken.json", "{\"jobs\": [\n  {\"name\": \"x\",}\n]}");
  Child broken(Coloader({"plan", tmp_.path() + "/broken.json"}));
  EXPECT_EQ(broken.Wait(), 2);
  EXPECT_NE(broken.Stderr().find("broken.json:2:16: expected a member name"), std::string::npos) << broken.Stderr();
}

}  // namespace
}  // namespace coloader
