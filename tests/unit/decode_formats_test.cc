// Decoder on every format and variant torchvision's ImageFolder meets besides plain JPEG: PNG
// (8/16-bit, palette with and without tRNS, grey, grey+alpha, RGBA), WebP (lossy, lossless,
// alpha, animated), TIFF (strips, tiles, both byte orders, grey, palette, 16-bit, CMYK,
// compressions), BMP (1/4/8/16/24/32-bit, RLE8, top-down, OS/2), PNM (P1-P6, maxval other than
// 255, 16-bit) and CMYK/YCCK JPEG. Each fixture in tests/data/formats/ has beside it the pixels
// Pillow's Image.open(f).convert("RGB") gives (scripts/make_test_fixtures.py), which is what
// torchvision's default loader gives; the decoder must agree within 1 per channel. Then every
// fixture cut short, and hostile headers, must be an error naming the file.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "pipeline/decode/decode.h"
#include "tests/support/test_support.h"

namespace coloader {
namespace {

using Bytes = std::vector<uint8_t>;

const std::string kDir = std::string(COLOADER_SOURCE_DIR) + "/tests/data/formats/";

struct Fixture {
  std::string name;
  int width = 0, height = 0;
};

void PrintTo(const Fixture& f, std::ostream* os) { *os << f.name; }

std::vector<Fixture> Manifest() {
  std::vector<Fixture> out;
  std::ifstream in(kDir + "MANIFEST");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    Fixture f;
    fields >> f.name >> f.width >> f.height;
    out.push_back(f);
  }
  return out;
}

Bytes Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The kind the fixture's name announces (its prefix), whatever its extension says.
ImageKind KindOf(const std::string& name) {
  if (name.rfind("png_", 0) == 0) return ImageKind::kPng;
  if (name.rfind("webp_", 0) == 0) return ImageKind::kWebp;
  if (name.rfind("tiff_", 0) == 0) return ImageKind::kTiff;
  if (name.rfind("bmp_", 0) == 0) return ImageKind::kBmp;
  if (name.rfind("pnm_", 0) == 0) return ImageKind::kPnm;
  if (name.rfind("jpeg_", 0) == 0) return ImageKind::kJpeg;
  return ImageKind::kOther;
}

class FormatFixtureTest : public ::testing::TestWithParam<Fixture> {
 protected:
  Decoder decoder_;
};

TEST_P(FormatFixtureTest, MatchesPillowsConvertRgbWithinOne) {
  const Fixture& f = GetParam();
  const Bytes bytes = Read(kDir + f.name);
  const Bytes want = Read(kDir + f.name + ".rgb");
  ASSERT_FALSE(bytes.empty()) << "missing fixture " << f.name << " (run scripts/make_test_fixtures.py)";
  ASSERT_EQ(want.size(), size_t(f.width) * f.height * 3) << f.name << ".rgb";

  ASSERT_OK_AND_ASSIGN(ImageInfo info, decoder_.Peek(bytes.data(), bytes.size(), f.name));
  EXPECT_EQ(info.kind, KindOf(f.name)) << ImageKindName(info.kind);
  EXPECT_EQ(info.width, f.width);
  EXPECT_EQ(info.height, f.height);

  // Scaling applies to JPEG only; every other format comes back at full size.
  ASSERT_OK_AND_ASSIGN(cv::Mat rgb, decoder_.DecodeRgb(bytes.data(), bytes.size(), 1, f.name));
  ASSERT_EQ(rgb.type(), CV_8UC3);
  ASSERT_EQ(rgb.cols, f.width);
  ASSERT_EQ(rgb.rows, f.height);
  int worst = 0, wx = 0, wy = 0, wc = 0;
  for (int y = 0; y < rgb.rows; ++y) {
    const uint8_t* got = rgb.ptr<uint8_t>(y);
    const uint8_t* ref = want.data() + size_t(y) * f.width * 3;
    for (int i = 0; i < f.width * 3; ++i) {
      const int d = std::abs(int(got[i]) - int(ref[i]));
      if (d > worst) worst = d, wx = i / 3, wy = y, wc = i % 3;
    }
  }
  EXPECT_LE(worst, 1) << f.name << ": pixel (" << wx << ", " << wy << ") channel " << wc << " is "
                      << int(rgb.ptr<uint8_t>(wy)[3 * wx + wc]) << ", Pillow gives "
                      << int(want[(size_t(wy) * f.width + wx) * 3 + wc]);
}

TEST_P(FormatFixtureTest, CutShortIsAnErrorNamingTheFileNeverACrash) {
  const Fixture& f = GetParam();
  const Bytes bytes = Read(kDir + f.name);
  ASSERT_FALSE(bytes.empty());
  const std::string path = "/data/cut/" + f.name;
  // Every length from nothing to the whole file but its last bytes (formats may end with an
  // optional trailer): the decoder either refuses it, naming the file, or gives an image of
  // the size its header states. Half the file is always an error.
  const size_t step = std::max<size_t>(1, bytes.size() / 97);
  for (size_t n = 0; n < bytes.size(); n += step) {
    Result<cv::Mat> rgb = decoder_.DecodeRgb(bytes.data(), n, 1, path);
    if (rgb.ok()) {
      EXPECT_EQ(rgb->cols, f.width) << n;
      EXPECT_EQ(rgb->rows, f.height) << n;
      EXPECT_GT(n, bytes.size() / 2) << f.name << " cut to " << n << " bytes decoded without error";
    } else {
      EXPECT_EQ(rgb.status().message().rfind(path + ": ", 0), 0u) << rgb.status().message();
    }
  }
}

std::string FixtureName(const ::testing::TestParamInfo<Fixture>& info) {
  std::string s = info.param.name;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FormatFixtureTest, ::testing::ValuesIn(Manifest()), FixtureName);

TEST(FormatFixtures, ManifestCoversEveryFormat) {
  std::vector<int> seen(7, 0);
  for (const Fixture& f : Manifest()) ++seen[static_cast<int>(KindOf(f.name))];
  for (ImageKind k : {ImageKind::kJpeg, ImageKind::kPng, ImageKind::kWebp, ImageKind::kTiff, ImageKind::kBmp,
                      ImageKind::kPnm}) {
    EXPECT_GE(seen[static_cast<int>(k)], 3) << ImageKindName(k);
  }
  EXPECT_EQ(seen[static_cast<int>(ImageKind::kOther)], 0);
}

// --- Hostile headers: a few bytes claiming a huge image are refused before any allocation.

void PutLe16(Bytes& b, uint32_t v) { b.push_back(uint8_t(v)), b.push_back(uint8_t(v >> 8)); }
void PutLe32(Bytes& b, uint32_t v) { PutLe16(b, v & 0xFFFF), PutLe16(b, v >> 16); }

// DecodeRgb's verdict; Peek (header only) must refuse whatever the header alone condemns.
Status PeekAndDecode(const Bytes& b, const std::string& path) {
  Decoder d;
  Result<ImageInfo> info = d.Peek(b.data(), b.size(), path);
  Result<cv::Mat> rgb = d.DecodeRgb(b.data(), b.size(), 1, path);
  if (!info.ok()) {
    EXPECT_FALSE(rgb.ok()) << path << ": Peek refused what DecodeRgb accepted";
  }
  return rgb.status();
}

void ExpectImplausible(const Bytes& b, const std::string& path) {
  Decoder d;
  Result<ImageInfo> info = d.Peek(b.data(), b.size(), path);
  ASSERT_FALSE(info.ok()) << path;
  EXPECT_EQ(info.status().message().rfind(path + ": implausible image size", 0), 0u) << info.status().message();
  const Status st = PeekAndDecode(b, path);
  ASSERT_FALSE(st.ok()) << path;
  EXPECT_EQ(st.message().rfind(path + ": implausible image size", 0), 0u) << st.message();
}

TEST(HostileHeaders, BmpClaimingGigapixelsIsRefused) {
  Bytes b = {'B', 'M'};
  PutLe32(b, 70), PutLe32(b, 0), PutLe32(b, 54);
  PutLe32(b, 40), PutLe32(b, 60000), PutLe32(b, 60000), PutLe16(b, 1), PutLe16(b, 24);
  for (int i = 0; i < 6; ++i) PutLe32(b, 0);
  b.resize(70, 0);
  ExpectImplausible(b, "/data/huge.bmp");
}

TEST(HostileHeaders, BmpWithTooFewPixelBytesIsTruncated) {
  Bytes b = {'B', 'M'};
  PutLe32(b, 70), PutLe32(b, 0), PutLe32(b, 54);
  PutLe32(b, 40), PutLe32(b, 4000), PutLe32(b, 4000), PutLe16(b, 1), PutLe16(b, 24);
  for (int i = 0; i < 6; ++i) PutLe32(b, 0);
  b.resize(70, 0);
  const Status st = PeekAndDecode(b, "/data/short.bmp");
  EXPECT_EQ(st.message().rfind("/data/short.bmp: truncated BMP data", 0), 0u) << st.message();
}

TEST(HostileHeaders, PnmClaimingGigapixelsIsRefused) {
  const std::string s = "P6 100000 100000 255\n";
  ExpectImplausible(Bytes(s.begin(), s.end()), "/data/huge.ppm");
  const std::string plain = "P3 4000 4000 255\n1 2 3\n";  // plausible size, far too little text
  const Status st = PeekAndDecode(Bytes(plain.begin(), plain.end()), "/data/short.ppm");
  EXPECT_EQ(st.message().rfind("/data/short.ppm: truncated PNM data", 0), 0u) << st.message();
}

TEST(HostileHeaders, PnmHeaderErrorsSayWhatIsWrong) {
  const std::string bad_maxval = "P5 2 2 70000\n";
  Status st = PeekAndDecode(Bytes(bad_maxval.begin(), bad_maxval.end()), "/data/m.pgm");
  EXPECT_NE(st.message().find("maxval 70000"), std::string::npos) << st.message();
  const std::string too_big = "P2 2 1 10\n3 11\n";
  st = PeekAndDecode(Bytes(too_big.begin(), too_big.end()), "/data/v.pgm");
  EXPECT_NE(st.message().find("sample 11 above maxval 10"), std::string::npos) << st.message();
}

TEST(HostileHeaders, PngTiffAndWebpClaimingGigapixelsAreRefused) {
  // PNG: IHDR of 30000 x 30000 (within libspng's own limits, above kMaxImagePixels).
  Bytes png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
               0, 0, 0x75, 0x30, 0, 0, 0x75, 0x30, 8, 2, 0, 0, 0};
  uint32_t crc = ~0u;  // the IHDR's CRC, so the header itself is valid
  for (size_t i = 12; i < png.size(); ++i) {
    crc ^= png[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  crc = ~crc;
  for (int s = 24; s >= 0; s -= 8) png.push_back(uint8_t(crc >> s));
  ExpectImplausible(png, "/data/huge.png");

  // TIFF: one IFD with width and length 60000 and one strip of 8 bytes.
  Bytes tif = {'I', 'I', 42, 0};
  PutLe32(tif, 8);
  PutLe16(tif, 4);
  PutLe16(tif, 256), PutLe16(tif, 4), PutLe32(tif, 1), PutLe32(tif, 60000);
  PutLe16(tif, 257), PutLe16(tif, 4), PutLe32(tif, 1), PutLe32(tif, 60000);
  PutLe16(tif, 273), PutLe16(tif, 4), PutLe32(tif, 1), PutLe32(tif, 0);
  PutLe16(tif, 279), PutLe16(tif, 4), PutLe32(tif, 1), PutLe32(tif, 8);
  PutLe32(tif, 0);
  ExpectImplausible(tif, "/data/huge.tif");

  // WebP: a lossless (VP8L) header of 16384 x 16384.
  Bytes webp = {'R', 'I', 'F', 'F'};
  PutLe32(webp, 4 + 8 + 6), webp.insert(webp.end(), {'W', 'E', 'B', 'P', 'V', 'P', '8', 'L'});
  PutLe32(webp, 6);
  webp.push_back(0x2f);
  const uint32_t bits = (16383u) | (16383u << 14);
  PutLe32(webp, bits), webp.push_back(0);
  ExpectImplausible(webp, "/data/huge.webp");
}

TEST(HostileHeaders, UnknownBytesNameTheFormatsRead) {
  const std::string gif = "GIF89a\x01\x00\x01\x00";
  const Status st = PeekAndDecode(Bytes(gif.begin(), gif.end()), "/data/a.gif");
  EXPECT_EQ(st.message().rfind("/data/a.gif: not a readable image (first bytes 47 49 46 38", 0), 0u)
      << st.message();
  EXPECT_NE(st.message().find("JPEG, PNG, WebP, TIFF, BMP and PNM"), std::string::npos);
}

}  // namespace
}  // namespace coloader
