// `serve --decode gpu|auto`: JPEG decode by nvJPEG and augmentation by a CUDA kernel, on the
// GPU of the first --device ring, written into that ring's per-slot device staging (uint8 NHWC,
// dense), from where DeviceRing::Upload normalises, casts and lays it out into the slot.
//
// Division of work, per batch:
//  - workers (CPU threads): read the file. The batch's last samples, as many as the split
//    gives the CPU (decode_split.h, --cpu-share), are decoded and augmented there exactly as
//    --decode cpu does. The others are routed (Prepare): a complete 8-bit YCbCr or grayscale
//    JPEG the engines can take keeps its bytes and gets its crop box from the CPU path's own
//    SampleCrop and SampleRng, so both paths crop the same box for the same seed. Anything else
//    (PNG, CMYK, progressive where the GPU has JPEG engines, an unterminated file, an
//    implausible size) is decoded on the worker too, errors included.
//  - a GPU lane thread (Finish): nvJPEG's hardware backend on what nvjpegDecodeBatchedSupported
//    accepts, then the GPU hybrid backend on the rest (a batch the hardware refused, or every
//    file on a GPU without engines), then the CPU for what both refuse; one kernel crops,
//    resizes and flips every sample; the CPU-decoded samples are copied up beside them.
//
// libnvjpeg is loaded at run time (dlopen): one binary runs with or without it. No CUDA types
// in this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "pipeline/transform/augment.h"
#include "pipeline/decode/decode_split.h"
#include "pipeline/decode/jpeg_markers.h"

namespace coloader {

enum class DecodeMode { kCpu, kGpu, kAuto };
// The resize kernel gives each sample of a batch one row of its CUDA grid, and a grid has at
// most 65535 rows: larger batches decode on the CPU.
constexpr uint32_t kMaxGpuDecodeBatch = 65535;
Result<DecodeMode> ParseDecodeMode(const std::string& s);  // "cpu" | "gpu" | "auto"

// Whether a GPU decoder gets this file: complete, 8-bit, 3 components in YCbCr or one of
// gray, a Huffman-coded DCT frame, a plausible size. The rest goes to the CPU decoder.
bool GpuDecodable(const JpegFrame& f);

// What a worker leaves in the job for the GPU lane about one sample.
struct GpuSample {
  bool on_gpu = false;  // false: done on the CPU (or failed)
  std::vector<uint8_t> bytes;
  int width = 0, height = 0;
  CropBox box;
};

struct GpuDecodeOptions {
  int device = 0;
  uint32_t num_slots = 0;
  uint32_t batch_size = 0;
  AugmentOptions augment;
  // Batches decoded at once on this GPU, each on its own thread, stream and nvJPEG states.
  // One: nvJPEG's hardware path holds its thread for the whole engine time of a batch (it
  // polls, issue 16), so a second lane nearly doubles the lanes' CPU without adding
  // throughput (H200, one job: 0.65 vs 0.66 of the ceiling, lanes at 0.88 vs 1.66 cores).
  // `serve --gpu-lanes`.
  int lanes = 1;
  bool use_hardware = true;  // false: the GPU hybrid backend only (for tests)
};

// The CPU twin of one sample, for a file the GPU will not take: decodes and transforms `data`
// into `dst` (the sample's uint8 NHWC place in the host staging), errors naming the file. The
// pool binds it to the sample's path, seed, epoch and index; the stage knows nothing of how.
using CpuFallback = std::function<Status(const uint8_t* data, size_t size, void* dst)>;
// The box of the image (width x height) that the sample's recipe crops, from its own draws.
using CropFor = std::function<CropBox(int width, int height)>;

// One batch as a lane finishes it: what Prepare left at each position, the failures found so
// far (Finish adds its own), and each position's CPU twin.
struct GpuBatch {
  uint32_t slot = 0;                        // the slot whose device staging it fills
  std::vector<GpuSample>* samples = nullptr;
  std::vector<std::pair<uint32_t, std::string>>* failures = nullptr;  // (position, reason)
  uint8_t* host_staging = nullptr;          // the slot's uint8 NHWC host area
  std::function<Status(uint32_t position, const uint8_t* data, size_t size, void* dst)> cpu;
};

// Samples per decoder, for the log line at the end and for tests.
struct GpuDecodeCounts {
  uint64_t hardware = 0, hybrid = 0, cpu = 0;
};

class GpuDecodeStage {
 public:
  // Loads nvJPEG, creates the lanes and the device staging (num_slots batches of uint8 NHWC).
  // Errors say what is missing and what to do.
  static Result<std::unique_ptr<GpuDecodeStage>> Make(const GpuDecodeOptions& o);
  // For --decode auto: whether nvJPEG loads and `device` has a hardware JPEG decoder. `why`
  // says what was found either way.
  static bool HardwareAvailable(int device, std::string* why);
  ~GpuDecodeStage();
  GpuDecodeStage(const GpuDecodeStage&) = delete;
  GpuDecodeStage& operator=(const GpuDecodeStage&) = delete;

