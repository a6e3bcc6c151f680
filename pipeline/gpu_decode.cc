// The parts of --decode gpu that need no GPU: the option, the JPEG frame scan that routes
// each file, the worker-side routing, and which GPUs decode (gpu_decode_nvjpeg.cc has the rest).
#include "pipeline/gpu_decode.h"

#include <algorithm>
#include <cstring>

#include "common/log_line.h"
#include "pipeline/decode.h"
#include "pipeline/transform.h"

namespace coloader {

Result<DecodeMode> ParseDecodeMode(const std::string& s) {
  if (s == "cpu") return DecodeMode::kCpu;
  if (s == "gpu") return DecodeMode::kGpu;
  if (s == "auto") return DecodeMode::kAuto;
  return Status::Invalid("--decode must be cpu, gpu or auto, got '" + s + "'");
}

namespace {
int BigEndian16(const uint8_t* p) { return (p[0] << 8) | p[1]; }
bool IsFrameMarker(int m) {
  // SOF0..SOF15 less DHT (C4), JPG (C8) and DAC (CC).
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}
}  // namespace

std::optional<JpegFrame> ScanJpegFrame(const uint8_t* data, size_t size) {
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return std::nullopt;
  JpegFrame f;
  f.ends_with_eoi = JpegEndsWithEoi(data, size);
  size_t pos = 2;
  while (pos + 4 <= size) {
    if (data[pos] != 0xFF) return std::nullopt;
    while (pos < size && data[pos] == 0xFF) ++pos;  // fill bytes
    if (pos + 3 > size) return std::nullopt;
    const int marker = data[pos];
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  // no length
      ++pos;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return std::nullopt;  // scan before any frame header
    const size_t length = static_cast<size_t>(BigEndian16(data + pos + 1));
    const uint8_t* seg = data + pos + 3;
    if (length < 2 || pos + 1 + length > size) return std::nullopt;
    const size_t seg_len = length - 2;
    if (marker == 0xEE && seg_len >= 12 && std::memcmp(seg, "Adobe", 5) == 0) {
      f.adobe_no_transform = seg[11] == 0;
    } else if (IsFrameMarker(marker)) {
      if (seg_len < 6) return std::nullopt;
      f.sof = marker;
      f.precision = seg[0];
      f.height = BigEndian16(seg + 1);
      f.width = BigEndian16(seg + 3);
      f.components = seg[5];
      return f;
    }
    pos += 1 + length;
  }
  return std::nullopt;
}

bool GpuDecodable(const JpegFrame& f) {
  const bool huffman_dct = f.sof == 0xC0 || f.sof == 0xC1 || f.sof == 0xC2;
  return f.ends_with_eoi && huffman_dct && f.precision == 8 && f.components == 3 && !f.adobe_no_transform &&
         f.width > 0 && f.height > 0 && f.width <= kMaxImageSide && f.height <= kMaxImageSide &&
         uint64_t(f.width) * uint64_t(f.height) <= kMaxImagePixels;
}

Status GpuDecodeStage::Prepare(SampleTransform& cpu, const AugmentOptions& augment, std::vector<uint8_t> bytes,
                               const std::string& path, uint64_t seed, uint64_t epoch, uint64_t index, GpuSample* out,
                               void* host_dst) {
  out->on_gpu = false;
  const std::optional<JpegFrame> frame = ScanJpegFrame(bytes.data(), bytes.size());
  if (!frame || !GpuDecodable(*frame)) {
    // The CPU path, unchanged: its decoder, its errors, its DCT scaling.
    return cpu.RunBytes(bytes.data(), bytes.size(), path, seed, epoch, index, host_dst);
  }
  SampleRng rng(seed, epoch, index);
  out->box = SampleCrop(frame->width, frame->height, augment, rng);
  out->width = frame->width;
  out->height = frame->height;
  out->bytes = std::move(bytes);
  out->on_gpu = true;
  return Status::OK();
}

Result<std::vector<std::unique_ptr<GpuDecodeStage>>> MakeGpuDecodeStages(const GpuDecodeRequest& r) {
  using Stages = std::vector<std::unique_ptr<GpuDecodeStage>>;
  const char* name = r.name.c_str();
  if (r.mode == DecodeMode::kCpu) return Stages();
  if (r.devices.empty()) {
    if (r.mode == DecodeMode::kGpu)
      return Status::Invalid("--decode gpu decodes on the GPU of the ring: add --device cuda:N");
    LogLine("[coloader %s] decode: cpu (--decode auto: no --device)\n", name);
    return Stages();
  }
  std::vector<int> decoders = r.devices;
  std::string why;
  if (r.mode == DecodeMode::kAuto) {
    if (r.batch_size > kMaxGpuDecodeBatch) {
      LogLine("[coloader %s] decode: cpu (--decode auto: batches over %u samples)\n", name, kMaxGpuDecodeBatch);
      return Stages();
    }
    if (!GpuDecodeStage::HardwareAvailable(r.devices[0], &why)) {
      LogLine("[coloader %s] decode: cpu (--decode auto: %s)\n", name, why.c_str());
      return Stages();
    }
    decoders.erase(std::remove_if(decoders.begin() + 1, decoders.end(),
                                  [](int d) {
                                    std::string unused;
                                    return !GpuDecodeStage::HardwareAvailable(d, &unused);
                                  }),
                   decoders.end());
  }
  Stages stages;
  for (int d : decoders) {
    GpuDecodeOptions g;
    g.device = d;
    g.num_slots = r.num_slots;
    g.batch_size = r.batch_size;
    g.augment = r.augment;
    g.lanes = r.lanes;
    COLOADER_ASSIGN_OR_RETURN(std::unique_ptr<GpuDecodeStage> stage, GpuDecodeStage::Make(g));
    if (r.mode == DecodeMode::kAuto && stages.empty()) {
      LogLine("[coloader %s] decode: gpu (%s; --decode auto found the %s)\n", name, stage->description().c_str(),
              why.c_str());
    } else {
      LogLine("[coloader %s] decode: gpu (%s)\n", name, stage->description().c_str());
    }
    stages.push_back(std::move(stage));
  }
  return stages;
}

}  // namespace coloader
