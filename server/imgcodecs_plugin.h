// The optional OpenCV imgcodecs decoder (PNG, BMP, TIFF, WebP, ...), built as a plugin that
// the decoder loads on first use. JPEG never needs it. Keeping it out of the binary keeps the
// binary's shared-library closure small (imgcodecs alone pulls in ~150 MB of image and GIS
// libraries on Debian), which matters where the binaries are carried to a GPU machine.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
// Decodes any format OpenCV reads into `out` (a cv::Mat*), as 3-channel RGB uint8.
// Returns 0 on success, -1 if the bytes are not a readable image.
int coloader_imgcodecs_decode_rgb(const uint8_t* data, size_t size, void* out);
}
