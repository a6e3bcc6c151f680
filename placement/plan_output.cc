// What a plan hands on: the producers' names, each job's environment (what `launch` starts it
// with), and the plan as one JSON object and as a table a person reads (placement/planner.h).
#include <cctype>
#include <cmath>
#include <cstdio>

#include "placement/planner.h"
#include "toolbox/json.h"

namespace coloader {

std::string ProducerName(const JobSet& set, int pipeline) {
  // Readable and stable: the dataset's last path component plus the pipeline's index.
  std::string data = set.pipelines[pipeline].data;
  while (data.size() > 1 && data.back() == '/') data.pop_back();
  // The last two path components ("imagenet/train" -> "imagenet-train").
  const size_t last = data.find_last_of('/');
  const size_t before = last == std::string::npos || last == 0 ? std::string::npos : data.find_last_of('/', last - 1);
  std::string base = before == std::string::npos ? data.substr(last == std::string::npos ? 0 : last + 1) : data.substr(before + 1);
  std::string name;
  for (char c : base) name += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '-';
  if (name.empty()) name = "data";
  if (name.size() > 40) name.resize(40);
  return "plan-" + name + "-" + std::to_string(pipeline);
}

std::map<std::string, std::string> JobEnvironment(const JobSet& set, const Planner& planner, const Placement& p) {
  std::map<std::string, std::string> env;
  const Gpu& gpu = planner.gpus()[p.gpu];
  env["CUDA_VISIBLE_DEVICES"] = std::to_string(gpu.index);
  if (p.producer >= 0) env["COLOADER_NAME"] = ProducerName(set, p.producer);
  const Mode mode = planner.ModeOf(p);
  if (mode == Mode::kMps) env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = std::to_string(planner.MpsThreadPercentage(p));
  const auto mib = [](double x) { return std::to_string(static_cast<long long>(std::ceil(x))); };
  if (p.mode == Mode::kMps) {
    // Shared, or alone for now with room for others: the job sees one device, ordinal 0, and
    // the limit it was placed with (Planner::LimitWhenPlaced, and the ring it maps), so that
    // past it the job itself gets an out-of-memory error (and recovers, Planner::Recover).
    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=" + mib(planner.MpsLimitMiB(p)) + "M";
  }
  // The same figure for the job itself, with or without MPS (e.g. for
  // torch.cuda.set_per_process_memory_fraction).
  env["COLOADER_MEMORY_LIMIT_MIB"] = mib(planner.MemoryLimitMiB(p));
  if (mode == Mode::kMig) env["COLOADER_MIG_PROFILE"] = p.mig_profile;
  return env;
}

std::string PlanJson(const JobSet& set, const Planner& planner, const Plan& plan) {
  JsonWriter w;
  w.BeginObject().Field("policy", PolicyName(planner.options().policy)).Field("sharing", planner.options().sharing);
  w.BeginArray("gpus");
  for (size_t g = 0; g < planner.gpus().size(); ++g) {
    const Gpu& gpu = planner.gpus()[g];
    const GpuLoad& load = planner.loads()[g];
    w.BeginObject()
        .Field("index", gpu.index)
        .Field("name", gpu.name)
        .Field("memory_mib", gpu.memory_mib)
        .Field("sms", gpu.sms)
        .Field("planned_mib", load.used_mib)
        .Field("producer_mib", load.producer_mib)
        .Field("sm_activity", load.sm);
    w.BeginArray("jobs");
    for (int j : load.jobs) w.Value(set.jobs[j].name);
    w.EndArray().EndObject();
  }
  w.EndArray();
  w.BeginArray("jobs");
  for (const Placement& p : plan.placements) {
    const Job& job = set.jobs[p.job];
    w.BeginObject()
        .Field("name", job.name)
        .Field("gpu", planner.gpus()[p.gpu].index)
        .Field("mode", ModeName(planner.ModeOf(p)))
        .Field("reserved_mib", p.reserved_mib)
        .Field("client_mib", p.client_mib)
        .Field("sm_activity", planner.SmOf(p.job))
        .Field("sm_source", SmSourceName(job.sm_source));
    if (!job.sm_why.empty()) w.Field("sm_why", job.sm_why);  // why a job with a model got no estimate
    if (!p.mig_profile.empty()) w.Field("mig_profile", p.mig_profile);
    if (p.producer >= 0) w.Field("producer", ProducerName(set, p.producer)).Field("host_path", p.host_path);
    w.Key("env").BeginObject();
    for (const auto& [k, v] : JobEnvironment(set, planner, p)) w.Field(k.c_str(), v);
    w.EndObject().EndObject();
  }
  w.EndArray();
  w.BeginArray("producers");
  for (size_t pi = 0; pi < set.pipelines.size(); ++pi) {
    if (!planner.options().sharing || !planner.ProducerRunning(static_cast<int>(pi))) continue;
    const JobPipeline& pl = set.pipelines[pi];
    const std::set<int> gpus = planner.ProducerGpus(static_cast<int>(pi));
    w.BeginObject()
        .Field("name", ProducerName(set, static_cast<int>(pi)))
        .Field("data", pl.data)
        .Field("pipeline", pl.Key())
        .Field("device_mib_per_gpu", gpus.empty() ? 0.0 : pl.DeviceMiB())
        .Field("cores", planner.ProducerCores(static_cast<int>(pi)));
    w.BeginArray("gpus");
    for (int g : gpus) w.Value(planner.gpus()[g].index);
    w.EndArray();
    const ProducerDecode d = planner.DecodeOf(static_cast<int>(pi));
    w.Key("decode").BeginObject().Field("mode", d.decode);
    if (d.gpu >= 0) w.Field("gpu", planner.gpus()[d.gpu].index);
    if (!d.mig_profile.empty()) w.Field("mig_profile", d.mig_profile).Field("mig_mib", d.reserved_mib);
    w.Field("why", d.why).EndObject();
    w.BeginArray("jobs");
    for (const Placement& p : plan.placements) {
      if (p.producer == static_cast<int>(pi)) w.Value(set.jobs[p.job].name);
    }
    w.EndArray().EndObject();
  }
  w.EndArray();
  w.BeginArray("queued");
  for (int j : plan.queued) w.Value(set.jobs[j].name);
  w.EndArray().BeginArray("impossible");
  for (int j : plan.impossible) w.Value(set.jobs[j].name);
  w.EndArray().BeginArray("impossible_why");
  for (const std::string& why : plan.impossible_why) w.Value(why);
  w.EndArray();
  w.Field("cpu_cores", planner.options().cpu_cores).Field("cpu_cores_from", planner.options().cpu_cores_from);
  w.Field("cpu_cores_used", plan.cpu_cores_used).Field("cpu_cores_without_sharing", plan.cpu_cores_without_sharing);
  w.EndObject();
  return w.str();
}

std::string PlanTable(const JobSet& set, const Planner& planner, const Plan& plan) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "policy %s, data sharing %s\n\n", PolicyName(planner.options().policy),
                planner.options().sharing ? "on" : "off");
  out += line;
  std::snprintf(line, sizeof(line), "%-20s %4s %-10s %10s %6s %5s %-9s %5s %-28s %s\n", "job", "gpu", "mode",
                "mem MiB", "client", "SM", "SM from", "thr%", "producer", "path");
  out += line;
  for (const Placement& p : plan.placements) {
    const Mode mode = planner.ModeOf(p);
    const std::string mode_s = mode == Mode::kMig ? "mig " + p.mig_profile : ModeName(mode);
    std::snprintf(line, sizeof(line), "%-20s %4d %-10s %10.0f %6.0f %5.2f %-9s %5d %-28s %s\n",
                  set.jobs[p.job].name.c_str(), planner.gpus()[p.gpu].index, mode_s.c_str(), p.reserved_mib,
                  p.client_mib, planner.SmOf(p.job), SmSourceName(set.jobs[p.job].sm_source),
                  planner.MpsThreadPercentage(p), p.producer >= 0 ? ProducerName(set, p.producer).c_str() : "(own loader)",
                  p.producer < 0 ? "-" : (p.host_path ? "host" : "cuda-ipc"));
    out += line;
  }
  out += "\n";
  for (size_t g = 0; g < planner.gpus().size(); ++g) {
    const Gpu& gpu = planner.gpus()[g];
    const GpuLoad& load = planner.loads()[g];
    std::snprintf(line, sizeof(line), "gpu %d (%s): %.0f of %.0f MiB planned (producers %.0f), SM activity %.2f, %zu job(s)\n",
                  gpu.index, gpu.name.c_str(), load.used_mib, gpu.memory_mib, load.producer_mib, load.sm, load.jobs.size());
    out += line;
  }
  for (const Placement& p : plan.placements) {
    const Job& job = set.jobs[p.job];
    if (job.sm_why.empty()) continue;
    std::snprintf(line, sizeof(line), "job %s: SM activity %.2f (--default-sm), because ", job.name.c_str(),
                  planner.SmOf(p.job));
    out += line + job.sm_why + "\n";
  }
  for (size_t pi = 0; pi < set.pipelines.size(); ++pi) {
    if (!planner.options().sharing || !planner.ProducerRunning(static_cast<int>(pi))) continue;
    const ProducerDecode d = planner.DecodeOf(static_cast<int>(pi));
    std::string where = d.decode;
    if (d.gpu >= 0) where += " on gpu " + std::to_string(planner.gpus()[d.gpu].index);
    if (!d.mig_profile.empty()) where += " (mig " + d.mig_profile + ")";
    out += "producer " + ProducerName(set, static_cast<int>(pi)) + " decodes: " + where + "; " + d.why + "\n";
  }
  std::snprintf(line, sizeof(line), "CPU cores for loading: %.1f of %.0f (%s; per-job loaders would need %.1f)\n",
                plan.cpu_cores_used, planner.options().cpu_cores, planner.options().cpu_cores_from.c_str(),
                plan.cpu_cores_without_sharing);
  out += line;
  for (int j : plan.queued) out += "queued (waits for room): " + set.jobs[j].name + "\n";
  for (size_t k = 0; k < plan.impossible.size(); ++k)
    out += "cannot run on these GPUs: " + set.jobs[plan.impossible[k]].name + ": " + plan.impossible_why[k] + "\n";
  return out;
}

}  // namespace coloader
