#include "server/imgcodecs_plugin.h"

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

extern "C" __attribute__((visibility("default"))) int coloader_imgcodecs_decode_rgb(const uint8_t* data,
                                                                                    size_t size, void* out) {
  try {
    const cv::Mat raw(1, static_cast<int>(size), CV_8UC1, const_cast<uint8_t*>(data));
    cv::Mat bgr = cv::imdecode(raw, cv::IMREAD_COLOR);
    if (bgr.empty()) return -1;
    cv::cvtColor(bgr, *static_cast<cv::Mat*>(out), cv::COLOR_BGR2RGB);
    return 0;
  } catch (...) {
    return -1;  // nothing may escape into the caller across the plugin boundary
  }
}
