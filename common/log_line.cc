#include "common/log_line.h"

#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <string>

namespace coloader {

void LogLine(const char* format, ...) {
  timeval tv{};
  ::gettimeofday(&tv, nullptr);
  tm local{};
  ::localtime_r(&tv.tv_sec, &local);
  char stamp[40];
  const size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
  std::snprintf(stamp + n, sizeof stamp - n, ".%03d ", static_cast<int>(tv.tv_usec / 1000));

  va_list args;
  va_start(args, format);
  va_list again;
  va_copy(again, args);
  const int length = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string line(stamp);
  if (length > 0) {
    const size_t at = line.size();
    line.resize(at + static_cast<size_t>(length) + 1);
    std::vsnprintf(line.data() + at, static_cast<size_t>(length) + 1, format, again);
    line.pop_back();  // vsnprintf's terminator
  }
  va_end(again);
  if (line.back() != '\n') line += '\n';  // a format that failed, or forgot its newline
  std::fflush(stderr);  // what stdio holds goes first
  for (size_t done = 0; done < line.size();) {
    const ssize_t w = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;  // nowhere to say it: a log line is not worth failing for
    done += static_cast<size_t>(w);
  }
}

}  // namespace coloader
