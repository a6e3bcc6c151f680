// The command line as users meet it, through the real binary: every subcommand answers
// --help on stdout with exit 0, and an unknown flag or a malformed value with exit 2, the
// flag and value named, and its usage; values mean what they say (decimal, last one wins).
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace coloader {
namespace {

using testing::Child;
using testing::Coloader;

const std::vector<std::string> kCommands = {"serve", "consume", "status", "plan", "launch", "simulate", "keygen",
                                            "clean"};

TEST(Cli, EverySubcommandHasHelp) {
  for (const std::string& command : kCommands) {
    SCOPED_TRACE(command);
    Child c(Coloader({command, "--help"}));
    ASSERT_EQ(c.Wait(), 0) << c.Stderr();
    EXPECT_NE(c.Stdout().find("\nusage: coloader " + command), std::string::npos) << c.Stdout();
    EXPECT_NE(c.Stdout().find("--help"), std::string::npos) << c.Stdout();
    EXPECT_EQ(c.Stderr(), "");
  }
  // What benchmarks/collocated/collocated.py and scripts/gpu/decode_profile.sh look for in serve's
  // help.
  Child serve(Coloader({"serve", "--help"}));
  ASSERT_EQ(serve.Wait(), 0);
  for (const char* flag : {"--decode", "--cpu-share", "--gpu-wait", "--device", "--output", "--tcp"}) {
    EXPECT_NE(serve.Stdout().find(flag), std::string::npos) << flag;
  }
}

TEST(Cli, AnUnknownFlagIsAUsageErrorInEverySubcommand) {
  for (const std::string& command : kCommands) {
    SCOPED_TRACE(command);
    // Plan and launch take their jobs file first; the flag must be refused before it is read.
    std::vector<std::string> args = {command};
    if (command == "plan" || command == "launch") args.push_back("/nonexistent/jobs.json");
    args.push_back("--frobnicate");
    Child c(Coloader(args));
    ASSERT_EQ(c.Wait(), 2) << c.Stderr();
    EXPECT_EQ(c.Stderr().find("coloader " + command + ": "), 0u) << c.Stderr();
    EXPECT_NE(c.Stderr().find("--frobnicate"), std::string::npos) << c.Stderr();
    EXPECT_NE(c.Stderr().find("\nusage: coloader " + command), std::string::npos) << c.Stderr();
    EXPECT_EQ(c.Stdout(), "");
  }
}

TEST(Cli, BadValuesNameTheFlagAndTheValue) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"serve", "--data", "/d", "--name", "p", "--output", "int4"}, "--output: int4 not in {uint8,float32,bfloat16,float16}"},
      {{"serve", "--data", "/d", "--name", "p", "--device", "cuda:x"}, "--device must be cpu or cuda:N[,cuda:M...] (e.g. cuda:0), got 'cuda:x'"},
      {{"serve", "--data", "/d", "--name", "p", "--device", "cuda:1,cuda:1"}, "--device names cuda:1 twice"},
      {{"serve", "--data", "/d", "--name", "p", "--epochs", "-1"}, "--epochs: must not be negative, got -1"},
      {{"serve", "--data", "/d", "--name", "p", "--batch-size", "4294967296"}, "--batch-size: must be at most 4294967295"},
      {{"serve", "--data", "/d", "--name", "p", "--epochs", "2", "--forever"}, "--epochs excludes --forever"},
      {{"serve", "--data", "/d", "--name", "p", "--window"}, "--window"},
      {{"serve", "--data", "/d"}, "--name is required"},
      {{"status", "--name", "p", "--timeout-ms", "0x10"}, "--timeout-ms: expects an integer, got '0x10'"},
      {{"consume", "--batch-size", "8"}, "--name (or --endpoint) is required"},
      {{"plan", "/nonexistent/jobs.json", "--sm-limit", "nan"}, "--sm-limit: expects auto or a number in [0.05, 4], got nan"},
      {{"plan", "/nonexistent/jobs.json", "--sm-limit", "9"}, "--sm-limit: expects auto or a number in [0.05, 4], got 9"},
      {{"plan", "/nonexistent/jobs.json", "--policy", "random"}, "--policy: random not in"},
      {{"simulate", "--trace", "/nonexistent/t.json", "--recovery", "retry"}, "--recovery: retry not in"},
      {{"launch", "/nonexistent/jobs.json", "--max-ooms", "101"}, "--max-ooms expects an integer in [0, 100], got 101"},
      {{"plan", "--json"}, "the jobs file (JSON or YAML) is required"},
      {{"launch", "/nonexistent/jobs.json", "--mps", "--no-mps"}, "--mps excludes --no-mps"},
      {{"simulate", "--trace", "/nonexistent/t.json", "--sharing", "maybe"}, "--sharing: maybe not in {both,on,off}"},
      {{"keygen"}, "--out is required"},
      {{"consume", "--name", "p", "--timeout-ms", "-1"}, "--timeout-ms: must be at least 0, got -1"},
      {{"consume", "--name", "p", "--step-ms", "-5"}, "--step-ms: must be at least 0, got -5"},
      {{"consume", "--name", "p", "--wait-ms", "-3"}, "--wait-ms: must be at least 0, got -3"},
      {{"consume", "--name", "p", "--connect-timeout-ms", "0"}, "--connect-timeout-ms: must be at least 1, got 0"},
      {{"serve", "--data", "/d", "--name", "p", "--workers", "-1"}, "--workers: must be at least 0, got -1"},
      {{"serve", "--data", "/d", "--name", "p", "--spare-slots", "-2"}, "--spare-slots: must be at least -1, got -2"},
      {{"status", "--name", "p", "--timeout-ms", "0"}, "--timeout-ms: must be at least 1, got 0"},
      {{"serve", "--data", "/d", "--name", "p", "--cpu-share", "1.5"}, "--cpu-share must be auto or a share of each batch between 0 and 1"},
      {{"serve", "--data", "/d", "--name", "p", "--decode", "cpu", "--cpu-share", "0.3"}, "--cpu-share splits each batch between a GPU's JPEG engines and the CPU workers: it applies to --decode gpu or auto"},
  };
  for (const auto& [args, want] : cases) {
    Child c(Coloader(args));
    EXPECT_EQ(c.Wait(), 2) << want << ": " << c.Stderr();
    EXPECT_NE(c.Stderr().find(want), std::string::npos) << c.Stderr();
    EXPECT_NE(c.Stderr().find("usage: coloader " + args[0]), std::string::npos) << c.Stderr();
  }
}

