// Replays the fuzz targets' bodies (tests/fuzz/fuzz_targets.h) over every seed of the fuzz
// corpora, every crash the fuzzers found (tests/fuzz/regressions/<target>/, each minimised
// and kept once fixed) and the decode fixtures, in every build: a crash, a sanitizer report
// or a broken property here is a regression. One test per file, named after it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "tests/fuzz/fuzz_targets.h"

namespace coloader {
namespace {

namespace fs = std::filesystem;

struct Input {
  std::string target;  // "protocol", "decode", "tar" or "json"
  std::string path;
};

// gtest prints a parameter in the test's description (and ctest's test name): the path, not bytes.
void PrintTo(const Input& input, std::ostream* os) { *os << input.target << ":" << input.path; }

std::vector<Input> Inputs() {
  const fs::path root = COLOADER_SOURCE_DIR;
  const std::vector<std::pair<std::string, fs::path>> dirs = {
      {"protocol", root / "tests/fuzz/corpus/protocol"},   {"protocol", root / "tests/fuzz/regressions/protocol"},
      {"decode", root / "tests/fuzz/corpus/decode"},       {"decode", root / "tests/fuzz/regressions/decode"},
      {"decode", root / "tests/data"},
      {"tar", root / "tests/fuzz/corpus/tar"},           {"tar", root / "tests/fuzz/regressions/tar"},
      {"json", root / "tests/fuzz/corpus/json"},          {"json", root / "tests/fuzz/regressions/json"},
      {"yaml", root / "tests/fuzz/corpus/yaml"},          {"yaml", root / "tests/fuzz/regressions/yaml"},
  };
  std::vector<Input> inputs;
  for (const auto& [target, dir] : dirs) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.is_regular_file() && entry.path().filename().string()[0] != '.' &&
          entry.path().extension() != ".md") {
        inputs.push_back({target, entry.path().string()});
      }
    }
  }
  std::sort(inputs.begin(), inputs.end(), [](const Input& a, const Input& b) { return a.path < b.path; });
  return inputs;
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class FuzzRegressionTest : public ::testing::TestWithParam<Input> {};

TEST_P(FuzzRegressionTest, ReplaysWithoutCrashOrBrokenProperty) {
  const Input& input = GetParam();
  const std::vector<uint8_t> bytes = ReadFile(input.path);
  ASSERT_FALSE(bytes.empty() && fs::file_size(input.path) != 0) << "cannot read " << input.path;
  const std::string broken = input.target == "protocol" ? fuzz::ProtocolOne(bytes.data(), bytes.size())
                             : input.target == "tar"    ? fuzz::TarOne(bytes.data(), bytes.size())
                             : input.target == "json"   ? fuzz::JsonOne(bytes.data(), bytes.size())
                             : input.target == "yaml"   ? fuzz::YamlOne(bytes.data(), bytes.size())
                                                        : fuzz::DecodeOne(bytes.data(), bytes.size());
  EXPECT_EQ(broken, "") << input.path;
}

std::string TestName(const ::testing::TestParamInfo<Input>& info) {
  const fs::path p(info.param.path);
  std::string name = info.param.target + "_" + p.parent_path().filename().string() + "_" + p.filename().string();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Corpus, FuzzRegressionTest, ::testing::ValuesIn(Inputs()), TestName);

// The protocol seeds are fuzzing's starting points: a seed that no longer decodes (the
// protocol changed) explores nothing past the header.
TEST(FuzzCorpusTest, ProtocolSeedsDecode) {
  int seeds = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(COLOADER_SOURCE_DIR) / "tests/fuzz/corpus/protocol")) {
    const std::vector<uint8_t> bytes = ReadFile(entry.path().string());
    Result<Message> m = Decode(bytes.data(), bytes.size());
    EXPECT_TRUE(m.ok()) << entry.path() << ": " << m.status().ToString()
                        << "; regenerate the seeds: build/tests/make_protocol_corpus tests/fuzz/corpus/protocol";
    ++seeds;
  }
  EXPECT_GE(seeds, 10);
}

// Regression (found reading the decoder for the fuzz harness): GetSlotTable checked
// `offset + 8 * P > slot_bytes` in uint64_t arithmetic that wraps, so a Welcome whose offset
// was near 2^64 passed, and the consumer would then read `slot base + offset`.
TEST(ProtocolRegressionTest, SlotTableOffsetsThatWrapAreRejected) {
  Welcome w;
  w.slots.shm_name = "/x";
  w.slots.num_slots = 1;
  w.slots.batch_size = 1;
  w.slots.height = w.slots.width = w.slots.channels = 1;
  w.slots.slot_bytes = 64;
  w.slots.indices_offset = ~uint64_t{0} - 7;  // + 8 * 1 wraps to 0
  w.slots.labels_offset = 8;
  w.slots.data_offset = 16;
  const std::vector<uint8_t> bytes = Encode(w);
  EXPECT_FALSE(Decode(bytes.data(), bytes.size()).ok()) << "indices at offset 2^64 - 8 of a 64-byte slot";
  w.slots.indices_offset = 0;
  w.slots.height = w.slots.width = 1u << 31;  // sample_bytes() = 2^62 * 3 wraps; P * that too
  w.slots.channels = 4;                        // 2^64: sample_bytes() == 0
  const std::vector<uint8_t> huge = Encode(w);
  EXPECT_FALSE(Decode(huge.data(), huge.size()).ok()) << "a 2^31 x 2^31 x 4 sample in a 64-byte slot";
}

}  // namespace
}  // namespace coloader
