// `coloader plan`, `coloader launch` and `coloader simulate`: the placement commands
// (docs/PLACEMENT.md). They share one planner (server/planner.h).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "server/cli.h"
#include "server/launcher.h"
#include "server/simulator.h"

namespace coloader::cli {

namespace {

constexpr const char* kPlanUsage =
    "coloader plan JOBS.json|yaml [--policy sharing-aware|most-memory|least-utilised|fifo-exclusive] [--no-sharing]\n"
    "              [--gpus file|nvml] [--cpu-cores N] [--sm-limit 0.8] [--default-sm 0.5] [--memory-margin 0]\n"
    "              [--python PYTHON (runs the estimator for \"auto\" memory)] [--json]";
constexpr const char* kLaunchUsage =
    "coloader launch JOBS.json|yaml [--policy P] [--no-sharing] [--gpus file|nvml] [--mps | --no-mps] [--host-path]\n"
    "              [--run-dir DIR] [--max-ooms 3] [--oom-growth 1.5] [--stop-timeout-ms 10000] [--cpu-cores N]\n"
    "              [--sm-limit 0.8] [--default-sm 0.5] [--memory-margin 0] [--python PYTHON] [--json] [--quiet]";
constexpr const char* kSimulateUsage =
    "coloader simulate --trace TRACE.json [--gpus 4] [--gpu-memory-mib 81559] [--gpu-sms 132]\n"
    "              [--policy all|P] [--sharing both|on|off] [--cpu-cores N] [--sm-limit 0.8] [--sample-s 300]\n"
    "              [--interference 0.003] [--sm-saturation 1.0] (the slowdown model, docs/PLACEMENT.md)\n"
    "              [--out DIR (summary.csv, timeseries.csv)] [--csv (the summary as CSV on stdout)]";

// The jobs file is the first argument; the rest are flags.
Status SplitPositional(const std::vector<std::string>& args, const Flags& f, std::string* path,
                       std::vector<std::string>* rest) {
  size_t first = 0;
  if (!args.empty() && args[0].rfind("--", 0) != 0) {
    *path = args[0];
    first = 1;
  }
  rest->assign(args.begin() + static_cast<long>(first), args.end());
  if (path->empty()) return f.Error("the jobs file (JSON) is required as the first argument");
  return Status::OK();
}

Status ParseDouble(const Flags& f, const std::string& name, const std::string& text, double lo, double hi, double* out) {
  if (text.empty()) return Status::OK();
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || errno != 0 || !(v >= lo && v <= hi)) {
    return f.Error("--" + name + " expects a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + text + "'");
  }
  *out = v;
  return Status::OK();
}

// Flags shared by plan and launch.
struct PlanFlags {
  std::string policy = "sharing-aware", gpus_from, cpu_cores, sm_limit, default_sm, margin;
  std::string python = std::getenv("COLOADER_PYTHON") ? std::getenv("COLOADER_PYTHON") : "python3";
  bool no_sharing = false, json = false, help = false;

