// Small process and clock utilities shared by producer and consumer.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

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
  ProcessWatch(ProcessWatch&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ProcessWatch& operator=(ProcessWatch&& o) noexcept;
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;
  ~ProcessWatch();

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // True once the process has exited (non-blocking).
  bool Exited() const;

 private:
  explicit ProcessWatch(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace coloader
