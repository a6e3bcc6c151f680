// libFuzzer target: the YAML reader (ParseYaml, libyaml's events). Any byte string must come back
// as a value or an error Status with a short message.
//   build-fuzz/tests/fuzz/yaml_fuzz tests/fuzz/corpus/yaml   (scripts/fuzz.sh)
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
