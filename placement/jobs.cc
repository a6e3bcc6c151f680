#include "placement/jobs.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "toolbox/shared_library.h"

namespace coloader {

std::string JobPipeline::Key() const {
  return data + "|augment=" + augment + "|size=" + std::to_string(image_size) + "|output=" + output +
         "|seed=" + std::to_string(seed);
}

double JobPipeline::SampleBytes() const {
  const double bytes_per_elem = output == "uint8" ? 1 : (output == "float32" ? 4 : 2);
  return 3.0 * image_size * image_size * bytes_per_elem;
}

double JobPipeline::RingMiB() const {
  const double slots = window + window / 2;
  return slots * producer_batch * SampleBytes() / (1024.0 * 1024.0);
}

double JobPipeline::ConsumerMiB(uint32_t batch) const {
  if (batch == 0) batch = producer_batch;
  const double labels_bytes = std::ceil(batch * 8.0 / 256.0) * 256.0;  // as Consumer::Spill lays them out
  return kCopyDepth * (labels_bytes + batch * SampleBytes()) / (1024.0 * 1024.0);
}

namespace {

// The largest integer a JSON number (a double) holds exactly; seeds above it would be rounded.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

// A whole number in lo..hi (or `fallback` when absent), so that the casts after it are defined:
// the file is untrusted, and a double out of an integer type's range makes the cast undefined.
Result<double> IntegerIn(const JsonFields& f, const std::string& key, double fallback, double lo, double hi) {
  COLOADER_ASSIGN_OR_RETURN(double v, f.Number(key, fallback));
  if (!(v >= lo && v <= hi) || v != std::floor(v)) {
    char range[96];
    std::snprintf(range, sizeof(range), "must be an integer in %.0f..%.0f, got %.15g", lo, hi, v);
    return f.Error(key, range);
  }
  return v;
}

Result<JobPipeline> ParsePipeline(const JsonValue& v, const std::string& where) {
  if (!v.is_object()) return v.ErrorAt(where + " must be an object (data, augment, image_size, ...)");
  JsonFields f(v, where);
  COLOADER_RETURN_NOT_OK(
      f.OnlyKnown({"data", "augment", "image_size", "output", "seed", "producer_batch", "window", "serve_args", "decode"}));
  JobPipeline p;
  COLOADER_ASSIGN_OR_RETURN(p.data, f.String("data"));
  if (p.data.empty()) return f.Error("data", "must name a dataset (an ImageFolder directory or a file list)");
  COLOADER_ASSIGN_OR_RETURN(p.augment, f.String("augment", p.augment));
  if (p.augment != "train" && p.augment != "eval" && p.augment != "none")
    return f.Error("augment", "must be train, eval or none, got \"" + p.augment + "\"");
  COLOADER_ASSIGN_OR_RETURN(double size, IntegerIn(f, "image_size", p.image_size, 8, 4096));
  p.image_size = static_cast<int>(size);
  COLOADER_ASSIGN_OR_RETURN(p.output, f.String("output", p.output));
  if (p.output != "uint8" && p.output != "float32" && p.output != "bfloat16" && p.output != "float16")
    return f.Error("output", "must be uint8, float32, bfloat16 or float16, got \"" + p.output + "\"");
  COLOADER_ASSIGN_OR_RETURN(double seed, IntegerIn(f, "seed", 0, 0, kMaxExactInteger));
  p.seed = static_cast<uint64_t>(seed);
  COLOADER_ASSIGN_OR_RETURN(double pb, IntegerIn(f, "producer_batch", p.producer_batch, 1, 65536));
  p.producer_batch = static_cast<uint32_t>(pb);
  COLOADER_ASSIGN_OR_RETURN(double window, IntegerIn(f, "window", p.window, 1, 1024));
  p.window = static_cast<uint32_t>(window);
  COLOADER_ASSIGN_OR_RETURN(p.serve_args, f.StringList("serve_args", {}));
  COLOADER_ASSIGN_OR_RETURN(p.decode, f.String("decode", p.decode));
  if (p.decode != "cpu" && p.decode != "gpu" && p.decode != "auto")
    return f.Error("decode", "must be cpu, gpu or auto (as coloader serve --decode), got \"" + p.decode + "\"");
  // The planner places the producer by its decode (a MIG instance with a JPEG engine), so the
  // flag must not also hide in serve_args, where a later --decode would win over the plan's.
  for (const std::string& a : p.serve_args) {
    if (a == "--decode" || a.rfind("--decode=", 0) == 0)
      return f.Error("serve_args", "must not hold --decode: give it as the pipeline's \"decode\" (cpu, gpu or auto), "
                                   "which the planner places the producer by");
    if (p.decode == "cpu" && (a == "--cpu-share" || a.rfind("--cpu-share=", 0) == 0))
      return f.Error("serve_args", "holds --cpu-share, which splits each batch between the JPEG engines and the CPU, "
                                   "but the pipeline's decode is cpu: drop one of them");
  }
  return p;
}

Result<double> NonNegative(const JsonFields& f, const std::string& key, double fallback) {
  COLOADER_ASSIGN_OR_RETURN(double v, f.Number(key, fallback));
  if (!(v >= 0) || !std::isfinite(v)) return f.Error(key, "must be a number >= 0");
  return v;
}

// Jobs whose pipelines share a key share one producer, so every field that says how that
// producer runs must agree: otherwise whichever job came first would silently decide it.
Status SameProducer(const JobPipeline& earlier, const JobPipeline& p, const JsonFields& g) {
  auto differ = [&](const char* field, const std::string& mine, const std::string& theirs) {
    return g.Error("pipeline", std::string("has ") + field + " " + mine + ", but an earlier job's pipeline with the same "
                   "data, augment, image_size, output and seed has " + theirs + ": they share one producer, so give "
                   "them the same " + field);
  };
  auto quoted = [](const std::string& s) { return "\"" + s + "\""; };
  auto joined = [](const std::vector<std::string>& v) {
    std::string out = "[";
    for (const auto& s : v) out += (out.size() > 1 ? ", \"" : "\"") + s + "\"";
    return out + "]";
  };
  if (earlier.decode != p.decode) return differ("decode", quoted(p.decode), quoted(earlier.decode));
  if (earlier.producer_batch != p.producer_batch)
    return differ("producer_batch", std::to_string(p.producer_batch), std::to_string(earlier.producer_batch));
  if (earlier.window != p.window) return differ("window", std::to_string(p.window), std::to_string(earlier.window));
  if (earlier.serve_args != p.serve_args)
    return differ("serve_args", joined(p.serve_args), joined(earlier.serve_args));
  return Status::OK();
}

Result<Job> ParseJob(const JsonValue& v, const std::string& where, const std::map<std::string, JobPipeline>& named,
                     std::vector<JobPipeline>* pipelines) {
  if (!v.is_object()) return v.ErrorAt(where + " must be an object");
  JsonFields f(v, where);
  COLOADER_RETURN_NOT_OK(f.OnlyKnown({"name", "command", "pipeline", "batch_size", "memory_mib", "model", "optimizer",
                             "precision", "channels_last", "sm_activity", "priority", "loader_cores", "isolation",
                             "arrival_s", "duration_s", "samples", "actual_memory_mib"}));
  Job j;
  COLOADER_ASSIGN_OR_RETURN(j.name, f.String("name"));
  if (j.name.empty() || j.name.find_first_of(" \t\n/") != std::string::npos)
    return f.Error("name", "must be a non-empty word without spaces or '/'");
  JsonFields named_fields(v, where + " (\"" + j.name + "\")");
  const JsonFields& g = named_fields;
  COLOADER_ASSIGN_OR_RETURN(j.command, g.StringList("command", {}));
  COLOADER_ASSIGN_OR_RETURN(double batch, IntegerIn(g, "batch_size", 0, 0, 1e6));
  j.batch_size = static_cast<uint32_t>(batch);

  const JsonValue* pv = v.Find("pipeline");
  if (!pv) return g.Error("pipeline", "is missing (a name from \"pipelines\", or an object with \"data\")");
  JobPipeline p;
  if (pv->is_string()) {
    auto it = named.find(pv->string());
    if (it == named.end()) return g.Error("pipeline", "names \"" + pv->string() + "\", which \"pipelines\" does not define");
    p = it->second;
  } else {
    COLOADER_ASSIGN_OR_RETURN(p, ParsePipeline(*pv, g.where() + ".pipeline"));
  }
  // Jobs whose pipelines have the same key share one producer, however the file spelt them.
  j.pipeline = -1;
  const std::string key = p.Key();
  for (size_t i = 0; i < pipelines->size() && j.pipeline < 0; ++i) {
    if ((*pipelines)[i].Key() == key) j.pipeline = static_cast<int>(i);
  }
  // One producer runs one way: two spellings of a pipeline must not disagree on how.
  if (j.pipeline >= 0) COLOADER_RETURN_NOT_OK(SameProducer((*pipelines)[j.pipeline], p, g));
  if (j.pipeline < 0) {
    pipelines->push_back(p);
    j.pipeline = static_cast<int>(pipelines->size() - 1);
  }

  const JsonValue* mem = v.Find("memory_mib");
  if (!mem) return g.Error("memory_mib", "is missing (MiB at peak, or \"auto\" to run the estimator)");
  if (mem->is_string() && mem->string() == "auto") {
    j.memory_auto = true;
  } else if (mem->is_number() && mem->number() > 0 && std::isfinite(mem->number())) {
    j.memory_mib = mem->number();
  } else {
    return g.Error("memory_mib", "must be a number of MiB > 0 or \"auto\"");
  }
  COLOADER_ASSIGN_OR_RETURN(j.model, g.String("model", ""));
  COLOADER_ASSIGN_OR_RETURN(j.optimizer, g.String("optimizer", j.optimizer));
  COLOADER_ASSIGN_OR_RETURN(j.precision, g.String("precision", j.precision));
  COLOADER_ASSIGN_OR_RETURN(j.channels_last, g.Bool("channels_last", false));
  // Only an "auto" job needs the estimator: one that wants just its SM activity from it keeps
  // --default-sm when the estimator refuses these fields (EstimateAutoJobs), so it plans as before.
  if (j.memory_auto) {
    if (j.model.empty()) return g.Error("model", "is needed when memory_mib is \"auto\" (e.g. \"torchvision:resnet50\")");
    if (j.batch_size == 0) return g.Error("batch_size", "is needed when memory_mib is \"auto\"");
    if (j.optimizer != "sgd" && j.optimizer != "adam" && j.optimizer != "adamw")
      return g.Error("optimizer", "must be sgd, adam or adamw, got \"" + j.optimizer + "\"");
    if (j.precision != "fp32" && j.precision != "bf16-amp" && j.precision != "fp16-amp")
      return g.Error("precision", "must be fp32, bf16-amp or fp16-amp, got \"" + j.precision + "\"");
  }
  if (g.Has("sm_activity")) {
    COLOADER_ASSIGN_OR_RETURN(j.sm_activity, g.Number("sm_activity"));
    if (!(j.sm_activity >= 0 && j.sm_activity <= 1)) return g.Error("sm_activity", "must be between 0 and 1");
    j.sm_source = Job::SmSource::kStated;
  }
  COLOADER_ASSIGN_OR_RETURN(double prio, IntegerIn(g, "priority", 0, -1e6, 1e6));
  j.priority = static_cast<int>(prio);
  COLOADER_ASSIGN_OR_RETURN(j.loader_cores, NonNegative(g, "loader_cores", j.loader_cores));
  COLOADER_ASSIGN_OR_RETURN(j.isolation, g.Bool("isolation", false));
  COLOADER_ASSIGN_OR_RETURN(j.arrival_s, NonNegative(g, "arrival_s", 0));
  COLOADER_ASSIGN_OR_RETURN(j.duration_s, NonNegative(g, "duration_s", 0));
  COLOADER_ASSIGN_OR_RETURN(j.samples, NonNegative(g, "samples", 0));
  COLOADER_ASSIGN_OR_RETURN(j.actual_memory_mib, NonNegative(g, "actual_memory_mib", 0));
  return j;
}

}  // namespace

Result<std::vector<Gpu>> ParseGpus(const JsonValue& array, const std::string& where) {
  if (!array.is_array()) return array.ErrorAt(where + " must be an array of GPUs");
  std::vector<Gpu> gpus;
  for (size_t i = 0; i < array.items().size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const JsonValue& v = array.items()[i];
    if (!v.is_object()) return v.ErrorAt(w + " must be an object");
    JsonFields f(v, w);
    COLOADER_RETURN_NOT_OK(f.OnlyKnown({"index", "name", "memory_mib", "sms", "mig", "mig_profiles", "compute_slices"}));
    Gpu g;
    COLOADER_ASSIGN_OR_RETURN(double index, IntegerIn(f, "index", static_cast<double>(i), 0, 1023));
    g.index = static_cast<int>(index);
    for (size_t k = 0; k < gpus.size(); ++k)
      if (gpus[k].index == g.index)
        return f.Error("index", "is " + std::to_string(g.index) + ", as " + where + "[" + std::to_string(k) +
                                    "]'s is: each GPU is listed once (an index is the GPU's CUDA/NVML ordinal)");
    COLOADER_ASSIGN_OR_RETURN(g.name, f.String("name", "gpu" + std::to_string(g.index)));
    COLOADER_ASSIGN_OR_RETURN(g.memory_mib, f.Number("memory_mib"));
    if (!(g.memory_mib > 0)) return f.Error("memory_mib", "must be > 0");
    COLOADER_ASSIGN_OR_RETURN(double sms, IntegerIn(f, "sms", 0, 0, 1e6));
    g.sms = static_cast<int>(sms);
    COLOADER_ASSIGN_OR_RETURN(g.mig, f.Bool("mig", false));
    if (const JsonValue* profiles = v.Find("mig_profiles")) {
      if (!profiles->is_array()) return f.Error("mig_profiles", "must be an array");
      for (size_t k = 0; k < profiles->items().size(); ++k) {
        const std::string pw = w + ".mig_profiles[" + std::to_string(k) + "]";
        if (!profiles->items()[k].is_object()) return profiles->items()[k].ErrorAt(pw + " must be an object");
        JsonFields pf(profiles->items()[k], pw);
        COLOADER_RETURN_NOT_OK(pf.OnlyKnown({"name", "memory_mib", "sms", "count", "compute_slices", "jpeg_engines"}));
        MigProfile m;
        COLOADER_ASSIGN_OR_RETURN(m.name, pf.String("name"));
        COLOADER_ASSIGN_OR_RETURN(m.memory_mib, pf.Number("memory_mib"));
        if (!(m.memory_mib > 0)) return pf.Error("memory_mib", "must be > 0");
        COLOADER_ASSIGN_OR_RETURN(double psms, IntegerIn(pf, "sms", 0, 0, 1e6));
        COLOADER_ASSIGN_OR_RETURN(double count, IntegerIn(pf, "count", 1, 1, 1024));
        COLOADER_ASSIGN_OR_RETURN(double slices, IntegerIn(pf, "compute_slices", 0, 0, 64));
        m.sms = static_cast<int>(psms);
        m.count = static_cast<int>(count);
        m.compute_slices = static_cast<int>(slices);
        if (pf.Has("jpeg_engines")) {
          COLOADER_ASSIGN_OR_RETURN(double jpeg, IntegerIn(pf, "jpeg_engines", 0, 0, 64));
          m.jpeg_engines = static_cast<int>(jpeg);
        }
        if (ComputeSlicesOf(m) == 0)
          return pf.Error("compute_slices", "must be given: the name \"" + m.name +
                                                "\" does not say them (NVIDIA's names do: 2g.10gb takes 2 of 7)");
        g.mig_profiles.push_back(m);
      }
    }
    if (g.mig && g.mig_profiles.empty()) return f.Error("mig_profiles", "must list the profiles when mig is true");
    COLOADER_ASSIGN_OR_RETURN(double gpu_slices, IntegerIn(f, "compute_slices", 0, 0, 64));
    g.compute_slices = static_cast<int>(gpu_slices);
    for (const MigProfile& m : g.mig_profiles)
      if (ComputeSlicesOf(m) > ComputeSlicesOf(g))
        return f.Error("compute_slices", "is " + std::to_string(ComputeSlicesOf(g)) + ", fewer than profile " + m.name +
                                             " takes (" + std::to_string(ComputeSlicesOf(m)) + ")");
    gpus.push_back(std::move(g));
  }
  return gpus;
}

Result<JobSet> ParseJobSet(const JsonValue& doc, const std::string& source) {
  // Errors below are positioned by the values ("jobs.json:4:17: jobs[0] ..."); a document made
  // in code has no positions, so the top level names the source itself.
  if (!doc.is_object()) {
    return Status::Invalid((doc.Position().empty() ? source : doc.Position()) +
                           ": the top level must be an object with \"jobs\"");
  }
  JsonFields top(doc, "");
  COLOADER_RETURN_NOT_OK(top.OnlyKnown({"jobs", "pipelines", "gpus", "cpu_cores", "comment"}));
  JobSet set;
  set.source = source;
  COLOADER_ASSIGN_OR_RETURN(set.cpu_cores, NonNegative(top, "cpu_cores", 0));
  std::map<std::string, JobPipeline> named;
  if (const JsonValue* pl = doc.Find("pipelines")) {
    if (!pl->is_object()) return top.Error("pipelines", "must be an object of name -> pipeline");
    for (const auto& [name, v] : pl->members()) {
      COLOADER_ASSIGN_OR_RETURN(JobPipeline p, ParsePipeline(v, "pipelines." + name));
      named[name] = p;
    }
  }
  const JsonValue* jobs = doc.Find("jobs");
  if (!jobs || !jobs->is_array() || jobs->items().empty())
    return top.Error("jobs", "must be a non-empty array of jobs");
  std::set<std::string> names;
  for (size_t i = 0; i < jobs->items().size(); ++i) {
    COLOADER_ASSIGN_OR_RETURN(Job j, ParseJob(jobs->items()[i], "jobs[" + std::to_string(i) + "]", named, &set.pipelines));
    if (!names.insert(j.name).second) return jobs->items()[i].ErrorAt("two jobs are named \"" + j.name + "\"");
    set.jobs.push_back(std::move(j));
  }
  if (const JsonValue* gpus = doc.Find("gpus")) {
    COLOADER_ASSIGN_OR_RETURN(set.gpus, ParseGpus(*gpus, "gpus"));
  }
  return set;
}

int ComputeSlicesOf(const MigProfile& m) {
  if (m.compute_slices > 0) return m.compute_slices;
  int n = 0;
  size_t k = 0;
  while (k < m.name.size() && k < 3 && m.name[k] >= '0' && m.name[k] <= '9') n = n * 10 + (m.name[k++] - '0');
  return k > 0 && k < m.name.size() && m.name[k] == 'g' ? n : 0;
}

int ComputeSlicesOf(const Gpu& g) {
  if (g.compute_slices > 0) return g.compute_slices;
  int most = 0;
  for (const MigProfile& m : g.mig_profiles) most = std::max(most, ComputeSlicesOf(m));
  return most;
}

double SmShareOf(const MigProfile& m, const Gpu& g) {
  if (m.sms > 0 && g.sms > 0) return std::min(1.0, static_cast<double>(m.sms) / g.sms);
  const int slices = ComputeSlicesOf(g);
  return slices > 0 ? std::min(1.0, static_cast<double>(ComputeSlicesOf(m)) / slices) : 1.0;
}

int JpegEnginesOf(const MigProfile& m, const Gpu& g) {
  if (m.jpeg_engines >= 0) return m.jpeg_engines;
  if (m.name.find("+me") != std::string::npos) return 1;
  if (m.name.find("-me") != std::string::npos) return 0;
  const bool hopper = g.name.find("H100") != std::string::npos || g.name.find("H200") != std::string::npos ||
                      g.name.find("H20") != std::string::npos;
  if (hopper) return ComputeSlicesOf(m);
  return ComputeSlicesOf(m) > 0 && ComputeSlicesOf(m) == ComputeSlicesOf(g) ? 1 : 0;
}

Result<JobSet> LoadJobSet(const std::string& path) {
  COLOADER_ASSIGN_OR_RETURN(JsonValue doc, ReadJsonOrYamlFile(path));
  return ParseJobSet(doc, path);
}

// ---- NVML, opened at run time ----------------------------------------------------------------

namespace {

// The few NVML entry points we use, declared from NVML's public API reference so the binary
// neither needs nvml.h to build nor libnvidia-ml to start.
using nvmlDevice_t = void*;
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlGpuInstanceProfileInfo {  // nvmlGpuInstanceProfileInfo_t (v1)
  unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount, decoderCount,
      encoderCount, jpegCount, ofaCount;
  unsigned long long memorySizeMB;
};
constexpr unsigned kNvmlGpuInstanceProfileCount = 17;  // NVML_GPU_INSTANCE_PROFILE_COUNT (upper bound we probe)

// What nvidia-smi appends to a profile's "Ng.Mgb" name for NVML's profile ids beside the plain
// ones (nvml.h's NVML_GPU_INSTANCE_PROFILE_*): without it, 1g.5gb and 1g.5gb+me (REV1, media
// extensions: the A100's only 1g instance with a JPEG engine) would share one name, which the
// planner counts instances by.
const char* NvmlProfileSuffix(unsigned id) {
  switch (id) {
    case 0x7: case 0x8: return "+me";            // *_SLICE_REV1
    case 0xA: case 0xB: case 0xC: return "+gfx";  // *_SLICE_GFX
    case 0xD: case 0xE: return "-me";            // *_SLICE_NO_ME
    case 0xF: case 0x10: return "+me.all";       // *_SLICE_ALL_ME
    default: return "";
  }
}

// SMs by product name, for drivers that do not report it on a whole GPU (from NVIDIA's data sheets).
int SmsByName(const std::string& name) {
  if (name.find("H100") != std::string::npos && name.find("PCIe") != std::string::npos) return 114;
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 132;  // SXM, NVL
  if (name.find("A100") != std::string::npos) return 108;
  if (name.find("L40") != std::string::npos) return 142;
  if (name.find("A10") != std::string::npos) return 72;
  return 0;
}

}  // namespace

Result<std::vector<Gpu>> GpusFromNvml() {
  Result<SharedLibrary> lib = SharedLibrary::Open({"libnvidia-ml.so.1"});
  if (!lib.ok()) return Status::NotFound("NVML is not available (libnvidia-ml.so.1: no NVIDIA driver here); give \"gpus\" in the jobs file");
  int (*init)() = nullptr, (*shutdown)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, nvmlDevice_t*) = nullptr;
  int (*name_fn)(nvmlDevice_t, char*, unsigned) = nullptr;
  int (*mem_fn)(nvmlDevice_t, NvmlMemory*) = nullptr;
  int (*mig_fn)(nvmlDevice_t, unsigned*, unsigned*) = nullptr;
  int (*profile_fn)(nvmlDevice_t, unsigned, NvmlGpuInstanceProfileInfo*) = nullptr;
  lib->Bind(init, "nvmlInit_v2");
  lib->Bind(count, "nvmlDeviceGetCount_v2");
  lib->Bind(handle, "nvmlDeviceGetHandleByIndex_v2");
  lib->Bind(name_fn, "nvmlDeviceGetName");
  lib->Bind(mem_fn, "nvmlDeviceGetMemoryInfo");
  lib->BindOptional(mig_fn, "nvmlDeviceGetMigMode");
  lib->BindOptional(profile_fn, "nvmlDeviceGetGpuInstanceProfileInfo");
  lib->BindOptional(shutdown, "nvmlShutdown");
  if (!lib->complete())
    return Status::NotFound("libnvidia-ml.so.1 lacks " + lib->missing() + " (driver too old?)");
  if (int rc = init(); rc != 0)
    return Status::NotFound("nvmlInit failed (error " + std::to_string(rc) + "); is the NVIDIA driver loaded?");
  unsigned n = 0;
  std::vector<Gpu> gpus;
  if (count(&n) == 0) {
    for (unsigned i = 0; i < n; ++i) {
      nvmlDevice_t dev = nullptr;
      if (handle(i, &dev) != 0) continue;
      Gpu g;
      g.index = static_cast<int>(i);
      char name[96] = {0};
      if (name_fn(dev, name, sizeof(name)) == 0) g.name = name;
      NvmlMemory m{};
      // What is free now: memory other processes already hold is not ours to plan with.
      if (mem_fn(dev, &m) == 0) g.memory_mib = static_cast<double>(m.free) / (1024.0 * 1024.0);
      g.sms = SmsByName(g.name);
      unsigned current = 0, pending = 0;
      if (mig_fn && mig_fn(dev, &current, &pending) == 0 && current == 1) {
        g.mig = true;
        for (unsigned p = 0; profile_fn && p < kNvmlGpuInstanceProfileCount; ++p) {
          NvmlGpuInstanceProfileInfo info{};
          if (profile_fn(dev, p, &info) != 0 || info.instanceCount == 0) continue;
          MigProfile mp;
          mp.name = std::to_string(info.sliceCount) + "g." + std::to_string((info.memorySizeMB + 1023) / 1024) + "gb" +
                    NvmlProfileSuffix(p);
          mp.memory_mib = static_cast<double>(info.memorySizeMB);
          mp.sms = static_cast<int>(info.multiprocessorCount);
          mp.count = static_cast<int>(info.instanceCount);
          mp.compute_slices = static_cast<int>(info.sliceCount);
          mp.jpeg_engines = static_cast<int>(info.jpegCount);
          g.mig_profiles.push_back(mp);
        }
      }
      gpus.push_back(std::move(g));
    }
  }
  if (shutdown) shutdown();
  if (gpus.empty()) return Status::NotFound("NVML reports no GPU; give \"gpus\" in the jobs file");
  return gpus;
}

}  // namespace coloader
