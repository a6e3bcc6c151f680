#include "common/status.h"

#include <cstring>

namespace coloader {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kIOError: return "I/O error";
    case StatusCode::kProtocolError: return "protocol error";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kDisconnected: return "disconnected";
    case StatusCode::kAlreadyExists: return "already exists";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kGroupBroken: return "group broken";
    case StatusCode::kDetached: return "detached";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kUnavailable: return "resource unavailable";
  }
  return "unknown";
}

Status Status::FromErrno(const std::string& what, int err) {
  return Status(StatusCode::kIOError, what + ": " + std::strerror(err));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

}  // namespace coloader
