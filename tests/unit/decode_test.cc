// Decoder: JPEG (baseline, progressive, grayscale, CMYK/YCCK, DCT scaling), PNG and other
// formats, and every kind of broken input as an error naming the file. Images are encoded
// here with TurboJPEG and by hand; the Pillow-made fixtures under tests/data/
// (scripts/make_test_fixtures.py) cover what TurboJPEG cannot write: Adobe CMYK as Pillow
// writes it. decode_formats_test.cc compares every other format against Pillow's pixels.
#include "pipeline/decode/decode.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "pipeline/assemble/sample_transform.h"
#include "tests/support/test_support.h"

#ifndef COLOADER_SOURCE_DIR
#define COLOADER_SOURCE_DIR "."
#endif

namespace coloader {
namespace {

using Bytes = std::vector<uint8_t>;

// Smooth colour gradients with a gentle ripple: JPEG keeps them within a few levels, and
// every region of the image differs from the others (a shifted decode would show).
cv::Mat TestImage(int w, int h) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      m.at<cv::Vec3b>(y, x) =
          cv::Vec3b(cv::saturate_cast<uint8_t>(30 + 200.0 * x / w),
                    cv::saturate_cast<uint8_t>(220 - 180.0 * y / h),
                    cv::saturate_cast<uint8_t>(128 + 60 * std::sin((x + 2 * y) / 23.0)));
    }
  }
  return m;
}

// Encodes `img` (CV_8UC3 RGB, CV_8UC1 gray or CV_8UC4 CMYK) with TurboJPEG.
Bytes EncodeJpeg(const cv::Mat& img, int quality, int flags = 0, int subsamp = TJSAMP_420) {
  int pf = TJPF_RGB;
  if (img.channels() == 1) {
    pf = TJPF_GRAY;
    subsamp = TJSAMP_GRAY;
  } else if (img.channels() == 4) {
    pf = TJPF_CMYK;  // TurboJPEG writes these as YCCK JPEGs
  }
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, img.data, img.cols, static_cast<int>(img.step), img.rows, pf, &out,
                             &size, subsamp, quality, flags);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(tj);
  Bytes bytes(out, out + size);
  tjFree(out);
  tjDestroy(tj);
  return bytes;
}

// A PNG built by hand (deflate "stored" blocks, no compression), so the expected pixels are
// known exactly without an encoder library.
uint32_t Crc32(const uint8_t* p, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void PutBe32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

void PutChunk(Bytes& png, const char* type, const Bytes& data) {
  PutBe32(png, static_cast<uint32_t>(data.size()));
  Bytes body(type, type + 4);
  body.insert(body.end(), data.begin(), data.end());
  png.insert(png.end(), body.begin(), body.end());
  PutBe32(png, Crc32(body.data(), body.size()));
}

Bytes EncodeStoredPng(const cv::Mat& rgb) {
  Bytes raw;  // filter byte 0 (none) before each row
  for (int y = 0; y < rgb.rows; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), rgb.ptr<uint8_t>(y), rgb.ptr<uint8_t>(y) + rgb.cols * 3);
  }
  Bytes z = {0x78, 0x01};  // zlib header, no compression
  for (size_t off = 0; off < raw.size() || off == 0;) {
    const size_t n = std::min<size_t>(65535, raw.size() - off);
    const bool last = off + n == raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(static_cast<uint8_t>(n));
    z.push_back(static_cast<uint8_t>(n >> 8));
    z.push_back(static_cast<uint8_t>(~n));
    z.push_back(static_cast<uint8_t>(~n >> 8));
    z.insert(z.end(), raw.begin() + static_cast<long>(off), raw.begin() + static_cast<long>(off + n));
    off += n;
    if (last) break;
  }
  uint32_t a = 1, b = 0;  // Adler-32 of the uncompressed data
  for (uint8_t v : raw) {
    a = (a + v) % 65521;
    b = (b + a) % 65521;
  }
  PutBe32(z, (b << 16) | a);

  Bytes png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  Bytes ihdr;
  PutBe32(ihdr, static_cast<uint32_t>(rgb.cols));
  PutBe32(ihdr, static_cast<uint32_t>(rgb.rows));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit RGB, deflate, no filter, no interlace
  PutChunk(png, "IHDR", ihdr);
  PutChunk(png, "IDAT", z);
  PutChunk(png, "IEND", {});
  return png;
}

