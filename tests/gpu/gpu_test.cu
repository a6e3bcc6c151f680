// GPU tests: the device path across real processes (a `coloader serve --device cuda:0`
// producer and `coloader consume --device` consumers, or the client library in this process).
// Every test skips cleanly where no CUDA device is visible; they run on the GPU machine
// through scripts/gpu_run.sh.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "client/consumer.h"
#include "tests/support/test_support.h"

namespace coloader {
namespace {

using testing::Child;
using testing::Coloader;
using testing::JsonLine;
using testing::ParseJsonLines;
using testing::U64;

constexpr int kImages = 103;

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible";
    run_dir_ = tmp_.path() + "/run";
    data_ = tmp_.path() + "/data";
    testing::MakeImageFolder(data_, kImages, 5, 64, 48);
    env_ = {{"COLOADER_RUN_DIR", run_dir_}};
    ::setenv("COLOADER_RUN_DIR", run_dir_.c_str(), 1);
  }
  void TearDown() override { ::unsetenv("COLOADER_RUN_DIR"); }
  void ReleaseOrdered(bool default_stream, bool zero_copy);

  std::unique_ptr<Child> Serve(const std::string& name, std::vector<std::string> extra,
                               std::map<std::string, std::string> env = {}) {
    std::vector<std::string> args = {"serve", "--data", data_, "--name", name, "--image-size", "32",
                                     "--workers", "4", "--quiet", "--seed", "7",
                                     "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1500"};
    args.insert(args.end(), extra.begin(), extra.end());
    for (auto& kv : env_) env.emplace(kv);
    auto child = std::make_unique<Child>(Coloader(args), env);
    EXPECT_TRUE(child->WaitForStderr("serving", 30000)) << child->Stderr();
    return child;
  }
  std::unique_ptr<Child> Consume(const std::string& name, std::vector<std::string> extra,
                                 std::map<std::string, std::string> env = {}) {
    std::vector<std::string> args = {"consume", "--name", name, "--json", "--checksum"};
    args.insert(args.end(), extra.begin(), extra.end());
    for (auto& kv : env_) env.emplace(kv);
    return std::make_unique<Child>(Coloader(args), env);
  }
  // The per-epoch lines of one producer run with one consumer.
  std::vector<JsonLine> RunOne(const std::string& name, std::vector<std::string> serve_args,
                               std::vector<std::string> consume_args) {
    auto p = Serve(name, serve_args);
    auto c = Consume(name, consume_args);
    EXPECT_EQ(c->Wait(120000), 0) << c->Stderr();
    EXPECT_EQ(p->Wait(60000), 0) << p->Stderr();
    return ParseJsonLines(c->Stdout());
  }
  static void ExpectExactEpoch(const JsonLine& e, uint64_t n = kImages) { testing::ExpectExactEpoch(e, n); }
  // Polls the producer's status (the state the tests wait for) until `pred` holds.
  template <typename Pred>
  bool WaitForStatus(const std::string& name, Pred pred, int timeout_ms = 60000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      Child s(Coloader({"status", "--name", name, "--json"}), env_);
      s.Wait(10000);
      auto lines = ParseJsonLines(s.Stdout());
      if (!lines.empty() && pred(lines[0])) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the poll interval
    }
    return false;
  }

  testing::TempDir tmp_;
  std::string run_dir_, data_;
  std::map<std::string, std::string> env_;
};

TEST_F(GpuTest, DeviceOutputIsExactAndBitwiseEqualToTheHostPath) {
  // The same seed gives the same crops; the device kernel rounds as the host loop does, so
  // uint8 and float32 batches are equal byte for byte, whatever the path.
  for (const char* output : {"uint8", "float32"}) {
    SCOPED_TRACE(output);
    auto host = RunOne("host", {"--batch-size", "16", "--epochs", "2", "--output", output}, {});
    // --decode cpu: with --device, serve decodes on the GPU's JPEG engine by default.
    auto dev = RunOne("dev", {"--batch-size", "16", "--epochs", "2", "--output", output, "--device", "cuda:0",
                              "--decode", "cpu"},
                      {"--device"});
    ASSERT_EQ(host.size(), 2u);
    ASSERT_EQ(dev.size(), 2u);
    for (size_t e = 0; e < 2; ++e) {
      ExpectExactEpoch(dev[e]);
      EXPECT_EQ(dev[e].at("path"), "device");
      EXPECT_EQ(host[e].at("path"), "host");
      EXPECT_EQ(dev[e].at("content_hash"), host[e].at("content_hash")) << "epoch " << e;
    }
  }
}

TEST_F(GpuTest, HalfPrecisionOutputsAreExactEpochs) {
  for (const char* output : {"bfloat16", "float16"}) {
    auto dev = RunOne("dev", {"--batch-size", "16", "--output", output, "--device", "cuda:0", "--layout", "nhwc"},
                      {"--device", "--batch-size", "7"});
    ASSERT_EQ(dev.size(), 1u) << output;
    ExpectExactEpoch(dev[0]);
  }
}