TEST(Cli, HeartbeatsPastTheirRangeAreRefusedNotWrapped) {
  // Issue 38: --heartbeat-ms 2147483648 passed the timeout check by overflow (2 x 2^31 is 0 in
  // 32 bits) and the producer then detached healthy consumers.
  for (const auto& [args, want] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--heartbeat-ms", "2147483648"}, "--heartbeat-ms must be between 10 and 3600000 (an hour), got 2147483648"},
           {{"--heartbeat-timeout-ms", "4294967295"}, "--heartbeat-timeout-ms must be at most 7200000"},
           {{"--heartbeat-ms", "1000", "--heartbeat-timeout-ms", "1500"}, "at least twice --heartbeat-ms"}}) {
    std::vector<std::string> cmd = {"serve", "--data", "/nonexistent", "--name", "hb"};
    cmd.insert(cmd.end(), args.begin(), args.end());
    Child c(Coloader(cmd));
    EXPECT_NE(c.Wait(), 0) << want;
    EXPECT_NE(c.Stderr().find(want), std::string::npos) << c.Stderr();
  }
}

// A jobs file's bad decode is refused by plan, launch and simulate alike, before any planning,
// naming the file, the pipeline, the field and the value.
TEST(Cli, ABadDecodeInAJobsFileNamesThePipelineAndTheValue) {
  testing::TempDir tmp;
  const std::string jobs = tmp.path() + "/jobs.json";
  testing::WriteFile(jobs, R"({"pipelines": {"imagenet": {"data": "/d", "decode": "nvjpeg"}},
                               "jobs": [{"name": "a", "pipeline": "imagenet", "memory_mib": 5000, "duration_s": 60}]})");
  const std::string want = jobs + ":1:53: pipelines.imagenet: field \"decode\" must be cpu, gpu or auto";
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"plan", jobs}, {"launch", jobs}, {"simulate", "--trace", jobs, "--gpus", "1"}}) {
    Child c(Coloader(args));
    EXPECT_EQ(c.Wait(60000), 2) << c.Stderr();
    EXPECT_EQ(c.Stderr().find("coloader " + args[0] + ": "), 0u) << c.Stderr();
    EXPECT_NE(c.Stderr().find(want), std::string::npos) << c.Stderr();
    EXPECT_NE(c.Stderr().find("got \"nvjpeg\""), std::string::npos) << c.Stderr();
    EXPECT_EQ(c.Stdout(), "");
  }
}