double MeanAbsDiff(const cv::Mat& a, const cv::Mat& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(a.type(), b.type());
  if (a.size() != b.size() || a.type() != b.type()) return 1e9;
  const cv::Scalar m = cv::mean(cv::abs(a - b) + cv::abs(b - a));  // saturating |a - b|
  return (m[0] + m[1] + m[2]) / 3;
}

Bytes Fixture(const std::string& name) {
  const std::string s = testing::ReadFile(std::string(COLOADER_SOURCE_DIR) + "/tests/data/" + name);
  EXPECT_FALSE(s.empty()) << "missing fixture tests/data/" << name
                          << " (regenerate with scripts/make_test_fixtures.py)";
  return Bytes(s.begin(), s.end());
}

class DecoderTest : public ::testing::Test {
 protected:
  Result<cv::Mat> Decode(const Bytes& b, int denom = 1, const std::string& path = "/data/x.jpg") {
    return dec_.DecodeRgb(b.data(), b.size(), denom, path);
  }
  Result<ImageInfo> Peek(const Bytes& b, const std::string& path = "/data/x.jpg") {
    return dec_.Peek(b.data(), b.size(), path);
  }
  // Peek and decode must both fail or both succeed; returns the first error, or OK.
  Status PeekAndDecode(const Bytes& b, const std::string& path) {
    auto info = Peek(b, path);
    if (!info.ok()) return info.status();
    auto img = Decode(b, 1, path);
    if (!img.ok()) return img.status();
    EXPECT_EQ(img->type(), CV_8UC3);
    return Status::OK();
  }
  Decoder dec_;
};

TEST_F(DecoderTest, BaselineJpegMatchesTheSource) {
  const cv::Mat src = TestImage(160, 120);
  for (int subsamp : {TJSAMP_444, TJSAMP_422, TJSAMP_420}) {
    const Bytes jpeg = EncodeJpeg(src, 95, 0, subsamp);
    ASSERT_OK_AND_ASSIGN(ImageInfo info, Peek(jpeg));
    EXPECT_EQ(info.kind, ImageKind::kJpeg);
    EXPECT_EQ(info.width, 160);
    EXPECT_EQ(info.height, 120);
    ASSERT_OK_AND_ASSIGN(cv::Mat rgb, Decode(jpeg));
    EXPECT_EQ(rgb.type(), CV_8UC3);
    EXPECT_LT(MeanAbsDiff(rgb, src), 2.5) << "subsampling " << subsamp;
  }
}

TEST_F(DecoderTest, ChannelOrderIsRgb) {
  cv::Mat red(16, 16, CV_8UC3, cv::Scalar(250, 10, 10));  // R, G, B in memory order
  ASSERT_OK_AND_ASSIGN(cv::Mat rgb, Decode(EncodeJpeg(red, 95, 0, TJSAMP_444)));
  const cv::Scalar m = cv::mean(rgb);
  EXPECT_GT(m[0], 230);
  EXPECT_LT(m[2], 30);
}

