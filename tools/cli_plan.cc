// `coloader plan`, `coloader launch` and `coloader simulate`: the placement commands
// (docs/PLACEMENT.md). They share one planner (placement/planner.h).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "tools/cli.h"
#include "placement/launcher.h"
#include "placement/simulator.h"

namespace coloader::cli {

namespace {

constexpr const char* kPlanSynopsis = "coloader plan JOBS.json|yaml [options]";
constexpr const char* kLaunchSynopsis = "coloader launch JOBS.json|yaml [options]";
constexpr const char* kSimulateSynopsis = "coloader simulate --trace TRACE.json|yaml [options]";

std::vector<std::string> PolicyNames() {
  std::vector<std::string> names;
  for (Policy p : AllPolicies()) names.emplace_back(PolicyName(p));
  return names;
}

// --sm-limit: "auto" (PlannerOptions::sm_limit 0: fill a GPU until it is busy, and a little past) or a number.
struct SmLimitFlag {
  std::string text = "auto";
  void Add(Command* cmd) {
    cmd->Add("--sm-limit", &text,
             "combined SM activity allowed on one GPU (sharing-aware): auto (the collocation model's saturation "
             "point plus 0.15, docs/PLACEMENT.md) or a number")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
              std::string number = text;
              if (text == "auto" || NumberIn(0.05, 4.0)(number).empty()) return {};
              return "expects auto or a number in [0.05, 4], got " + text;
            },
            "auto or in [0.05, 4]"));
  }
  double Value() const { return text == "auto" ? 0.0 : std::strtod(text.c_str(), nullptr); }
};

// The planner's flags, shared by plan and launch; bound to the planner's own options, whose
// defaults are the flags' defaults. CPU cores default to the jobs file's, then this machine's.
// The Python that runs the estimator: $COLOADER_PYTHON, else python3 on the PATH.
std::string DefaultPython() { return std::getenv("COLOADER_PYTHON") ? std::getenv("COLOADER_PYTHON") : "python3"; }

// `--python` and `--default-sm`, as plan, launch and simulate all take them.
void AddEstimatorFlags(Command* cmd, std::string* python, PlannerOptions* o) {
  cmd->Add("--default-sm", &o->default_sm, "SM activity of a job that states none and whose SM activity cannot be "
                                           "estimated (no model, or the estimator failed)")
      ->check(NumberIn(0.0, 1.0));
  cmd->Add("--python", python, "the Python that runs the estimator for \"auto\" memory and for the SM "
                               "activity of a job with a model ($COLOADER_PYTHON)")
      ->type_name("PYTHON");
}

// "SM activity: 3 stated, 2 estimated, 1 the default 0.5 (--default-sm)": where the figures the
// planner packs by came from.
std::string SmSources(const JobSet& set, double default_sm) {
  int stated = 0, estimated = 0, defaulted = 0;
  for (const Job& j : set.jobs) {
    if (j.sm_source == Job::SmSource::kStated) ++stated;
    else if (j.sm_source == Job::SmSource::kEstimated) ++estimated;
    else ++defaulted;
  }
  char buf[160];
  std::snprintf(buf, sizeof(buf), "SM activity: %d stated, %d estimated, %d the default %g (--default-sm)", stated,
                estimated, defaulted, default_sm);
  return buf;
}

// plan, launch and simulate all place through one rule (Planner::LimitWhenPlaced).
constexpr const char* kNoHeadroomHelp =
    "a job's memory limit is its reservation alone, not also its share of the GPU's unreserved memory";

struct PlanFlags {
  std::string policy = "sharing-aware", gpus_from, jobs_path;
  std::string python = DefaultPython();
  bool no_sharing = false, no_headroom = false, json = false;
  SmLimitFlag sm_limit;