TEST_F(GpuTest, TwoDeviceConsumersWithDifferentBatchSizesSeeTheSameSamples) {
  auto p = Serve("p", {"--batch-size", "16", "--epochs", "2", "--device", "cuda:0", "--min-consumers", "2"});
  auto a = Consume("p", {"--device", "--batch-size", "5"});
  auto b = Consume("p", {"--device", "--batch-size", "40"});
  ASSERT_EQ(a->Wait(120000), 0) << a->Stderr();
  ASSERT_EQ(b->Wait(120000), 0) << b->Stderr();
  auto ea = ParseJsonLines(a->Stdout()), eb = ParseJsonLines(b->Stdout());
  ASSERT_EQ(ea.size(), 2u);
  ASSERT_EQ(eb.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    ExpectExactEpoch(ea[e]);
    ExpectExactEpoch(eb[e]);
    EXPECT_EQ(ea[e].at("content_hash"), eb[e].at("content_hash"));  // views and device gathers agree
  }
  EXPECT_EQ(p->Wait(60000), 0);
}

// Catch-up on the device path: a consumer that joins mid-epoch gets the rest of it, then what it
// missed, decoded again and uploaded for it alone; every epoch whole, each sample the same bytes
// as the first consumer's (content_hash: indices, labels and pixels).
TEST_F(GpuTest, LateJoinOnTheDevice) {
  // --decode gpu: nvJPEG decodes every sample, the same bytes each time (with auto, the CPU
  // workers and the engines split each batch as demand goes, and a sample decoded again may come
  // from the other decoder).
  auto p = Serve("p", {"--batch-size", "8", "--epochs", "3", "--window", "2", "--device", "cuda:0", "--decode", "gpu"});
  // 200 ms a batch: epoch 0 lasts ~2.6 s, time for the late consumer's process, CUDA context and
  // ring mapping to start inside it.
  auto first = Consume("p", {"--device", "--step-ms", "200", "--checksum"});
  // Wait until the first consumer is mid-epoch: its own batches, read from the status.
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) {
    return U64(s, "batches_published") >= 3 && U64(s, "epoch") == 0;
  }));
  auto late = Consume("p", {"--device", "--checksum", "--batch-size", "7"});
  ASSERT_EQ(late->Wait(120000), 0) << late->Stderr();
  ASSERT_EQ(first->Wait(120000), 0) << first->Stderr();
  auto epochs = ParseJsonLines(late->Stdout()), firsts = ParseJsonLines(first->Stdout());
  ASSERT_EQ(epochs.size(), 3u);
  ASSERT_EQ(firsts.size(), 3u);
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(epochs[e].at("partial"), "false") << "epoch " << e;
    ExpectExactEpoch(epochs[e]);
    EXPECT_EQ(epochs[e].at("content_hash"), firsts[e].at("content_hash")) << "epoch " << e;
  }
  EXPECT_NE(p->Stderr().find("joined epoch 0 at sample "), std::string::npos) << p->Stderr();
  EXPECT_EQ(p->Wait(60000), 0);
}

TEST_F(GpuTest, ALateGroupOnTheDeviceIsCaughtUpToWholeEpochsSplitEqually) {
  // A 2-rank group (batches of 6: 103 samples pad one, copied on the device as it passes) joins
  // mid-epoch: it reads the rest with the first consumer, then what it missed, uploaded once for
  // both ranks; each rank's split is of the whole epoch in the order the group read it.
  // A step (2 x 6) spans two batches of 8: two spare slots hold it.
  auto p = Serve("p", {"--batch-size", "8", "--epochs", "3", "--window", "2", "--spare-slots", "2", "--device",
                       "cuda:0", "--decode", "gpu"});
  auto first = Consume("p", {"--device", "--step-ms", "200"});  // epoch 0 outlasts the ranks' start
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) {
    return U64(s, "batches_published") >= 3 && U64(s, "epoch") == 0;
  }));
  std::vector<std::unique_ptr<Child>> ranks;
  for (const char* r : {"0", "1"})
    ranks.push_back(Consume("p", {"--device", "--group", "g", "--rank", r, "--world-size", "2", "--batch-size", "6",
                                  "--indices"}));
  std::vector<std::vector<JsonLine>> lines;
  for (auto& r : ranks) {
    ASSERT_EQ(r->Wait(120000), 0) << r->Stderr();
    lines.push_back(ParseJsonLines(r->Stdout()));
    ASSERT_EQ(lines.back().size(), 3u) << r->Stdout();
  }
  ASSERT_EQ(first->Wait(120000), 0) << first->Stderr();
  EXPECT_GT(U64(lines[0][0], "split_origin"), 0u) << "the group joined after 3 batches of epoch 0";
  for (size_t e = 0; e < 3; ++e) {
    std::map<int64_t, int> seen;
    for (int r : {0, 1}) {
      EXPECT_EQ(lines[r][e].at("partial"), "false") << "rank " << r << " epoch " << e;
      EXPECT_EQ(U64(lines[r][e], "samples"), 52u) << "rank " << r << " epoch " << e;  // ceil(103 / 2)
      for (int64_t i : testing::Indices(lines[r][e])) ++seen[i];
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(kImages)) << "epoch " << e;
  }
  EXPECT_NE(p->Stderr().find("group g joined epoch 0 at sample "), std::string::npos) << p->Stderr();
  EXPECT_EQ(p->Wait(60000), 0);
}

