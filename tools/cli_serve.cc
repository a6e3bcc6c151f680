#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "common/log.h"
#include "common/process.h"
#include "producer/device_ring.h"
#include "producer/producer.h"
#include "toolbox/json_reader.h"
#include "tools/cli.h"

namespace coloader::cli {

namespace {

Producer* g_producer = nullptr;

// A torch checkpoint (torch.save's zip, or its legacy pickle): this binary does not read
// pickles; the `coloader` command installed with the package (python -m coloader) converts it.
bool IsTorchCheckpoint(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;  // a pipe is read once
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  unsigned char magic[2] = {0, 0};
  const size_t n = std::fread(magic, 1, 2, f);
  std::fclose(f);
  return n == 2 && ((magic[0] == 'P' && magic[1] == 'K') || magic[0] == 0x80);
}

// --resume STATE: a Loader's state_dict() saved as JSON (json.dump(loader.state_dict(), f)).
Status ReadResume(const std::string& path, bool seed_given, ProducerOptions* o) {
  if (IsTorchCheckpoint(path)) {
    return Status::Invalid("--resume " + path + " is a torch checkpoint: start the producer with the coloader "
                           "command the Python package installs (or python -m coloader), which reads it, and name "
                           "the loader's state in it with --resume-key KEY (e.g. --resume-key loader); or save "
                           "json.dump(loader.state_dict(), f) and give that file");
  }
  COLOADER_ASSIGN_OR_RETURN(JsonValue v, ReadJsonFile(path));
  if (!v.is_object()) return Status::Invalid("--resume " + path + ": expected a JSON object (a Loader's state_dict())");
  auto number = [&](const char* key, bool required, uint64_t* out) -> Status {
    const JsonValue* f = v.Find(key);
    if (f == nullptr || f->is_null()) {
      return required ? Status::Invalid("--resume " + path + ": no \"" + key + "\" (is it a Loader's state_dict()?)")
                      : Status::OK();
    }
    // Whole and exact in a double (a JSON number): 1e30 or 2^64 wrapped to 0, 0.5 was truncated.
    constexpr double kMaxExact = 9007199254740992.0;  // 2^53
    if (!f->is_number() || !(f->number() >= 0 && f->number() <= kMaxExact) || f->number() != std::floor(f->number()))
    {
      char shown[40];
      std::snprintf(shown, sizeof(shown), "%.17g", f->is_number() ? f->number() : 0.0);
      return Status::Invalid(f->Position() + ": --resume: \"" + key + "\" must be a whole number in [0, 2^53], got " +
                             (f->is_number() ? std::string(shown) : "a " + std::string(JsonTypeName(f->type()))));
    }
    *out = static_cast<uint64_t>(f->number());
    return Status::OK();
  };
  DatasetOptions::ResumePoint& r = o->dataset.resume;
  uint64_t world = 1, rank = 0, batch = 0, seed = 0;
  COLOADER_RETURN_NOT_OK(number("epoch", true, &r.epoch));
  COLOADER_RETURN_NOT_OK(number("samples_seen_in_epoch", true, &r.samples));
  COLOADER_RETURN_NOT_OK(number("batch_size", true, &batch));
  COLOADER_RETURN_NOT_OK(number("world_size", false, &world));
  COLOADER_RETURN_NOT_OK(number("rank", false, &rank));
  COLOADER_RETURN_NOT_OK(number("split_begin", false, &r.begin));
  COLOADER_RETURN_NOT_OK(number("split_origin", false, &r.origin));
  if (batch < 1 || batch > UINT32_MAX || world < 1 || world > kMaxGroupSize)
    return Status::Invalid("--resume " + path + ": batch_size " + std::to_string(batch) + " and world_size " +
                           std::to_string(world) + " must be >= 1 (and a group has at most " +
                           std::to_string(kMaxGroupSize) + " ranks)");
  if (rank >= world)
    return Status::Invalid("--resume " + path + ": rank " + std::to_string(rank) + " is not a rank of a world of " +
                           std::to_string(world) + ": the state cannot have been saved by a Loader");
  r.batch_size = static_cast<uint32_t>(batch);
  r.world_size = static_cast<uint32_t>(world);
  if (const JsonValue* d = v.Find("drop_last"); d != nullptr && d->type() == JsonValue::Type::kBool) r.drop_last = d->bool_value();
  const JsonValue* k = v.Find("data_key");
  if (k == nullptr || !k->is_string() || k->string().empty())
    return Status::Invalid("--resume " + path + ": no \"data_key\": a Loader's state_dict() names the data it was "
                           "saved from, and a state without it cannot be checked against this producer's");
  r.data_key = k->string();
  if (const JsonValue* sd = v.Find("seed"); sd != nullptr && sd->is_number()) {
    COLOADER_RETURN_NOT_OK(number("seed", false, &seed));
    if (seed_given && seed != o->dataset.seed) {
      return Status::Invalid("--resume " + path + ": the state was saved with --seed " + std::to_string(seed) +
                             ", but --seed " + std::to_string(o->dataset.seed) + " was given: its epochs hold other samples");
    }
    o->dataset.seed = seed;  // the state's, when none is given
  }
  r.set = true;
  return Status::OK();
}

volatile sig_atomic_t g_signal = 0;  // the signal that stopped the run

void OnSignal(int sig) {
  g_signal = sig;
  if (g_producer) g_producer->Stop(sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal");
}

constexpr const char* kServeSynopsis = "coloader serve --data DIR --name NAME [options]";

// The flags that are not ProducerOptions fields as they are written.
struct ServeFlags {
  std::string augment = "train", output = "float32", layout, on_bad = "skip", device = "cpu", decode = "auto",
              gpu_wait = "block", cpu_share, resume, resume_key, transform;
  bool no_shuffle = false, no_catch_up = false, quiet = false, no_dct = false, no_crop_decode = false;
  double alone_timeout_s = -1;  // unset: 600 s for --epochs runs, never for --forever
};

void AddServeFlags(Command& cmd, ProducerOptions& o, ServeFlags& f) {
  cmd.Add("--data", &o.dataset.data, "an ImageFolder tree (DIR/<class>/<image>), a file list (path,label per line), or "
                             "WebDataset shards: 'train-{000000..000146}.tar', http(s):// URLs or pipe:COMMAND")
      ->type_name("PATH");
  cmd.Add("--label-field", &o.dataset.label_field, "with WebDataset shards: the label from this integer field of KEY.json "
                                           "instead of KEY.cls")
      ->type_name("NAME");
  cmd.Add("--name", &o.name, "what consumers connect to ([A-Za-z0-9._-], up to 64)")->type_name("NAME");
  cmd.Add("--batch-size", &o.batch_size, "producer batch (samples per ring slot)");
  cmd.Add("--image-size", &o.dataset.image_size, "output is S x S");
  cmd.Add("--workers", &o.dataset.workers, "decode threads (0: one per core)")->check(AtLeast(0));
  cmd.Add("--window", &o.window, "how many batches the producer may run ahead of the slowest consumer");
  cmd.Add("--spare-slots", &o.spare_slots, "extra ring slots for batches consumers keep (-1: window/2, at least 1)")
      ->check(AtLeast(-1));
  CLI::Option* epochs = cmd.Add("--epochs", &o.epochs, "how many epochs to serve");
  cmd.Add("--forever", &o.forever, "serve epochs until stopped")->excludes(epochs);
  cmd.Add("--seed", &o.dataset.seed, "the permutation and augmentation are functions of (seed, epoch, index)");
  cmd.Add("--no-shuffle", &f.no_shuffle, "serve every epoch in dataset order");
  CLI::Option* augment = cmd.Add("--augment", &f.augment, "the named recipes: RandomResizedCrop + flip; Resize + "
                                                         "CenterCrop; plain resize (each then ImageNet's Normalize)")
      ->check(CLI::IsMember({"train", "eval", "none"}));
  cmd.Add("--transform", &f.transform, "the recipe, torchvision's ops with their arguments: recipe.yaml or .json "
                                       "(a .py Compose through `python -m coloader serve`); it sets the image size")
      ->type_name("FILE")
      ->excludes(augment);
  cmd.Add("--output", &f.output, "raw pixels or ImageNet-normalised floats (the 16-bit types need --device)")
      ->check(CLI::IsMember({"uint8", "float32", "bfloat16", "float16"}));
  cmd.Add("--layout", &f.layout, "default: nhwc for uint8, nchw otherwise")->check(CLI::IsMember({"nchw", "nhwc"}));
  cmd.Add("--device", &f.device, "cpu, or cuda:N[,cuda:M...]: the ring in GPU memory, one ring per GPU (CUDA IPC)");
  cmd.Add("--decode", &f.decode, "gpu: nvJPEG + GPU augmentation on the first --device; auto: gpu where it has a "
                                 "JPEG engine")
      ->check(CLI::IsMember({"cpu", "gpu", "auto"}));
  cmd.Add("--gpu-wait", &f.gpu_wait, "how threads wait for the GPU: block spares the CPU, spin is CUDA's default")
      ->check(CLI::IsMember({"block", "spin"}));
  cmd.Add("--gpu-lanes", &o.dataset.gpu_lanes, "batches each decoding GPU works on at once");
  cmd.Add("--cpu-share", &f.cpu_share, "with GPU decoding, the share of each batch the CPU workers decode: auto "
                                       "follows demand (--decode auto's default), a number in [0, 1] fixes it "
                                       "(--decode gpu's default: 0)")
      ->type_name("auto|SHARE");
  cmd.Add("--on-bad-file", &f.on_bad, "a file that cannot be decoded is reported and skipped, or stops the run")
      ->check(CLI::IsMember({"skip", "fail"}));
  cmd.Add("--min-consumers", &o.min_consumers, "start the first epoch when this many consumers are attached");
  cmd.Add("--no-catch-up", &f.no_catch_up,
          "a consumer that joins mid-epoch gets the rest of it (a partial epoch), not also the samples it missed "
          "decoded again for it");
  cmd.Add("--rank", &o.dataset.rank, "this producer's shard of the dataset, as torch's DistributedSampler");
  cmd.Add("--world-size", &o.dataset.world_size, "the number of shards (one producer per node)");
  cmd.Add("--heartbeat-ms", &o.heartbeat_ms, "liveness pings to consumers that are not local processes");
  cmd.Add("--heartbeat-timeout-ms", &o.heartbeat_timeout_ms, "a consumer silent this long is dropped");
  cmd.Add("--lag-timeout-ms", &o.lag_timeout_ms,
          "a consumer that holds the others back this long without taking a batch (and longer than 4 of its own "
          "steps) is taken off the shared stream: its unread batches go back, and the rest of its epoch is decoded "
          "again for it alone; 0: never (it holds them back until --stall-timeout-ms)");
  cmd.Add("--stall-timeout-ms", &o.stall_timeout_ms,
          "a consumer that holds the others back this long (stopped reading, or kept batches it cannot copy) is "
          "detached; 0: never");
  cmd.Add("--alone-timeout", &f.alone_timeout_s,
          "once the first epoch has begun, end the run (exit 1, saying how far it got) when no consumer has been "
          "attached this many seconds; 0: wait for consumers forever (default: 600 with --epochs, 0 with --forever)")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 7 * 86400.0));
  cmd.Add("--max-shard-bytes", &o.dataset.max_shard_bytes,
          "shards read whole (http(s)://, pipe:, .tar.gz): the most bytes one shard may hold, inflated; 8 are held "
          "at once (default: a sixteenth of the memory, within 256 MiB and 64 GiB)")
      ->type_name("BYTES");
  cmd.Add("--shard-timeout", &o.dataset.shard_timeout_s,
          "shards read whole: the longest one shard's fetch may take, every attempt together; 0: no limit")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 7 * 86400.0));
  cmd.Add("--no-dct-scaling", &f.no_dct, "decode JPEGs at full size even when the crop is small");
  cmd.Add("--no-crop-decode", &f.no_crop_decode, "decode whole JPEGs, not just the crop's rows and columns");
  cmd.Add("--quiet", &f.quiet, "no progress line");
  cmd.Add("--tcp", &o.tcp_endpoint, "also serve consumers on other machines (host path); needs --curve-key and "
                                    "--authorized-keys, or --insecure")
      ->type_name("tcp://HOST:PORT");
  cmd.Add("--curve-key", &o.curve_key_file, "this producer's key pair (coloader keygen)")->type_name("FILE");
  cmd.Add("--authorized-keys", &o.authorized_keys_file, "the consumers' public keys it accepts, one per line")
      ->type_name("FILE");
  cmd.Add("--insecure", &o.insecure, "--tcp without authentication: anyone who reaches the port may connect");
  cmd.Add("--resume", &f.resume, "where a checkpointed job resumes: its Loader's state_dict() as JSON, or a torch "
                                 "checkpoint holding it (with --resume-key)")
      ->type_name("STATE");
  cmd.Add("--resume-key", &f.resume_key, "the key of the Loader's state in a torch checkpoint (read by the Python "
                                         "package's coloader command), e.g. loader or state.loader")
      ->type_name("KEY");
}

