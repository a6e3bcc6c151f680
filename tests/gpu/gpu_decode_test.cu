// --decode gpu against the CPU path, in this process: the GPU ResizeCrop kernel against
// augment.cc's ResizeCrop on the same decoded image, and the whole GPU stage (routing, nvJPEG,
// CPU fallback, dense output) against SampleTransform on the same files and seeds.
//
// Tolerances: the kernel and OpenCV differ by at most 1 level (fixed-point vs float
// rounding); nvJPEG and libjpeg-turbo decode the same file differently (IDCT and chroma
// upsampling), so whole samples are held to a mean absolute difference of at most 2 levels
// (the figures are printed). Files the CPU decodes for the GPU path are equal byte for byte.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include <gtest/gtest.h>
#include <opencv2/imgproc.hpp>

#include "pipeline/transform/augment_device.h"
#include "pipeline/decode/gpu_decode.h"
#include "pipeline/assemble/pool.h"
#include "pipeline/assemble/sample_transform.h"
#include "pipeline/source/read.h"
#include "tests/support/test_support.h"

namespace coloader {
namespace {

namespace fs = std::filesystem;

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A textured test image: smooth gradients plus blurred noise, like a photograph's statistics.
cv::Mat MakeImage(int width, int height) {
  cv::Mat noise(height, width, CV_8UC3);
  cv::randu(noise, 0, 256);
  cv::Mat img;
  cv::GaussianBlur(noise, img, cv::Size(5, 5), 1.5);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      cv::Vec3b& p = img.at<cv::Vec3b>(y, x);
      p[0] = static_cast<uint8_t>((p[0] + x * 255 / width) / 2);
      p[2] = static_cast<uint8_t>((p[2] + y * 255 / height) / 2);
    }
  return img;
}

TEST(GpuResizeCrop, MatchesTheCpuResizeCropWithinOneLevel) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible";
  const int w = 640, h = 480, size = 160;  // boxes from 0.08 to all of the image: both resize kinds
  const cv::Mat src = MakeImage(w, h);
  AugmentOptions aug;
  aug.size = size;
  std::vector<CropBox> boxes;
  for (uint64_t i = 0; i < 400; ++i) {
    SampleRng rng(7, 0, i);
    boxes.push_back(SampleTrainCrop(w, h, aug, rng));
  }
  boxes.push_back(EvalCrop(w, h, aug));
  boxes.push_back(CropBox{0, 0, w, h, false});
  boxes.push_back(CropBox{10, 20, 40, 30, true});  // enlarging
  int area = 0, bilinear = 0;
  for (const CropBox& b : boxes) (b.width >= 2 * size && b.height >= 2 * size ? area : bilinear)++;
  ASSERT_GT(area, 10);
  ASSERT_GT(bilinear, 10);

