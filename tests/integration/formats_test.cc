// An ImageFolder as torchvision reads one: JPEGs mixed with every other format it accepts
// (PNG, some behind .JPEG names, WebP, TIFF, BMP, PPM/PGM), served by a real `coloader serve`
// and read by a real `coloader consume --json`, with --decode cpu and (on a GPU machine)
// --decode gpu. Every file must be decoded: an exact epoch over all of them, and not one
// "skipped bad file" from the producer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/test_support.h"

namespace coloader {
namespace {

namespace fs = std::filesystem;
using testing::Child;
using testing::Coloader;
using testing::ParseJsonLines;

// Copies every fixture of tests/data/formats (or $COLOADER_TEST_DATA/formats) into the folder's
// two classes, each under an extension torchvision accepts, and a few PNGs again behind
// .JPEG names. Returns how many files it wrote.
int AddEveryFormat(const std::string& data) {
  const char* env = std::getenv("COLOADER_TEST_DATA");
  const std::string dir =
      (env && *env ? std::string(env) : std::string(COLOADER_SOURCE_DIR) + "/tests/data") + "/formats/";
  std::ifstream manifest(dir + "MANIFEST");
  std::string line;
  int n = 0;
  while (std::getline(manifest, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find(' '));
    const std::string bytes = testing::ReadFile(dir + name);
    // .pbm is not one of torchvision's extensions; a bitmap is read by content anyway.
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".pbm") == 0) name.replace(name.size() - 4, 4, ".ppm");
    testing::WriteFile(data + "/class" + std::to_string(n % 2) + "/zz_" + name, bytes);
    ++n;
    if (name.rfind("png_", 0) == 0 && n % 3 == 0) {  // ImageNet's way: PNG bytes, JPEG name
      testing::WriteFile(data + "/class" + std::to_string(n % 2) + "/n0144_" + std::to_string(n) + ".JPEG", bytes);
      ++n;
    }
  }
  return n;
}

// --decode cpu everywhere; --decode gpu where a GPU is (its routing sends every one of these
// files but the plain JPEGs to the CPU decoder: none may be lost on the way).
class FormatsEndToEnd : public ::testing::TestWithParam<std::string> {};

TEST_P(FormatsEndToEnd, AnImageFolderOfEveryFormatIsServedExactlyWithNoBadFile) {
  const bool gpu = GetParam() == "gpu";
  // The NVIDIA driver's control node: present wherever a GPU can be used.
  if (gpu && !fs::exists("/dev/nvidiactl")) GTEST_SKIP() << "no NVIDIA GPU on this machine";
  testing::TempDir tmp;
  const std::string data = tmp.path() + "/data";
  const int jpegs = testing::MakeImageFolder(data, 24, 2);
  const int others = AddEveryFormat(data);
  ASSERT_GE(others, 60) << "tests/data/formats is missing fixtures";
  const uint64_t total = uint64_t(jpegs) + uint64_t(others);

  const std::map<std::string, std::string> env = {{"COLOADER_RUN_DIR", tmp.path() + "/run"}};
  std::vector<std::string> serve = {"serve", "--data", data, "--name", "formats", "--image-size", "32",
                                    "--workers", "2", "--batch-size", "8", "--epochs", "2", "--quiet"};
  std::vector<std::string> consume = {"consume", "--name", "formats", "--json"};
  if (gpu) {
    serve.insert(serve.end(), {"--device", "cuda:0", "--decode", "gpu", "--output", "uint8"});
    consume.push_back("--device");
  }
  Child producer(Coloader(serve), env);
  ASSERT_TRUE(producer.WaitForStderr("serving", 20000)) << producer.Stderr();
  Child consumer(Coloader(consume), env);
  ASSERT_EQ(consumer.Wait(120000), 0) << consumer.Stderr();
  ASSERT_EQ(producer.Wait(), 0) << producer.Stderr();
  const auto epochs = ParseJsonLines(consumer.Stdout());
  ASSERT_EQ(epochs.size(), 2u) << consumer.Stdout();
  for (const auto& e : epochs) testing::ExpectExactEpoch(e, total);
  EXPECT_EQ(producer.Stderr().find("skipped bad file"), std::string::npos) << producer.Stderr();
}

INSTANTIATE_TEST_SUITE_P(Decode, FormatsEndToEnd, ::testing::Values("cpu", "gpu"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace coloader
