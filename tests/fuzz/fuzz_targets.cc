#include "tests/fuzz/fuzz_targets.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "common/protocol.h"
#include "pipeline/assemble/sample_transform.h"
#include "pipeline/decode/decode.h"
#include "pipeline/source/tar_index.h"
#include "pipeline/source/webdataset.h"
#include "toolbox/json_reader.h"

namespace coloader::fuzz {

namespace {

// The harness's own bound on decoded images. The decoder accepts what its header states up to
// kMaxImagePixels (192 MB of RGB from a 200-byte file), so without a tighter bound runs would
// spend their time allocating and filling large images instead of looking further. Images
// above the bound are peeked (header only, every format) but not decoded.
constexpr uint64_t kMaxFuzzPixels = uint64_t{1} << 22;

std::string Hex(const std::vector<uint8_t>& v, size_t limit = 64) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < v.size() && i < limit; ++i) {
    out += kDigits[v[i] >> 4];
    out += kDigits[v[i] & 15];
  }
  if (v.size() > limit) out += "...";
  return out;
}

uint64_t Scaled(int full, int denom) { return (static_cast<uint64_t>(full) + denom - 1) / denom; }

}  // namespace

std::string ProtocolOne(const uint8_t* data, size_t size) {
  // Only a successful decode has a property to check; any error value is a right answer.
  Result<Message> first = Decode(data, size);
  if (!first.ok()) {
    if (first.status().ok()) return "Decode failed with an OK status";
    return "";
  }
  const std::vector<uint8_t> encoded = Encode(*first);
  Result<Message> second = Decode(encoded.data(), encoded.size());
  if (!second.ok()) {
    return std::string("the re-encoding of a decoded ") + MessageTypeName(*first) +
           " does not decode: " + second.status().ToString();
  }
  if (second->index() != first->index()) {
    return std::string("a ") + MessageTypeName(*first) + " re-decodes as a " + MessageTypeName(*second);
  }
  const std::vector<uint8_t> again = Encode(*second);
  if (again != encoded) {
    return std::string("the ") + MessageTypeName(*first) + " round trip changed the encoding: " + Hex(encoded) +
           " -> " + Hex(again);
  }
  if (encoded != std::vector<uint8_t>(data, data + size)) {
    return std::string("a ") + MessageTypeName(*first) + " has a second encoding: " +
           Hex(std::vector<uint8_t>(data, data + size)) + " re-encodes as " + Hex(encoded);
  }
  return "";
}

std::string DecodeOne(const uint8_t* data, size_t size) {
  // One decoder and two transforms for the whole run, as a producer worker keeps them: state
  // left behind by a bad input (the TurboJPEG handle's error state) must not break the next.
  static Decoder decoder;
  static const std::unique_ptr<SampleTransform> transforms[] = {
      [] {
        TransformOptions o;
        o.augment.mode = AugmentMode::kTrain;
        o.augment.size = 16;
        o.output = DType::kUInt8;
        o.layout = TensorLayout::kNHWC;
        return std::make_unique<SampleTransform>(o);
      }(),
      [] {
        TransformOptions o;
        o.augment.mode = AugmentMode::kEval;
        o.augment.flip_probability = 0;
        o.augment.size = 12;
        o.output = DType::kFloat32;
        o.layout = TensorLayout::kNCHW;
        return std::make_unique<SampleTransform>(o);
      }(),
  };
  static std::vector<uint8_t> out;

  const std::string path = "fuzz-input";
  Result<ImageInfo> info = decoder.Peek(data, size, path);
  if (!info.ok()) {
    if (info.status().ok()) return "Peek failed with an OK status";
    return "";
  }
  const uint64_t pixels = static_cast<uint64_t>(info->width) * static_cast<uint64_t>(info->height);
  for (int denom : {1, 2, 4, 8}) {
    const int d = info->kind == ImageKind::kJpeg ? denom : 1;  // other formats ignore it
    const uint64_t w = Scaled(info->width, d), h = Scaled(info->height, d);
    if (w * h > kMaxFuzzPixels) continue;
    Result<cv::Mat> rgb = decoder.DecodeRgb(data, size, denom, path);
    if (!rgb.ok()) {
      if (rgb.status().ok()) return "DecodeRgb failed with an OK status";
      continue;
    }
    if (rgb->type() != CV_8UC3 || static_cast<uint64_t>(rgb->cols) != w || static_cast<uint64_t>(rgb->rows) != h) {
      return "DecodeRgb at 1/" + std::to_string(denom) + " gave " + std::to_string(rgb->cols) + "x" +
             std::to_string(rgb->rows) + " (type " + std::to_string(rgb->type()) + ") where Peek said " +
             std::to_string(info->width) + "x" + std::to_string(info->height);
    }
  }
  // RunBytes decodes JPEGs at the DCT scale it picks for a small output (1/8 for a large
  // image); anything else at full size.
  if (pixels > (info->kind == ImageKind::kJpeg ? 64 * kMaxFuzzPixels : kMaxFuzzPixels)) return "";
  uint64_t index = size;
  for (const auto& t : transforms) {
    out.assign(t->sample_bytes(), 0);
    Status st = t->RunBytes(data, size, path, /*seed=*/size, /*epoch=*/0, index++, out.data());
    (void)st;  // an error is a right answer for a bad file; returning at all is the property
  }
  return "";
}

std::string TarOne(const uint8_t* data, size_t size) {
  Result<TarIndex> r = IndexTarBytes(data, size, "fuzz.tar");
  if (!r.ok()) return "";
  for (const TarMember& m : r->members) {
    if (m.offset > size || m.size > size - m.offset)
      return "member '" + m.name + "' at " + std::to_string(m.offset) + "+" + std::to_string(m.size) +
             " lies outside the " + std::to_string(size) + " bytes";
  }
  // The shard as `serve` lists it: members grouped into samples, labels read from KEY.cls or
  // from KEY.json's field (--label-field). A shard in memory (memfd), read in place by path.
  static const int fd = ::memfd_create("fuzz-shard", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return "";
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  for (const char* field : {"", "label"}) {
    std::vector<Sample> samples;
    std::vector<std::string> notes;
    ShardListing listing;
    listing.label_field = field;
    if (!ListShardSamples({path}, &samples, &notes, listing).ok()) continue;
    for (const Sample& s : samples) {
      if (s.offset > size || s.size > size - s.offset)
        return "sample '" + s.member + "' lies outside the " + std::to_string(size) + " bytes";
      if (s.label < -1) return "sample '" + s.member + "' has label " + std::to_string(s.label);
    }
  }
  return "";
}

namespace {

// A reader's result: "" when it is a value or an error of at most 1 KiB (a hostile value is
// quoted by its start and length).
std::string Briefly(const Result<JsonValue>& v, const char* reader) {
  if (v.ok() || v.status().message().size() <= 1024) return "";
  return std::string(reader) + "'s error is " + std::to_string(v.status().message().size()) + " characters long";
}

}  // namespace

std::string JsonOne(const uint8_t* data, size_t size) {
  // JSON: what comes from outside (a sample's KEY.json, a resume state), through yaml-cpp. yaml-cpp
  // 0.7 exhausts its memory on some malformed flow collections (this target's first findings,
  // tests/fuzz/regressions/json): the reader's own pre-pass refuses them first.
  return Briefly(ParseJson(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json"), "ParseJson");
}

std::string YamlOne(const uint8_t* data, size_t size) {
  return Briefly(ParseYaml(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml"), "ParseYaml");
}

}  // namespace coloader::fuzz
