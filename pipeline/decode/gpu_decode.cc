// The parts of --decode gpu that need no GPU: the option, the JPEG frame scan that routes
// each file, the worker-side routing, and which GPUs decode (gpu_decode_nvjpeg.cc has the rest).
#include "pipeline/decode/gpu_decode.h"

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "pipeline/decode/decode.h"

namespace coloader {

Result<DecodeMode> ParseDecodeMode(const std::string& s) {
  if (s == "cpu") return DecodeMode::kCpu;
  if (s == "gpu") return DecodeMode::kGpu;
  if (s == "auto") return DecodeMode::kAuto;
  return Status::Invalid("--decode must be cpu, gpu or auto, got '" + s + "'");
}

bool GpuDecodable(const JpegFrame& f) {
  const bool huffman_dct = f.sof == 0xC0 || f.sof == 0xC1 || f.sof == 0xC2;
  // Grayscale too: nvJPEG writes its one channel into all three of the RGB output.
  const bool ycbcr_or_gray = (f.components == 3 && !f.adobe_no_transform) || f.components == 1;
  return f.ends_with_eoi && huffman_dct && f.precision == 8 && ycbcr_or_gray &&
         f.width > 0 && f.height > 0 && f.width <= kMaxImageSide && f.height <= kMaxImageSide &&
         uint64_t(f.width) * uint64_t(f.height) <= kMaxImagePixels;
}

Status GpuDecodeStage::Prepare(std::vector<uint8_t> bytes, const CropFor& crop, const CpuFallback& cpu,
                               GpuSample* out, void* host_dst) const {
  out->on_gpu = false;
  const std::optional<JpegFrame> frame = ScanJpegFrame(bytes.data(), bytes.size());
  const bool progressive = frame && frame->sof == 0xC2;
  if (!frame || !GpuDecodable(*frame) || (progressive && hardware())) {
    // The CPU path, unchanged: its decoder, its errors, its DCT scaling.
    return cpu(bytes.data(), bytes.size(), host_dst);
  }
  out->box = crop(frame->width, frame->height);
  out->width = frame->width;
  out->height = frame->height;
  out->bytes = std::move(bytes);
  out->on_gpu = true;
  return Status::OK();
}

Result<GpuDecode> MakeGpuDecode(const GpuDecodeRequest& r) {
  const char* name = r.name.c_str();
  GpuDecode out;
  if (r.mode == DecodeMode::kCpu) return out;
  if (r.devices.empty()) {
    if (r.mode == DecodeMode::kGpu)
      return Status::Invalid("--decode gpu decodes on the GPU of the ring: add --device cuda:N");
    LogLine("[coloader %s] decode: cpu (--decode auto: no --device)\n", name);
    return out;
  }
  std::vector<int> decoders = r.devices;
  std::string why;
  if (r.mode == DecodeMode::kAuto) {
    if (r.stage.batch_size > kMaxGpuDecodeBatch) {
      LogLine("[coloader %s] decode: cpu (--decode auto: batches over %u samples)\n", name, kMaxGpuDecodeBatch);
      return out;
    }
    if (!GpuDecodeStage::HardwareAvailable(r.devices[0], &why)) {
      LogLine("[coloader %s] decode: cpu (--decode auto: %s)\n", name, why.c_str());
      return out;
    }
    decoders.erase(std::remove_if(decoders.begin() + 1, decoders.end(),
                                  [](int d) {
                                    std::string unused;
                                    return !GpuDecodeStage::HardwareAvailable(d, &unused);
                                  }),
                   decoders.end());
  }
  // auto: the workers take what the engines cannot, as demand requires; gpu: the engines alone.
  out.share = r.cpu_share.value_or(r.mode == DecodeMode::kAuto ? CpuShare{} : CpuShare{false, 0});
  const std::string split =
      out.share.adaptive ? "the CPU workers decode a share of each batch that follows demand (--cpu-share auto)"
      : out.share.fixed == 0 ? "the CPU workers decode only what the GPU cannot (--cpu-share 0)"
                             : "the CPU workers decode " + CpuShareName(out.share) + " of each batch (--cpu-share)";
  for (int d : decoders) {
    GpuDecodeOptions g = r.stage;
    g.device = d;
    COLOADER_ASSIGN_OR_RETURN(std::unique_ptr<GpuDecodeStage> stage, GpuDecodeStage::Make(g));
    if (r.mode == DecodeMode::kAuto && out.stages.empty()) {
      LogLine("[coloader %s] decode: auto (%s; %s; --decode auto found the %s)\n", name, stage->description().c_str(),
              split.c_str(), why.c_str());
    } else {
      LogLine("[coloader %s] decode: %s (%s; %s)\n", name, r.mode == DecodeMode::kAuto ? "auto" : "gpu",
              stage->description().c_str(), split.c_str());
    }
    out.stages.push_back(std::move(stage));
  }
  return out;
}

}  // namespace coloader