TEST_F(GpuTest, KilledDeviceConsumerIsReclaimedAndOthersStayExact) {
  auto p = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "3", "--device", "cuda:0",
                       "--min-consumers", "2"});
  auto victim = Consume("p", {"--device", "--step-ms", "1000"});
  auto other = Consume("p", {"--device", "--batch-size", "13"});
  // Both attached (min-consumers 2) and the window full: the victim, a second per batch, holds slots.
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "slots_in_use") >= 3; }));
  victim->Signal(SIGKILL);
  ASSERT_EQ(other->Wait(120000), 0) << other->Stderr();
  for (const auto& e : ParseJsonLines(other->Stdout())) ExpectExactEpoch(e);
  EXPECT_EQ(p->Wait(60000), 0) << p->Stderr();
}

TEST_F(GpuTest, ProducerKilledWhileConsumersHoldDeviceBatchesGivesAClearError) {
  auto p = Serve("p", {"--batch-size", "8", "--forever", "--window", "3", "--device", "cuda:0"});
  auto a = Consume("p", {"--device", "--step-ms", "20"});
  auto b = Consume("p", {"--device", "--step-ms", "20", "--batch-size", "3"});
  // Both reading, mid-stream, when the producer dies.
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 20; }));
  const auto t0 = std::chrono::steady_clock::now();
  p->Signal(SIGKILL);
  EXPECT_EQ(a->Wait(10000), 1);  // an error exit, not a crash (139) or a hang (-1)
  EXPECT_EQ(b->Wait(10000), 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 2.5);
  EXPECT_NE(a->Stderr().find("exited without saying goodbye"), std::string::npos) << a->Stderr();
}

TEST_F(GpuTest, ConsumerThatCannotMapTheDeviceFallsBackToTheHostPath) {
  auto p = Serve("p", {"--batch-size", "16", "--device", "cuda:0", "--output", "uint8"});
  // No GPU visible to this consumer: as in another container or a MIG instance.
  auto c = Consume("p", {"--device"}, {{"CUDA_VISIBLE_DEVICES", ""}});
  ASSERT_EQ(c->Wait(120000), 0) << c->Stderr();
  auto epochs = ParseJsonLines(c->Stdout());
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_EQ(epochs[0].at("path"), "host");
  ExpectExactEpoch(epochs[0]);
  EXPECT_NE(c->Stderr().find("using the host path"), std::string::npos) << c->Stderr();
  EXPECT_EQ(p->Wait(60000), 0);
}

TEST_F(GpuTest, GpuDecodeGivesExactEpochsOnTheDeviceAndHostPaths) {
  // --decode gpu: nvJPEG + the GPU ResizeCrop into the ring; a device consumer and one that
  // cannot map device memory read the same batches.
  auto p = Serve("p", {"--batch-size", "16", "--epochs", "2", "--device", "cuda:0", "--decode", "gpu",
                       "--min-consumers", "2"});
  auto dev = Consume("p", {"--device", "--batch-size", "9"});
  auto host = Consume("p", {"--device"}, {{"CUDA_VISIBLE_DEVICES", ""}});
  ASSERT_EQ(dev->Wait(120000), 0) << dev->Stderr();
  ASSERT_EQ(host->Wait(120000), 0) << host->Stderr();
  auto d = ParseJsonLines(dev->Stdout()), h = ParseJsonLines(host->Stdout());
  ASSERT_EQ(d.size(), 2u);
  ASSERT_EQ(h.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    ExpectExactEpoch(d[e]);
    ExpectExactEpoch(h[e]);
    EXPECT_EQ(d[e].at("path"), "device");
    EXPECT_EQ(h[e].at("path"), "host");
    EXPECT_EQ(d[e].at("content_hash"), h[e].at("content_hash")) << "epoch " << e;
  }
  EXPECT_EQ(p->Wait(60000), 0) << p->Stderr();
  EXPECT_NE(p->Stderr().find("decode: gpu (nvJPEG"), std::string::npos) << p->Stderr();
  std::printf("%s", p->Stderr().c_str());
}

