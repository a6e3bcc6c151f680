#include "pipeline/source/read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/unique_fd.h"

namespace coloader {

bool MachineFault(int err) {
  return err == EMFILE || err == ENFILE || err == ENOMEM || err == ENOBUFS || err == EAGAIN || err == EINTR ||
         err == EIO;
}

namespace {

// The error of a failed call on `what`: the machine's (kUnavailable, not the file's fault) or
// the file's (kIOError, a bad file).
Status ReadError(const std::string& what, int err) {
  if (MachineFault(err))
    return Status::Unavailable(what + ": " + std::strerror(err) + " (the machine's, not the file's: out of " +
                               "descriptors or memory, or a failing device)");
  return Status::FromErrno(what, err);
}

// open(2), tried again while the machine is out of descriptors or memory: a moment later another
// thread may have closed its file (five tries over about 1.5 s).
UniqueFd OpenForRead(const std::string& path) {
  for (int attempt = 0;; ++attempt) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.valid() || !MachineFault(errno) || attempt == 4) return fd;
    ::usleep(static_cast<useconds_t>(50'000) << attempt);
  }
}

}  // namespace

Status ReadWholeFile(const std::string& path, std::vector<uint8_t>* out) {
  const UniqueFd fd = OpenForRead(path);
  if (!fd.valid()) return ReadError(path + ": cannot open", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(path + ": cannot stat", errno);
  out->resize(static_cast<size_t>(st.st_size));
  const int64_t got = PreadFully(fd.get(), out->data(), out->size(), 0);
  if (got < 0) return ReadError(path + ": read failed", errno);
  if (static_cast<size_t>(got) < out->size()) return Status::IOError(path + ": file shrank while being read");
  if (out->empty()) return Status::Invalid(path + ": empty file");
  return Status::OK();
}

Status ReadFileInChunks(const std::string& path, const std::function<bool(const uint8_t*, size_t)>& take) {
  const UniqueFd fd = OpenForRead(path);
  if (!fd.valid()) return ReadError(path + ": cannot open", errno);
  std::vector<uint8_t> chunk(size_t{1} << 20);
  for (uint64_t offset = 0;;) {
    const int64_t got = PreadFully(fd.get(), chunk.data(), chunk.size(), offset);
    if (got < 0) return ReadError(path + ": read failed", errno);
    if (got == 0) return offset == 0 ? Status::Invalid(path + ": empty file") : Status::OK();
    if (!take(chunk.data(), static_cast<size_t>(got))) return Status::OK();
    offset += static_cast<uint64_t>(got);
    if (static_cast<size_t>(got) < chunk.size()) return Status::OK();
  }
}

Status ReadSample(const Sample& sample, std::vector<uint8_t>* out) {
  if (!sample.in_archive()) return ReadWholeFile(sample.path, out);
  const std::string where = sample.where();
  if (sample.size == 0) return Status::Invalid(where + ": empty member");
  const UniqueFd fd = OpenForRead(sample.path);
  if (!fd.valid()) return ReadError(sample.path + ": cannot open", errno);
  out->resize(static_cast<size_t>(sample.size));
  const int64_t got = PreadFully(fd.get(), out->data(), out->size(), sample.offset);
  if (got < 0) return ReadError(where + ": read failed", errno);
  if (static_cast<size_t>(got) < out->size()) return Status::IOError(where + ": the shard shrank while being read");
  return Status::OK();
}

}  // namespace coloader
