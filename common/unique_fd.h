// Owned file descriptors. UniqueFd closes what it holds exactly once (move-only; closing a
// moved-from or reset one is a no-op); EventFd is the wake-up counter the loops poll on, whose
// Signal() is safe from any thread and from a signal handler.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <utility>

#include "common/status.h"

namespace coloader {

// Reads up to `n` bytes of `fd` at `offset` (pread, again after a signal or a short read): how
// many were read (fewer only where the file ends), or -1 with errno set.
int64_t PreadFully(int fd, void* buf, size_t n, uint64_t offset);

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  // Closes what it held (if anything) and takes `fd`.
  void Reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Gives the descriptor up without closing it.
  int Release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// A close-on-exec pipe, both ends owned.
struct Pipe {
  static Result<Pipe> Make();
  UniqueFd read;
  UniqueFd write;
};

class EventFd {
 public:
  // A non-blocking, close-on-exec eventfd.
  static Result<EventFd> Make();

  EventFd() = default;
  EventFd(EventFd&&) noexcept = default;
  EventFd& operator=(EventFd&&) noexcept = default;
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;

  int fd() const noexcept { return fd_.get(); }
  bool valid() const noexcept { return fd_.valid(); }
  // Makes the fd readable. Never blocks (the counter only grows); async-signal-safe (write(2)).
  void Signal() const noexcept;
  // Resets the counter; returns how many signals it had gathered (0 when none: EAGAIN).
  uint64_t Drain() const noexcept;

 private:
  explicit EventFd(int fd) noexcept : fd_(fd) {}
  UniqueFd fd_;
};

}  // namespace coloader