  // On a worker thread, for the sample at `host_dst` (its uint8 NHWC place in the host
  // staging area): keeps `bytes` in `out` for the GPU with the box `crop` gives, or runs `cpu`
  // on them into host_dst. Progressive JPEGs go to the CPU where this GPU has JPEG engines:
  // they cannot take them, and the hybrid backend would decode them on the lane's thread
  // while the engines wait.
  Status Prepare(std::vector<uint8_t> bytes, const CropFor& crop, const CpuFallback& cpu, GpuSample* out,
                 void* host_dst) const;

  // On lane thread `lane`: decodes and augments the batch's GPU samples into its slot's device
  // staging, copies the CPU ones up, each at its own position (a failed one takes its
  // ReplacementFor's, as the pool does on the host), and waits for the GPU. Failures found
  // here are added to batch.failures. Returns how many samples the GPU decoded.
  Result<uint32_t> Finish(int lane, GpuBatch& batch);

  const uint8_t* device_staging(uint32_t slot) const;
  int device() const;
  int lanes() const;
  bool hardware() const;  // the JPEG engines decode (else the hybrid backend)
  const AugmentOptions& augment() const;
  GpuDecodeCounts counts() const;
  // "nvJPEG hardware backend on cuda:0" or "nvJPEG GPU hybrid backend on cuda:0".
  std::string description() const;

  struct Impl;

 private:
  explicit GpuDecodeStage(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Which GPUs decode a producer's batches (serve --decode, --device, --gpu-lanes, --cpu-share).
struct GpuDecodeRequest {
  std::string name;          // the producer's, for its log lines
  DecodeMode mode = DecodeMode::kAuto;
  std::vector<int> devices;  // the rings' devices, in order
  GpuDecodeOptions stage;    // every decoding GPU's stage, its `device` set per GPU
  // What the CPU workers decode of each batch beside the GPU. Unset: the mode's own, a share
  // that follows demand under auto, none under gpu.
  std::optional<CpuShare> cpu_share;
};

// The GPU side of a producer's decoding: one stage per decoding GPU (none: the CPU decodes
// everything) and the share of each batch the CPU workers take beside them.
struct GpuDecode {
  std::vector<std::unique_ptr<GpuDecodeStage>> stages;
  CpuShare share;
};

// The stages and share for a request, and a log line that says what was chosen (and why, under
// auto: with devices the hardware engine decodes where there is one, the CPU elsewhere). Each
// GPU decodes its share of the batches (Pipeline), so decode capacity grows with the JPEG
// engines; under auto a device without an engine is left out of decoding (its ring is still
// filled, peer to peer).
Result<GpuDecode> MakeGpuDecode(const GpuDecodeRequest& r);

}  // namespace coloader
