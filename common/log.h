// What coloader has to say that is not an error, in one place for both sides:
//   Log      the consumer library's messages (the wait for a producer, a resume that could not
//            be exact, a kept batch that could not be copied away): inside a training job these
//            are the job's log lines. Without a handler: "coloader: MESSAGE" on stderr.
//   LogLine  a long-running producer's lines (consumers coming and going, decode choices, skipped
//            files). Without a handler: on stderr after the local date and time to the
//            millisecond, "2026-11-24 08:32:12.123 [coloader NAME] ...".
// A program that embeds the library (the Python package, through the C ABI) hands both to its
// own logging with SetLogHandler; a line goes out whole either way (one write(2) or one call),
// so lines of different threads never mix.
#pragma once

#include <string>

namespace coloader {

// Python logging's numbers, so that a handler in Python passes them through.
enum class LogLevel : int { kInfo = 20, kWarning = 30, kError = 40 };

// Called from whichever thread has something to say (the caller's, the I/O thread, the release
// thread, the producer's session loop and workers); it must not call back into the library.
// `message` has no newline and no time stamp.
using LogHandler = void (*)(int level, const char* message, void* user);

// `handler` nullptr: back to stderr. Returns once no call of the previous handler is under
// way, or after 2 s at most (so it must not be called from inside a handler); every later
// message goes to the new one.
void SetLogHandler(LogHandler handler, void* user);

void Log(LogLevel level, const std::string& message);

// printf-style; `format` ends with the line's newline. LogLine is at kInfo.
void LogLine(const char* format, ...) __attribute__((format(printf, 1, 2)));
void LogLineAt(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace coloader