TEST_F(DecoderTest, DctScalingGivesLibjpegScaledSizes) {
  // 401x301 does not divide by 8: libjpeg rounds the scaled size up.
  const cv::Mat src = TestImage(401, 301);
  const Bytes jpeg = EncodeJpeg(src, 95);
  const int want_w[] = {0, 401, 201, 0, 101, 0, 0, 0, 51};
  const int want_h[] = {0, 301, 151, 0, 76, 0, 0, 0, 38};
  for (int d : {1, 2, 4, 8}) {
    ASSERT_OK_AND_ASSIGN(cv::Mat rgb, Decode(jpeg, d));
    EXPECT_EQ(rgb.cols, want_w[d]) << "1/" << d;
    EXPECT_EQ(rgb.rows, want_h[d]) << "1/" << d;
    // The content is the source averaged over d x d blocks (compare away from the partial
    // last block).
    const int fw = (401 / d) * d, fh = (301 / d) * d;
    cv::Mat ref;
    cv::resize(src(cv::Rect(0, 0, fw, fh)), ref, cv::Size(fw / d, fh / d), 0, 0, cv::INTER_AREA);
    EXPECT_LT(MeanAbsDiff(rgb(cv::Rect(0, 0, fw / d, fh / d)), ref), 3.0) << "1/" << d;
  }
}

TEST_F(DecoderTest, ARegionDecodesToTheSamePixelsAsTheWholeImage) {
  // Noise over the gradients: any shift, edge effect or upsampling difference would show.
  cv::Mat img = TestImage(501, 377), noise(377, 501, CV_8UC3);
  cv::RNG rng(7);
  rng.fill(noise, cv::RNG::UNIFORM, 0, 40);
  img += noise;
  struct Config {
    const char* name;
    int subsamp, flags;
  };
  for (const Config c : {Config{"4:2:0", TJSAMP_420, 0}, Config{"4:2:2", TJSAMP_422, 0},
                         Config{"4:4:4", TJSAMP_444, 0}, Config{"4:2:0 progressive", TJSAMP_420, TJFLAG_PROGRESSIVE}}) {
    const Bytes jpeg = EncodeJpeg(img, 88, c.flags, c.subsamp);
    for (int denom : {1, 2, 4, 8}) {
      SCOPED_TRACE(std::string(c.name) + ", 1/" + std::to_string(denom));
      ASSERT_OK_AND_ASSIGN(cv::Mat whole, Decode(jpeg, denom));
      for (int k = 0; k < 60; ++k) {
        const int x0 = rng.uniform(0, whole.cols), y0 = rng.uniform(0, whole.rows);
        const cv::Rect rect(x0, y0, rng.uniform(1, whole.cols - x0 + 1), rng.uniform(1, whole.rows - y0 + 1));
        SCOPED_TRACE(::testing::Message() << "rect " << rect);
        auto region = dec_.DecodeJpegRegion(jpeg.data(), jpeg.size(), denom, rect);
        ASSERT_TRUE(region.has_value());
        ASSERT_EQ(region->y, rect.y);
        ASSERT_LE(region->x, rect.x);
        ASSERT_GE(region->x + region->rgb.cols, rect.x + rect.width);
        const cv::Mat got = region->rgb(cv::Rect(rect.x - region->x, 0, rect.width, rect.height));
        EXPECT_EQ(cv::norm(got, whole(rect), cv::NORM_INF), 0.0);
      }
    }
  }
  // Grayscale comes out as RGB, as from DecodeRgb.
  cv::Mat gray;
  cv::cvtColor(img, gray, cv::COLOR_RGB2GRAY);
  const Bytes gjpeg = EncodeJpeg(gray, 90);
  ASSERT_OK_AND_ASSIGN(cv::Mat gwhole, Decode(gjpeg));
  auto gregion = dec_.DecodeJpegRegion(gjpeg.data(), gjpeg.size(), 1, cv::Rect(100, 50, 200, 100));
  ASSERT_TRUE(gregion.has_value());
  EXPECT_EQ(cv::norm(gregion->rgb(cv::Rect(100 - gregion->x, 0, 200, 100)), gwhole(cv::Rect(100, 50, 200, 100)),
                     cv::NORM_INF), 0.0);
}