TEST_F(GpuTest, GpuDecodeIsDeterministicWhateverTheBatchSizeAndAutoPicksTheHardwareDecoder) {
  // A sample's crop, flip and pixels depend on (seed, epoch, index) only: two producers with
  // different batch sizes serve the same content, in train and eval mode.
  for (const char* mode : {"train", "eval"}) {
    SCOPED_TRACE(mode);
    // auto with the CPU's share fixed at none: the engines decode every sample, as gpu does.
    auto p = Serve("a", {"--batch-size", "16", "--device", "cuda:0", "--decode", "auto", "--cpu-share", "0",
                         "--augment", mode});
    auto c = Consume("a", {"--device"});
    ASSERT_EQ(c->Wait(120000), 0) << c->Stderr();
    ASSERT_EQ(p->Wait(60000), 0) << p->Stderr();
    EXPECT_NE(p->Stderr().find("decode: auto (nvJPEG hardware backend"), std::string::npos) << p->Stderr();
    auto b = RunOne("b", {"--batch-size", "40", "--device", "cuda:0", "--decode", "gpu", "--augment", mode},
                    {"--device", "--batch-size", "7"});
    auto a = ParseJsonLines(c->Stdout());
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    ExpectExactEpoch(a[0]);
    ExpectExactEpoch(b[0]);
    EXPECT_EQ(a[0].at("content_hash"), b[0].at("content_hash"));
  }
}

TEST_F(GpuTest, AFixedCpuShareSplitsEveryBatchTheSameWayAndRepeatsBitwise) {
  // --cpu-share 0.5: the last half of every batch is decoded by the workers (the CPU path),
  // the rest by the engines. 103 images in batches of 16: six batches give 8 each to the CPU,
  // the last of 7 gives 4 (3.5 rounded), 52 in all. The same run twice serves the same bytes.
  std::vector<std::string> hashes;
  for (int run = 0; run < 2; ++run) {
    auto p = Serve("s", {"--batch-size", "16", "--device", "cuda:0", "--decode", "auto", "--cpu-share", "0.5",
                         "--output", "uint8", "--min-consumers", "2"});
    auto dev = Consume("s", {"--device", "--batch-size", "9"});
    auto host = Consume("s", {"--device"}, {{"CUDA_VISIBLE_DEVICES", ""}});
    ASSERT_EQ(dev->Wait(120000), 0) << dev->Stderr();
    ASSERT_EQ(host->Wait(120000), 0) << host->Stderr();
    ASSERT_EQ(p->Wait(60000), 0) << p->Stderr();
    auto d = ParseJsonLines(dev->Stdout()), h = ParseJsonLines(host->Stdout());
    ASSERT_EQ(d.size(), 1u);
    ASSERT_EQ(h.size(), 1u);
    ExpectExactEpoch(d[0]);
    ExpectExactEpoch(h[0]);
    EXPECT_EQ(d[0].at("content_hash"), h[0].at("content_hash"));
    hashes.push_back(d[0].at("content_hash"));
    EXPECT_NE(p->Stderr().find("the CPU workers decode 0.5 of each batch (--cpu-share)"), std::string::npos)
        << p->Stderr();
    EXPECT_NE(p->Stderr().find("51 images by the hardware backend, 0 by the GPU hybrid backend, 52 on the CPU"),
              std::string::npos)
        << p->Stderr();
    if (run == 0) std::printf("%s", p->Stderr().c_str());
  }
  EXPECT_EQ(hashes[0], hashes[1]);
}

TEST_F(GpuTest, AnAdaptiveCpuShareGivesExactEpochsAndSaysWhatItDid) {
  // --decode auto's default: the share follows the lane's load. Which decoder takes a sample
  // is a matter of timing here, so the content is not compared; every epoch must be exact.
  auto p = Serve("a", {"--batch-size", "16", "--epochs", "3", "--device", "cuda:0", "--decode", "auto"});
  auto c = Consume("a", {"--device", "--batch-size", "12"});
  ASSERT_EQ(c->Wait(120000), 0) << c->Stderr();
  ASSERT_EQ(p->Wait(60000), 0) << p->Stderr();
  auto epochs = ParseJsonLines(c->Stdout());
  ASSERT_EQ(epochs.size(), 3u);
  for (const auto& e : epochs) ExpectExactEpoch(e);
  EXPECT_NE(p->Stderr().find("a share of each batch that follows demand (--cpu-share auto)"), std::string::npos)
      << p->Stderr();
  EXPECT_NE(p->Stderr().find("decode split on cuda:0: the CPU workers took"), std::string::npos) << p->Stderr();
  std::printf("%s", p->Stderr().c_str());
}

