#include <signal.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <memory>

#include "common/process.h"
#include "server/cli.h"
#include "server/device_ring.h"
#include "server/producer.h"

namespace coloader::cli {

namespace {

Producer* g_producer = nullptr;

void OnSignal(int) {
  if (g_producer) g_producer->Stop();
}

constexpr const char* kServeUsage =
    "coloader serve --data DIR --name NAME [--batch-size 256] [--image-size 224] [--workers N]\n"
    "               [--window K] [--spare-slots S] [--epochs N | --forever] [--seed S] [--no-shuffle]\n"
    "               [--augment train|eval|none] [--output uint8|float32|bfloat16|float16]\n"
    "               [--layout nchw|nhwc] [--device cpu|cuda:N[,cuda:M...]]\n"
    "               [--on-bad-file skip|fail] [--min-consumers N] [--rank R --world-size W]\n"
    "               [--heartbeat-ms MS] [--heartbeat-timeout-ms MS] [--no-dct-scaling] [--no-crop-decode]\n"
    "               [--quiet]\n"
    "               [--decode cpu|gpu|auto]   (gpu: nvJPEG + GPU augmentation, needs --device)\n"
    "               [--gpu-wait block|spin]   (how threads wait for the GPU; block spares the CPU)\n"
    "               [--tcp tcp://HOST:PORT (--curve-key FILE --authorized-keys FILE | --insecure)]";

}  // namespace

int Serve(const std::vector<std::string>& args) {
  ProducerOptions o;
  std::string augment = "train", output = "float32", layout, on_bad = "skip", device = "cpu", decode = "cpu",
              gpu_wait = "block";
  bool no_shuffle = false, quiet = false, no_dct = false, no_crop_decode = false, help = false;
  Flags f("serve", kServeUsage);
  f.AddString("data", &o.data);
  f.AddString("name", &o.name);
  f.AddU32("batch-size", &o.batch_size);
  f.AddInt("image-size", &o.image_size);
  f.AddInt("workers", &o.workers);
  f.AddU32("window", &o.window);
  f.AddInt("spare-slots", &o.spare_slots);
  f.AddUInt("epochs", &o.epochs);
  f.AddBool("forever", &o.forever);
  f.AddUInt("seed", &o.seed);
  f.AddBool("no-shuffle", &no_shuffle);
  f.AddString("augment", &augment);
  f.AddString("output", &output);
  f.AddString("layout", &layout);
  f.AddString("device", &device);
  f.AddString("decode", &decode);
  f.AddString("gpu-wait", &gpu_wait);
  f.AddString("on-bad-file", &on_bad);
  f.AddU32("min-consumers", &o.min_consumers);
  f.AddInt("rank", &o.rank);
  f.AddInt("world-size", &o.world_size);
  f.AddU32("heartbeat-ms", &o.heartbeat_ms);
  f.AddU32("heartbeat-timeout-ms", &o.heartbeat_timeout_ms);
  f.AddBool("no-dct-scaling", &no_dct);
  f.AddBool("no-crop-decode", &no_crop_decode);
  f.AddBool("quiet", &quiet);
  f.AddString("tcp", &o.tcp_endpoint);
  f.AddString("curve-key", &o.curve_key_file);
  f.AddString("authorized-keys", &o.authorized_keys_file);
  f.AddBool("insecure", &o.insecure);
  f.AddBool("help", &help);
  Status st = f.Parse(args);
  if (help) {
    std::printf("usage: %s\n", kServeUsage);
    return 0;
  }
  if (st.ok() && o.data.empty()) st = f.Error("--data is required (an ImageFolder directory or a file list)");
  if (st.ok() && o.name.empty()) st = f.Error("--name is required (consumers connect by it)");
  if (st.ok() && o.forever && f.Seen("epochs")) st = f.Error("give --epochs or --forever, not both");
  if (st.ok() && on_bad != "skip" && on_bad != "fail")
    st = f.Error("--on-bad-file must be skip or fail, got '" + on_bad + "'");
  if (st.ok()) {
    if (auto a = ParseAugmentMode(augment); a.ok()) o.augment = *a; else st = f.Error(a.status().message());
  }
  if (st.ok()) {
    if (output == "uint8") o.output = DType::kUInt8;
    else if (output == "float32") o.output = DType::kFloat32;
    else if (output == "bfloat16") o.output = DType::kBFloat16;
    else if (output == "float16") o.output = DType::kFloat16;
    else st = f.Error("--output must be uint8, float32, bfloat16 or float16, got '" + output + "'");
  }
  if (st.ok()) {
    // uint8 is what a GPU-side normalisation wants (NHWC, as decoded); float32 is what a
    // model wants (NCHW, normalised). Either can be overridden.
    if (layout.empty()) layout = o.output == DType::kUInt8 ? "nhwc" : "nchw";
    if (layout == "nhwc") o.layout = TensorLayout::kNHWC;
    else if (layout == "nchw") o.layout = TensorLayout::kNCHW;
    else st = f.Error("--layout must be nchw or nhwc, got '" + layout + "'");
  }
  if (st.ok()) {
    if (auto d = ParseDecodeMode(decode); d.ok()) o.decode = *d; else st = f.Error(d.status().message());
  }
  if (st.ok() && gpu_wait != "block" && gpu_wait != "spin")
    st = f.Error("--gpu-wait must be block or spin, got '" + gpu_wait + "'");
  if (st.ok() && device != "cpu") {
    // cuda:N, or a comma-separated list of them: one ring per GPU.
    size_t start = 0;
    while (st.ok() && start <= device.size()) {
      const size_t comma = device.find(',', start);
      const std::string one = device.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      char* end = nullptr;
      const long ordinal = one.rfind("cuda:", 0) == 0 ? std::strtol(one.c_str() + 5, &end, 10) : -1;
      if (ordinal < 0 || ordinal > 1024 || end == one.c_str() + 5 || *end != '\0') {
        st = f.Error("--device must be cpu or cuda:N[,cuda:M...] (e.g. cuda:0), got '" + device + "'");
      } else if (std::find(o.devices.begin(), o.devices.end(), ordinal) != o.devices.end()) {
        st = f.Error("--device names " + one + " twice");
      } else {
        o.devices.push_back(static_cast<int>(ordinal));
      }
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 2;
  }
  o.shuffle = !no_shuffle;
  o.dct_scaling = !no_dct;
  o.crop_decode = !no_crop_decode;
  o.on_bad_file = on_bad == "fail" ? OnBadFile::kFail : OnBadFile::kSkip;
  if (quiet) o.progress_interval_ms = 0;

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
  std::fprintf(stderr, "[coloader %s] serving %s on %s\n", o.name.c_str(), o.data.c_str(),
               (*producer)->endpoint().c_str());
  if (!(*producer)->tcp_endpoint().empty()) {
    std::fprintf(stderr, "[coloader %s] also serving on %s (%s)\n", o.name.c_str(), (*producer)->tcp_endpoint().c_str(),
                 o.insecure ? "INSECURE: anyone who can reach the port may connect" : "CURVE, listed client keys only");
  }

  Status run = (*producer)->Run();
  g_producer = nullptr;
  const double cpu = ProcessCpuSeconds();
  producer->reset();
  if (run.code() == StatusCode::kCancelled) {
    std::fprintf(stderr, "[coloader %s] stopped; consumers were told (CPU %.2f s)\n", o.name.c_str(), cpu);
    return 0;
  }
  if (!run.ok()) {
    std::fprintf(stderr, "coloader serve: %s\n", run.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "[coloader %s] done: every epoch delivered (CPU %.2f s)\n", o.name.c_str(), cpu);
  return 0;
}

}  // namespace coloader::cli
