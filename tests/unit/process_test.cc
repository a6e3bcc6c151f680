// ProcessIdentity and IsThisProcess (common/process.h): a pid is trusted as a peer's only in this
// PID namespace and with the peer's start time, so a pid from another namespace (a container
// with --ipc=host but not --pid=host) or a reused one never stands for it.
#include "common/process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include <gtest/gtest.h>

namespace coloader {
namespace {

TEST(ProcessIdentityTest, ThisProcessIsItself) {
  const ProcessIdentity self = ThisProcessIdentity();
  ASSERT_NE(self.pid_ns, 0u) << "/proc/self/ns/pid unreadable";
  ASSERT_NE(self.start_time, 0u) << "/proc/self/stat unreadable";
  EXPECT_TRUE(IsThisProcess(::getpid(), self));
}

TEST(ProcessIdentityTest, AnotherNamespaceOrStartTimeOrNothingIsNotIt) {
  const ProcessIdentity self = ThisProcessIdentity();
  EXPECT_FALSE(IsThisProcess(::getpid(), {self.pid_ns + 1, self.start_time}));  // another namespace
  EXPECT_FALSE(IsThisProcess(::getpid(), {self.pid_ns, self.start_time + 1}));  // the pid reused
  EXPECT_FALSE(IsThisProcess(::getpid(), {}));                                  // unknown: not trusted
  EXPECT_FALSE(IsThisProcess(0, self));
  // A child's pid with this process's identity: another process. (Start times count clock
  // ticks since boot: the child must start at least one tick after this process did.)
  const auto ticks_now = [] {
    double uptime = 0;
    if (FILE* f = std::fopen("/proc/uptime", "r")) {
      if (std::fscanf(f, "%lf", &uptime) != 1) uptime = 0;
      std::fclose(f);
    }
    return static_cast<uint64_t>(uptime * static_cast<double>(::sysconf(_SC_CLK_TCK)));
  };
  for (int i = 0; i < 1000 && ticks_now() <= self.start_time; ++i) ::usleep(1000);
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  EXPECT_FALSE(IsThisProcess(child, self));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // A pid that is gone.
  EXPECT_FALSE(IsThisProcess(child, self));
}

}  // namespace
}  // namespace coloader