TEST_F(GpuTest, GpuDecodeRoutesEveryKindOfFileAndFailsBadOnesLikeTheCpuPath) {
  const char* env_dir = std::getenv("COLOADER_TEST_DATA");
  const std::string fixtures = env_dir && *env_dir ? env_dir : std::string(COLOADER_SOURCE_DIR) + "/tests/data";
  // The routing sends PNG (also behind a .JPEG name), WebP, TIFF, BMP and PNM to the CPU
  // decoder, linked into the producer: none of them may be skipped on the GPU machine.
  for (const char* f : {"progressive.jpg", "cmyk.jpg", "gray.jpg", "png_named.JPEG", "formats/webp_lossy_alpha.webp",
                        "formats/tiff_rgb_lzw.tif", "formats/bmp_rgb24.bmp", "formats/pnm_rgb.ppm",
                        "formats/png_gray16.png"}) {
    const std::string name = std::string(f).substr(std::string(f).rfind('/') + 1);
    testing::WriteFile(data_ + "/class0/zz_" + name, testing::ReadFile(fixtures + "/" + f));
  }
  for (const char* f : {"truncated.jpg", "not_an_image.jpg"})
    testing::WriteFile(data_ + "/class1/zz_" + f, testing::ReadFile(fixtures + "/" + f));
  {
    auto p = Serve("p", {"--batch-size", "16", "--device", "cuda:0", "--decode", "gpu", "--output", "uint8"});
    auto c = Consume("p", {"--device"});
    ASSERT_EQ(c->Wait(120000), 0) << c->Stderr();
    ASSERT_EQ(p->Wait(60000), 0) << p->Stderr();
    auto epochs = ParseJsonLines(c->Stdout());
    ASSERT_EQ(epochs.size(), 1u);
    // The two bad files are skipped; their positions carry a neighbour's sample (FillFailed).
    EXPECT_EQ(U64(epochs[0], "samples"), kImages + 11u);
    EXPECT_EQ(U64(epochs[0], "unique_samples"), kImages + 9u);
    EXPECT_NE(p->Stderr().find("zz_truncated.jpg: truncated JPEG data"), std::string::npos) << p->Stderr();
    EXPECT_NE(p->Stderr().find("zz_not_an_image.jpg"), std::string::npos) << p->Stderr();
    EXPECT_EQ(p->Stderr().find(" 0 on the CPU"), std::string::npos) << p->Stderr();  // CMYK, grayscale, ...
    EXPECT_EQ(p->Stderr().find("skipped bad file: " + data_ + "/class0/"), std::string::npos) << p->Stderr();
    std::printf("%s", p->Stderr().c_str());
  }
  {
    auto p = Serve("p", {"--batch-size", "16", "--device", "cuda:0", "--decode", "gpu", "--on-bad-file", "fail"});
    auto c = Consume("p", {"--device"});
    EXPECT_EQ(p->Wait(60000), 1);
    EXPECT_NE(p->Stderr().find("zz_"), std::string::npos) << p->Stderr();
    EXPECT_EQ(c->Wait(60000), 1) << c->Stderr();  // told the producer stopped, and why
    EXPECT_TRUE(c->Stderr().find("zz_") != std::string::npos ||
                c->Stderr().find("stopped while this consumer was connecting") != std::string::npos)
        << c->Stderr();
  }
}

// A kernel that takes its time before reading the slot: if the producer could overwrite a
// slot once the consumer released it on the host, this kernel would hash new data.
__global__ void SlowHash(const uint8_t* data, uint64_t n, unsigned long long* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const long long start = clock64();
  while (clock64() - start < 20'000'000) {
  }  // ~10 ms
  unsigned long long h = 1469598103934665603ull;
  for (uint64_t i = 0; i < n; ++i) h = (h ^ data[i]) * 1099511628211ull;
  *out = h;
}

uint64_t HostHash(const std::vector<uint8_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : v) h = (h ^ b) * 1099511628211ull;
  return h;
}

// Zero-copy views: the slot's ack waits for the kernel. The job's own copies (the default): the
// copy is freed, and its memory reused for the next batch, only after the kernel.
TEST_F(GpuTest, ReleaseIsOrderedAfterTheConsumersStreamWork) { ReleaseOrdered(false, true); }
TEST_F(GpuTest, ReleaseIsOrderedAfterWorkOnTheLegacyDefaultStream) { ReleaseOrdered(true, true); }
TEST_F(GpuTest, ACopiedBatchIsFreedOnlyAfterTheStreamWorkReadingIt) { ReleaseOrdered(false, false); }

