#include "common/unique_fd.h"

#include <fcntl.h>
#include <sys/eventfd.h>

#include <cerrno>

namespace coloader {

int64_t PreadFully(int fd, void* buf, size_t n, uint64_t offset) {
  auto* out = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<int64_t>(done);
}

Result<Pipe> Pipe::Make() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe", errno);
  Pipe p;
  p.read.Reset(fds[0]);
  p.write.Reset(fds[1]);
  return p;
}

Result<EventFd> EventFd::Make() {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return Status::FromErrno("eventfd", errno);
  return EventFd(fd);
}

void EventFd::Signal() const noexcept {
  const uint64_t one = 1;
  (void)!::write(fd_.get(), &one, sizeof(one));
}

uint64_t EventFd::Drain() const noexcept {
  uint64_t counter = 0;
  if (::read(fd_.get(), &counter, sizeof(counter)) != static_cast<ssize_t>(sizeof(counter))) return 0;
  return counter;
}

}  // namespace coloader
