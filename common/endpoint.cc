#include "common/endpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "common/shm.h"

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
  COLOADER_RETURN_NOT_OK(EnsurePrivateDir(dir));
  return dir;
}

namespace {

// Two run directories (COLOADER_RUN_DIR) may reuse a name: keep their rings apart by hashing
// the directory into the shm name. The prefix every object of this run directory starts with.
std::string ShmPrefix(const std::string& dir) {
  uint64_t h = 1469598103934665603ull;
  for (char c : dir) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return "coloader-" + std::to_string(::geteuid()) + "-" + std::to_string(h % 1000003) + "-";
}

ProducerPaths PathsIn(const std::string& dir, const std::string& name) {
  ProducerPaths p;
  p.socket = dir + "/" + name + ".sock";
  p.endpoint = "ipc://" + p.socket;
  p.lock = dir + "/" + name + ".lock";
  p.shm_name = ShmPrefix(dir) + name;
  p.mailbox_shm_name = p.shm_name + ".mbox";
  return p;
}

uint64_t FileBytes(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  return names;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

Result<ProducerPaths> PathsFor(const std::string& name) {
  COLOADER_RETURN_NOT_OK(ValidateName(name));
  COLOADER_ASSIGN_OR_RETURN(std::string dir, RunDir());
  return PathsIn(dir, name);
}

Result<NameLock> NameLock::Acquire(const std::string& lock_path) {
  // A holder unlinks the file while it still holds the lock (Release, `coloader clean`), so
  // the file we opened may be gone by the time our flock succeeds: then the lock is on an
  // orphan that nobody else will ever look at, and we try again on the path's new file.
  for (int attempt = 0;; ++attempt) {
    UniqueFd fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) return Status::FromErrno("cannot open lock file " + lock_path, errno);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char buf[32] = {};
      const ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
      if (err == EWOULDBLOCK) {
        std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
        while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
        return Status::AlreadyExists("a producer is already running under this name (pid " + pid +
                                     ", lock " + lock_path + "); stop it or choose another --name");
      }
      return Status::FromErrno("cannot lock " + lock_path, err);
    }
    struct stat held {}, now {};
    if (::fstat(fd.get(), &held) == 0 && ::stat(lock_path.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      char buf[32] = {};
      const ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
      const uint32_t previous = n > 0 ? static_cast<uint32_t>(std::strtoul(buf, nullptr, 10)) : 0;
      std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
        // The pid is informative only; the lock itself is what matters.
      }
      return NameLock(std::move(fd), lock_path, previous);
    }
    if (attempt >= 100) return Status::IOError("lock file " + lock_path + " keeps being replaced; is something removing it?");
  }
}

