// Private to the CUDA translation units: CUDA errors become Status through one macro, and
// CUDA runtime resources are held by owners that free them once. An owner frees on the device
// that is current when it goes: the class holding it makes its device current first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "common/status.h"

#define CUDA_RETURN_NOT_OK(expr)                                                              \
  do {                                                                                        \
    cudaError_t _err = (expr);                                                                \
    if (_err != cudaSuccess) {                                                                \
      cudaGetLastError(); /* reported here: not left for the next caller (torch's) to find */  \
      return ::coloader::Status::IOError(std::string("CUDA: ") + #expr + " failed: " +       \
                                         cudaGetErrorName(_err) + " (" + cudaGetErrorString(_err) + ")"); \
    }                                                                                         \
  } while (false)

namespace coloader {

struct CudaFree {
  void operator()(void* p) const noexcept { cudaFree(p); }
};
struct CudaFreeHost {
  void operator()(void* p) const noexcept { cudaFreeHost(p); }
};
struct CudaHostUnregister {
  void operator()(void* p) const noexcept { cudaHostUnregister(p); }
};
struct CudaStreamDestroy {
  void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
};
struct CudaEventDestroy {
  void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
};
struct CudaIpcClose {
  void operator()(void* p) const noexcept { cudaIpcCloseMemHandle(p); }
};
struct CudaMemPoolDestroy {
  void operator()(cudaMemPool_t p) const noexcept { cudaMemPoolDestroy(p); }
};

template <typename T>
using CudaDeviceMemory = std::unique_ptr<T, CudaFree>;  // cudaMalloc
template <typename T>
using CudaPinnedMemory = std::unique_ptr<T, CudaFreeHost>;  // cudaMallocHost
using CudaHostRegistration = std::unique_ptr<void, CudaHostUnregister>;  // cudaHostRegister
using CudaStream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, CudaStreamDestroy>;
using CudaEvent = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, CudaEventDestroy>;
using CudaIpcMapping = std::unique_ptr<uint8_t, CudaIpcClose>;  // cudaIpcOpenMemHandle
using CudaMemPool = std::unique_ptr<std::remove_pointer_t<cudaMemPool_t>, CudaMemPoolDestroy>;

// `bytes` of device memory into `out` (which frees what it held).
template <typename T>
cudaError_t CudaMalloc(CudaDeviceMemory<T>* out, size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaSuccess) out->reset(static_cast<T*>(p));
  return err;
}
template <typename T>
cudaError_t CudaMallocHost(CudaPinnedMemory<T>* out, size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err == cudaSuccess) out->reset(static_cast<T*>(p));
  return err;
}
inline cudaError_t CudaStreamCreate(CudaStream* out, unsigned flags) {
  cudaStream_t s = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&s, flags);
  if (err == cudaSuccess) out->reset(s);
  return err;
}
inline cudaError_t CudaEventCreate(CudaEvent* out, unsigned flags) {
  cudaEvent_t e = nullptr;
  const cudaError_t err = cudaEventCreateWithFlags(&e, flags);
  if (err == cudaSuccess) out->reset(e);
  return err;
}

}  // namespace coloader
