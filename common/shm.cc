#include "common/shm.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace coloader {

namespace {

// shm_open wants one leading slash; the names coloader builds have none.
std::string ObjectName(const std::string& name) { return "/" + name; }
std::string PathOf(const std::string& name) { return std::string(kShmDir) + "/" + name; }

// posix_fallocate returns the error (it does not set errno). A signal can interrupt a long
// allocation (a GiB ring takes a while to zero); it is simply asked again, and the pages it
// already gave stay given.
int Fallocate(int fd, uint64_t offset, uint64_t length) {
  int rc;
  do {
    rc = ::posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(length));
  } while (rc == EINTR);
  return rc;
}

Status ReserveRanges(int fd, const std::string& name, uint64_t size, const SharedMemory::Ranges& ranges,
                     bool* no_space) {
  for (const auto& [offset, length] : ranges) {
    if (length == 0) continue;
    if (offset > size || length > size - offset) {
      return Status::Internal("reservation [" + std::to_string(offset) + ", +" + std::to_string(length) +
                              ") is outside " + PathOf(name) + " of " + std::to_string(size) + " bytes");
    }
    if (int rc = Fallocate(fd, offset, length); rc != 0) {
      if (rc == ENOSPC && no_space) *no_space = true;
      std::string free_now;
      if (auto s = QueryShmSpace(); s.ok()) free_now = " (" + HumanBytes(s->free_bytes) + " free now)";
      // ENOMEM rather than ENOSPC: the tmpfs had room but the memory cgroup did not (tmpfs
      // pages are charged to the container's memory limit).
      return Status::IOError("cannot reserve " + HumanBytes(length) + " of " + PathOf(name) + " in " + kShmDir +
                             free_now + ": " + std::strerror(rc) +
                             (rc == ENOMEM ? " (pages of /dev/shm count against this container's memory limit: "
                                             "raise it or make the ring smaller)" : ""));
    }
  }
  return Status::OK();
}

}  // namespace

Result<ShmSpace> QueryShmSpace() {
  struct statvfs v {};
  if (::statvfs(kShmDir, &v) != 0) return Status::FromErrno(std::string("cannot statvfs ") + kShmDir, errno);
  ShmSpace s;
  s.free_bytes = uint64_t{v.f_bavail} * v.f_frsize;
  s.total_bytes = uint64_t{v.f_blocks} * v.f_frsize;
  return s;
}

std::string HumanBytes(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  else if (bytes >= (1ull << 20)) std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1ull << 20));
  else std::snprintf(buf, sizeof(buf), "%llu KiB", static_cast<unsigned long long>((bytes + 1023) >> 10));
  return buf;
}

SharedMemory& SharedMemory::operator=(SharedMemory&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    o.name_.clear();
    fd_ = std::move(o.fd_);
  }
  return *this;
}

SharedMemory::~SharedMemory() {
  if (data_) ::munmap(data_, size_);
}

Result<SharedMemory> SharedMemory::Create(const std::string& name, size_t bytes, const Ranges& reserve,
                                          bool* no_space) {
  if (no_space) *no_space = false;
  if (bytes == 0) return Status::Internal("shared memory " + PathOf(name) + " of 0 bytes");
  // The caller holds the name's lock, so an object of this name is a crashed owner's leftover:
  // unlink it (a reader still mapping it keeps its pages) and make a fresh one, never reusing
  // its bytes or its permissions.
  ::shm_unlink(ObjectName(name).c_str());
  UniqueFd fd(::shm_open(ObjectName(name).c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    const int err = errno;
    struct stat st {};
    if (err == EEXIST && ::stat(PathOf(name).c_str(), &st) == 0 && st.st_uid != ::geteuid()) {
      // Still there after our unlink: /dev/shm is sticky, so another user made it, and its
      // name is ours (it carries our uid): a squatter, or a leftover of a process run as root.
      const passwd* owner = ::getpwuid(st.st_uid);
      return Status::AlreadyExists(PathOf(name) + " exists and belongs to user " +
                                   (owner ? std::string(owner->pw_name) : std::string("?")) + " (uid " +
                                   std::to_string(st.st_uid) + "), not to this user, who cannot remove it: ask them "
                                   "or root to remove it, or use another --name");
    }
    return Status::FromErrno("cannot create shared memory " + PathOf(name), err);
  }
  ::fchmod(fd.get(), 0600);  // past the umask, whatever it is
  auto fail = [&](Status st) {
    ::shm_unlink(ObjectName(name).c_str());
    return st;
  };
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    return fail(Status::FromErrno("cannot size shared memory " + PathOf(name) + " to " + HumanBytes(bytes), err));
  }
  Status reserved = ReserveRanges(fd.get(), name, bytes, reserve.empty() ? Ranges{{0, bytes}} : reserve, no_space);
  if (!reserved.ok()) return fail(reserved);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return fail(Status::FromErrno("cannot map shared memory " + PathOf(name), err));
  }
  // fd closes on return: the mapping keeps the object; Reserve reopens it by name.
  SharedMemory shm;
  shm.data_ = static_cast<uint8_t*>(p);
  shm.size_ = bytes;
  shm.name_ = name;
  return shm;
}