void GpuTest::ReleaseOrdered(bool default_stream, bool zero_copy) {
  // Window 2: the producer wants every slot back at once. Each batch is released right after
  // a slow kernel reading it was enqueued; the kernel must still see the batch it was given.
  auto p = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "2", "--device", "cuda:0", "--output", "uint8"});
  ConsumerOptions o;
  o.name = "p";
  o.device = true;
  o.zero_copy = zero_copy;
  ASSERT_OK_AND_ASSIGN(auto consumer, Consumer::Connect(o));
  ASSERT_TRUE(consumer->on_device()) << consumer->fallback_reason();
  cudaStream_t stream = nullptr;  // the legacy default stream, as PyTorch's default
  if (!default_stream) ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  unsigned long long* hashes = nullptr;
  ASSERT_EQ(cudaMalloc(&hashes, 64 * sizeof(unsigned long long)), cudaSuccess);
  std::vector<uint64_t> expected;
  while (true) {
    ASSERT_OK_AND_ASSIGN(bool more, consumer->NextEpoch());
    if (!more) break;
    while (true) {
      ASSERT_OK_AND_ASSIGN(std::optional<Batch> b, consumer->Next(stream));
      if (!b) break;
      ASSERT_GE(b->device(), 0);
      std::vector<uint8_t> copy(b->bytes());
      ASSERT_OK(b->CopyTo(copy.data()));  // what the batch holds now
      expected.push_back(HostHash(copy));
      SlowHash<<<1, 1, 0, stream>>>(static_cast<const uint8_t*>(b->data()), b->bytes(), hashes + expected.size() - 1);
      b->Release();  // at once: the ack must wait for SlowHash
    }
  }
  std::vector<unsigned long long> got(expected.size());
  ASSERT_EQ(cudaMemcpy(got.data(), hashes, got.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(expected.size(), 2u * 13u);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "batch " << i;
  EXPECT_EQ(p->Wait(60000), 0) << p->Stderr();
}

TEST_F(GpuTest, ZeroCopyConsumersShareOneAllocationAndMakeNoDeviceCopy) {
  // Four zero-copy device consumers and one producer: every consumer's device pointers are in
  // the producer's ring, and a consumer's own GPU memory is its context, not a copy of the ring.
  auto p = Serve("p", {"--batch-size", "256", "--window", "4", "--spare-slots", "0", "--device", "cuda:0", "--forever",
                       "--image-size", "224", "--min-consumers", "4"});
  std::vector<std::unique_ptr<Child>> consumers;
  for (int i = 0; i < 4; ++i) consumers.push_back(Consume("p", {"--device", "--zero-copy", "--step-ms", "50"}));
  // All four have mapped the ring and read from it (min-consumers 4: nothing is published before).
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 8; }));
  FILE* smi = ::popen("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits", "r");
  ASSERT_NE(smi, nullptr);
  std::map<int, long> used;
  int pid;
  long mib;
  while (std::fscanf(smi, "%d, %ld", &pid, &mib) == 2) used[pid] = mib;
  ::pclose(smi);
  const long ring_mib = 4L * 256 * 224 * 224 * 3 * 4 / (1 << 20);  // float32 slots
  ASSERT_TRUE(used.count(p->pid())) << "producer not listed by nvidia-smi";
  std::printf("[ memory   ] ring %ld MiB; producer %ld MiB", ring_mib, used[p->pid()]);
  for (auto& c : consumers) {
    ASSERT_TRUE(used.count(c->pid()));
    std::printf("; consumer %ld MiB", used[c->pid()]);
    EXPECT_LT(used[c->pid()], ring_mib) << "a consumer holds as much as the ring: a copy?";
  }
  std::printf("\n");
  EXPECT_GT(used[p->pid()], ring_mib);
  p->Signal(SIGTERM);
  EXPECT_EQ(p->Wait(30000), 0);
  for (auto& c : consumers) {
    EXPECT_EQ(c->Wait(30000), 1) << c->Stderr();  // a --forever stream stopped: said so
    EXPECT_NE(c->Stderr().find("SIGTERM"), std::string::npos) << c->Stderr();
  }
}

// Kernels for the isolation test: what an in-place op does to a batch, and a hash of it.
__global__ void Scribble(uint8_t* data, uint64_t n) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) data[i] = 0;
}

TEST_F(GpuTest, AJobWritingItsDeviceBatchesInPlaceChangesNothingAnotherJobSees) {
  // Job A (this process) zeroes every batch it gets, in place on its stream, as
  // x.zero_() or Normalize(inplace=True) would; job B (another process) hashes what it gets.
  // B's hash must be the host path's for the same seed, and A must see its own writes.
  for (const char* output : {"uint8", "float32"}) {
    SCOPED_TRACE(output);
    auto host = RunOne("host", {"--batch-size", "16", "--output", output}, {});
    auto p = Serve("p", {"--batch-size", "16", "--output", output, "--device", "cuda:0", "--decode", "cpu",
                         "--min-consumers", "2"});
    auto b = Consume("p", {"--device"});
    ConsumerOptions o;
    o.name = "p";
    o.device = true;
    o.batch_size = 16;  // the same slots as B reads
    ASSERT_OK_AND_ASSIGN(auto a, Consumer::Connect(o));
    ASSERT_TRUE(a->on_device()) << a->fallback_reason();
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    int batches = 0;
    ASSERT_OK_AND_ASSIGN(bool more, a->NextEpoch());
    ASSERT_TRUE(more);
    for (;;) {
      ASSERT_OK_AND_ASSIGN(std::optional<Batch> batch, a->Next(stream));
      if (!batch) break;
      Scribble<<<64, 256, 0, stream>>>(static_cast<uint8_t*>(const_cast<void*>(batch->data())), batch->bytes());
      std::vector<uint8_t> back(batch->bytes(), 1);
      ASSERT_OK(batch->CopyTo(back.data()));  // ordered after the kernel on the batch's stream
      ASSERT_EQ(std::count(back.begin(), back.end(), 0), static_cast<long>(back.size())) << "a write was lost";
      ++batches;
    }
    EXPECT_EQ(batches, (kImages + 15) / 16);
    ASSERT_EQ(b->Wait(120000), 0) << b->Stderr();
    auto eb = ParseJsonLines(b->Stdout());
    ASSERT_EQ(eb.size(), 1u);
    ExpectExactEpoch(eb[0]);
    EXPECT_EQ(eb[0].at("content_hash"), host.at(0).at("content_hash")) << "A's writes reached B";
    a.reset();
    cudaStreamDestroy(stream);
    EXPECT_EQ(p->Wait(60000), 0) << p->Stderr();
  }
}

