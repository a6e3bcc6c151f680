// Where a named producer lives on this machine: a per-user run directory (mode 0700) holding
// the producer's socket and lock file, and the name of its shared-memory ring.
//
//   run dir     $COLOADER_RUN_DIR, else $XDG_RUNTIME_DIR/coloader, else /tmp/coloader-<uid>
//   socket      ipc://<run dir>/<name>.sock
//   lock        <run dir>/<name>.lock   (flock held by the live producer; tells a crashed
//                                        producer's leftovers from a running one)
//   ring        /dev/shm/coloader-<uid>-<hash of the run dir>-<name>
//   mailboxes   /dev/shm/coloader-<uid>-<hash of the run dir>-<name>.mbox
//
// A producer that dies by SIGKILL (or a container stopped under it) leaves its socket, lock file
// and both shared-memory objects behind. The lock says whether their owner is alive: the next
// producer of the name, `coloader status` and `coloader clean` reclaim only what a dead one left.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

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
  std::string shm_name;   // the ring, for shm_open (no leading slash: SharedMemory adds it)
  std::string mailbox_shm_name;  // the consumers' mailboxes
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

  NameLock(NameLock&&) noexcept = default;
  NameLock& operator=(NameLock&&) noexcept = default;

  // Unlocks and removes the lock file (normal exit).
  void Release();
  // The pid the lock file named when it was taken: a producer that died holding the name
  // (0 when the file was new or named nobody).
  uint32_t previous_pid() const { return previous_pid_; }

 private:
  NameLock(UniqueFd fd, std::string path, uint32_t previous)
      : fd_(std::move(fd)), path_(std::move(path)), previous_pid_(previous) {}
  UniqueFd fd_;  // the flock is held while it is open
  std::string path_;
  uint32_t previous_pid_ = 0;
};

// With the name's lock held (so its owner is dead): removes what a producer of this name left
// behind, its ring, its mailboxes and its socket. Returns the paths it removed.
std::vector<std::string> RemoveProducerLeftovers(const ProducerPaths& paths);

// Something a dead producer left: a shared-memory object, a socket or a lock file.
struct Leftover {
  std::string name;  // the producer's name
  std::string kind;  // "ring", "mailboxes", "socket", "lock"
  std::string path;
  uint64_t bytes = 0;
};

// Leftovers of dead producers of this run directory: its sockets and lock files whose lock no
// process holds, and the shared-memory objects of those names (this user's, in /dev/shm).
// A live producer's files are never listed. `foreign_segments` (if given) counts this user's
// coloader objects in /dev/shm that belong to other run directories, whose owners cannot be
// judged from here.
Result<std::vector<Leftover>> FindLeftovers(size_t* foreign_segments = nullptr);

// The names of the producers of this run directory that are running now (their name lock is
// held), sorted.
Result<std::vector<std::string>> RunningProducers();

// For a message about a name no producer runs under: "; did you mean 'NAME'? (running here:
// ...)" when a running one is a typo away, "; running here: ..." otherwise, "" when none runs;
// that one is starting when `name` itself holds its lock (its socket is not made yet).
std::string WhatRunsInstead(const std::string& name);

// Removes the leftovers of every dead producer of this run directory, each under its name lock
// (a producer that starts meanwhile keeps its name and its files). Returns what was removed.
Result<std::vector<Leftover>> CleanLeftovers();

}  // namespace coloader
