// Where a named producer lives on this machine: a per-user run directory (mode 0700) holding
// the producer's socket and lock file, and the name of its shared-memory ring.
//
//   run dir     $COLOADER_RUN_DIR, else $XDG_RUNTIME_DIR/coloader, else /tmp/coloader-<uid>
//   socket      ipc://<run dir>/<name>.sock
//   lock        <run dir>/<name>.lock   (flock held by the live producer; tells a crashed
//                                        producer's leftovers from a running one)
//   ring        /dev/shm/coloader-<uid>-<name>
#pragma once

#include <string>

#include "common/status.h"

namespace coloader {

// Producer names are file-name safe: [A-Za-z0-9._-], 1 to 64 characters, not starting with '.'.
Status ValidateName(const std::string& name);

// The run directory, created with mode 0700 if missing. An existing one must belong to this
// user and not be accessible to others; otherwise the error says which and what to do.
Result<std::string> RunDir();

struct ProducerPaths {
  std::string endpoint;   // ipc://.../<name>.sock
  std::string socket;     // the socket file itself
  std::string lock;
  std::string shm_name;   // for shm_open (no leading slash; Boost adds it)
};
Result<ProducerPaths> PathsFor(const std::string& name);

// The producer's claim on a name: an flock on the lock file, released by the kernel when
// the process dies however it dies. Move-only; unlocks and closes on destruction.
class NameLock {
 public:
  // Fails with kAlreadyExists (naming the holder's pid) if a live producer holds the name.
  static Result<NameLock> Acquire(const std::string& lock_path);
  // True if some process holds the lock now (a live producer).
  static bool IsHeld(const std::string& lock_path);

  NameLock(NameLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  NameLock& operator=(NameLock&& o) noexcept;
  NameLock(const NameLock&) = delete;
  NameLock& operator=(const NameLock&) = delete;
  ~NameLock();

  // Unlocks and removes the lock file (normal exit).
  void Release();

 private:
  NameLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace coloader
