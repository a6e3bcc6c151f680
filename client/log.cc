#include "client/log.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>

namespace coloader {
namespace {

struct HandlerState {
  std::mutex mu;
  std::condition_variable idle;
  LogHandler handler = nullptr;
  void* user = nullptr;
  int in_flight = 0;  // calls of the handler under way
};

// Never destroyed: a library thread may still log while the process's statics go at exit.
HandlerState& State() {
  static HandlerState* state = new HandlerState;
  return *state;
}

}  // namespace

void SetLogHandler(LogHandler fn, void* user) {
  HandlerState& s = State();
  std::unique_lock<std::mutex> lock(s.mu);
  s.handler = fn;
  s.user = user;
  // The old handler may be running on another thread: return once it has returned, so that a
  // caller taking its handler away (Python at exit) is not called again; but not later than
  // 2 s: a handler that hangs must not hang the caller with it.
  s.idle.wait_for(lock, std::chrono::seconds(2), [&s] { return s.in_flight == 0; });
}

void Log(LogLevel level, const std::string& message) {
  HandlerState& s = State();
  LogHandler fn;
  void* user;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    fn = s.handler;
    user = s.user;
    if (fn != nullptr) ++s.in_flight;
  }
  if (fn == nullptr) {
    std::fprintf(stderr, "coloader: %s\n", message.c_str());
    return;
  }
  fn(static_cast<int>(level), message.c_str(), user);  // unlocked: it may log again
  {
    std::lock_guard<std::mutex> lock(s.mu);
    --s.in_flight;
  }
  s.idle.notify_all();
}

}  // namespace coloader