TEST_F(DecoderTest, RegionDecodingStepsAsideForWhatTheWholeDecodeMustJudge) {
  const Bytes good = EncodeJpeg(TestImage(320, 240), 90);
  const cv::Rect rect(10, 10, 50, 50);
  EXPECT_TRUE(dec_.DecodeJpegRegion(good.data(), good.size(), 1, rect).has_value());
  // Cut short (no end-of-image marker): even a crop from the intact top is not decoded alone,
  // so the file fails as a whole, whatever the crop.
  const Bytes cut(good.begin(), good.begin() + static_cast<long>(good.size() / 2));
  EXPECT_FALSE(dec_.DecodeJpegRegion(cut.data(), cut.size(), 1, rect).has_value());
  // CMYK, out-of-image rectangles, not a JPEG, garbage: nullopt, never a crash.
  cv::Mat cmyk(40, 40, CV_8UC4, cv::Scalar(10, 20, 30, 200));
  const Bytes ycck = EncodeJpeg(cmyk, 90);
  EXPECT_FALSE(dec_.DecodeJpegRegion(ycck.data(), ycck.size(), 1, cv::Rect(0, 0, 10, 10)).has_value());
  EXPECT_FALSE(dec_.DecodeJpegRegion(good.data(), good.size(), 1, cv::Rect(300, 200, 50, 50)).has_value());
  EXPECT_FALSE(dec_.DecodeJpegRegion(good.data(), good.size(), 1, cv::Rect(-1, 0, 5, 5)).has_value());
  const Bytes png = EncodeStoredPng(TestImage(16, 16));
  EXPECT_FALSE(dec_.DecodeJpegRegion(png.data(), png.size(), 1, cv::Rect(0, 0, 4, 4)).has_value());
  // Corrupt entropy-coded data in the rows a crop reads: libjpeg warns, the region is refused.
  Bytes damaged = good;
  for (size_t i = damaged.size() / 4; i < damaged.size() / 4 + 64; ++i) damaged[i] ^= 0x5A;
  EXPECT_FALSE(dec_.DecodeJpegRegion(damaged.data(), damaged.size(), 1, cv::Rect(0, 0, 320, 239)).has_value());
}

TEST_F(DecoderTest, GrayscaleJpegComesOutAsRgb) {
  cv::Mat gray;
  cv::cvtColor(TestImage(96, 64), gray, cv::COLOR_RGB2GRAY);
  const Bytes jpeg = EncodeJpeg(gray, 95);
  ASSERT_OK_AND_ASSIGN(cv::Mat rgb, Decode(jpeg));
  ASSERT_EQ(rgb.type(), CV_8UC3);
  cv::Mat gray3;
  cv::cvtColor(gray, gray3, cv::COLOR_GRAY2RGB);
  EXPECT_LT(MeanAbsDiff(rgb, gray3), 1.5);
  ASSERT_OK_AND_ASSIGN(cv::Mat half, Decode(jpeg, 2));
  EXPECT_EQ(half.cols, 48);
  EXPECT_EQ(half.channels(), 3);
}

TEST_F(DecoderTest, ProgressiveJpegMatchesBaseline) {
  const cv::Mat src = TestImage(200, 150);
  ASSERT_OK_AND_ASSIGN(cv::Mat base, Decode(EncodeJpeg(src, 90)));
  const Bytes prog = EncodeJpeg(src, 90, TJFLAG_PROGRESSIVE);
  ASSERT_OK_AND_ASSIGN(cv::Mat rgb, Decode(prog));
  EXPECT_LT(MeanAbsDiff(rgb, base), 1.0);
  ASSERT_OK_AND_ASSIGN(cv::Mat quarter, Decode(prog, 4));
  EXPECT_EQ(quarter.cols, 50);
  EXPECT_EQ(quarter.rows, 38);
}