bool NameLock::IsHeld(const std::string& lock_path) {
  const UniqueFd fd(::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  // Closing (on return) drops the shared lock we may have taken.
  return ::flock(fd.get(), LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
}

void NameLock::Release() {
  if (!fd_.valid()) return;
  // Unlink while still holding the lock, so no newcomer locks a file that is about to vanish.
  ::unlink(path_.c_str());
  fd_.Reset();
}

std::vector<std::string> RemoveProducerLeftovers(const ProducerPaths& p) {
  std::vector<std::string> removed;
  for (const std::string& shm : {p.shm_name, p.mailbox_shm_name}) {
    if (SharedMemory::Remove(shm)) removed.push_back(std::string(kShmDir) + "/" + shm);
  }
  if (::unlink(p.socket.c_str()) == 0) removed.push_back(p.socket);
  return removed;
}

Result<std::vector<Leftover>> FindLeftovers(size_t* foreign_segments) {
  COLOADER_ASSIGN_OR_RETURN(std::string dir, RunDir());
  // Names with anything in the run directory or in /dev/shm under this directory's prefix.
  std::set<std::string> names;
  for (const std::string& f : ListDir(dir)) {
    for (const char* ext : {".sock", ".lock"}) {
      if (EndsWith(f, ext)) names.insert(f.substr(0, f.size() - std::strlen(ext)));
    }
  }
  const std::string prefix = ShmPrefix(dir);
  const std::string mine = "coloader-" + std::to_string(::geteuid()) + "-";
  if (foreign_segments) *foreign_segments = 0;
  for (const std::string& f : ListDir(kShmDir)) {
    if (f.compare(0, prefix.size(), prefix) == 0) {
      std::string name = f.substr(prefix.size());
      if (EndsWith(name, ".mbox")) name.resize(name.size() - 5);
      names.insert(name);
    } else if (foreign_segments && f.compare(0, mine.size(), mine) == 0) {
      ++*foreign_segments;
    }
  }
  std::vector<Leftover> out;
  for (const std::string& name : names) {
    if (!ValidateName(name).ok()) continue;  // not a producer's file
    const ProducerPaths p = PathsIn(dir, name);
    if (NameLock::IsHeld(p.lock)) continue;  // a live producer: not a leftover
    const std::string ring = std::string(kShmDir) + "/" + p.shm_name;
    const std::string mbox = std::string(kShmDir) + "/" + p.mailbox_shm_name;
    if (Exists(ring)) out.push_back({name, "ring", ring, FileBytes(ring)});
    if (Exists(mbox)) out.push_back({name, "mailboxes", mbox, FileBytes(mbox)});
    if (Exists(p.socket)) out.push_back({name, "socket", p.socket, 0});
    if (Exists(p.lock)) out.push_back({name, "lock", p.lock, 0});
  }
  return out;
}

namespace {

// Edits (insertions, deletions, substitutions) between two names.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

Result<std::vector<std::string>> RunningProducers() {
  COLOADER_ASSIGN_OR_RETURN(std::string dir, RunDir());
  std::vector<std::string> out;
  for (const std::string& f : ListDir(dir)) {
    if (!EndsWith(f, ".lock")) continue;
    const std::string name = f.substr(0, f.size() - 5);
    if (ValidateName(name).ok() && NameLock::IsHeld(PathsIn(dir, name).lock)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// For a name no producer runs under: the closest running one, if a typo away, and the others.
std::string WhatRunsInstead(const std::string& name) {
  Result<std::vector<std::string>> running = RunningProducers();
  if (!running.ok() || running->empty()) return "";
  // It holds its name from the start, and answers once its ring and socket are made.
  if (std::find(running->begin(), running->end(), name) != running->end())
    return "; a producer of this name is starting (it holds the name, its socket is not there yet)";
  const std::string* closest = nullptr;
  size_t best = std::max<size_t>(2, name.size() / 3) + 1;
  for (const std::string& r : *running) {
    if (const size_t d = EditDistance(name, r); d < best) best = d, closest = &r;
  }
  std::string all;
  for (const std::string& r : *running) all += (all.empty() ? "" : ", ") + r;
  return closest ? "; did you mean '" + *closest + "'? (running here: " + all + ")" : "; running here: " + all;
}

Result<std::vector<Leftover>> CleanLeftovers() {
  COLOADER_ASSIGN_OR_RETURN(std::vector<Leftover> found, FindLeftovers());
  COLOADER_ASSIGN_OR_RETURN(std::string dir, RunDir());
  std::map<std::string, std::vector<Leftover>> by_name;
  for (Leftover& l : found) by_name[l.name].push_back(std::move(l));
  std::vector<Leftover> removed;
  for (auto& [name, items] : by_name) {
    // Taking the name's lock is what makes this safe: while we hold it no producer of that
    // name can start, and if one started since the listing, we fail to take it and skip.
    Result<NameLock> lock = NameLock::Acquire(PathsIn(dir, name).lock);
    if (!lock.ok()) continue;
    RemoveProducerLeftovers(PathsIn(dir, name));
    lock->Release();  // removes the lock file, which was a leftover too
    for (Leftover& l : items) {
      if (!Exists(l.path)) removed.push_back(std::move(l));
    }
  }
  return removed;
}

}  // namespace coloader