  void Add(Command* cmd, PlannerOptions* o) {
    cmd->Positional("jobs", &jobs_path, "the jobs file (JSON or YAML; docs/PLACEMENT.md)")->type_name("JOBS");
    cmd->Add("--policy", &policy, "how jobs are placed on GPUs")->check(CLI::IsMember(PolicyNames()));
    cmd->Add("--no-sharing", &no_sharing, "every job gets its own loader, even when pipelines match");
    cmd->Add("--gpus", &gpus_from, "the GPUs: the jobs file's, or those NVML sees here (default: the file's when "
                                   "it names them)")
        ->check(CLI::IsMember({"file", "nvml"}));
    cmd->Add("--cpu-cores", &o->cpu_cores, "cores for loading (default: the file's cpu_cores, else this machine's)")
        ->check(NumberIn(1.0, 1e6))
        ->default_str("");  // not the planner's placeholder: the default depends on the file
    sm_limit.Add(cmd);
    cmd->Add("--memory-margin", &o->memory_margin, "fraction added to every memory estimate")
        ->check(NumberIn(0.0, 10.0));
    cmd->Add("--no-headroom", &no_headroom, kNoHeadroomHelp);
    AddEstimatorFlags(cmd, &python, o);
    cmd->Add("--json", &json, "the result as one JSON object");
  }
  // After parsing: the jobs file is there, and the options the flags do not set directly.
  Status Check(const Command& cmd) const {
    if (jobs_path.empty()) return cmd.Error("the jobs file (JSON or YAML) is required as the first argument");
    return Status::OK();
  }
  void ToOptions(const Command& cmd, const JobSet& set, PlannerOptions* o) const {
    o->policy = *ParsePolicy(policy);  // checked by --policy's IsMember
    o->sharing = !no_sharing;
    o->memory_headroom = !no_headroom;
    o->sm_limit = sm_limit.Value();
    if (cmd.Given("--cpu-cores")) {
      o->cpu_cores_from = "--cpu-cores";
    } else if (set.cpu_cores > 0) {
      o->cpu_cores = set.cpu_cores;
      o->cpu_cores_from = "the jobs file's cpu_cores";
    } else {
      o->cpu_cores = std::max(1u, std::thread::hardware_concurrency());
      o->cpu_cores_from = "this machine's core count: set cpu_cores in the jobs file to plan for another";
    }
  }
};

// What launch and simulate do with a job that runs out of memory (Planner::Recover).
struct RecoveryFlags {
  std::string rule = RecoveryName(OomRecovery{}.rule);
  void Add(Command* cmd, OomRecovery* r) {
    cmd->Add("--recovery", &rule,
             "after an OOM: grow-then-alone (grow the first time, alone the second or when no GPU holds the grown "
             "estimate), grow (requeued with --oom-growth times its estimate) or alone (a recovery queue first, "
             "each job on a GPU of its own)")
        ->check(CLI::IsMember(
            {RecoveryName(Recovery::kGrowThenAlone), RecoveryName(Recovery::kGrow), RecoveryName(Recovery::kAlone)}));
    cmd->Add("--max-ooms", &r->max_ooms, "out-of-memory restarts per job before it counts as failed");
    cmd->Add("--oom-growth", &r->growth,
             "with --recovery grow or grow-then-alone, the estimate after an OOM times this")
        ->check(NumberIn(1.01, 100.0));
  }
  Status Check(const Command& cmd, const OomRecovery& r) const {
    if (r.max_ooms < 0 || r.max_ooms > 100) {
      return cmd.Error("--max-ooms expects an integer in [0, 100], got " + std::to_string(r.max_ooms));
    }
    return Status::OK();
  }
  void ToOptions(OomRecovery* r) const { r->rule = *ParseRecovery(rule); }  // checked by IsMember
};

// GPUs: the file's when it names them (planning for elsewhere), else NVML's; `--gpus` picks.
// `from_nvml` says which was used.
Result<std::vector<Gpu>> ResolveGpus(const JobSet& set, const std::string& from, bool prefer_nvml, bool* from_nvml) {
  *from_nvml = false;
  const bool want_nvml = from == "nvml" || (from.empty() && (prefer_nvml || set.gpus.empty()));
  if (want_nvml) {
    Result<std::vector<Gpu>> g = GpusFromNvml();
    if (g.ok()) {
      *from_nvml = true;
      return g;
    }
    if (from == "nvml" || set.gpus.empty()) {
      return Status::NotFound(set.source + ": " + g.status().message());
    }
  }
  if (set.gpus.empty()) return Status::NotFound(set.source + ": names no \"gpus\"; add them or run where NVML sees GPUs");
  return set.gpus;
}

// Writes `text` to `path` whole, or says why not: a full disk or an unwritable file is an error,
// never a stale file from an earlier run that happens to be there.
Status WriteWhole(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::FromErrno("cannot create " + path, errno);
  out << text;
  out.close();
  if (!out) return Status::IOError("cannot write " + path + " (disk full?)");
  return Status::OK();
}

