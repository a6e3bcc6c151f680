#include "server/decode.h"

#include <dlfcn.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <mutex>

#include <jpeglib.h>  // after <cstdio>: it uses FILE

#include <opencv2/imgproc.hpp>

#include "server/imgcodecs_plugin.h"

namespace coloader {

namespace {

std::string FirstBytes(const uint8_t* data, size_t size) {
  std::string out;
  char buf[4];
  for (size_t i = 0; i < size && i < 4; ++i) {
    std::snprintf(buf, sizeof(buf), "%s%02x", i ? " " : "", data[i]);
    out += buf;
  }
  return out.empty() ? "none" : out;
}

ImageKind Sniff(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageKind::kJpeg;
  if (size >= 8 && std::memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageKind::kPng;
  return ImageKind::kOther;
}

// The formats other than JPEG and PNG handed to OpenCV, by their leading bytes: BMP, TIFF,
// WebP, PNM. OpenCV's imdecode would also try every other codec it was built with (DICOM
// through GDCM, JPEG 2000, OpenEXR...), and some of those abort the process on hostile input
// (found by the decode fuzzer: a GDCM assertion); no training set needs them.
bool IsOtherKnownFormat(const uint8_t* d, size_t n) {
  if (n >= 2 && d[0] == 'B' && d[1] == 'M') return true;                                // BMP
  if (n >= 4 && ((d[0] == 'I' && d[1] == 'I' && d[2] == 42 && d[3] == 0) ||              // TIFF, little endian
                 (d[0] == 'M' && d[1] == 'M' && d[2] == 0 && d[3] == 42)))              // TIFF, big endian
    return true;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) return true;
  if (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6' && std::isspace(d[2])) return true;  // PBM/PGM/PPM
  return false;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

using PluginDecode = int (*)(const uint8_t*, size_t, void*);

// Finds the imgcodecs plugin once: $COLOADER_IMGCODECS_PLUGIN, the library search path
// (the binary's RUNPATH), then the binary's own directory.
PluginDecode LoadPlugin(std::string* where) {
  static std::once_flag once;
  static PluginDecode fn = nullptr;
  static std::string tried;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("COLOADER_IMGCODECS_PLUGIN"); env && *env) candidates.push_back(env);
    candidates.push_back("libcoloader_imgcodecs.so");
    char exe[PATH_MAX] = {};
    ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
      std::string dir(exe, static_cast<size_t>(n));
      dir = dir.substr(0, dir.rfind('/'));
      candidates.push_back(dir + "/libcoloader_imgcodecs.so");
      candidates.push_back(dir + "/../server/libcoloader_imgcodecs.so");  // tests in the build tree
    }
    for (const std::string& c : candidates) {
      if (void* h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        fn = reinterpret_cast<PluginDecode>(::dlsym(h, "coloader_imgcodecs_decode_rgb"));
        if (fn) return;
      }
      tried += (tried.empty() ? "" : ", ") + c;
    }
  });
  *where = tried;
  return fn;
}

// Adobe writes CMYK JPEGs inverted (0 = full ink), which is what libjpeg hands back; with
// K also inverted, R = C * K / 255 on the stored values.
void InvertedCmykToRgb(const uint8_t* cmyk, int pixels, uint8_t* rgb) {
  for (int i = 0; i < pixels; ++i) {
    const int c = cmyk[4 * i], m = cmyk[4 * i + 1], y = cmyk[4 * i + 2], k = cmyk[4 * i + 3];
    rgb[3 * i] = static_cast<uint8_t>((c * k + 127) / 255);
    rgb[3 * i + 1] = static_cast<uint8_t>((m * k + 127) / 255);
    rgb[3 * i + 2] = static_cast<uint8_t>((y * k + 127) / 255);
  }
}

// libjpeg reports errors through error_exit, which must not return: it jumps back to the
// decode's setjmp. Warnings (level < 0: corrupt data libjpeg worked around) are remembered.
struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it as j_common_ptr->err
  std::jmp_buf jump;
  bool warned;
};

[[noreturn]] void JpegFail(j_common_ptr c) { std::longjmp(reinterpret_cast<JpegErrors*>(c->err)->jump, 1); }

void JpegMessage(j_common_ptr c, int level) {
  if (level < 0) reinterpret_cast<JpegErrors*>(c->err)->warned = true;
}

