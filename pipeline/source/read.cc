#include "pipeline/source/read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"

namespace coloader {

Status ReadWholeFile(const std::string& path, std::vector<uint8_t>* out) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(path + ": cannot open", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(path + ": cannot stat", errno);
  out->resize(static_cast<size_t>(st.st_size));
  const int64_t got = PreadFully(fd.get(), out->data(), out->size(), 0);
  if (got < 0) return Status::FromErrno(path + ": read failed", errno);
  if (static_cast<size_t>(got) < out->size()) return Status::IOError(path + ": file shrank while being read");
  if (out->empty()) return Status::Invalid(path + ": empty file");
  return Status::OK();
}

Status ReadSample(const Sample& sample, std::vector<uint8_t>* out) {
  if (!sample.in_archive()) return ReadWholeFile(sample.path, out);
  const std::string where = sample.where();
  if (sample.size == 0) return Status::Invalid(where + ": empty member");
  const UniqueFd fd(::open(sample.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(sample.path + ": cannot open", errno);
  out->resize(static_cast<size_t>(sample.size));
  const int64_t got = PreadFully(fd.get(), out->data(), out->size(), sample.offset);
  if (got < 0) return Status::FromErrno(where + ": read failed", errno);
  if (static_cast<size_t>(got) < out->size()) return Status::IOError(where + ": the shard shrank while being read");
  return Status::OK();
}

}  // namespace coloader
