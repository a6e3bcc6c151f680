#include "common/process.h"

#include <new>

#include <poll.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture
#endif

namespace coloader {

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t MachineMemoryBytes() {
  struct sysinfo si {};
  uint64_t bytes = ::sysinfo(&si) == 0 ? uint64_t{si.totalram} * si.mem_unit : 0;
  for (const char* limit : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    if (FILE* f = std::fopen(limit, "re")) {
      unsigned long long v = 0;
      // "max" (v2) does not scan: no limit; v1 says "no limit" with a number near 2^63.
      if (std::fscanf(f, "%llu", &v) == 1 && v > 0 && (bytes == 0 || v < bytes)) bytes = v;
      std::fclose(f);
    }
  }
  return bytes;
}

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

void NameThisThread(const std::string& name) {
  const std::string kept = name.substr(0, 15);  // the kernel's limit, without the terminator
  ::prctl(PR_SET_NAME, kept.c_str(), 0, 0, 0);
}

namespace {

// Field 22 of /proc/PID/stat (after the parenthesised name, which may hold spaces).
uint64_t StartTimeOf(const std::string& pid) {
  FILE* f = std::fopen(("/proc/" + pid + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  // After ") ": state is field 3; start time is field 22, i.e. 19 more fields on.
  for (int field = 2; field < 22 && *p; ++p)
    if (*p == ' ') ++field;
  return std::strtoull(p, nullptr, 10);
}

uint64_t PidNamespaceOf(const std::string& pid) {
  struct stat st {};
  return ::stat(("/proc/" + pid + "/ns/pid").c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace

ProcessIdentity ThisProcessIdentity() { return {PidNamespaceOf("self"), StartTimeOf("self")}; }

ProcessIdentity IdentityOf(int pid) {
  if (pid <= 0) return {};
  return {PidNamespaceOf(std::to_string(pid)), StartTimeOf(std::to_string(pid))};
}

bool IsThisProcess(int pid, const ProcessIdentity& claimed) {
  if (pid <= 0 || claimed.pid_ns == 0 || claimed.start_time == 0) return false;
  // The claim's namespace must be ours: /proc/PID/ns/pid names the namespace the process
  // itself is in, which for a process of a child namespace differs from the one it claims.
  return claimed.pid_ns == ThisProcessIdentity().pid_ns && StartTimeOf(std::to_string(pid)) == claimed.start_time;
}

Result<ProcessWatch> ProcessWatch::Open(int pid) {
  if (pid <= 0) return Status::Invalid("invalid pid " + std::to_string(pid));
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) return Status::FromErrno("pidfd_open(" + std::to_string(pid) + ")", errno);
  return ProcessWatch(static_cast<int>(fd));
}

bool ProcessWatch::Exited() const { return WaitExited(0); }

bool ProcessWatch::WaitExited(int timeout_ms) const {
  if (!fd_.valid()) return false;
  pollfd p{fd_.get(), POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, timeout_ms);  // (a signal restarts the whole wait: fine for its callers)
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

std::string ResourceFailure(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return "out of memory";
  if (const auto* se = dynamic_cast<const std::system_error*>(&e);
      se != nullptr && (se->code() == std::errc::resource_unavailable_try_again || se->code() == std::errc::not_enough_memory)) {
    return std::string(e.what()) +
           ": the limit on processes and threads was reached (ulimit -u, or a container's pids limit): run fewer "
           "threads (a smaller --workers) or raise the limit";
  }
  return e.what();
}

}  // namespace coloader