// --device: cpu, or cuda:N[,cuda:M...] (one ring per GPU).
Result<std::vector<int>> ParseDevices(const std::string& device) {
  std::vector<int> devices;
  if (device == "cpu") return devices;
  size_t start = 0;
  while (start <= device.size()) {
    const size_t comma = device.find(',', start);
    const std::string one = device.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const long ordinal = one.rfind("cuda:", 0) == 0 ? std::strtol(one.c_str() + 5, &end, 10) : -1;
    if (ordinal < 0 || ordinal > 1024 || end == one.c_str() + 5 || *end != '\0')
      return Status::Invalid("--device must be cpu or cuda:N[,cuda:M...] (e.g. cuda:0), got '" + device + "'");
    if (std::find(devices.begin(), devices.end(), ordinal) != devices.end())
      return Status::Invalid("--device names " + one + " twice");
    devices.push_back(static_cast<int>(ordinal));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return devices;
}

// The flags into `o`; a usage error says what is wrong.
Status ApplyServeFlags(const ServeFlags& f, bool seed_given, bool size_given, ProducerOptions& o) {
  if (o.dataset.data.empty()) return Status::Invalid("--data is required (an ImageFolder directory or a file list)");
  if (o.name.empty()) return Status::Invalid("--name is required (consumers connect by it)");
  COLOADER_ASSIGN_OR_RETURN(o.dataset.augment, ParseAugmentMode(f.augment));
  if (!f.transform.empty()) {
    COLOADER_ASSIGN_OR_RETURN(Recipe recipe, ReadRecipeFile(f.transform));
    if (size_given && recipe.geometry.size != o.dataset.image_size)
      return Status::Invalid("--image-size " + std::to_string(o.dataset.image_size) + " disagrees with the recipe's " +
                             std::to_string(recipe.geometry.size) + " (" + f.transform + "): drop --image-size");
    o.dataset.image_size = recipe.geometry.size;
    o.dataset.recipe = std::make_shared<const Recipe>(std::move(recipe));
  }
  COLOADER_ASSIGN_OR_RETURN(o.dataset.decode, ParseDecodeMode(f.decode));
  if (!f.cpu_share.empty()) {
    if (o.dataset.decode == DecodeMode::kCpu)
      return Status::Invalid("--cpu-share splits each batch between a GPU's JPEG engines and the CPU workers: it "
                             "applies to --decode gpu or auto, not --decode cpu");
    COLOADER_ASSIGN_OR_RETURN(o.dataset.cpu_share, ParseCpuShare(f.cpu_share));
  }
  if (!f.resume_key.empty()) {
    return Status::Invalid("--resume-key " + f.resume_key + ": a torch checkpoint is read by the coloader command the "
                           "Python package installs (python -m coloader serve ...), which hands this binary the "
                           "state it holds");
  }
  if (!f.resume.empty()) COLOADER_RETURN_NOT_OK(ReadResume(f.resume, seed_given, &o));
  if (f.output == "uint8") o.dataset.output = DType::kUInt8;
  else if (f.output == "bfloat16") o.dataset.output = DType::kBFloat16;
  else if (f.output == "float16") o.dataset.output = DType::kFloat16;
  else o.dataset.output = DType::kFloat32;
  // uint8 is what a GPU-side normalisation wants (NHWC, as decoded); float32 is what a
  // model wants (NCHW, normalised). Either can be overridden.
  const std::string layout = f.layout.empty() ? (o.dataset.output == DType::kUInt8 ? "nhwc" : "nchw") : f.layout;
  o.dataset.layout = layout == "nhwc" ? TensorLayout::kNHWC : TensorLayout::kNCHW;
  COLOADER_ASSIGN_OR_RETURN(o.devices, ParseDevices(f.device));
  o.dataset.shuffle = !f.no_shuffle;
  o.catch_up = !f.no_catch_up;
  o.dataset.dct_scaling = !f.no_dct;
  o.dataset.crop_decode = !f.no_crop_decode;
  o.dataset.on_bad_file = f.on_bad == "fail" ? OnBadFile::kFail : OnBadFile::kSkip;
  // A run of --epochs whose consumers all crashed would otherwise wait for them forever (and a
  // launch script's `wait` with it).
  o.alone_timeout_ms = static_cast<uint32_t>(f.alone_timeout_s < 0 ? (o.forever ? 0 : 600) * 1000.0
                                                                    : f.alone_timeout_s * 1000.0);
  if (f.quiet) o.progress_interval_ms = 0;
  return Status::OK();
}

// Makes the producer and serves until its epochs are delivered or a signal stops it.
int RunProducer(const ProducerOptions& o, const std::string& gpu_wait) {
  // Before any other CUDA call of this process, so every context and library stream gets it.
  // A device that refuses is reported by Make below, with the options checked first.
  Status wait_set;
  for (int d : o.devices) {
    if (Status w = SetGpuWait(d, gpu_wait == "block"); !w.ok() && wait_set.ok())
      wait_set = Status::IOError("--device cuda:" + std::to_string(d) + ": --gpu-wait " + gpu_wait + ": " + w.message());
  }
  Result<std::unique_ptr<Producer>> producer = Producer::Make(o);
  if (!producer.ok()) {
    std::fprintf(stderr, "coloader serve: %s\n", producer.status().message().c_str());
    return producer.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (!wait_set.ok()) std::fprintf(stderr, "coloader serve: warning: %s\n", wait_set.message().c_str());
  g_producer = producer->get();
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  LogLine("[coloader %s] serving %s on %s\n", o.name.c_str(), o.dataset.data.c_str(), (*producer)->endpoint().c_str());
  if (!(*producer)->tcp_endpoint().empty()) {
    LogLine("[coloader %s] also serving on %s (%s)\n", o.name.c_str(), (*producer)->tcp_endpoint().c_str(),
            o.insecure ? "INSECURE: anyone who can reach the port may connect" : "CURVE, listed client keys only");
  }

  Result<Producer::RunEnd> end = (*producer)->Run();
  const Status run = end.status();
  g_producer = nullptr;
  const double cpu = ProcessCpuSeconds();
  producer->reset();
  if (run.code() == StatusCode::kCancelled) {
    if (o.forever) {  // a signal is how a --forever run ends
      LogLine("[coloader %s] stopped; consumers were told (CPU %.2f s)\n", o.name.c_str(), cpu);
      return 0;
    }
    // Its epochs were not all served: a launch script's `wait`, Slurm or Kubernetes hears it as
    // the shell would say it (128 + the signal).
    const int sig = g_signal != 0 ? static_cast<int>(g_signal) : SIGTERM;
    LogLine("[coloader %s] stopped by %s before its %llu epoch(s) were served; consumers were told (CPU %.2f s)\n",
            o.name.c_str(), sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal",
            static_cast<unsigned long long>(o.epochs), cpu);
    return 128 + sig;
  }
  if (!run.ok()) {
    std::fprintf(stderr, "coloader serve: %s\n", run.message().c_str());
    return 1;
  }
  if (*end == Producer::RunEnd::kConsumersLeft) {  // the log said why and how far it got
    LogLine("[coloader %s] ended before its %llu epoch(s) were served (CPU %.2f s)\n", o.name.c_str(),
            static_cast<unsigned long long>(o.epochs), cpu);
    return 1;
  }
  LogLine("[coloader %s] done: every epoch delivered (CPU %.2f s)\n", o.name.c_str(), cpu);
  return 0;
}

}  // namespace

int Serve(const std::vector<std::string>& args) {
  ProducerOptions o;
  ServeFlags f;
  Command cmd("serve", kServeSynopsis,
              "Run a producer: decode and augment every batch once and serve it, under a name, to any number of "
              "consumers (README.md has the semantics).");
  AddServeFlags(cmd, o, f);
  if (std::optional<int> exit = cmd.Parse(args)) return *exit;
  if (Status st = ApplyServeFlags(f, cmd.Given("--seed"), cmd.Given("--image-size"), o); !st.ok()) return cmd.UsageError(st.message());
  return RunProducer(o, f.gpu_wait);
}

}  // namespace coloader::cli