int Fail(const char* cmd, const Status& st) {
  // Flag errors already say "coloader <cmd>: ..." and show the usage.
  const std::string prefix = std::string("coloader ") + cmd + ": ";
  const bool has_prefix = st.message().rfind(prefix, 0) == 0;
  std::fprintf(stderr, "%s%s\n", has_prefix ? "" : prefix.c_str(), st.message().c_str());
  return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int PlanCommand(const std::vector<std::string>& args) {
  PlanFlags pf;
  PlannerOptions o;
  Command cmd("plan", kPlanSynopsis,
              "Place jobs on GPUs (MPS or MIG) with shared producers, and print the plan (docs/PLACEMENT.md).");
  pf.Add(&cmd, &o);
  if (std::optional<int> exit = cmd.Parse(args)) return *exit;
  if (Status e = pf.Check(cmd); !e.ok()) return Fail("plan", e);
  Result<JobSet> set = LoadJobSet(pf.jobs_path);
  if (!set.ok()) return Fail("plan", set.status());
  if (Status e = EstimateAutoJobs(&*set, pf.python); !e.ok()) return Fail("plan", e);
  pf.ToOptions(cmd, *set, &o);
  bool nvml = false;
  Result<std::vector<Gpu>> gpus = ResolveGpus(*set, pf.gpus_from, false, &nvml);
  if (!gpus.ok()) return Fail("plan", gpus.status());
  Planner planner(o, *gpus, &*set);
  Plan plan = MakePlan(*set, *gpus, o, &planner);
  if (pf.json) {
    std::printf("%s\n", PlanJson(*set, planner, plan).c_str());
  } else {
    std::printf("%s", PlanTable(*set, planner, plan).c_str());
  }
  return plan.impossible.empty() ? 0 : 1;
}

int LaunchCommand(const std::vector<std::string>& args) {
  PlanFlags pf;
  LaunchOptions lo;
  bool mps = false, no_mps = false, host_path = false, quiet = false;
  Command cmd("launch", kLaunchSynopsis,
              "Run a plan: the MPS daemon, one producer per shared pipeline, the jobs; a job that runs out of GPU "
              "memory recovers by --recovery (docs/PLACEMENT.md).");
  pf.Add(&cmd, &lo.planner);
  CLI::Option* with_mps = cmd.Add("--mps", &mps, "run an MPS control daemon (default: where NVML sees GPUs)");
  cmd.Add("--no-mps", &no_mps, "no MPS daemon")->excludes(with_mps);
  cmd.Add("--host-path", &host_path, "producers keep their rings in host memory (default without a GPU)");
  cmd.Add("--run-dir", &lo.run_dir, "where the producers' and jobs' logs go")->type_name("DIR");
  RecoveryFlags rf;
  rf.Add(&cmd, &lo.planner.recovery);
  cmd.Add("--stop-timeout-ms", &lo.stop_timeout_ms, "on a stop, SIGTERM, then SIGKILL after this long");
  cmd.Add("--quiet", &quiet, "no progress lines");
  if (std::optional<int> exit = cmd.Parse(args)) return *exit;
  if (Status e = pf.Check(cmd); !e.ok()) return Fail("launch", e);
  if (Status e = rf.Check(cmd, lo.planner.recovery); !e.ok()) return Fail("launch", e);
  if (lo.stop_timeout_ms < 0) {
    return Fail("launch",
                cmd.Error("--stop-timeout-ms expects milliseconds >= 0, got " + std::to_string(lo.stop_timeout_ms)));
  }
  const std::string& path = pf.jobs_path;
  Result<JobSet> set = LoadJobSet(path);
  if (!set.ok()) return Fail("launch", set.status());
  for (const Job& j : set->jobs) {
    if (j.command.empty()) return Fail("launch", Status::Invalid(path + ": job \"" + j.name + "\" has no \"command\" to run"));
  }
  if (Status e = EstimateAutoJobs(&*set, pf.python); !e.ok()) return Fail("launch", e);
  pf.ToOptions(cmd, *set, &lo.planner);
  rf.ToOptions(&lo.planner.recovery);
  bool nvml = false;
  Result<std::vector<Gpu>> gpus = ResolveGpus(*set, pf.gpus_from, true, &nvml);
  if (!gpus.ok()) return Fail("launch", gpus.status());
  // Without a GPU here, producers keep their rings in host memory and there is no MPS.
  lo.planner.host_path = host_path || !nvml;
  lo.mps = mps || (!no_mps && nvml);
  lo.quiet = quiet;
  if (const char* bin = std::getenv("COLOADER_BINARY"); bin && *bin) lo.coloader_binary = bin;
  Result<LaunchSummary> s = Launch(*set, *gpus, lo);
  if (!s.ok()) return Fail("launch", s.status());
  if (pf.json) std::printf("%s\n", LaunchSummaryJson(*s).c_str());
  else std::printf("%s", LaunchSummaryText(*s).c_str());
  std::fflush(stdout);
  if (s->stopped) return 130;
  return s->failed == 0 ? 0 : 1;
}

int SimulateCommand(const std::vector<std::string>& args) {
  std::string trace_path, policy = "all", sharing = "both", out_dir;
  int gpus_n = 0, sms = 132;
  double mem_mib = 81559;
  bool csv = false;
  SimOptions so;
  so.sample_s = 300;
  std::vector<std::string> policies_or_all = PolicyNames();
  policies_or_all.insert(policies_or_all.begin(), "all");
  Command cmd("simulate", kSimulateSynopsis,
              "Replay a trace of job arrivals under each placement policy, with and without sharing, and compare "
              "makespan, job completion time, OOMs and utilisation (docs/PLACEMENT.md).");
  cmd.Add("--trace", &trace_path, "the trace: a jobs file with arrival_s and duration_s (scripts/make_trace.py)")
      ->type_name("FILE");
  cmd.Add("--gpus", &gpus_n, "simulate this many identical GPUs (0: the trace's)");
  cmd.Add("--gpu-memory-mib", &mem_mib, "memory of each of those GPUs")->check(NumberIn(1.0, 1e9));
  cmd.Add("--gpu-sms", &sms, "SMs of each of those GPUs");
  cmd.Add("--policy", &policy, "one placement policy, or all of them")->check(CLI::IsMember(policies_or_all));
  cmd.Add("--sharing", &sharing, "with shared producers, without, or both")
      ->check(CLI::IsMember({"both", "on", "off"}));
  cmd.Add("--cpu-cores", &so.planner.cpu_cores, "cores for loading (default: the trace's cpu_cores, else 64)")
      ->check(NumberIn(1.0, 1e6))
      ->default_str("");
  SmLimitFlag sm_limit;
  sm_limit.Add(&cmd);
  cmd.Add("--memory-margin", &so.planner.memory_margin, "fraction added to every memory estimate (as plan)")
      ->check(NumberIn(0.0, 10.0));
  bool no_headroom = false;
  cmd.Add("--no-headroom", &no_headroom, kNoHeadroomHelp);
  std::string python = DefaultPython();
  AddEstimatorFlags(&cmd, &python, &so.planner);
  cmd.Add("--step-s", &so.dt_s, "simulated time step, seconds")->check(NumberIn(0.01, 3600.0));
  cmd.Add("--oom-after-s", &so.oom_after_s, "a job over its memory limit fails this long after its start")
      ->check(NumberIn(0.0, 86400.0));
  cmd.Add("--sample-s", &so.sample_s, "utilisation sampling period, seconds")->check(NumberIn(1.0, 86400.0));
  cmd.Add("--interference", &so.planner.model.interference, "slowdown model: fractional slowdown per extra job on a GPU")
      ->check(NumberIn(0.0, 1.0));
  cmd.Add("--sm-saturation", &so.planner.model.sm_saturation, "slowdown model: combined SM activity beyond which jobs share SMs")
      ->check(NumberIn(0.05, 4.0));
  RecoveryFlags rf;
  rf.Add(&cmd, &so.planner.recovery);
  cmd.Add("--out", &out_dir, "also write summary.csv, timeseries.csv and attempts.csv (every job's runs) here")
      ->type_name("DIR");
  cmd.Add("--csv", &csv, "the summary as CSV on stdout");
  if (std::optional<int> exit = cmd.Parse(args)) return *exit;
  if (trace_path.empty()) return cmd.UsageError("--trace is required (make one with scripts/make_trace.py)");
  if (Status e = rf.Check(cmd, so.planner.recovery); !e.ok()) return Fail("simulate", e);
  if (gpus_n < 0) {
    return cmd.UsageError("--gpus expects a number of GPUs >= 1 (or leave it out for the trace's), got " +
                          std::to_string(gpus_n));
  }
  if (sms < 1) return cmd.UsageError("--gpu-sms expects SMs per GPU >= 1, got " + std::to_string(sms));
  rf.ToOptions(&so.planner.recovery);
  so.planner.sm_limit = sm_limit.Value();
  so.planner.memory_headroom = !no_headroom;
  Result<JobSet> trace = LoadJobSet(trace_path);
  if (!trace.ok()) return Fail("simulate", trace.status());
  // As plan and launch: "auto" memory and the SM activity a job does not state come from the
  // estimator, so the simulator packs by the figures launch would.
  if (Status e = EstimateAutoJobs(&*trace, python); !e.ok()) return Fail("simulate", e);
  std::vector<Gpu> gpus = trace->gpus;
  if (gpus_n > 0) {
    gpus.clear();
    for (int g = 0; g < gpus_n; ++g) gpus.push_back(Gpu{g, "sim-gpu", mem_mib, sms, false, {}});
  }
  if (cmd.Given("--cpu-cores")) {
    so.planner.cpu_cores_from = "--cpu-cores";
  } else if (trace->cpu_cores > 0) {
    so.planner.cpu_cores = trace->cpu_cores;
    so.planner.cpu_cores_from = "the trace's cpu_cores";
  } else {
    so.planner.cpu_cores = 64;
    so.planner.cpu_cores_from = "the default, 64: set cpu_cores in the trace";
  }
  std::vector<Policy> policies;
  if (policy == "all") {
    policies = AllPolicies();
  } else {
    policies.push_back(*ParsePolicy(policy));  // checked by --policy's IsMember
  }
  std::vector<SimResult> runs;
  for (Policy p : policies) {
    for (int share = 0; share < 2; ++share) {
      if ((share == 1 && sharing == "off") || (share == 0 && sharing == "on")) continue;
      so.planner.policy = p;
      so.planner.sharing = share == 1;
      Result<SimResult> r = Simulate(*trace, gpus, so);
      if (!r.ok()) return Fail("simulate", r.status());
      runs.push_back(std::move(*r));
    }
  }
  if (!out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec) return Fail("simulate", Status::IOError("cannot create --out " + out_dir + ": " + ec.message()));
    if (Status e = WriteWhole(out_dir + "/summary.csv", SimSummaryCsv(runs)); !e.ok()) return Fail("simulate", e);
    if (Status e = WriteWhole(out_dir + "/timeseries.csv", SimTimeseriesCsv(runs)); !e.ok()) return Fail("simulate", e);
    if (Status e = WriteWhole(out_dir + "/attempts.csv", SimAttemptsCsv(runs)); !e.ok()) return Fail("simulate", e);
  }
  // A job no GPU can hold is not run in any replay: the figures leave it out, and say so.
  std::map<std::string, std::string> unrun;
  for (const SimResult& r : runs)
    for (const SimJobReport& j : r.jobs)
      if (j.outcome == "impossible") unrun.emplace(j.name, j.why);
  auto say_unrun = [&] {
    for (const auto& [name, why] : unrun)
      std::fprintf(stderr, "coloader simulate: %s cannot run on these GPUs, and the figures leave it out: %s\n",
                   name.c_str(), why.c_str());
    return unrun.empty() ? 0 : 1;
  };
  if (csv) {
    std::printf("%s", SimSummaryCsv(runs).c_str());
    return say_unrun();
  }
  std::printf("%zu jobs on %zu GPUs, %.0f CPU cores (%s); %s\n", trace->jobs.size(), gpus.size(),
              so.planner.cpu_cores, so.planner.cpu_cores_from.c_str(), SmSources(*trace, so.planner.default_sm).c_str());
  std::printf("%-15s %-7s %10s %10s %5s %6s %6s %6s %6s %6s %10s %6s\n", "policy", "sharing", "makespan h", "mean JCT h",
              "OOMs", "failed", "unrun", "mem %", "SM %", "cores", "peak cores", "delta");
  for (const SimResult& r : runs) {
    std::printf("%-15s %-7s %10.2f %10.2f %5d %6d %6d %6.1f %6.1f %6.1f %10.1f %6.2f\n", r.policy.c_str(),
                r.sharing ? "on" : "off", r.makespan_s / 3600, r.mean_jct_s / 3600, r.ooms, r.failed, r.impossible,
                100 * r.mean_memory_util, 100 * r.mean_sm_util, r.mean_cores, r.peak_cores, r.mean_speedup);
  }
  std::printf("recovery after an OOM: %s; delta: seed 003's co-location speedup, the mean over GPUs\n",
              RecoveryName(so.planner.recovery.rule));
  std::fflush(stdout);
  return say_unrun();
}

}  // namespace coloader::cli