  uint8_t *d_src = nullptr, *d_dst = nullptr;
  ResizeCropTask* d_tasks = nullptr;
  const size_t sample = size_t(size) * size * 3;
  ASSERT_EQ(cudaMalloc(&d_src, src.total() * 3), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_dst, sample * boxes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_tasks, sizeof(ResizeCropTask) * boxes.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_src, src.data, src.total() * 3, cudaMemcpyHostToDevice), cudaSuccess);
  // Every interpolation, the flips both ways on every other box.
  // (The named recipes' fast resize, OpenCV's sampling, too.)
  const std::pair<Interpolation, bool> modes[] = {{Interpolation::kBilinear, true}, {Interpolation::kBicubic, true},
                                                   {Interpolation::kNearest, true}, {Interpolation::kBilinear, false}};
  for (const auto& [interp, exact] : modes) {
    std::vector<ResizeCropTask> tasks(boxes.size());
    for (size_t i = 0; i < boxes.size(); ++i) {
      boxes[i].vflip = i % 2 == 1;
      tasks[i] = TaskFor(boxes[i], w, h, size, interp, exact);
      tasks[i].src = d_src;
      tasks[i].pitch = w * 3;
      tasks[i].dst_index = static_cast<uint32_t>(i);
    }
    ASSERT_EQ(cudaMemcpy(d_tasks, tasks.data(), sizeof(ResizeCropTask) * tasks.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_TRUE(ResizeCropBatchOnDevice(d_tasks, static_cast<uint32_t>(tasks.size()), size, d_dst, nullptr).ok());
    std::vector<uint8_t> gpu(sample * boxes.size());
    ASSERT_EQ(cudaMemcpy(gpu.data(), d_dst, gpu.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    int worst = 0;
    uint64_t differing = 0;
    for (size_t i = 0; i < boxes.size(); ++i) {
      cv::Mat cpu(size, size, CV_8UC3);
      ResizeCrop(src, w, h, boxes[i], cpu, interp, exact);
      for (size_t k = 0; k < sample; ++k) {
        const int d = std::abs(int(cpu.data[k]) - int(gpu[i * sample + k]));
        worst = std::max(worst, d);
        differing += d != 0;
      }
    }
    std::printf("GPU ResizeCrop vs CPU, %s%s: %zu boxes (%d shrinking 2x+, %d not), max diff %d, %.4f%% of values "
                "differ\n", InterpolationName(interp), exact ? "" : " (fast)", boxes.size(), area, bilinear, worst,
                100.0 * differing / (sample * boxes.size()));
    EXPECT_LE(worst, 1) << InterpolationName(interp);
  }
  cudaFree(d_src);
  cudaFree(d_dst);
  cudaFree(d_tasks);
}

std::string FixtureDir() {
  if (const char* d = std::getenv("COLOADER_TEST_DATA"); d && *d) return d;
  return std::string(COLOADER_SOURCE_DIR) + "/tests/data";
}

// Real photographs where there are some (the bundle's, or Debian's mate-backgrounds).
std::vector<std::string> Photos() {
  std::vector<std::string> out;
  const char* env_photos = std::getenv("COLOADER_TEST_PHOTOS");
  for (const char* dir : std::vector<const char*>{env_photos, "/usr/share/backgrounds/mate/nature"}) {
    if (!dir || !fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".jpg") out.push_back(e.path().string());
    if (!out.empty()) break;
  }
  std::sort(out.begin(), out.end());
  if (out.size() > 8) out.resize(8);
  return out;
}

TEST(GpuDecodeStage, MatchesTheCpuPathAndRoutesEveryKindOfFile) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible";
  std::vector<std::string> paths = Photos();
  const size_t photos = paths.size();
  for (const char* f : {"progressive.jpg", "cmyk.jpg", "gray.jpg", "png_named.JPEG", "truncated.jpg",
                        "not_an_image.jpg"})
    paths.push_back(FixtureDir() + "/" + f);
  const size_t n = paths.size();
  const uint64_t seed = 11;
  const int size = 96;
  TransformOptions to;
  to.augment.size = size;
  to.output = DType::kUInt8;
  to.layout = TensorLayout::kNHWC;
  to.dct_scaling = false;  // the GPU decodes at full size; compare like with like
  const size_t sample = size_t(size) * size * 3;

  // The CPU path: what --decode cpu writes for each file, and its errors.
  SampleTransform cpu(to);
  std::vector<std::vector<uint8_t>> expected(n, std::vector<uint8_t>(sample));
  std::vector<std::string> cpu_error(n);
  for (size_t i = 0; i < n; ++i) {
    Status st = cpu.Run(paths[i], seed, 0, i, expected[i].data());
    if (!st.ok()) cpu_error[i] = st.message();
  }
  ASSERT_FALSE(cpu_error[n - 1].empty());
  ASSERT_FALSE(cpu_error[n - 2].empty());

  std::string why;
  const bool hardware = GpuDecodeStage::HardwareAvailable(0, &why);
  std::printf("hardware backend: %s (%s)\n", hardware ? "yes" : "no", why.c_str());
  // The lane as it is, hybrid only, and the same stage on a second GPU (serve --device
  // cuda:0,cuda:1 decodes every other batch there): each must give the CPU path's failures and
  // its samples within tolerance, and the second GPU exactly the first one's bytes.
  struct Variant {
    const char* name;
    bool use_hardware;
    int device;
  };
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  const Variant variants[] = {
      {"hardware first", true, 0},
      {"hybrid only", false, 0},
      {"hardware first on cuda:1", true, 1},
  };
  std::vector<uint8_t> first_gpu;  // "hardware first" on cuda:0
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    if (v.device >= gpus) {
      std::printf("%s: skipped, %d GPU(s) visible\n", v.name, gpus);
      continue;
    }
    const bool use_hardware = v.use_hardware;
    GpuDecodeOptions o;
    o.device = v.device;
    o.num_slots = 2;
    o.batch_size = static_cast<uint32_t>(n);
    o.augment = to.augment;
    o.lanes = 1;
    o.use_hardware = use_hardware;
    auto stage = GpuDecodeStage::Make(o);
    ASSERT_TRUE(stage.ok()) << stage.status().message();
    std::printf("%s: %s\n", v.name, (*stage)->description().c_str());
    // The batch as the pool hands it over: its samples, failures and CPU twin.
    std::vector<GpuSample> samples(n);
    std::vector<std::pair<uint32_t, std::string>> failures;
    std::vector<uint8_t> host(sample * n);
    for (size_t i = 0; i < n; ++i) {
      std::vector<uint8_t> bytes;
      ASSERT_TRUE(ReadWholeFile(paths[i], &bytes).ok());
      Status st = (*stage)->Prepare(
          std::move(bytes), [&](int w, int h) { return cpu.Crop(w, h, seed, 0, i); },
          [&](const uint8_t* data, size_t size, void* out) { return cpu.RunBytes(data, size, paths[i], seed, 0, i, out); },
          &samples[i], host.data() + i * sample);
      if (!st.ok()) failures.emplace_back(static_cast<uint32_t>(i), st.message());
    }
    // The crop boxes: the CPU path's own, from the same seed, on the same image size.
    for (size_t i = 0; i < photos; ++i) {
      ASSERT_TRUE(samples[i].on_gpu) << paths[i];
      std::vector<uint8_t> bytes;
      ASSERT_TRUE(ReadWholeFile(paths[i], &bytes).ok());
      Decoder d;
      auto info = d.Peek(bytes.data(), bytes.size(), paths[i]);
      ASSERT_TRUE(info.ok());
      SampleRng rng(seed, 0, i);
      EXPECT_EQ(samples[i].box, SampleCrop(info->width, info->height, to.augment, rng)) << paths[i];
    }
    // Progressive files go to the CPU where the JPEG engines decode (they cannot take them, and
    // the hybrid backend would hold the lane); a GPU without engines decodes them itself.
    EXPECT_EQ(samples[photos].on_gpu, !(use_hardware && hardware)) << paths[photos];
    GpuBatch batch;
    batch.slot = 1;
    batch.samples = &samples;
    batch.failures = &failures;
    batch.host_staging = host.data();
    batch.cpu = [&](uint32_t pos, const uint8_t* data, size_t size, void* out) {
      return cpu.RunBytes(data, size, paths[pos], seed, 0, pos, out);
    };
    const Result<uint32_t> gpu_decoded = (*stage)->Finish(0, batch);
    ASSERT_TRUE(gpu_decoded.ok()) << gpu_decoded.status().message();
    // Exactly the CPU path's failures, with its messages.
    std::map<uint32_t, std::string> failed(failures.begin(), failures.end());
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(failed.count(static_cast<uint32_t>(i)) ? failed[static_cast<uint32_t>(i)] : "", cpu_error[i])
          << paths[i];
    }
    const size_t good = n - failed.size();
    std::vector<uint8_t> out(sample * good);
    ASSERT_EQ(cudaMemcpy(out.data(), (*stage)->device_staging(1), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    if (v.device == 0 && use_hardware) first_gpu = out;
    if (v.device != 0) EXPECT_TRUE(out == first_gpu) << "cuda:" << v.device << " differs from cuda:0";
    size_t dense = 0;
    for (size_t i = 0; i < n; ++i) {
      if (failed.count(static_cast<uint32_t>(i))) continue;
      double sum = 0;
      int worst = 0;
      for (size_t k = 0; k < sample; ++k) {
        const int d = std::abs(int(out[dense * sample + k]) - int(expected[i][k]));
        sum += d;
        worst = std::max(worst, d);
      }
      const double mean = sum / sample;
      std::printf("  %-60s %-4s mean |diff| %.3f, max %d\n", paths[i].c_str(), samples[i].on_gpu ? "gpu" : "cpu",
                  mean, worst);
      if (samples[i].on_gpu) {
        EXPECT_LE(mean, 2.0) << paths[i];
      } else {
        EXPECT_EQ(worst, 0) << paths[i];  // the CPU path's own bytes
      }
      ++dense;
    }
    const GpuDecodeCounts c = (*stage)->counts();
    std::printf("  counts: %llu hardware, %llu hybrid, %llu cpu\n", (unsigned long long)c.hardware,
                (unsigned long long)c.hybrid, (unsigned long long)c.cpu);
    EXPECT_EQ(c.hardware + c.hybrid + c.cpu, good);
    EXPECT_GE(c.cpu, use_hardware && hardware ? 3u : 2u);  // CMYK, PNG (and progressive)
    EXPECT_TRUE(samples[photos + 2].on_gpu) << paths[photos + 2];  // grayscale: on the GPU
    EXPECT_EQ(*gpu_decoded, c.hardware + c.hybrid);
    if (use_hardware && hardware) EXPECT_GE(c.hardware, photos);
    if (!use_hardware) EXPECT_EQ(c.hardware, 0u);
  }
}

}  // namespace
}  // namespace coloader
