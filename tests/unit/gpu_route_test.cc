// Which files --decode gpu hands to nvJPEG and which to the CPU decoder (ScanJpegFrame,
// GpuDecodable), on the fixtures in tests/data and on hand-made headers.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <utility>

#include "pipeline/decode/gpu_decode.h"
#include "tests/support/test_support.h"

namespace coloader {
namespace {

std::optional<JpegFrame> ScanFixture(const std::string& name) {
  const std::string bytes = testing::ReadFile(std::string(COLOADER_SOURCE_DIR) + "/tests/data/" + name);
  return ScanJpegFrame(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

TEST(GpuRoute, ProgressiveYCbCrGoesToTheGpu) {
  auto f = ScanFixture("progressive.jpg");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->sof, 0xC2);
  EXPECT_EQ(f->components, 3);
  EXPECT_EQ(f->width, 96);
  EXPECT_EQ(f->height, 72);
  EXPECT_TRUE(f->ends_with_eoi);
  EXPECT_TRUE(GpuDecodable(*f));
}

TEST(GpuRoute, GrayscaleGoesToTheGpuCmykTruncatedAndOtherFormatsStayOnTheCpu) {
  auto cmyk = ScanFixture("cmyk.jpg");
  ASSERT_TRUE(cmyk.has_value());
  EXPECT_EQ(cmyk->components, 4);
  EXPECT_FALSE(GpuDecodable(*cmyk));
  auto gray = ScanFixture("gray.jpg");
  ASSERT_TRUE(gray.has_value());
  EXPECT_EQ(gray->components, 1);
  EXPECT_TRUE(GpuDecodable(*gray));
  auto truncated = ScanFixture("truncated.jpg");
  ASSERT_TRUE(truncated.has_value());
  EXPECT_FALSE(truncated->ends_with_eoi);
  EXPECT_FALSE(GpuDecodable(*truncated));
  EXPECT_FALSE(ScanFixture("png_named.JPEG").has_value());
  EXPECT_FALSE(ScanFixture("not_an_image.jpg").has_value());
}

// Every PNG, WebP, TIFF, BMP and PNM fixture (tests/data/formats) goes to the CPU decoder,
// whatever its name says, and so do the CMYK and YCCK JPEGs; the plain JPEG goes to the GPU.
TEST(GpuRoute, EveryOtherFormatStaysOnTheCpu) {
  const std::string manifest = testing::ReadFile(std::string(COLOADER_SOURCE_DIR) + "/tests/data/formats/MANIFEST");
  int others = 0;
  size_t at = 0;
  while (at < manifest.size()) {
    size_t end = manifest.find('\n', at);
    if (end == std::string::npos) end = manifest.size();
    const std::string line = manifest.substr(at, end - at);
    at = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const std::string name = "formats/" + line.substr(0, line.find(' '));
    auto frame = ScanFixture(name);
    if (name.rfind("formats/jpeg_", 0) == 0) {
      ASSERT_TRUE(frame.has_value()) << name;
      EXPECT_EQ(GpuDecodable(*frame), name == "formats/jpeg_rgb.jpg") << name;
    } else {
      EXPECT_FALSE(frame.has_value()) << name << " scanned as a JPEG";
      ++others;
    }
  }
  EXPECT_GE(others, 50);
}

TEST(GpuRoute, BaselineFromTheTestImagesGoesToTheGpu) {
  testing::TempDir tmp;
  testing::MakeImageFolder(tmp.path(), 1, 1, 64, 48);
  const std::string bytes = testing::ReadFile(tmp.path() + "/class0/img00000.jpg");
  auto f = ScanJpegFrame(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->sof, 0xC0);
  EXPECT_EQ(f->width, 64);
  EXPECT_EQ(f->height, 48);
  EXPECT_TRUE(GpuDecodable(*f));
}

TEST(GpuRoute, BrokenAndHostileHeadersAreRefusedWithoutReadingPastTheEnd) {
  const std::vector<std::vector<uint8_t>> cases = {
      {},
      {0xFF, 0xD8},
      {0xFF, 0xD8, 0xFF},
      {0xFF, 0xD8, 0xFF, 0xE0, 0xFF, 0xFF},               // a segment longer than the file
      {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x01, 0xFF, 0xD9},   // a length below 2
      {0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x02, 0xFF, 0xD9},   // a scan before any frame
      {0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x04, 0x08, 0x00},   // a frame header cut short
  };
  for (const auto& c : cases) EXPECT_FALSE(ScanJpegFrame(c.data(), c.size()).has_value());
  // 65535 x 65535 claimed in a tiny file: routed to the CPU, which refuses it by name.
  const std::vector<uint8_t> huge = {0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x11, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0x03,
                                     1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1, 0xFF, 0xD9};
  auto f = ScanJpegFrame(huge.data(), huge.size());
  ASSERT_TRUE(f.has_value());
  EXPECT_FALSE(GpuDecodable(*f));
}

TEST(GpuRoute, DecodeModeParsesAndNamesBadValues) {
  EXPECT_EQ(*ParseDecodeMode("gpu"), DecodeMode::kGpu);
  EXPECT_EQ(*ParseDecodeMode("auto"), DecodeMode::kAuto);
  EXPECT_EQ(*ParseDecodeMode("cpu"), DecodeMode::kCpu);
  auto bad = ParseDecodeMode("nvjpeg");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'nvjpeg'"), std::string::npos);
}

}  // namespace
}  // namespace coloader