TEST_F(GpuTest, ProducerAndConsumersUnderMps) {
  // Our own MPS control daemon, with its own pipe and log directories, stopped afterwards.
  const std::string pipes = tmp_.path() + "/mps-pipe", logs = tmp_.path() + "/mps-log";
  std::filesystem::create_directories(pipes);
  std::filesystem::create_directories(logs);
  std::map<std::string, std::string> mps = {{"CUDA_MPS_PIPE_DIRECTORY", pipes}, {"CUDA_MPS_LOG_DIRECTORY", logs}};
  Child daemon({"/bin/sh", "-c", "exec nvidia-cuda-mps-control -d"}, mps);
  ASSERT_EQ(daemon.Wait(20000), 0) << daemon.Stderr();
  auto p = Serve("p", {"--batch-size", "16", "--epochs", "2", "--device", "cuda:0", "--min-consumers", "2"}, mps);
  auto a = Consume("p", {"--device", "--batch-size", "10"}, mps);
  auto b = Consume("p", {"--device", "--batch-size", "16"}, mps);
  const int ra = a->Wait(120000), rb = b->Wait(120000), rp = p->Wait(60000);
  Child stop({"/bin/sh", "-c", "echo quit | nvidia-cuda-mps-control"}, mps);
  EXPECT_EQ(stop.Wait(30000), 0);
  ASSERT_EQ(ra, 0) << a->Stderr();
  ASSERT_EQ(rb, 0) << b->Stderr();
  EXPECT_EQ(rp, 0) << p->Stderr();
  for (auto* c : {a.get(), b.get()}) {
    auto epochs = ParseJsonLines(c->Stdout());
    ASSERT_EQ(epochs.size(), 2u);
    for (const auto& e : epochs) {
      ExpectExactEpoch(e);
      EXPECT_EQ(e.at("path"), "device");
    }
  }
  // The daemon really served them: its control log names the clients it started.
  EXPECT_NE(testing::ReadFile(logs + "/control.log").find("NEW CLIENT"), std::string::npos)
      << testing::ReadFile(logs + "/control.log");
}

TEST_F(GpuTest, ProducerOutsideMpsServesConsumersUnderIt) {
  // Issue 16: the producer may stay out of MPS (its pipe directory points where no daemon
  // listens, so CUDA runs it as an ordinary context, time-sliced beside the MPS server) while
  // the jobs are MPS clients: they must still map its ring through CUDA IPC.
  const std::string pipes = tmp_.path() + "/mps-pipe", logs = tmp_.path() + "/mps-log";
  const std::string none = tmp_.path() + "/no-mps";
  for (const auto& d : {pipes, logs, none}) std::filesystem::create_directories(d);
  std::map<std::string, std::string> mps = {{"CUDA_MPS_PIPE_DIRECTORY", pipes}, {"CUDA_MPS_LOG_DIRECTORY", logs}};
  Child daemon({"/bin/sh", "-c", "exec nvidia-cuda-mps-control -d"}, mps);
  ASSERT_EQ(daemon.Wait(20000), 0) << daemon.Stderr();
  auto p = Serve("p", {"--batch-size", "16", "--epochs", "2", "--device", "cuda:0", "--decode", "gpu",
                       "--min-consumers", "2"},
                 {{"CUDA_MPS_PIPE_DIRECTORY", none}});
  auto a = Consume("p", {"--device", "--batch-size", "10"}, mps);
  auto b = Consume("p", {"--device", "--batch-size", "16"}, mps);
  const int ra = a->Wait(120000), rb = b->Wait(120000), rp = p->Wait(60000);
  Child stop({"/bin/sh", "-c", "echo quit | nvidia-cuda-mps-control"}, mps);
  EXPECT_EQ(stop.Wait(30000), 0);
  ASSERT_EQ(ra, 0) << a->Stderr();
  ASSERT_EQ(rb, 0) << b->Stderr();
  EXPECT_EQ(rp, 0) << p->Stderr();
  for (auto* c : {a.get(), b.get()}) {
    auto epochs = ParseJsonLines(c->Stdout());
    ASSERT_EQ(epochs.size(), 2u);
    for (const auto& e : epochs) {
      ExpectExactEpoch(e);
      EXPECT_EQ(e.at("path"), "device");
    }
  }
  EXPECT_NE(testing::ReadFile(logs + "/control.log").find("NEW CLIENT"), std::string::npos)
      << testing::ReadFile(logs + "/control.log");
}

