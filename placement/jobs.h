// What the planner packs: jobs (from a jobs file or a trace), the data pipelines they read, and
// the GPUs (from the file, or from NVML at run time). The jobs-file format is in docs/PLACEMENT.md.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "toolbox/json_reader.h"

namespace coloader {

// A dataset pipeline: the producer a group of jobs can share. Two jobs share one producer
// exactly when their pipelines have the same key (the dataset path and everything that
// changes the batches it makes: augmentation, image size, output type, seed).
struct JobPipeline {
  std::string data;
  std::string augment = "train";
  int image_size = 224;
  std::string output = "float32";
  uint64_t seed = 0;
  // How the producer is run; these do not change what a consumer sees, so they are not in the key.
  uint32_t producer_batch = 256;
  uint32_t window = 4;
  std::vector<std::string> serve_args;  // more `coloader serve` flags
  // Where its producer decodes JPEGs, as `coloader serve --decode`: cpu, gpu or auto (serve's
  // default: the GPU's JPEG engines where its --device has them, else the CPU). The planner
  // decides where a gpu or auto producer whose jobs read host memory (MIG) decodes: see
  // Planner::DecodeOf.
  std::string decode = "auto";

  std::string Key() const;
  // One sample as the producer lays it out in a slot: image_size^2 x 3 elements of the output type.
  double SampleBytes() const;
  // The producer's ring as `coloader serve` sizes it: window + window/2 spare slots of
  // producer_batch samples of image_size^2 x 3 elements of the output type.
  double RingMiB() const;
  // What the producer holds on each GPU it serves: the ring plus its own CUDA context and
  // allocator slack (kProducerContextMiB, an allowance that scripts/gpu_launch_check.sh measures).
  double DeviceMiB() const { return RingMiB() + kProducerContextMiB; }
  static constexpr double kProducerContextMiB = 600;
  // What a consumer of `batch` samples allocates on the GPU on the device path: every batch it
  // reads is copied into a buffer of its own (the Loader's write protection, unless zero_copy;
  // gathered across slots when it straddles two), from the consumer's memory pool
  // (DeviceMapper::Allocate, client/slicing.cc), 256-aligned labels (8 bytes each) then
  // batch x SampleBytes(), freed stream-ordered when the batch goes. kCopyDepth of them are live
  // at once: the batch the training step still holds while the loop's next() copies the
  // following one (or, with the Loader's batch ahead, the batch handed out and the one taken
  // ahead: the loop drops the previous batch as next() returns, usually before the Loader's
  // thread, which waits for the GIL, allocates the next copy in its memory, stream-ordered; a
  // job that keeps its previous batch longer has three). `batch` 0 (not stated) reads at the
  // producer's batch size.
  double ConsumerMiB(uint32_t batch) const;
  static constexpr int kCopyDepth = 2;
};

struct Job {
  std::string name;
  std::vector<std::string> command;  // argv; "{producer}" is replaced by the producer's name
  int pipeline = -1;                 // index into JobSet::pipelines
  uint32_t batch_size = 0;
  double memory_mib = 0;  // the estimate the planner packs by (peak, as nvidia-smi reports it)
  bool memory_auto = false;
  std::string model, optimizer = "sgd", precision = "fp32";
  bool channels_last = false;
  double sm_activity = -1;  // expected SM activity alone on the GPU, 0..1; < 0 unknown
  // Where sm_activity came from: the jobs file, the estimator (EstimateAutoJobs, for a job with
  // a model), or neither (the planner then assumes --default-sm).
  enum class SmSource { kDefault, kStated, kEstimated };
  SmSource sm_source = SmSource::kDefault;
  // kDefault for a job with a model: why the estimator gave no figure (the plan's sm_why).
  std::string sm_why;
  int priority = 0;         // higher first
  double loader_cores = 4;  // CPU cores its own (per-job) loader would need
  bool isolation = false;   // must not share SMs/memory bandwidth: MIG or a GPU of its own
  // Trace-only fields (the simulator): when it arrives, how long it runs alone, what it really uses.
  double arrival_s = 0;
  double duration_s = 0;
  // Traces: the samples the job reads in all. With duration_s it gives the job's pace alone in
  // samples/s, which the simulator needs to hold a reader to its producer's slowest reader; 0:
  // unknown (the pace is then compared as a fraction of each job's speed alone).
  double samples = 0;
  double actual_memory_mib = 0;  // 0: equal to the estimate
};

struct MigProfile {
  std::string name;  // e.g. "3g.40gb"
  double memory_mib = 0;
  int sms = 0;
  int count = 0;  // how many instances of it the GPU can hold
  int compute_slices = 0;  // of the GPU's (ComputeSlicesOf); 0: the N of its "Ng.<memory>" name
  int jpeg_engines = -1;   // hardware JPEG decoders (NVJPG) in one instance; -1: from its name (JpegEnginesOf)
};

struct Gpu {
  int index = 0;
  std::string name;
  double memory_mib = 0;
  int sms = 0;
  bool mig = false;
  std::vector<MigProfile> mig_profiles;
  int compute_slices = 0;  // MIG: its compute slices; 0: those of its largest profile
};

// A MIG profile's compute slices: stated, or the N of NVIDIA's "Ng.<memory>" name (1g.5gb: 1);
// 0 when neither says. A GPU's: stated, or its largest profile's (every MIG GPU offers one
// instance of the whole GPU: 7g on an A100 or H100, 4g on an A30). The instances on a GPU
// never hold more compute slices than it has, whatever their memory (A100: 7 slices, 8 of memory).
int ComputeSlicesOf(const MigProfile& m);
int ComputeSlicesOf(const Gpu& g);
// The share of GPU g's SMs that an instance of profile m holds: by SMs where both state them,
// else by compute slices (an A100's 1g: 1/7).
double SmShareOf(const MigProfile& m, const Gpu& g);
// The JPEG engines of an instance of profile m on GPU g: stated (the file's jpeg_engines, NVML's
// jpegCount), else from NVIDIA's MIG user guide by the names: a "+me" (media extensions) profile
// has one, a "-me" profile none; on a Hopper GPU (H100, H200, H20) one per compute slice (its 7
// NVJPGs are spread over the 7 slices); elsewhere (A100, A30, and GPUs we have no figures for) only
// the instance of the whole GPU has the GPU's one, the other profiles none (an A100's 1g.5gb, 2g.10gb,
// 3g.20gb: 0 JPEG). docs/PLACEMENT.md.
int JpegEnginesOf(const MigProfile& m, const Gpu& g);

struct JobSet {
  std::vector<JobPipeline> pipelines;
  std::vector<Job> jobs;
  std::vector<Gpu> gpus;  // from the file; empty when it names none
  double cpu_cores = 0;   // the machine's cores for loading; 0: this machine's count
  std::string source;
};

// Reads a jobs file: JSON, or YAML when the name ends in .yaml or .yml (toolbox/json_reader.h).
// Every error names the file, the line:column, the job and the field.
Result<JobSet> LoadJobSet(const std::string& path);
Result<JobSet> ParseJobSet(const JsonValue& doc, const std::string& source);
Result<std::vector<Gpu>> ParseGpus(const JsonValue& array, const std::string& where);

// The GPUs NVML reports (libnvidia-ml.so.1 opened at run time; no link-time dependency), with
// the memory free at this moment as their memory_mib.
// NotFound when there is no driver or no GPU.
Result<std::vector<Gpu>> GpusFromNvml();

// Runs the estimator (`<python> -m coloader.estimator ... --json`) once per distinct command and
// fills memory_mib of every `auto` job and sm_activity (SmSource::kEstimated) of every job that
// has a model but states no sm_activity. Only an `auto` job's memory makes a failure an error (it
// names the job and says what failed and what to do); a job that wanted only its SM activity keeps
// SmSource::kDefault (--default-sm) with the reason in sm_why, and one warning line per distinct
// reason goes to stderr.
Status EstimateAutoJobs(JobSet* set, const std::string& python);

// "stated", "estimated" or "default" (the plan's sm_source).
const char* SmSourceName(Job::SmSource source);

// The estimator's command line for one job (exposed for tests and messages).
std::vector<std::string> EstimatorCommand(const Job& job, const JobPipeline& pipeline, const std::string& python);

// argv and envp for posix_spawn: this process's environment with `env` added or replaced.
// The arrays point into this object, which must outlive the spawn call.
class SpawnArgs {
 public:
  SpawnArgs(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);
  char* const* argv() { return args_.data(); }
  char* const* envp() { return envp_.data(); }

 private:
  std::vector<std::string> arg_strings_, env_strings_;
  std::vector<char*> args_, envp_;
};

// Runs argv, returns its exit status and captured stdout/stderr (for the estimator, mps control).
struct CommandOutput {
  int exit_code = -1;  // 128 + signal when killed
  std::string out, err;
};
Result<CommandOutput> RunCommand(const std::vector<std::string>& argv, int timeout_ms,
                                 const std::map<std::string, std::string>& env = {});

}  // namespace coloader
