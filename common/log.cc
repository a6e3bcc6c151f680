#include "common/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <ctime>
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

// Gives `message` to the handler if there is one; false when there is none.
bool ToHandler(LogLevel level, const char* message) {
  HandlerState& s = State();
  LogHandler fn;
  void* user;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    fn = s.handler;
    user = s.user;
    if (fn == nullptr) return false;
    ++s.in_flight;
  }
  fn(static_cast<int>(level), message, user);  // unlocked: it may log again
  {
    std::lock_guard<std::mutex> lock(s.mu);
    --s.in_flight;
  }
  s.idle.notify_all();
  return true;
}

void WriteToStderr(const std::string& line) {
  std::fflush(stderr);  // what stdio holds goes first
  for (size_t done = 0; done < line.size();) {
    const ssize_t w = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;  // nowhere to say it: a log line is not worth failing for
    done += static_cast<size_t>(w);
  }
}

std::string Format(const char* format, va_list args) {
  va_list again;
  va_copy(again, args);
  const int length = std::vsnprintf(nullptr, 0, format, args);
  std::string text;
  if (length > 0) {
    text.resize(static_cast<size_t>(length) + 1);
    std::vsnprintf(text.data(), text.size(), format, again);
    text.pop_back();  // vsnprintf's terminator
  }
  va_end(again);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

void EmitLine(LogLevel level, const std::string& text) {
  if (ToHandler(level, text.c_str())) return;
  timeval tv{};
  ::gettimeofday(&tv, nullptr);
  tm local{};
  ::localtime_r(&tv.tv_sec, &local);
  char stamp[40];
  const size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
  std::snprintf(stamp + n, sizeof stamp - n, ".%03d ", static_cast<int>(tv.tv_usec / 1000));
  WriteToStderr(stamp + text + "\n");
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
  if (!ToHandler(level, message.c_str())) WriteToStderr("coloader: " + message + "\n");
}

void LogLine(const char* format, ...) {
  va_list args;
  va_start(args, format);
  const std::string text = Format(format, args);
  va_end(args);
  EmitLine(LogLevel::kInfo, text);
}

void LogLineAt(LogLevel level, const char* format, ...) {
  va_list args;
  va_start(args, format);
  const std::string text = Format(format, args);
  va_end(args);
  EmitLine(level, text);
}

}  // namespace coloader
