#include "common/endpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace coloader {

Status ValidateName(const std::string& name) {
  if (name.empty() || name.size() > 64) {
    return Status::Invalid("producer name '" + name + "' must be 1 to 64 characters long");
  }
  if (name[0] == '.') return Status::Invalid("producer name '" + name + "' must not start with '.'");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Status::Invalid("producer name '" + name +
                             "' may only contain letters, digits, '.', '_' and '-'");
    }
  }
  return Status::OK();
}

namespace {

Status EnsurePrivateDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno("cannot create run directory " + dir, errno);
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return Status::FromErrno("cannot stat " + dir, errno);
  if (!S_ISDIR(st.st_mode)) {
    return Status::Invalid(dir + " is not a directory; remove it or set COLOADER_RUN_DIR");
  }
  if (st.st_uid != ::geteuid()) {
    return Status::Invalid("run directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                           ", not to you (uid " + std::to_string(::geteuid()) +
                           "); set COLOADER_RUN_DIR to a directory of your own");
  }
  if ((st.st_mode & 077) != 0) {
    // Ours but open to others: close it rather than refuse, as ssh-agent does with its dir.
    if (::chmod(dir.c_str(), 0700) != 0) {
      return Status::FromErrno("run directory " + dir + " is accessible to other users and chmod 0700 failed", errno);
    }
  }
  return Status::OK();
}

}  // namespace

Result<std::string> RunDir() {
  std::string dir;
  if (const char* e = std::getenv("COLOADER_RUN_DIR"); e && *e) {
    dir = e;
  } else if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) {
    dir = std::string(x) + "/coloader";
  } else {
    dir = "/tmp/coloader-" + std::to_string(::geteuid());
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  RETURN_NOT_OK(EnsurePrivateDir(dir));
  return dir;
}

Result<ProducerPaths> PathsFor(const std::string& name) {
  RETURN_NOT_OK(ValidateName(name));
  ASSIGN_OR_RETURN(std::string dir, RunDir());
  ProducerPaths p;
  p.socket = dir + "/" + name + ".sock";
  p.endpoint = "ipc://" + p.socket;
  p.lock = dir + "/" + name + ".lock";
  // Two run directories (COLOADER_RUN_DIR) may reuse a name: keep their rings apart by
  // hashing the directory into the shm name.
  uint64_t h = 1469598103934665603ull;
  for (char c : dir) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  p.shm_name = "coloader-" + std::to_string(::geteuid()) + "-" + std::to_string(h % 1000003) +
               "-" + name;
  return p;
}

Result<NameLock> NameLock::Acquire(const std::string& lock_path) {
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno("cannot open lock file " + lock_path, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    char buf[32] = {};
    ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      return Status::AlreadyExists("a producer is already running under this name (pid " + pid +
                                   ", lock " + lock_path + "); stop it or choose another --name");
    }
    return Status::FromErrno("cannot lock " + lock_path, err);
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // The pid is informative only; the lock itself is what matters.
  }
  return NameLock(fd, lock_path);
}

bool NameLock::IsHeld(const std::string& lock_path) {
  int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // closing drops the shared lock we may have taken
  return held;
}

NameLock& NameLock::operator=(NameLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

NameLock::~NameLock() {
  if (fd_ >= 0) ::close(fd_);
}

void NameLock::Release() {
  if (fd_ < 0) return;
  // Unlink while still holding the lock, so no newcomer locks a file that is about to vanish.
  ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

}  // namespace coloader
