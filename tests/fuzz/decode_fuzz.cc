// libFuzzer target: image decoding (Decoder::Peek, DecodeRgb at every DCT scale, and
// SampleTransform::RunBytes). Any byte string must come back as an image or an error Status.
//   build-fuzz/tests/fuzz/decode_fuzz tests/fuzz/corpus/decode   (scripts/fuzz.sh)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken = coloader::fuzz::DecodeOne(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "decode_fuzz: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
