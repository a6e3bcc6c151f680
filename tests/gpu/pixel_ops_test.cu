// The pixel ops' GPU twin (pixel_ops.cu) against their CPU twin (RunPixelProgram) on the same
// images and programs: every step kind alone, then whole drawn programs of the recipes' ops
// (ColorJitter, RandomGrayscale, TrivialAugmentWide, RandAugment, AutoAugment, RandomCrop) in one batch,
// whose programs differ in length. The twins share their arithmetic (pixel_math.h), so they
// must agree bit for bit; GaussianBlur sums in another order on the CPU (OpenCV's separable
// filter) and is held to one level.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <opencv2/imgproc.hpp>

#include "pipeline/transform/pixel_ops.h"
#include "pipeline/transform/pixel_ops_device.h"

namespace coloader {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// A textured square image: gradients plus blurred noise, and a flat one where `flat`.
cv::Mat MakeImage(int size, uint64_t seed, bool flat = false) {
  cv::Mat img(size, size, CV_8UC3);
  if (flat) {
    img.setTo(cv::Scalar(90, 140, 200));
    return img;
  }
  cv::RNG rng(seed);
  cv::Mat noise(size, size, CV_8UC3);
  rng.fill(noise, cv::RNG::UNIFORM, 0, 256);
  cv::GaussianBlur(noise, img, cv::Size(3, 3), 1.0);
  for (int y = 0; y < size; ++y)
    for (int x = 0; x < size; ++x) {
      cv::Vec3b& p = img.at<cv::Vec3b>(y, x);
      p[0] = static_cast<uint8_t>((p[0] + x * 255 / size) / 2);
      p[2] = static_cast<uint8_t>((p[2] + y * 255 / size) / 2);
    }
  return img;
}

// Runs `programs` on `images` (all size x size) with the GPU twin; returns the results. With
// `src_is_a`, the images start in the first ping-pong buffer, as the device ring has them.
void RunOnGpu(const std::vector<cv::Mat>& images, const std::vector<PixelProgram>& programs,
              std::vector<cv::Mat>* out, bool src_is_a = false) {
  const int size = images[0].rows;
  const uint32_t n = static_cast<uint32_t>(images.size());
  const size_t bytes = size_t(size) * size * 3;
  std::vector<uint8_t> host(bytes * n);
  for (uint32_t i = 0; i < n; ++i) std::copy(images[i].data, images[i].data + bytes, host.data() + i * bytes);
  uint8_t *src = nullptr, *a = nullptr, *b = nullptr;
  PixelProgram* progs = nullptr;
  PixelStats* stats = nullptr;
  float* rows = nullptr;
  CUDA_OK(cudaMalloc(&rows, bytes * n * sizeof(float)));
  CUDA_OK(cudaMalloc(&src, bytes * n));
  CUDA_OK(cudaMalloc(&a, bytes * n));
  CUDA_OK(cudaMalloc(&b, bytes * n));
  CUDA_OK(cudaMalloc(&progs, sizeof(PixelProgram) * n));
  CUDA_OK(cudaMalloc(&stats, sizeof(PixelStats) * n));
  CUDA_OK(cudaMemcpy(src, host.data(), bytes * n, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(progs, programs.data(), sizeof(PixelProgram) * n, cudaMemcpyHostToDevice));
  Result<const uint8_t*> result =
      PixelOpsBatchOnDevice(progs, programs.data(), n, size, src, src_is_a ? src : a, b, stats, rows, nullptr);
  ASSERT_TRUE(result.ok()) << result.status().message();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(host.data(), *result, bytes * n, cudaMemcpyDeviceToHost));
  out->clear();
  for (uint32_t i = 0; i < n; ++i) out->push_back(cv::Mat(size, size, CV_8UC3, host.data() + i * bytes).clone());
  cudaFree(src), cudaFree(a), cudaFree(b), cudaFree(progs), cudaFree(stats), cudaFree(rows);
}

int MaxDiff(const cv::Mat& x, const cv::Mat& y) {
  cv::Mat d;
  cv::absdiff(x, y, d);
  double hi = 0;
  cv::minMaxLoc(d.reshape(1), nullptr, &hi);
  return static_cast<int>(hi);
}

PixelStep StepOf(PixelKind kind, double f0 = 0, int i0 = 0) {
  PixelStep s;
  s.kind = kind;
  s.f[0] = f0;
  s.i[0] = i0;
  return s;
}

TEST(GpuPixelOps, EveryStepMatchesItsCpuTwin) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible";
  const float fill[3] = {10, 20, 30};
  std::vector<std::pair<std::string, PixelStep>> steps = {
      {"brightness 0.3", StepOf(PixelKind::kBrightness, 0.3)},
      {"brightness 1.7", StepOf(PixelKind::kBrightness, 1.7)},
      {"contrast 0.4", StepOf(PixelKind::kContrast, 0.4)},
      {"contrast 1.9", StepOf(PixelKind::kContrast, 1.9)},
      {"saturation 0", StepOf(PixelKind::kSaturation, 0.0)},
      {"saturation 1.6", StepOf(PixelKind::kSaturation, 1.6)},
      {"hue -0.4", StepOf(PixelKind::kHue, -0.4)},
      {"hue 0.13", StepOf(PixelKind::kHue, 0.13)},
      {"sharpness 0.1", StepOf(PixelKind::kSharpness, 0.1)},
      {"sharpness 1.99", StepOf(PixelKind::kSharpness, 1.99)},
      {"grayscale", StepOf(PixelKind::kGrayscale)},
      {"posterize 3", StepOf(PixelKind::kPosterize, 0, 3)},
      {"solarize 128", StepOf(PixelKind::kSolarize, 128.0)},
      {"autocontrast", StepOf(PixelKind::kAutoContrast)},
      {"equalize", StepOf(PixelKind::kEqualize)},
      {"invert", StepOf(PixelKind::kInvert)},
  };
  for (const char* op : {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"})
    for (double m : {-0.7, 0.35, 30.0}) {
      if (std::string(op).find("Translate") == std::string::npos && m == 30.0) m = 45.0;  // degrees for Rotate
      Result<PixelStep> s = AugmentOpStep(op, std::string(op).find("Shear") == 0 ? m / 50.0 : m, Interpolation::kNearest,
                                          fill, 40, 40);
      ASSERT_TRUE(s.ok());
      steps.emplace_back(std::string(op) + " " + std::to_string(m), *s);
    }
  for (int mode = 0; mode < 4; ++mode)
    for (const auto& [dx, dy] : {std::pair<int, int>{-3, 2}, {4, -4}, {0, 1}}) {
      PixelStep s = StepOf(PixelKind::kPadCrop, dx);
      s.f[1] = dy, s.f[2] = mode;
      s.i[0] = 11, s.i[1] = 22, s.i[2] = 33;
      steps.emplace_back("RandomCrop mode " + std::to_string(mode) + " (" + std::to_string(dx) + ", " +
                             std::to_string(dy) + ")",
                         s);
    }
  PixelStep blur = StepOf(PixelKind::kBlur, 1.3);
  blur.i[0] = 5, blur.i[1] = 9;
  for (int size : {1, 2, 3, 40, 97}) {
    std::vector<cv::Mat> images;
    std::vector<PixelProgram> programs;
    for (size_t k = 0; k < steps.size(); ++k) {
      for (bool flat : {false, true}) {
        images.push_back(MakeImage(size, 100 + k, flat));
        PixelProgram p;
        PixelStep s = steps[k].second;
        if (s.kind == PixelKind::kAffine) {
          // The map is the image's: redraw it at this size.
          const std::string name = steps[k].first.substr(0, steps[k].first.find(' '));
          const double m = std::stod(steps[k].first.substr(steps[k].first.find(' ') + 1));
          s = *AugmentOpStep(name, name.find("Shear") == 0 ? m / 50.0 : m, Interpolation::kNearest, fill, size, size);
        }
        p.Add(s);
        programs.push_back(p);
      }
    }
    std::vector<cv::Mat> gpu;
    RunOnGpu(images, programs, &gpu);
    for (size_t i = 0; i < images.size(); ++i) {
      cv::Mat cpu = images[i].clone();
      RunPixelProgram(cpu, programs[i]);
      EXPECT_EQ(MaxDiff(cpu, gpu[i]), 0) << steps[i / 2].first << " at " << size << "x" << size
                                         << (i % 2 ? " (flat)" : "");
    }
    // GaussianBlur, 5 x 9 and 23 x 23: within a level of OpenCV's order of summation.
    for (int k : {0, 23}) {
      std::vector<cv::Mat> one = {MakeImage(size, 7)};
      PixelProgram p;
      PixelStep s = blur;
      if (k > 0) s.i[0] = s.i[1] = k, s.f[0] = 4.0;
      p.Add(s);
      RunOnGpu(one, {p}, &gpu);
      cv::Mat cpu = one[0].clone();
      RunPixelProgram(cpu, p);
      EXPECT_LE(MaxDiff(cpu, gpu[0]), 1) << "blur " << s.i[0] << " x " << s.i[1] << " at " << size;
    }
  }
}

TEST(GpuPixelOps, DrawnProgramsOfEveryRecipeOpMatchInOneBatch) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible";
  AutoAugmentOptions ta, ra, aa;
  ta.kind = AutoAugmentKind::kTrivialAugmentWide;
  ra.kind = AutoAugmentKind::kRandAugment;
  ra.num_ops = 3;
  aa.kind = AutoAugmentKind::kAutoAugmentImageNet;
  aa.fill[0] = aa.fill[1] = aa.fill[2] = 128;
  const float fill[3] = {5, 6, 7};
  const PixelOps ops = {MakeColorJitter({0.6, 1.4, true}, {0.6, 1.4, true}, {0.6, 1.4, true}, {-0.1, 0.1, true}),
                        MakeRandomGrayscale(0.3), MakeAutoAugment(ta), MakeAutoAugment(ra), MakeAutoAugment(aa),
                        MakeRandomCrop({4, 2, 4, 6}, PadMode::kReflect, fill)};
  const int size = 64;
  std::vector<cv::Mat> images;
  std::vector<PixelProgram> programs;
  int steps = 0;
  for (uint64_t i = 0; i < 300; ++i) {
    images.push_back(MakeImage(size, 1000 + i));
    // Every op alone and all of them, so programs of 0 to 12 steps share the batch.
    const PixelOps chosen = i % 7 == 6 ? ops : PixelOps{ops[i % 6]};
    programs.push_back(DrawPixelProgram(chosen, size, 42, 3, i));
    steps += programs.back().count;
  }
  std::vector<cv::Mat> gpu;
  RunOnGpu(images, programs, &gpu, true);
  int differ = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    cv::Mat cpu = images[i].clone();
    RunPixelProgram(cpu, programs[i]);
    const int d = MaxDiff(cpu, gpu[i]);
    differ += d != 0;
    EXPECT_EQ(d, 0) << "sample " << i << " (" << programs[i].count << " steps)";
  }
  std::printf("[pixel ops] %zu samples, %d steps: %d differ between the twins\n", images.size(), steps, differ);
}

}  // namespace
}  // namespace coloader
