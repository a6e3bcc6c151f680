// libFuzzer target: the tar index of WebDataset shards (IndexTarBytes). Any byte string must
// come back as members inside it or an error Status.
//   build-fuzz/tests/fuzz/tar_fuzz tests/fuzz/corpus/tar   (scripts/fuzz.sh)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken = coloader::fuzz::TarOne(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "tar_fuzz: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
