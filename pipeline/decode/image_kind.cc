#include "pipeline/decode/image_kind.h"

namespace coloader {

const char* ImageKindName(ImageKind kind) {
  switch (kind) {
    case ImageKind::kJpeg: return "JPEG";
    case ImageKind::kPng: return "PNG";
    case ImageKind::kWebp: return "WebP";
    case ImageKind::kTiff: return "TIFF";
    case ImageKind::kBmp: return "BMP";
    case ImageKind::kPnm: return "PNM";
    case ImageKind::kOther: break;
  }
  return "unknown";
}

}  // namespace coloader