  void Add(Flags* f) {
    f->AddString("policy", &policy);
    f->AddBool("no-sharing", &no_sharing);
    f->AddString("gpus", &gpus_from);
    f->AddString("cpu-cores", &cpu_cores);
    f->AddString("sm-limit", &sm_limit);
    f->AddString("default-sm", &default_sm);
    f->AddString("memory-margin", &margin);
    f->AddString("python", &python);
    f->AddBool("json", &json);
    f->AddBool("help", &help);
  }
  Status ToOptions(const Flags& f, const JobSet& set, PlannerOptions* o) const {
    Result<Policy> p = ParsePolicy(policy);
    if (!p.ok()) return f.Error(p.status().message());
    o->policy = *p;
    o->sharing = !no_sharing;
    o->cpu_cores = set.cpu_cores > 0 ? set.cpu_cores : std::max(1u, std::thread::hardware_concurrency());
    RETURN_NOT_OK(ParseDouble(f, "cpu-cores", cpu_cores, 1, 1e6, &o->cpu_cores));
    RETURN_NOT_OK(ParseDouble(f, "sm-limit", sm_limit, 0.05, 4, &o->sm_limit));
    RETURN_NOT_OK(ParseDouble(f, "default-sm", default_sm, 0, 1, &o->default_sm));
    RETURN_NOT_OK(ParseDouble(f, "memory-margin", margin, 0, 10, &o->memory_margin));
    return Status::OK();
  }
};

// GPUs: the file's when it names them (planning for elsewhere), else NVML's; `--gpus` picks.
// `from_nvml` says which was used.
Result<std::vector<Gpu>> ResolveGpus(const Flags& f, const JobSet& set, const std::string& from, bool prefer_nvml,
                                     bool* from_nvml) {
  *from_nvml = false;
  if (!from.empty() && from != "file" && from != "nvml") return f.Error("--gpus must be file or nvml, got '" + from + "'");
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
  Flags f("plan", kPlanUsage);
  pf.Add(&f);
  std::string path;
  std::vector<std::string> rest;
  Status st = SplitPositional(args, f, &path, &rest);
  Status parsed = f.Parse(rest);
  if (pf.help) {
    std::printf("usage: %s\n", kPlanUsage);
    return 0;
  }
  if (!parsed.ok()) return Fail("plan", parsed);
  if (!st.ok()) return Fail("plan", st);
  Result<JobSet> set = LoadJobSet(path);
  if (!set.ok()) return Fail("plan", set.status());
  if (Status e = EstimateAutoJobs(&*set, pf.python); !e.ok()) return Fail("plan", e);
  PlannerOptions o;
  if (Status e = pf.ToOptions(f, *set, &o); !e.ok()) return Fail("plan", e);
  bool nvml = false;
  Result<std::vector<Gpu>> gpus = ResolveGpus(f, *set, pf.gpus_from, false, &nvml);
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
  std::string growth;
  Flags f("launch", kLaunchUsage);
  pf.Add(&f);
  f.AddBool("mps", &mps);
  f.AddBool("no-mps", &no_mps);
  f.AddBool("host-path", &host_path);
  f.AddString("run-dir", &lo.run_dir);
  f.AddInt("max-ooms", &lo.max_ooms);
  f.AddString("oom-growth", &growth);
  f.AddInt("stop-timeout-ms", &lo.stop_timeout_ms);
  f.AddBool("quiet", &quiet);
  std::string path;
  std::vector<std::string> rest;
  Status st = SplitPositional(args, f, &path, &rest);
  Status parsed = f.Parse(rest);
  if (pf.help) {
    std::printf("usage: %s\n", kLaunchUsage);
    return 0;
  }
  if (!parsed.ok()) return Fail("launch", parsed);
  if (!st.ok()) return Fail("launch", st);
  if (mps && no_mps) return Fail("launch", f.Error("give --mps or --no-mps, not both"));
  if (lo.max_ooms < 0 || lo.max_ooms > 100)
    return Fail("launch", f.Error("--max-ooms expects an integer in [0, 100], got " + std::to_string(lo.max_ooms)));
  if (lo.stop_timeout_ms < 0)
    return Fail("launch", f.Error("--stop-timeout-ms expects milliseconds >= 0, got " + std::to_string(lo.stop_timeout_ms)));
  if (Status e = ParseDouble(f, "oom-growth", growth, 1.01, 100, &lo.oom_growth); !e.ok()) return Fail("launch", e);
  Result<JobSet> set = LoadJobSet(path);
  if (!set.ok()) return Fail("launch", set.status());
  for (const Job& j : set->jobs) {
    if (j.command.empty()) return Fail("launch", Status::Invalid(path + ": job \"" + j.name + "\" has no \"command\" to run"));
  }
  if (Status e = EstimateAutoJobs(&*set, pf.python); !e.ok()) return Fail("launch", e);
  if (Status e = pf.ToOptions(f, *set, &lo.planner); !e.ok()) return Fail("launch", e);
  bool nvml = false;
  Result<std::vector<Gpu>> gpus = ResolveGpus(f, *set, pf.gpus_from, true, &nvml);
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
  std::string trace_path, policy = "all", sharing = "both", out_dir, cpu_cores, sm_limit, mem = "81559", sample = "300",
              interference, saturation;
  int gpus_n = 0, sms = 132;
  bool csv = false, help = false;
  Flags f("simulate", kSimulateUsage);
  f.AddString("trace", &trace_path);
  f.AddInt("gpus", &gpus_n);
  f.AddString("gpu-memory-mib", &mem);
  f.AddInt("gpu-sms", &sms);
  f.AddString("policy", &policy);
  f.AddString("sharing", &sharing);
  f.AddString("cpu-cores", &cpu_cores);
  f.AddString("sm-limit", &sm_limit);
  f.AddString("out", &out_dir);
  f.AddString("sample-s", &sample);
  f.AddString("interference", &interference);
  f.AddString("sm-saturation", &saturation);
  f.AddBool("csv", &csv);
  f.AddBool("help", &help);
  Status st = f.Parse(args);
  if (help) {
    std::printf("usage: %s\n", kSimulateUsage);
    return 0;
  }
  if (st.ok() && trace_path.empty()) st = f.Error("--trace is required (make one with scripts/make_trace.py)");
  if (st.ok() && sharing != "both" && sharing != "on" && sharing != "off")
    st = f.Error("--sharing must be both, on or off, got '" + sharing + "'");
  if (st.ok() && gpus_n < 0) st = f.Error("--gpus expects a number of GPUs >= 1 (or leave it out for the trace's), got " + std::to_string(gpus_n));
  if (st.ok() && sms < 1) st = f.Error("--gpu-sms expects SMs per GPU >= 1, got " + std::to_string(sms));
  if (!st.ok()) return Fail("simulate", st);
  Result<JobSet> trace = LoadJobSet(trace_path);
  if (!trace.ok()) return Fail("simulate", trace.status());
  std::vector<Gpu> gpus = trace->gpus;
  double mem_mib = 0;
  if (Status e = ParseDouble(f, "gpu-memory-mib", mem, 1, 1e9, &mem_mib); !e.ok()) return Fail("simulate", e);
  if (gpus_n > 0) {
    gpus.clear();
    for (int g = 0; g < gpus_n; ++g) gpus.push_back(Gpu{g, "sim-gpu", mem_mib, sms, false, {}});
  }
  SimOptions so;
  so.planner.cpu_cores = trace->cpu_cores > 0 ? trace->cpu_cores : 64;
  if (Status e = ParseDouble(f, "cpu-cores", cpu_cores, 1, 1e6, &so.planner.cpu_cores); !e.ok()) return Fail("simulate", e);
  if (Status e = ParseDouble(f, "sm-limit", sm_limit, 0.05, 4, &so.planner.sm_limit); !e.ok()) return Fail("simulate", e);
  if (Status e = ParseDouble(f, "sample-s", sample, 1, 86400, &so.sample_s); !e.ok()) return Fail("simulate", e);
  if (Status e = ParseDouble(f, "interference", interference, 0, 1, &so.interference); !e.ok()) return Fail("simulate", e);
  if (Status e = ParseDouble(f, "sm-saturation", saturation, 0.05, 4, &so.sm_saturation); !e.ok()) return Fail("simulate", e);
  std::vector<Policy> policies;
  if (policy == "all") {
    policies = AllPolicies();
  } else {
    Result<Policy> p = ParsePolicy(policy);
    if (!p.ok()) return Fail("simulate", f.Error(p.status().message()));
    policies.push_back(*p);
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
  }
  if (csv) {
    std::printf("%s", SimSummaryCsv(runs).c_str());
    return 0;
  }
  std::printf("%zu jobs on %zu GPUs, %.0f CPU cores\n", trace->jobs.size(), gpus.size(), so.planner.cpu_cores);
  std::printf("%-15s %-7s %10s %10s %5s %6s %6s %6s %10s\n", "policy", "sharing", "makespan h", "mean JCT h", "OOMs",
              "mem %", "SM %", "cores", "peak cores");
  for (const SimResult& r : runs) {
    std::printf("%-15s %-7s %10.2f %10.2f %5d %6.1f %6.1f %6.1f %10.1f\n", r.policy.c_str(), r.sharing ? "on" : "off",
                r.makespan_s / 3600, r.mean_jct_s / 3600, r.ooms, 100 * r.mean_memory_util, 100 * r.mean_sm_util,
                r.mean_cores, r.peak_cores);
  }
  return 0;
}

}  // namespace coloader::cli
