// libFuzzer target: the JSON reader (ParseJson). Any byte string must come back as a value or an
// error Status with a short message.
//   build-fuzz/tests/fuzz/json_fuzz tests/fuzz/corpus/json   (scripts/fuzz.sh)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken = coloader::fuzz::JsonOne(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "json_fuzz: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
