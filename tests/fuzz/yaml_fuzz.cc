// libFuzzer target: the YAML reader (ParseYaml). Any byte string must come back as a value or an
// error Status with a short message. Not in scripts/fuzz.sh's default targets (yaml-cpp's own
// hangs: fuzz_targets.h); run it by name:
//   scripts/fuzz.sh yaml      (starts from tests/fuzz/corpus/yaml)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken = coloader::fuzz::YamlOne(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "yaml_fuzz: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