TEST_F(DecoderTest, YcckJpegComesOutAsRgb) {
  // Store the image as Adobe-style inverted CMYK (255 = no ink), with real black in K:
  // K' = max(R, G, B), C' = R * 255 / K', so that R = C' * K' / 255.
  const cv::Mat src = TestImage(64, 48);
  cv::Mat cmyk(src.rows, src.cols, CV_8UC4);
  for (int y = 0; y < src.rows; ++y) {
    for (int x = 0; x < src.cols; ++x) {
      const cv::Vec3b p = src.at<cv::Vec3b>(y, x);
      const int k = std::max({p[0], p[1], p[2], uint8_t{1}});
      cmyk.at<cv::Vec4b>(y, x) = cv::Vec4b(static_cast<uint8_t>(p[0] * 255 / k),
                                           static_cast<uint8_t>(p[1] * 255 / k),
                                           static_cast<uint8_t>(p[2] * 255 / k),
                                           static_cast<uint8_t>(k));
    }
  }
  const Bytes jpeg = EncodeJpeg(cmyk, 95, 0, TJSAMP_444);
  ASSERT_OK_AND_ASSIGN(cv::Mat rgb, Decode(jpeg));
  ASSERT_EQ(rgb.type(), CV_8UC3);
  EXPECT_LT(MeanAbsDiff(rgb, src), 3.0);
  ASSERT_OK_AND_ASSIGN(cv::Mat half, Decode(jpeg, 2));
  EXPECT_EQ(half.cols, 32);
}

TEST_F(DecoderTest, PngDecodesExactly) {
  const cv::Mat src = TestImage(37, 23);
  const Bytes png = EncodeStoredPng(src);
  ASSERT_OK_AND_ASSIGN(ImageInfo info, Peek(png, "/data/a.png"));
  EXPECT_EQ(info.kind, ImageKind::kPng);
  EXPECT_EQ(info.width, 37);
  EXPECT_EQ(info.height, 23);
  // Scaling applies to JPEG only: a PNG always comes back at full size.
  ASSERT_OK_AND_ASSIGN(cv::Mat rgb, Decode(png, 4, "/data/a.png"));
  EXPECT_EQ(MeanAbsDiff(rgb, src), 0.0);
}

TEST_F(DecoderTest, TruncatedJpegIsAnErrorNamingThePath) {
  const Bytes jpeg = EncodeJpeg(TestImage(160, 120), 90);
  const Bytes half(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2));
  ASSERT_TRUE(Peek(half, "/data/y.jpg").ok());  // the header is intact...
  auto r = Decode(half, 1, "/data/y.jpg");       // ...the data is not
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "/data/y.jpg: truncated JPEG data");
  // At any cut, even one that loses only the end marker, decoding fails cleanly.
  for (size_t n = 0; n < jpeg.size(); n += (n < 700 ? 1 : 37)) {
    const Bytes cut(jpeg.begin(), jpeg.begin() + static_cast<long>(n));
    const Status st = PeekAndDecode(cut, "/data/cut.jpg");
    ASSERT_FALSE(st.ok()) << "prefix of " << n << " of " << jpeg.size() << " bytes decoded";
    EXPECT_EQ(st.message().rfind("/data/cut.jpg: ", 0), 0u) << st.message();
  }
  const Bytes no_eoi(jpeg.begin(), jpeg.end() - 2);
  EXPECT_FALSE(PeekAndDecode(no_eoi, "/data/cut.jpg").ok());
}

