// Small process and clock utilities shared by producer and consumer.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace coloader {

// CLOCK_MONOTONIC in nanoseconds; comparable across processes on one machine.
uint64_t MonotonicNs();
// CPU time (user + system) of this process, in seconds, all threads.
double ProcessCpuSeconds();
// Names the calling thread (at most 15 characters are kept): what top -H, perf and
// /proc/PID/task/TID/comm show, so a thread's CPU can be told from the others'.
void NameThisThread(const std::string& name);

// A file descriptor for a process that becomes readable when it exits (pidfd_open, Linux 5.3+).
// Lets a poll loop notice a local peer's death at once. Move-only.
class ProcessWatch {
 public:
  static Result<ProcessWatch> Open(int pid);
  ProcessWatch() = default;

  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }
  // True once the process has exited (non-blocking).
  bool Exited() const;
  // Waits up to `timeout_ms` for the process to exit; true if it has.
  bool WaitExited(int timeout_ms) const;

 private:
  explicit ProcessWatch(int fd) : fd_(fd) {}
  UniqueFd fd_;  // move-only through it
};

}  // namespace coloader
