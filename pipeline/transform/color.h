// The pure kernels behind the recipe's pixel ops (pixel_ops.h), on uint8 RGB images (HxWx3,
// interleaved), each computing what torchvision's tensor kernel of the same name computes on a
// uint8 CHW tensor: the same float32 arithmetic, the same truncation or rounding back to uint8.
// tests/unit/color_test.cc checks the properties; python/tests/test_recipes.py checks each
// against torchvision on the same images.
#pragma once

#include <opencv2/core.hpp>

namespace coloader::color {

// ratio * a + (1 - ratio) * b, clamped to [0, 255], truncated (torchvision's _blend).
void BlendWithImage(cv::Mat& rgb, const cv::Mat& other, double ratio);
void BlendWithValue(cv::Mat& rgb, float value, double ratio);

float GrayMean(const cv::Mat& rgb);                  // the mean of the uint8 grayscale image, in float32

void AdjustBrightness(cv::Mat& rgb, double factor);  // blend with black
void AdjustContrast(cv::Mat& rgb, double factor);    // blend with the mean of the grayscale image
void AdjustSaturation(cv::Mat& rgb, double factor);  // blend with the grayscale image
void AdjustHue(cv::Mat& rgb, double shift);          // shift in [-0.5, 0.5] of the hue circle, through HSV
void AdjustSharpness(cv::Mat& rgb, double factor);   // blend with a 3x3 smoothing, the border kept
void Grayscale(cv::Mat& rgb);                        // 0.2989 r + 0.587 g + 0.114 b into all three channels
void Posterize(cv::Mat& rgb, int bits);              // keep the top `bits` bits
void Solarize(cv::Mat& rgb, double threshold);       // invert the values >= threshold
void AutoContrast(cv::Mat& rgb);                     // stretch each channel to [0, 255]
void Equalize(cv::Mat& rgb);                         // each channel's histogram equalised
void Invert(cv::Mat& rgb);
// Gaussian blur with a kx x ky kernel of standard deviation sigma, reflect padding, rounded.
void GaussianBlur(cv::Mat& rgb, int kx, int ky, double sigma);

// RandomCrop's window of the padded image: output pixel (x, y) is source pixel (x + dx, y + dy),
// the pixels outside the image padded by `mode` (pixel_math.h's PadIndex; 0: `fill`).
void PadCrop(cv::Mat& rgb, int dx, int dy, int mode, const uint8_t fill[3]);

// torchvision's inverse affine map (_get_inverse_affine_matrix, then affine's shift to the
// image's centre) of a width x height image: angle in degrees (counter-clockwise for rotate's
// sign), translate in pixels, shear in degrees (x, y), about `center` (pixels from the
// top-left; nullptr: the image's centre). `m` maps an output pixel's centre, relative to the
// image's centre, to the source: x' = m[0] x + m[1] y + m[2], y' = m[3] x + m[4] y + m[5].
void AffineMatrix(int width, int height, double angle, double tx, double ty, double shear_x, double shear_y,
                  const double* center, double m[6]);
// The warp with nearest-neighbour sampling, as torchvision's affine/rotate on a tensor
// (_gen_affine_grid and grid_sample in float32); uncovered pixels take `fill`.
void AffineNearest(cv::Mat& rgb, const double m[6], const uint8_t fill[3]);

}  // namespace coloader::color