TEST_F(DecoderTest, NonImagesAreErrorsNamingThePathAndTheBytes) {
  const std::string html = "<html>not found</html>";
  const Status st = PeekAndDecode(Bytes(html.begin(), html.end()), "/data/x.jpg");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("/data/x.jpg: ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find("3c 68 74 6d"), std::string::npos) << st.message();

  const std::vector<Bytes> junk = {
      {},                                   // empty
      {0xFF},                               // one byte
      {0xFF, 0xD8},                         // SOI only
      {0xFF, 0xD8, 0xFF},                   // JPEG magic only
      {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10},  // magic and a segment length, nothing more
      {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'},  // PNG signature only
      {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
  };
  for (const Bytes& b : junk) {
    const Status s = PeekAndDecode(b, "/data/junk.JPEG");
    EXPECT_FALSE(s.ok()) << b.size() << " bytes";
    EXPECT_EQ(s.message().rfind("/data/junk.JPEG: ", 0), 0u) << s.message();
  }
}

TEST_F(DecoderTest, OtherFormatsAreReadOnlyWhenTheyAreTrainingImageFormats) {
  // PPM and BMP, built by hand: their pixels come back exactly.
  const cv::Mat img = TestImage(5, 3);
  std::string ppm = "P6\n5 3\n255\n";
  ppm.append(reinterpret_cast<const char*>(img.data), img.total() * 3);
  Bytes bmp = {'B', 'M'};
  auto put32 = [&](uint32_t v) { for (int i = 0; i < 4; ++i) bmp.push_back(static_cast<uint8_t>(v >> (8 * i))); };
  auto put16 = [&](uint16_t v) { bmp.push_back(static_cast<uint8_t>(v)); bmp.push_back(static_cast<uint8_t>(v >> 8)); };
  const uint32_t row = 16;  // 5 x 3 bytes, padded to 4
  put32(54 + row * 3); put32(0); put32(54);
  put32(40); put32(5); put32(3); put16(1); put16(24); put32(0); put32(row * 3); put32(2835); put32(2835); put32(0); put32(0);
  for (int y = 2; y >= 0; --y) {  // bottom-up, BGR
    for (int x = 0; x < 5; ++x) {
      const cv::Vec3b p = img.at<cv::Vec3b>(y, x);
      bmp.insert(bmp.end(), {p[2], p[1], p[0]});
    }
    bmp.push_back(0);
  }
  for (const Bytes& b : {Bytes(ppm.begin(), ppm.end()), bmp}) {
    ASSERT_OK_AND_ASSIGN(cv::Mat got, Decode(b, 1, "/data/x.ppm"));
    EXPECT_EQ(cv::norm(got, img, cv::NORM_INF), 0.0);
  }
  // A DICOM file (magic "DICM" at byte 128) is no training image format: a clear error (the
  // OpenCV imgcodecs coloader once used had a GDCM codec that aborted the process on a fuzzed
  // one, tests/fuzz/regressions/decode).
  Bytes dicom(132, 0);
  std::memcpy(dicom.data() + 128, "DICM", 4);
  const Status st = PeekAndDecode(dicom, "/data/scan.dcm");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/data/scan.dcm: not a readable image"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("JPEG, PNG, WebP, TIFF, BMP and PNM"), std::string::npos) << st.message();
}

TEST_F(DecoderTest, BrokenPngIsAnError) {
  Bytes png = EncodeStoredPng(TestImage(40, 30));
  const Bytes cut(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
  EXPECT_FALSE(PeekAndDecode(cut, "/data/p.png").ok());
  // A PNG claiming 0 x 0 pixels.
  Bytes zero = png;
  for (int i = 16; i < 24; ++i) zero[static_cast<size_t>(i)] = 0;
  EXPECT_FALSE(PeekAndDecode(zero, "/data/p.png").ok());
}

TEST_F(DecoderTest, CorruptedJpegsNeverCrash) {
  // Random byte flips in a valid JPEG, and random bytes behind the JPEG and PNG magic: each
  // must decode or fail with an error, never crash or hang.
  const Bytes jpeg = EncodeJpeg(TestImage(64, 48), 85);
  std::mt19937 gen(1234);
  int failures = 0;
  for (int trial = 0; trial < 600; ++trial) {
    Bytes b = jpeg;
    const int flips = 1 + static_cast<int>(gen() % 8);
    for (int f = 0; f < flips; ++f) b[gen() % b.size()] = static_cast<uint8_t>(gen());
    failures += !PeekAndDecode(b, "/data/flip.jpg").ok();
  }
  EXPECT_GT(failures, 0);
  for (int trial = 0; trial < 300; ++trial) {
    Bytes b(gen() % 400);
    for (uint8_t& v : b) v = static_cast<uint8_t>(gen());
    const Bytes magic = trial % 2 ? Bytes{0xFF, 0xD8, 0xFF} : Bytes{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    b.insert(b.begin(), magic.begin(), magic.end());
    EXPECT_FALSE(PeekAndDecode(b, "/data/random.jpg").ok());
  }
}

// Fixtures written by Pillow (scripts/make_test_fixtures.py) from one crop of a photograph.
class FixtureTest : public DecoderTest {
 protected:
  void SetUp() override {
    const Bytes png = Fixture("reference.png");
    auto ref = Decode(png, 1, "reference.png");
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    ref_ = *ref;
    ASSERT_EQ(ref_.cols, 96);
    ASSERT_EQ(ref_.rows, 72);
  }
  cv::Mat ref_;
};

TEST_F(FixtureTest, PillowCmykJpegDecodesToTheOriginalColours) {
  const Bytes jpeg = Fixture("cmyk.jpg");
  ASSERT_OK_AND_ASSIGN(ImageInfo info, Peek(jpeg, "cmyk.jpg"));
  EXPECT_EQ(info.kind, ImageKind::kJpeg);
  ASSERT_OK_AND_ASSIGN(cv::Mat rgb, Decode(jpeg, 1, "cmyk.jpg"));
  const cv::Scalar got = cv::mean(rgb), want = cv::mean(ref_);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(got[c], want[c], 3.0) << "channel " << c;
  // Not only the means: an uninverted conversion would give the negative image.
  EXPECT_LT(MeanAbsDiff(rgb, ref_), 6.0);
}

TEST_F(FixtureTest, GrayscaleProgressiveAndMisnamedPng) {
  ASSERT_OK_AND_ASSIGN(cv::Mat gray, Decode(Fixture("gray.jpg"), 1, "gray.jpg"));
  cv::Mat ref_gray, ref_gray3;
  cv::cvtColor(ref_, ref_gray, cv::COLOR_RGB2GRAY);
  cv::cvtColor(ref_gray, ref_gray3, cv::COLOR_GRAY2RGB);
  EXPECT_LT(MeanAbsDiff(gray, ref_gray3), 4.0);

  ASSERT_OK_AND_ASSIGN(cv::Mat prog, Decode(Fixture("progressive.jpg"), 1, "progressive.jpg"));
  EXPECT_LT(MeanAbsDiff(prog, ref_), 6.0);

  // The name says JPEG, the bytes say PNG: the bytes win.
  const Bytes misnamed = Fixture("png_named.JPEG");
  ASSERT_OK_AND_ASSIGN(ImageInfo info, Peek(misnamed, "png_named.JPEG"));
  EXPECT_EQ(info.kind, ImageKind::kPng);
  ASSERT_OK_AND_ASSIGN(cv::Mat png, Decode(misnamed, 2, "png_named.JPEG"));
  EXPECT_EQ(MeanAbsDiff(png, ref_), 0.0);
}

TEST_F(FixtureTest, BadFilesAreErrorsNamingThePath) {
  Status st = PeekAndDecode(Fixture("truncated.jpg"), "/data/truncated.jpg");
  EXPECT_EQ(st.message(), "/data/truncated.jpg: truncated JPEG data");
  st = PeekAndDecode(Fixture("not_an_image.jpg"), "/data/not_an_image.jpg");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("/data/not_an_image.jpg: ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find("3c 68 74 6d"), std::string::npos) << st.message();
}

CropBox Box(int w, int h) {
  CropBox b;
  b.width = w;
  b.height = h;
  return b;
}

// The whole sample path (SampleTransform: crop, region decode or not, resize, flip, normalise)
// gives the same bytes with and without the region decode, for every kind of JPEG and mode.
TEST(SampleTransformTest, DecodingTheCropsRegionOnlyChangesNoByte) {
  cv::Mat img = TestImage(501, 377), noise(377, 501, CV_8UC3), gray;
  cv::RNG rng(11);
  rng.fill(noise, cv::RNG::UNIFORM, 0, 40);
  img += noise;
  cv::cvtColor(img, gray, cv::COLOR_RGB2GRAY);
  const std::vector<std::pair<std::string, Bytes>> files = {
      {"4:2:0", EncodeJpeg(img, 90)},
      {"4:4:4", EncodeJpeg(img, 90, 0, TJSAMP_444)},
      {"progressive", EncodeJpeg(img, 85, TJFLAG_PROGRESSIVE)},
      {"gray", EncodeJpeg(gray, 90)},
      {"cmyk", Fixture("cmyk.jpg")},  // not decoded by region: the whole decode, as before
      {"large", EncodeJpeg(TestImage(1400, 1000), 90)},  // crops >= 448 px: DCT-scaled regions
  };
  for (const AugmentMode mode : {AugmentMode::kTrain, AugmentMode::kEval, AugmentMode::kNone}) {
    for (const DType output : {DType::kUInt8, DType::kFloat32}) {
      TransformOptions with;
      with.augment.mode = mode;
      with.augment.size = 64;
      with.output = output;
      with.layout = output == DType::kUInt8 ? TensorLayout::kNHWC : TensorLayout::kNCHW;
      TransformOptions without = with;
      without.crop_decode = false;
      SampleTransform a(with), b(without);
      std::vector<uint8_t> out_a(a.sample_bytes()), out_b(b.sample_bytes());
      for (const auto& [name, bytes] : files) {
        for (uint64_t index = 0; index < 40; ++index) {
          SCOPED_TRACE(name + " " + AugmentModeName(mode) + " " + DTypeName(output) + " #" + std::to_string(index));
          ASSERT_OK(a.RunBytes(bytes.data(), bytes.size(), name, 5, 1, index, out_a.data()));
          ASSERT_OK(b.RunBytes(bytes.data(), bytes.size(), name, 5, 1, index, out_b.data()));
          ASSERT_EQ(out_a, out_b);
        }
      }
      // Train and eval crops are smaller than the image: most decodes were of the region only.
      if (mode != AugmentMode::kNone) {
        EXPECT_GE(a.region_decodes(), 4u * 40 / 2);
      }
      EXPECT_EQ(b.region_decodes(), 0u);
    }
  }
  // A file cut short fails the same way with or without it, whatever the crop.
  const Bytes cut(files[0].second.begin(), files[0].second.begin() + static_cast<long>(files[0].second.size() / 2));
  TransformOptions with;
  with.augment.size = 64;
  SampleTransform t(with);
  std::vector<uint8_t> out(t.sample_bytes());
  for (uint64_t index = 0; index < 10; ++index) {
    const Status st = t.RunBytes(cut.data(), cut.size(), "/data/cut.jpg", 5, 1, index, out.data());
    EXPECT_NE(st.message().find("/data/cut.jpg: truncated JPEG data"), std::string::npos) << st.message();
  }
}

TEST(ChooseScaleDenomTest, LargestScaleThatKeepsTheOutputResolution) {
  EXPECT_EQ(ChooseScaleDenom(Box(500, 375), 224, true), 1);
  EXPECT_EQ(ChooseScaleDenom(Box(448, 448), 224, true), 2);
  EXPECT_EQ(ChooseScaleDenom(Box(447, 448), 224, true), 1);
  EXPECT_EQ(ChooseScaleDenom(Box(900, 1000), 224, true), 4);
  EXPECT_EQ(ChooseScaleDenom(Box(1792, 1792), 224, true), 8);
  EXPECT_EQ(ChooseScaleDenom(Box(4000, 1791), 224, true), 4);
  EXPECT_EQ(ChooseScaleDenom(Box(1792, 1792), 224, false), 1);
  EXPECT_EQ(ChooseScaleDenom(Box(10, 10), 224, true), 1);
  EXPECT_EQ(ChooseScaleDenom(Box(1, 1), 1, true), 1);
  EXPECT_EQ(ChooseScaleDenom(Box(8, 8), 1, true), 8);
}

}  // namespace
}  // namespace coloader