// simulate packs by the figures plan and launch use: a trace job with a model and no sm_activity
// gets the estimator's, and without a working estimator the default, and simulate says which.
TEST(Cli, SimulateEstimatesTheSmActivityOfAJobThatStatesNoneAsPlanDoes) {
  testing::TempDir tmp;
  const std::string trace = tmp.path() + "/trace.json";
  testing::WriteFile(trace, R"({"jobs": [
      {"name": "a", "pipeline": {"data": "/d", "image_size": 64}, "memory_mib": 3000, "duration_s": 600,
       "model": "torchvision:resnet18", "batch_size": 32, "precision": "bf16-amp"},
      {"name": "b", "pipeline": {"data": "/d", "image_size": 64}, "memory_mib": 3000, "duration_s": 600,
       "sm_activity": 0.3}]})");
  const std::vector<std::string> args = {"simulate", "--trace", trace, "--gpus", "1", "--policy", "fifo-exclusive",
                                         "--sharing", "off", "--default-sm", "0.25"};
  std::vector<std::string> no_python = args;
  no_python.insert(no_python.end(), {"--python", "/nonexistent/python3"});
  Child fallback(Coloader(no_python));
  ASSERT_EQ(fallback.Wait(60000), 0) << fallback.Stderr();
  EXPECT_NE(fallback.Stdout().find("SM activity: 1 stated, 0 estimated, 1 the default 0.25 (--default-sm)"),
            std::string::npos) << fallback.Stdout();
  EXPECT_NE(fallback.Stderr().find("warning: no SM activity estimated for job a"), std::string::npos)
      << fallback.Stderr();

  Child torch({"/usr/bin/python3", "-c", "import torch, torchvision"});
  if (torch.Wait(60000) != 0) GTEST_SKIP() << "/usr/bin/python3 has no torch and torchvision";
  std::vector<std::string> with_python = args;
  with_python.insert(with_python.end(), {"--python", "/usr/bin/python3"});
  Child estimated(Coloader(with_python), {{"PYTHONPATH", std::string(COLOADER_SOURCE_DIR) + "/python"}});
  ASSERT_EQ(estimated.Wait(120000), 0) << estimated.Stderr();
  EXPECT_NE(estimated.Stdout().find("SM activity: 1 stated, 1 estimated, 0 the default"), std::string::npos)
      << estimated.Stdout();
}

// Issue 38: a trace job larger than every GPU printed makespan 0 and 0 failed, exit 0, as if all
// had gone well. It is named, with why and what to do, the table counts it, and the exit is 1
// (as plan's).
TEST(Cli, SimulateNamesAJobNoGpuCanHold) {
  testing::TempDir tmp;
  const std::string trace = tmp.path() + "/trace.json";
  testing::WriteFile(trace, R"({"jobs": [
      {"name": "huge", "pipeline": {"data": "/d"}, "memory_mib": 200000, "duration_s": 600, "sm_activity": 0.3},
      {"name": "small", "pipeline": {"data": "/d"}, "memory_mib": 5000, "duration_s": 600, "sm_activity": 0.3}]})");
  for (const char* csv : {"", "--csv"}) {
    std::vector<std::string> args = {"simulate", "--trace", trace, "--gpus", "2", "--policy", "fifo-exclusive",
                                     "--sharing", "off"};
    if (*csv) args.push_back(csv);
    Child sim(Coloader(args));
    ASSERT_EQ(sim.Wait(60000), 1) << sim.Stdout() << sim.Stderr();
    EXPECT_NE(sim.Stderr().find("coloader simulate: huge cannot run on these GPUs, and the figures leave it out: "),
              std::string::npos) << sim.Stderr();
    EXPECT_EQ(sim.Stderr().find("small"), std::string::npos) << sim.Stderr();
    if (!*csv) {
      EXPECT_NE(sim.Stdout().find("unrun"), std::string::npos) << sim.Stdout();
    }
  }
}

// Integers are decimal ("010" is ten, not CLI11's octal eight), --flag=value is --flag value,
// and a flag given twice takes its last value.
TEST(Cli, ValuesMeanWhatTheySay) {
  testing::TempDir tmp;
  const std::string trace = tmp.path() + "/trace.json";
  testing::WriteFile(trace, R"({"jobs": [{"name": "a", "pipeline": {"data": "/d"}, "memory_mib": 5000,
                                          "duration_s": 600}]})");
  Child sim(Coloader({"simulate", "--trace=" + trace, "--gpus", "3", "--gpus", "010", "--policy=fifo-exclusive",
                      "--sharing", "off"}));
  ASSERT_EQ(sim.Wait(60000), 0) << sim.Stderr();
  EXPECT_NE(sim.Stdout().find("1 jobs on 10 GPUs"), std::string::npos) << sim.Stdout();

  Child keygen(Coloader({"keygen", "--out=" + tmp.path() + "/k"}));
  ASSERT_EQ(keygen.Wait(), 0) << keygen.Stderr();
  EXPECT_TRUE(std::filesystem::exists(tmp.path() + "/k.key"));
  EXPECT_TRUE(std::filesystem::exists(tmp.path() + "/k.pub"));
}

}  // namespace
}  // namespace coloader
