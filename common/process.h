// Small process and clock utilities shared by producer and consumer.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "common/status.h"
#include "common/unique_fd.h"

namespace coloader {

// CLOCK_MONOTONIC in nanoseconds; comparable across processes on one machine.
uint64_t MonotonicNs();
// CPU time (user + system) of this process, in seconds, all threads.
double ProcessCpuSeconds();
// The memory this process may use: the machine's RAM, or its container's limit where that is
// lower (cgroup v2 memory.max, v1 memory.limit_in_bytes). 0 if none can be read.
uint64_t MachineMemoryBytes();
// Names the calling thread (at most 15 characters are kept): what top -H, perf and
// /proc/PID/task/TID/comm show, so a thread's CPU can be told from the others'.
void NameThisThread(const std::string& name);

// What a resource failure caught as an exception says: "out of memory", or the thread limit.
std::string ResourceFailure(const std::exception& e);

// Starts a thread running `fn`, or says why it could not, as a Status: std::thread throws when
// the process may not start another (ulimit -u, a container's pids limit), and an exception
// must not end a producer or a training job without a word.
template <typename F>
Result<std::thread> StartThread(const std::string& what, F&& fn) {
  try {
    return std::thread(std::forward<F>(fn));
  } catch (const std::system_error& e) {
    return Status::IOError("cannot start " + what + ": " + ResourceFailure(e));
  }
}

// Who a process is beyond its pid, which means another process in another PID namespace (a
// container started with --ipc=host but not --pid=host) and may be reused once it exits:
// the inode of its PID namespace and its start time (clock ticks after boot, /proc/PID/stat).
// Zero where /proc does not say.
struct ProcessIdentity {
  uint64_t pid_ns = 0;
  uint64_t start_time = 0;
};
ProcessIdentity ThisProcessIdentity();
// Another process's, as this one sees it (zeros when it is gone).
ProcessIdentity IdentityOf(int pid);
// Whether `pid`, as this process sees it, is the process that claims to be it with `claimed`:
// the same PID namespace as this one, and that pid's start time. False when unknown.
bool IsThisProcess(int pid, const ProcessIdentity& claimed);

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
