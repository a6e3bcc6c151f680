// What the consumer library has to say that is not an error: the wait for a producer, a resume
// that could not be exact, a kept batch that could not be copied away. Inside a training job
// these are the job's log lines, not the library's stderr: the caller may hand them to its own
// logging (the Python package hands them to the `coloader` logger). Without a handler each
// goes to stderr as one line, "coloader: MESSAGE".
#pragma once

#include <string>

namespace coloader {

// Python logging's numbers, so that a handler in Python passes them through.
enum class LogLevel : int { kInfo = 20, kWarning = 30, kError = 40 };

// Called from whichever thread has something to say (the caller's, the I/O thread, the
// release thread); it must not call back into the consumer.
using LogHandler = void (*)(int level, const char* message, void* user);

// `handler` nullptr: back to stderr. Returns once no call of the previous handler is under
// way, or after 2 s at most (so it must not be called from inside a handler); every later
// message goes to the new one.
void SetLogHandler(LogHandler handler, void* user);

void Log(LogLevel level, const std::string& message);

}  // namespace coloader