// The libjpeg part of DecodeJpegRegion: rows [y, y + h) and at least columns [x, x + w) of the
// image scaled by 1/denom, into `rows` (resized here to what the region needs). The header is
// read once, here; an image the decoder would refuse (kMaxImageSide, kMaxImagePixels) is
// refused before anything is allocated. Only C objects are made between setjmp and a longjmp
// (`rows` exists before), so the jump skips no destructor. False when the region cannot be
// decoded cleanly; then nothing is promised about `rows`.
bool DecodeJpegRows(const uint8_t* data, size_t size, int denom, int x, int y, int w, int h,
                    std::vector<uint8_t>* rows, int* out_x, int* out_w) {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = JpegFail;
  errors.mgr.emit_message = JpegMessage;
  errors.warned = false;
  jpeg_create_decompress(&cinfo);
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const uint64_t iw = cinfo.image_width, ih = cinfo.image_height;
  bool ok = cinfo.jpeg_color_space != JCS_CMYK && cinfo.jpeg_color_space != JCS_YCCK && iw > 0 && ih > 0 &&
            iw <= uint64_t(kMaxImageSide) && ih <= uint64_t(kMaxImageSide) && iw * ih <= kMaxImagePixels;
  if (ok) {
    // What tjDecompress2(TJPF_RGB) asks of libjpeg, so the pixels are the same.
    cinfo.scale_num = 1;
    cinfo.scale_denom = static_cast<unsigned>(denom);
    cinfo.out_color_space = JCS_EXT_RGB;
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&cinfo);
    ok = cinfo.output_components == 3 && JDIMENSION(x + w) <= cinfo.output_width &&
         JDIMENSION(y + h) <= cinfo.output_height;
  }
  // One more column each side where the image has it: libjpeg upsamples chroma at a cropped
  // region's first and last columns as at an image edge, so those two may differ from the
  // whole decode; inside them every pixel is the same.
  JDIMENSION xoff = static_cast<JDIMENSION>(x > 0 ? x - 1 : 0);
  JDIMENSION width = ok ? std::min<JDIMENSION>(cinfo.output_width, JDIMENSION(x + w + 1)) - xoff : 0;
  if (ok && width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &width);  // widens to blocks
  if (ok) {
    try {
      rows->resize(size_t(h) * width * 3);
    } catch (const std::bad_alloc&) {  // thrown by our code, not through libjpeg's frames
      ok = false;
    }
  }
  if (ok && y > 0) ok = jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y)) == JDIMENSION(y);
  for (int r = 0; ok && r < h; ++r) {
    JSAMPROW row = rows->data() + size_t(r) * width * 3;
    ok = jpeg_read_scanlines(&cinfo, &row, 1) == 1;
  }
  ok = ok && !errors.warned;
  jpeg_destroy_decompress(&cinfo);  // also abandons the rows below the region, never read
  *out_x = static_cast<int>(xoff);
  *out_w = static_cast<int>(width);
  return ok;
}

}  // namespace

bool JpegEndsWithEoi(const uint8_t* data, size_t size) {
  const size_t tail = std::min<size_t>(size, 64);
  for (size_t i = size - tail; i + 1 < size; ++i)
    if (data[i] == 0xFF && data[i + 1] == 0xD9) return true;
  return false;
}

Decoder::Decoder() : tj_(tjInitDecompress()) {}
Decoder::~Decoder() {
  if (tj_) tjDestroy(static_cast<tjhandle>(tj_));
}

Result<ImageInfo> Decoder::Peek(const uint8_t* data, size_t size, const std::string& path) {
  ImageInfo info;
  info.kind = Sniff(data, size);
  if (info.kind == ImageKind::kJpeg) {
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(static_cast<tjhandle>(tj_), data, static_cast<unsigned long>(size), &w, &h, &subsamp,
                            &colorspace) != 0) {
      return Status::Invalid(path + ": corrupt JPEG header (" + tjGetErrorStr2(static_cast<tjhandle>(tj_)) + ")");
    }
    info.width = w;
    info.height = h;
  } else if (info.kind == ImageKind::kPng) {
    // IHDR is always the first chunk: 8-byte signature, length, "IHDR", width, height.
    if (size < 24 || std::memcmp(data + 12, "IHDR", 4) != 0) return Status::Invalid(path + ": corrupt PNG header");
    info.width = static_cast<int>(BigEndian32(data + 16));
    info.height = static_cast<int>(BigEndian32(data + 20));
  } else {
    // Rare formats (BMP, TIFF, WebP...): decode once to learn the size.
    ASSIGN_OR_RETURN(cv::Mat m, DecodeRgb(data, size, 1, path));
    info.width = m.cols;
    info.height = m.rows;
  }
  // A few hundred bytes can claim 65000x65000 pixels (12 GB decoded): refuse what no
  // training image is, before anything is allocated for it.
  if (info.width <= 0 || info.height <= 0 || info.width > kMaxImageSide || info.height > kMaxImageSide ||
      uint64_t(info.width) * uint64_t(info.height) > kMaxImagePixels) {
    return Status::Invalid(path + ": implausible image size " + std::to_string(info.width) + "x" +
                           std::to_string(info.height) + " (at most " + std::to_string(kMaxImagePixels >> 20) +
                           " Mpixels are decoded)");
  }
  return info;
}

