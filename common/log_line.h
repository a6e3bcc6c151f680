// One line of a long-running process's log (the producer's), on stderr, after the local date
// and time to the millisecond: "2026-11-24 08:32:12.123 [coloader NAME] ...". The line is
// formatted first and written with one write(2), so lines of different threads never mix.
#pragma once

namespace coloader {

// printf-style; `format` ends with the line's newline.
void LogLine(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace coloader
