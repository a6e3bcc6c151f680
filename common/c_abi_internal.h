// The C++ side of the C ABIs (client/c_api.cc, producer/c_api.cc): one error model for both.
// Every exported function runs its body inside Guard(), which catches everything (nothing may
// unwind into C or Python), maps a Status or exception to a coloader_error code and keeps the
// message in this thread's last-error string. Private: included by the two c_api.cc only, and
// each library has its own copy of the last-error string.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <utility>

#include "common/c_abi.h"
#include "common/protocol.h"
#include "common/status.h"

namespace coloader::c_abi {

static_assert(static_cast<int>(DType::kUInt8) == COLOADER_UINT8 &&
                  static_cast<int>(DType::kFloat32) == COLOADER_FLOAT32 &&
                  static_cast<int>(DType::kBFloat16) == COLOADER_BFLOAT16 &&
                  static_cast<int>(DType::kFloat16) == COLOADER_FLOAT16 &&
                  static_cast<int>(DType::kBool) == COLOADER_BOOL && static_cast<int>(DType::kInt8) == COLOADER_INT8 &&
                  static_cast<int>(DType::kInt16) == COLOADER_INT16 &&
                  static_cast<int>(DType::kInt32) == COLOADER_INT32 &&
                  static_cast<int>(DType::kInt64) == COLOADER_INT64 &&
                  static_cast<int>(DType::kFloat64) == COLOADER_FLOAT64 &&
                  static_cast<int>(DType::kComplex64) == COLOADER_COMPLEX64 &&
                  kMaxFieldDims == COLOADER_MAX_FIELD_DIMS,
              "the C ABI's dtype codes are the wire protocol's");
static_assert(static_cast<int>(TensorLayout::kNHWC) == COLOADER_NHWC &&
                  static_cast<int>(TensorLayout::kNCHW) == COLOADER_NCHW,
              "the C ABI's layout codes are the wire protocol's");

inline std::string& LastError() {
  thread_local std::string message;
  return message;
}

inline int SetError(int code, std::string message) {
  // Assigning may allocate; if even that fails, the old message stays. Never throws out.
  try {
    LastError() = std::move(message);
  } catch (...) {
  }
  return code;
}

inline int CodeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return COLOADER_OK;
    case StatusCode::kInvalidArgument:
    case StatusCode::kAlreadyExists: return COLOADER_E_INVALID;
    case StatusCode::kNotFound: return COLOADER_E_NOT_FOUND;
    case StatusCode::kIOError:
    case StatusCode::kUnavailable: return COLOADER_E_IO;
    case StatusCode::kProtocolError: return COLOADER_E_PROTOCOL;
    case StatusCode::kTimeout: return COLOADER_E_TIMEOUT;
    case StatusCode::kDisconnected:
    case StatusCode::kCancelled: return COLOADER_E_DISCONNECTED;
    case StatusCode::kGroupBroken: return COLOADER_E_GROUP_BROKEN;
    case StatusCode::kDetached: return COLOADER_E_DETACHED;
    case StatusCode::kInternal: return COLOADER_E_INTERNAL;
  }
  return COLOADER_E_INTERNAL;
}

inline int Fail(const Status& st) { return SetError(CodeFor(st.code()), st.message()); }

// Runs `body` (which returns a coloader_error code) and turns any exception into one.
template <typename Fn>
int Guard(const char* what, Fn&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return SetError(COLOADER_E_INTERNAL, std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    return SetError(COLOADER_E_INTERNAL, std::string(what) + ": " + e.what());
  } catch (...) {
    return SetError(COLOADER_E_INTERNAL, std::string(what) + ": unknown exception");
  }
}

inline int NullArgument(const char* what, const char* arg) {
  return SetError(COLOADER_E_INVALID, std::string(what) + ": " + arg + " is NULL");
}

}  // namespace coloader::c_abi