TEST_F(GpuTest, EachGpuIsServedFromARingOnItself) {
  int n = 0;
  cudaGetDeviceCount(&n);
  if (n < 2) GTEST_SKIP() << "needs two GPUs, " << n << " visible";
  // One decode, one upload per GPU in use: a consumer on GPU 1 maps the ring on GPU 1.
  auto p = Serve("p", {"--batch-size", "16", "--epochs", "2", "--device", "cuda:0,cuda:1", "--min-consumers", "2",
                       "--output", "uint8"});
  auto a = Consume("p", {"--device", "--batch-size", "10"}, {{"CUDA_VISIBLE_DEVICES", "0"}});
  auto b = Consume("p", {"--device", "--batch-size", "16"}, {{"CUDA_VISIBLE_DEVICES", "1"}});
  ASSERT_EQ(a->Wait(120000), 0) << a->Stderr();
  ASSERT_EQ(b->Wait(120000), 0) << b->Stderr();
  auto ea = ParseJsonLines(a->Stdout()), eb = ParseJsonLines(b->Stdout());
  ASSERT_EQ(ea.size(), 2u);
  ASSERT_EQ(eb.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    ExpectExactEpoch(ea[e]);
    ExpectExactEpoch(eb[e]);
    EXPECT_EQ(ea[e].at("path"), "device");
    EXPECT_EQ(eb[e].at("path"), "device");
    EXPECT_EQ(ea[e].at("content_hash"), eb[e].at("content_hash"));  // the same batches on both GPUs
  }
  EXPECT_EQ(p->Wait(60000), 0) << p->Stderr();
  // The producer says which ring each consumer reads.
  EXPECT_NE(p->Stderr().find("device path"), std::string::npos) << p->Stderr();
}

TEST_F(GpuTest, GpuDecodeOnTwoGpusSplitsTheBatchesAndServesTheOneGpuBytes) {
  int n = 0;
  cudaGetDeviceCount(&n);
  if (n < 2) GTEST_SKIP() << "needs two GPUs, " << n << " visible";
  // Each GPU's JPEG engines decode every other batch; each ring gets the other GPU's batches
  // peer to peer. Consumers on either GPU read exact epochs, with the bytes of a one-GPU decode.
  auto p = Serve("p", {"--batch-size", "16", "--epochs", "2", "--device", "cuda:0,cuda:1", "--decode", "gpu",
                       "--min-consumers", "2"});
  auto a = Consume("p", {"--device", "--batch-size", "10"}, {{"CUDA_VISIBLE_DEVICES", "0"}});
  auto b = Consume("p", {"--device", "--batch-size", "16"}, {{"CUDA_VISIBLE_DEVICES", "1"}});
  ASSERT_EQ(a->Wait(120000), 0) << a->Stderr();
  ASSERT_EQ(b->Wait(120000), 0) << b->Stderr();
  ASSERT_EQ(p->Wait(60000), 0) << p->Stderr();
  auto one = RunOne("one", {"--batch-size", "16", "--epochs", "2", "--device", "cuda:0", "--decode", "gpu"},
                    {"--device", "--batch-size", "7"});
  auto ea = ParseJsonLines(a->Stdout()), eb = ParseJsonLines(b->Stdout());
  ASSERT_EQ(ea.size(), 2u);
  ASSERT_EQ(eb.size(), 2u);
  ASSERT_EQ(one.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    ExpectExactEpoch(ea[e]);
    ExpectExactEpoch(eb[e]);
    EXPECT_EQ(ea[e].at("content_hash"), eb[e].at("content_hash")) << "epoch " << e;
    EXPECT_EQ(ea[e].at("content_hash"), one[e].at("content_hash")) << "epoch " << e;
  }
  // Both GPUs decoded: one banner and one count line per GPU, each with images.
  const std::string err = p->Stderr();
  EXPECT_NE(err.find("on cuda:0, 1 lane"), std::string::npos) << err;
  EXPECT_NE(err.find("on cuda:1, 1 lane"), std::string::npos) << err;
  for (const std::string dev : {"(cuda:0)", "(cuda:1)"}) {
    // "[coloader] decode gpu: N images by the hardware backend, ... (cuda:K)", one per GPU.
    std::istringstream lines(err);
    std::string line, count;
    while (std::getline(lines, line)) {
      const size_t at = line.find("decode gpu: ");
      if (at != std::string::npos && line.size() >= dev.size() &&
          line.compare(line.size() - dev.size(), dev.size(), dev) == 0)
        count = line.substr(at);
    }
    ASSERT_FALSE(count.empty()) << "no count line for " << dev << ": " << err;
    EXPECT_NE(count.rfind("decode gpu: 0 ", 0), 0u) << "no hardware images on " << dev << ": " << count;
  }
}

}  // namespace
}  // namespace coloader
