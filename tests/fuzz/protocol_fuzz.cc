// libFuzzer target: the wire codec. Any byte string must decode to a message or an error
// value; a decoded message must re-encode to the bytes it came from (see fuzz_targets.h).
//   build-fuzz/tests/fuzz/protocol_fuzz tests/fuzz/corpus/protocol   (scripts/fuzz.sh)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken = coloader::fuzz::ProtocolOne(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "protocol_fuzz: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