Result<cv::Mat> Decoder::DecodeRgb(const uint8_t* data, size_t size, int scale_denom, const std::string& path) {
  try {
    return DecodeRgbUnchecked(data, size, scale_denom, path);
  } catch (const std::exception& e) {
    // An allocation OpenCV could not make, or anything else thrown below: this file's
    // problem, reported as such, never the producer's end.
    return Status::Invalid(path + ": cannot decode (" + e.what() + ")");
  }
}

Result<cv::Mat> Decoder::DecodeRgbUnchecked(const uint8_t* data, size_t size, int scale_denom,
                                            const std::string& path) {
  const ImageKind kind = Sniff(data, size);
  if (kind == ImageKind::kOther && !IsOtherKnownFormat(data, size)) {
    return Status::Invalid(path + ": not a readable image (first bytes " + FirstBytes(data, size) +
                           "; coloader reads JPEG, PNG, BMP, TIFF, WebP and PNM)");
  }
  if (kind != ImageKind::kJpeg) {
    std::string tried;
    PluginDecode decode = LoadPlugin(&tried);
    if (!decode) {
      return Status::Invalid(path + ": not a JPEG (first bytes " + FirstBytes(data, size) +
                             ") and no decoder for other formats: the imgcodecs plugin was not found (tried " +
                             tried + ")");
    }
    cv::Mat rgb;
    if (decode(data, size, &rgb) != 0 || rgb.empty()) {
      return Status::Invalid(path + (kind == ImageKind::kPng ? ": corrupt PNG data"
                                                             : ": not a readable image (first bytes " +
                                                                   FirstBytes(data, size) + ")"));
    }
    return rgb;
  }
  auto* tj = static_cast<tjhandle>(tj_);
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, data, static_cast<unsigned long>(size), &w, &h, &subsamp, &colorspace) != 0) {
    return Status::Invalid(path + ": corrupt JPEG header (" + tjGetErrorStr2(tj) + ")");
  }
  if (w <= 0 || h <= 0 || w > kMaxImageSide || h > kMaxImageSide || uint64_t(w) * uint64_t(h) > kMaxImagePixels) {
    return Status::Invalid(path + ": implausible image size " + std::to_string(w) + "x" + std::to_string(h));
  }
  tjscalingfactor sf{1, scale_denom > 0 ? scale_denom : 1};
  const int sw = TJSCALED(w, sf), sh = TJSCALED(h, sf);
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  cv::Mat rgb(sh, sw, CV_8UC3);
  cv::Mat cmyk_buf;
  uint8_t* dst = rgb.data;
  int pixel_format = TJPF_RGB, pitch = sw * 3;
  if (cmyk) {
    // libjpeg-turbo will not convert CMYK to RGB itself; take CMYK and convert here.
    cmyk_buf.create(sh, sw, CV_8UC4);
    dst = cmyk_buf.data;
    pixel_format = TJPF_CMYK;
    pitch = sw * 4;
  }
  if (tjDecompress2(tj, data, static_cast<unsigned long>(size), dst, sw, pitch, sh, pixel_format, 0) != 0) {
    const std::string err = tjGetErrorStr2(tj);
    // Warnings (stray bytes before a marker) leave a usable image, as PIL accepts it;
    // a file that ends early does not: part of it is grey.
    // libjpeg says "Premature end of JPEG file" for a file cut short and "premature end of
    // data segment" for data that stops early at a marker: both leave most of the image grey.
    std::string lower = err;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool truncated = lower.find("premature end") != std::string::npos;
    if (tjGetErrorCode(tj) != TJERR_WARNING || truncated) {
      return Status::Invalid(path + (truncated ? ": truncated JPEG data" : ": corrupt JPEG data (" + err + ")"));
    }
  }
  if (cmyk) InvertedCmykToRgb(cmyk_buf.data, sw * sh, rgb.data);
  return rgb;
}

std::optional<DecodedRegion> Decoder::DecodeJpegRegion(const uint8_t* data, size_t size, int scale_denom,
                                                       const cv::Rect& rect) {
  if (Sniff(data, size) != ImageKind::kJpeg || !JpegEndsWithEoi(data, size)) return std::nullopt;
  if (rect.x < 0 || rect.y < 0 || rect.width <= 0 || rect.height <= 0) return std::nullopt;
  DecodedRegion region;
  int width = 0;
  if (!DecodeJpegRows(data, size, scale_denom > 0 ? scale_denom : 1, rect.x, rect.y, rect.width, rect.height,
                      &region_buf_, &region.x, &width)) {
    return std::nullopt;
  }
  region.y = rect.y;
  region.rgb = cv::Mat(rect.height, width, CV_8UC3, region_buf_.data());  // valid until the next decode
  return region;
}

int ChooseScaleDenom(const CropBox& box, int out_size, bool enabled) {
  if (!enabled) return 1;
  for (int d : {8, 4, 2}) {
    // libjpeg rounds scaled sizes up; requiring floor(box / d) >= out keeps a margin.
    if (box.width / d >= out_size && box.height / d >= out_size) return d;
  }
  return 1;
}

}  // namespace coloader
