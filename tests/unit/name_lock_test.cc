// NameLock and PathsFor (common/endpoint.h): a producer's claim on its name is an flock that
// the kernel drops however the holder dies; the paths of a name live in a private run
// directory. Holders here are real processes (fork), killed for real.
#include "common/endpoint.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/test_support.h"

namespace coloader {
namespace {

using ::coloader::testing::ReadFile;
using ::coloader::testing::TempDir;

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// A process that takes the lock, says so through a pipe, and holds it until killed.
class Holder {
 public:
  explicit Holder(const std::string& lock_path) {
    int ready[2];
    if (::pipe(ready) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      auto lock = NameLock::Acquire(lock_path);
      const char answer = lock.ok() ? 'y' : 'n';
      if (::write(ready[1], &answer, 1) != 1) ::_exit(2);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char answer = 0;
    locked_ = pid_ > 0 && ::read(ready[0], &answer, 1) == 1 && answer == 'y';
    ::close(ready[0]);
  }
  ~Holder() { Kill(); }
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;

  bool locked() const { return locked_; }
  pid_t pid() const { return pid_; }
  // SIGKILL: no destructor, no Release; only the kernel cleans up. Returns once reaped.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  bool locked_ = false;
};

class NameLockTest : public ::testing::Test {
 protected:
  std::string Lock(const std::string& name = "p") const { return dir_.path() + "/" + name + ".lock"; }
  TempDir dir_;
};

TEST_F(NameLockTest, AcquireCreatesTheLockFileHoldingThisPid) {
  ASSERT_FALSE(Exists(Lock()));
  EXPECT_FALSE(NameLock::IsHeld(Lock()));  // no file: nobody holds it
  ASSERT_OK_AND_ASSIGN(NameLock lock, NameLock::Acquire(Lock()));
  EXPECT_TRUE(Exists(Lock()));
  EXPECT_EQ(ReadFile(Lock()), std::to_string(::getpid()) + "\n");
  struct stat st {};
  ASSERT_EQ(::stat(Lock().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(NameLock::IsHeld(Lock()));
}

TEST_F(NameLockTest, ASecondAcquireInAnotherProcessFailsNamingTheHolder) {
  ASSERT_OK_AND_ASSIGN(NameLock lock, NameLock::Acquire(Lock()));
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    auto second = NameLock::Acquire(Lock());
    std::string report = second.ok() ? std::string("acquired") : second.status().ToString();
    report = (second.ok() || second.status().code() != StatusCode::kAlreadyExists ? "W " : "A ") + report;
    ::_exit(::write(fds[1], report.data(), report.size()) == static_cast<ssize_t>(report.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string report;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) report.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(report.substr(0, 2), "A ") << "expected kAlreadyExists, got: " << report;
  EXPECT_NE(report.find("pid " + std::to_string(::getpid())), std::string::npos) << report;
  EXPECT_NE(report.find(Lock()), std::string::npos) << report;
  // The loser did not disturb the holder's claim.
  EXPECT_TRUE(NameLock::IsHeld(Lock()));
  EXPECT_EQ(ReadFile(Lock()), std::to_string(::getpid()) + "\n");
}

TEST_F(NameLockTest, AcquireFailsWhileAnotherProcessHoldsItAndSucceedsOnceTheKernelDropsIt) {
  Holder holder(Lock());
  ASSERT_TRUE(holder.locked());
  EXPECT_TRUE(NameLock::IsHeld(Lock()));
  auto refused = NameLock::Acquire(Lock());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(refused.status().message().find("pid " + std::to_string(holder.pid())), std::string::npos)
      << refused.status().ToString();

  holder.Kill();  // SIGKILL: it never releases
  EXPECT_TRUE(Exists(Lock())) << "the killed holder's lock file is left over";
  EXPECT_FALSE(NameLock::IsHeld(Lock()));
  ASSERT_OK_AND_ASSIGN(NameLock taken_over, NameLock::Acquire(Lock()));
  EXPECT_EQ(ReadFile(Lock()), std::to_string(::getpid()) + "\n");  // the stale pid is replaced
  EXPECT_TRUE(NameLock::IsHeld(Lock()));
}

TEST_F(NameLockTest, ASecondAcquireInTheSameProcessAlsoFails) {
  ASSERT_OK_AND_ASSIGN(NameLock lock, NameLock::Acquire(Lock()));
  auto again = NameLock::Acquire(Lock());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(NameLock::IsHeld(Lock()));  // the failed attempt did not drop ours
}

TEST_F(NameLockTest, ReleaseUnlocksAndRemovesTheFile) {
  ASSERT_OK_AND_ASSIGN(NameLock lock, NameLock::Acquire(Lock()));
  lock.Release();
  EXPECT_FALSE(Exists(Lock()));
  EXPECT_FALSE(NameLock::IsHeld(Lock()));
  lock.Release();  // twice is harmless
  ASSERT_OK_AND_ASSIGN(NameLock next, NameLock::Acquire(Lock()));  // the name is free again
  EXPECT_TRUE(NameLock::IsHeld(Lock()));
}

TEST_F(NameLockTest, DestructionWithoutReleaseUnlocksButLeavesTheFile) {
  {
    ASSERT_OK_AND_ASSIGN(NameLock lock, NameLock::Acquire(Lock()));
    EXPECT_TRUE(NameLock::IsHeld(Lock()));
  }
  EXPECT_FALSE(NameLock::IsHeld(Lock()));
  EXPECT_TRUE(Exists(Lock()));
}

TEST_F(NameLockTest, IsHeldIsFalseForAFileThatNobodyLocks) {
  ::coloader::testing::WriteFile(Lock(), "12345\n");  // a leftover naming a long-gone pid
  EXPECT_FALSE(NameLock::IsHeld(Lock()));
  ASSERT_OK_AND_ASSIGN(NameLock lock, NameLock::Acquire(Lock()));
  EXPECT_EQ(ReadFile(Lock()), std::to_string(::getpid()) + "\n");
}

TEST_F(NameLockTest, MovingKeepsTheLock) {
  static_assert(!std::is_copy_constructible_v<NameLock> && !std::is_copy_assignable_v<NameLock>);
  std::optional<NameLock> moved;
  {
    ASSERT_OK_AND_ASSIGN(NameLock lock, NameLock::Acquire(Lock()));
    moved.emplace(std::move(lock));
  }  // the moved-from lock is destroyed here
  EXPECT_TRUE(NameLock::IsHeld(Lock()));
  moved->Release();  // the moved-to one still knows its file
  EXPECT_FALSE(NameLock::IsHeld(Lock()));
  EXPECT_FALSE(Exists(Lock()));
}

TEST_F(NameLockTest, MoveAssignmentDropsTheTargetsLockAndKeepsTheSourcesOne) {
  ASSERT_OK_AND_ASSIGN(NameLock target, NameLock::Acquire(Lock("a")));
  ASSERT_OK_AND_ASSIGN(NameLock source, NameLock::Acquire(Lock("b")));
  target = std::move(source);
  EXPECT_FALSE(NameLock::IsHeld(Lock("a")));
  EXPECT_TRUE(NameLock::IsHeld(Lock("b")));
  source.Release();  // NOLINT(bugprone-use-after-move): a moved-from lock owns nothing to release
  EXPECT_TRUE(NameLock::IsHeld(Lock("b")));
  EXPECT_TRUE(Exists(Lock("b")));
  target.Release();
  EXPECT_FALSE(Exists(Lock("b")));
}

TEST_F(NameLockTest, AcquireInAMissingDirectoryIsAnErrorNamingThePath) {
  const std::string path = dir_.path() + "/no/such/dir/p.lock";
  auto r = NameLock::Acquire(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
}

// Two processes contend for one name as fast as they can: each acquires, marks itself the
// holder in shared memory, un-marks, releases, again. If both ever hold the name at once, the
// mark shows it. Release unlinks the file before it unlocks, so an Acquire whose open() fell
// just before a Release locks an unlinked file: it must notice and retry on the path's new
// file, or two producers run under one name. (Before Acquire compared the locked file with
// the path's, this failed within a few hundred acquisitions here; it runs 3 s.)
TEST_F(NameLockTest, TwoProcessesContendingForANameNeverBothHoldIt) {
  struct Shared {
    std::atomic<int> holder;
    std::atomic<int> both;
    std::atomic<long> acquired;
  };
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* shared = new (mem) Shared{{0}, {0}, {0}};
  const auto contend = [&](int me) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (shared->both.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      auto lock = NameLock::Acquire(Lock());
      if (!lock.ok()) continue;
      ++shared->acquired;
      int nobody = 0;
      if (!shared->holder.compare_exchange_strong(nobody, me)) {
        ++shared->both;
      } else {
        for (int i = 0; i < 20; ++i) std::this_thread::yield();  // hold it a moment
        shared->holder.store(0);
      }
      lock->Release();
    }
  };
  pid_t children[2];
  for (int c = 0; c < 2; ++c) {
    children[c] = ::fork();
    if (children[c] == 0) {
      contend(c + 1);
      ::_exit(0);
    }
  }
  for (pid_t child : children) ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_GT(shared->acquired.load(), 0);
  EXPECT_EQ(shared->both.load(), 0) << "two processes held the name at once (after " << shared->acquired.load()
                                    << " acquisitions)";
  ::munmap(mem, sizeof(Shared));
}

// ------------------------------------------------------------------------------ PathsFor

// Sets (or unsets, with nullopt) an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class PathsForTest : public ::testing::Test {
 protected:
  std::string Run() const { return dir_.path() + "/run"; }
  TempDir dir_;
};

TEST_F(PathsForTest, PutsTheSocketAndLockInCOLOADER_RUN_DIRCreatedPrivate) {
  ScopedEnv env("COLOADER_RUN_DIR", Run());
  ASSERT_OK_AND_ASSIGN(ProducerPaths p, PathsFor("imagenet-train_1.0"));
  EXPECT_EQ(p.socket, Run() + "/imagenet-train_1.0.sock");
  EXPECT_EQ(p.endpoint, "ipc://" + Run() + "/imagenet-train_1.0.sock");
  EXPECT_EQ(p.lock, Run() + "/imagenet-train_1.0.lock");
  const std::string prefix = "coloader-" + std::to_string(::geteuid()) + "-";
  EXPECT_EQ(p.shm_name.rfind(prefix, 0), 0u) << p.shm_name;
  EXPECT_EQ(p.shm_name.substr(p.shm_name.size() - 19), "-imagenet-train_1.0") << p.shm_name;
  EXPECT_EQ(p.shm_name.find('/'), std::string::npos) << p.shm_name;
  struct stat st {};
  ASSERT_EQ(::stat(Run().c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(PathsForTest, TrailingSlashesOfTheRunDirAreDropped) {
  ScopedEnv env("COLOADER_RUN_DIR", Run() + "//");
  ASSERT_OK_AND_ASSIGN(ProducerPaths p, PathsFor("p"));
  EXPECT_EQ(p.lock, Run() + "/p.lock");
}

TEST_F(PathsForTest, TheSameNameInTwoRunDirsGetsTwoRings) {
  ProducerPaths a, b, a_again;
  {
    ScopedEnv env("COLOADER_RUN_DIR", dir_.path() + "/one");
    ASSERT_OK_AND_ASSIGN(a, PathsFor("train"));
  }
  {
    ScopedEnv env("COLOADER_RUN_DIR", dir_.path() + "/two");
    ASSERT_OK_AND_ASSIGN(b, PathsFor("train"));
  }
  {
    ScopedEnv env("COLOADER_RUN_DIR", dir_.path() + "/one");
    ASSERT_OK_AND_ASSIGN(a_again, PathsFor("train"));
  }
  EXPECT_NE(a.shm_name, b.shm_name);
  EXPECT_NE(a.lock, b.lock);
  EXPECT_EQ(a.shm_name, a_again.shm_name);  // stable: a consumer finds the producer's ring
}

TEST_F(PathsForTest, WithoutCOLOADER_RUN_DIRItUsesXDG_RUNTIME_DIR) {
  ScopedEnv run("COLOADER_RUN_DIR", std::string());  // empty counts as unset
  ScopedEnv xdg("XDG_RUNTIME_DIR", dir_.path());
  ASSERT_OK_AND_ASSIGN(ProducerPaths p, PathsFor("p"));
  EXPECT_EQ(p.lock, dir_.path() + "/coloader/p.lock");
}

TEST_F(PathsForTest, ARunDirOpenToOthersIsMadePrivate) {
  ASSERT_EQ(::mkdir(Run().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(Run().c_str(), 0777), 0);
  ScopedEnv env("COLOADER_RUN_DIR", Run());
  ASSERT_OK_AND_ASSIGN(ProducerPaths p, PathsFor("p"));
  struct stat st {};
  ASSERT_EQ(::stat(Run().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(PathsForTest, ARunDirThatIsAFileIsAnErrorNamingIt) {
  ::coloader::testing::WriteFile(Run(), "not a directory");
  ScopedEnv env("COLOADER_RUN_DIR", Run());
  auto r = PathsFor("p");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(Run()), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("COLOADER_RUN_DIR"), std::string::npos) << r.status().ToString();
}

TEST_F(PathsForTest, NamesOfLettersDigitsDotsUnderscoresAndDashesUpTo64AreAccepted) {
  ScopedEnv env("COLOADER_RUN_DIR", Run());
  const std::vector<std::string> names = {"a", "Z", "0", "a.b", "a_b", "a-b", "train.v2_final-3", "-x", "_x",
                                          std::string(64, 'n')};
  for (const std::string& name : names) {
    EXPECT_TRUE(ValidateName(name).ok()) << "'" << name << "': " << ValidateName(name).ToString();
    EXPECT_TRUE(PathsFor(name).ok()) << "'" << name << "'";
  }
}

TEST_F(PathsForTest, BadNamesAreErrorsNamingTheValue) {
  ScopedEnv env("COLOADER_RUN_DIR", Run());
  const std::string too_long(65, 'n');
  const std::vector<std::string> names = {std::string(), too_long, ".hidden", ".", "..", "a/b", "../up", "a b",
                                          "tab\there", "new\nline", "caf\xc3\xa9", "semi;colon", "a*",
                                          std::string("nul\0byte", 8)};
  for (const std::string& name : names) {
    auto r = PathsFor(name);
    ASSERT_FALSE(r.ok()) << "'" << name << "' was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "'" << name << "'";
    EXPECT_NE(r.status().message().find("'" + name + "'"), std::string::npos) << r.status().ToString();
    EXPECT_EQ(r.status().ToString(), ValidateName(name).ToString());
  }
  EXPECT_NE(PathsFor(too_long).status().message().find("64"), std::string::npos);
}

TEST_F(PathsForTest, ABadNameCreatesNoRunDir) {
  ScopedEnv env("COLOADER_RUN_DIR", Run());
  EXPECT_FALSE(PathsFor("a/b").ok());
  EXPECT_FALSE(Exists(Run()));
}

}  // namespace
}  // namespace coloader
