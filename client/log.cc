#include "client/log.h"

#include <cstdio>
#include <mutex>

namespace coloader {
namespace {

std::mutex handler_mu;
LogHandler handler = nullptr;
void* handler_user = nullptr;

}  // namespace

void SetLogHandler(LogHandler fn, void* user) {
  std::lock_guard<std::mutex> lock(handler_mu);
  handler = fn;
  handler_user = user;
}

void Log(LogLevel level, const std::string& message) {
  LogHandler fn;
  void* user;
  {
    std::lock_guard<std::mutex> lock(handler_mu);
    fn = handler;
    user = handler_user;
  }
  if (fn != nullptr) {
    fn(static_cast<int>(level), message.c_str(), user);
  } else {
    std::fprintf(stderr, "coloader: %s\n", message.c_str());
  }
}

}  // namespace coloader
