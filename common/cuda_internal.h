// Private to the CUDA translation units: CUDA errors become Status through one macro.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/status.h"

#define CUDA_RETURN_NOT_OK(expr)                                                              \
  do {                                                                                        \
    cudaError_t _err = (expr);                                                                \
    if (_err != cudaSuccess) {                                                                \
      return ::coloader::Status::IOError(std::string("CUDA: ") + #expr + " failed: " +       \
                                         cudaGetErrorName(_err) + " (" + cudaGetErrorString(_err) + ")"); \
    }                                                                                         \
  } while (false)
