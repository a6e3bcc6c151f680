#include "pipeline/decode/decode.h"

#include <turbojpeg.h>

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <jpeglib.h>  // after <cstdio>: it uses FILE

#include <opencv2/imgproc.hpp>

#include "pipeline/decode/decode_formats.h"
#include "pipeline/decode/jpeg_markers.h"

namespace coloader {

using formats::Sniff;

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

Status NotAnImage(const uint8_t* data, size_t size, const std::string& path) {
  return Status::Invalid(path + ": not a readable image (first bytes " + FirstBytes(data, size) +
                         "; coloader reads JPEG, PNG, WebP, TIFF, BMP and PNM, chosen by their leading bytes)");
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

Decoder::Decoder() : tj_(tjInitDecompress()) {}
Decoder::~Decoder() {
  if (tj_) tjDestroy(static_cast<tjhandle>(tj_));
}

Result<ImageInfo> Decoder::Peek(const uint8_t* data, size_t size, const std::string& path) {
  switch (Sniff(data, size)) {
    case ImageKind::kJpeg: break;
    case ImageKind::kPng: return formats::PeekPng(data, size, path);
    case ImageKind::kWebp: return formats::PeekWebp(data, size, path);
    case ImageKind::kTiff: return formats::PeekTiff(data, size, path);
    case ImageKind::kBmp: return formats::PeekBmp(data, size, path);
    case ImageKind::kPnm: return formats::PeekPnm(data, size, path);
    case ImageKind::kOther: return NotAnImage(data, size, path);
  }
  ImageInfo info;
  info.kind = ImageKind::kJpeg;
  int subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(static_cast<tjhandle>(tj_), data, static_cast<unsigned long>(size), &info.width,
                          &info.height, &subsamp, &colorspace) != 0) {
    return Status::Invalid(path + ": corrupt JPEG header (" + tjGetErrorStr2(static_cast<tjhandle>(tj_)) + ")");
  }
  COLOADER_RETURN_NOT_OK(formats::CheckImageSize(info.width, info.height, path));
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
  switch (Sniff(data, size)) {
    case ImageKind::kJpeg: break;
    case ImageKind::kPng: return formats::DecodePng(data, size, path);
    case ImageKind::kWebp: return formats::DecodeWebp(data, size, path);
    case ImageKind::kTiff: return formats::DecodeTiff(data, size, path);
    case ImageKind::kBmp: return formats::DecodeBmp(data, size, path);
    case ImageKind::kPnm: return formats::DecodePnm(data, size, path);
    case ImageKind::kOther: return NotAnImage(data, size, path);
  }
  auto* tj = static_cast<tjhandle>(tj_);
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, data, static_cast<unsigned long>(size), &w, &h, &subsamp, &colorspace) != 0) {
    return Status::Invalid(path + ": corrupt JPEG header (" + tjGetErrorStr2(tj) + ")");
  }
  COLOADER_RETURN_NOT_OK(formats::CheckImageSize(w, h, path));
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

namespace formats {

ImageKind Sniff(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return ImageKind::kJpeg;
  if (n >= 8 && std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageKind::kPng;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) return ImageKind::kWebp;
  // Classic TIFF (42) and BigTIFF (43), either byte order.
  if (n >= 4 && ((d[0] == 'I' && d[1] == 'I' && (d[2] == 42 || d[2] == 43) && d[3] == 0) ||
                 (d[0] == 'M' && d[1] == 'M' && d[2] == 0 && (d[3] == 42 || d[3] == 43))))
    return ImageKind::kTiff;
  if (n >= 2 && d[0] == 'B' && d[1] == 'M') return ImageKind::kBmp;
  if (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6' && std::isspace(d[2])) return ImageKind::kPnm;
  return ImageKind::kOther;
}

Status CheckImageSize(int64_t width, int64_t height, const std::string& path) {
  // A few hundred bytes can claim 65000x65000 pixels (12 GB decoded): refuse what no
  // training image is, before anything is allocated for it.
  if (width <= 0 || height <= 0 || width > kMaxImageSide || height > kMaxImageSide ||
      uint64_t(width) * uint64_t(height) > kMaxImagePixels) {
    return Status::Invalid(path + ": implausible image size " + std::to_string(width) + "x" + std::to_string(height) +
                           " (at most " + std::to_string(kMaxImageSide) + " a side and " +
                           std::to_string(kMaxImagePixels >> 20) + " Mpixels are decoded)");
  }
  return Status::OK();
}

}  // namespace formats

}  // namespace coloader