Status SharedMemory::Reserve(const Ranges& ranges, bool* no_space) {
  if (no_space) *no_space = false;
  const UniqueFd fd(::shm_open(ObjectName(name_).c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno("cannot reopen shared memory " + PathOf(name_) + " to reserve space", errno);
  return ReserveRanges(fd.get(), name_, size_, ranges, no_space);
}

Result<SharedMemory> SharedMemory::Open(const std::string& name, size_t expected_bytes, bool writable) {
  UniqueFd fd(::shm_open(ObjectName(name).c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("the producer's shared memory " + PathOf(name) + " does not exist");
    return Status::FromErrno("cannot open the producer's shared memory " + PathOf(name), err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("cannot stat " + PathOf(name), errno);
  // Mapping past the end of the object would SIGBUS on the first read there: check first.
  if (static_cast<uint64_t>(st.st_size) < expected_bytes) {
    return Status::Protocol("shared memory " + PathOf(name) + " holds " + std::to_string(st.st_size) +
                            " bytes, the producer announced " + std::to_string(expected_bytes));
  }
  void* p = ::mmap(nullptr, expected_bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return Status::FromErrno("cannot map the producer's shared memory " + PathOf(name), errno);
  SharedMemory shm;
  shm.data_ = static_cast<uint8_t*>(p);
  shm.size_ = expected_bytes;
  shm.name_ = name;
  shm.fd_ = std::move(fd);
  return shm;
}

Result<PrivateView> PrivateView::Map(const SharedMemory& shm, uint64_t offset, uint64_t bytes) {
  if (shm.fd() < 0) return Status::Internal("a private view needs a region opened with SharedMemory::Open");
  if (bytes == 0 || offset > shm.size() || bytes > shm.size() - offset)
    return Status::Internal("a private view of [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                            ") lies outside " + PathOf(shm.name()));
  // Private mappings need only read access to the object: its descriptor may be read-only.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, shm.fd(), static_cast<off_t>(offset));
  if (p == MAP_FAILED) return Status::FromErrno("cannot map a private view of " + PathOf(shm.name()), errno);
  PrivateView v;
  v.data_ = static_cast<uint8_t*>(p);
  v.size_ = bytes;
  return v;
}

PrivateView& PrivateView::operator=(PrivateView&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

PrivateView::~PrivateView() {
  if (data_) ::munmap(data_, size_);
}

Status PrivateView::Detach() {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels say EINVAL
#endif
  if (!data_) return Status::OK();
  if (::madvise(data_, size_, MADV_POPULATE_WRITE) == 0) return Status::OK();
  if (errno != EINVAL) return Status::FromErrno("cannot copy a private view of " + HumanBytes(size_), errno);
  DetachPageByPage();  // a kernel without MADV_POPULATE_WRITE
  return Status::OK();
}

void PrivateView::DetachPageByPage() {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t off = 0; off < size_; off += page) __atomic_fetch_or(data_ + off, uint8_t{0}, __ATOMIC_RELAXED);
}

bool SharedMemory::Remove(const std::string& name) { return ::shm_unlink(ObjectName(name).c_str()) == 0; }

}  // namespace coloader
