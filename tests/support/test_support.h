// Helpers for tests that drive real processes: spawn the `coloader` binary, wait on explicit
// readiness lines (never on sleeps), parse its --json lines, and make small datasets.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

#define ASSERT_OK(expr)                                   \
  do {                                                    \
    ::coloader::Status _st = (expr);                      \
    ASSERT_TRUE(_st.ok()) << _st.ToString();              \
  } while (false)

#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, rexpr)        \
  auto tmp = (rexpr);                                     \
  ASSERT_TRUE(tmp.ok()) << tmp.status().ToString();       \
  lhs = std::move(*tmp)

#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  ASSERT_OK_AND_ASSIGN_IMPL(COLOADER_CONCAT(_res_, __LINE__), lhs, rexpr)

namespace coloader::testing {

// A temporary directory removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process with stdout and stderr captured to files. Killed (SIGKILL) and reaped on
// destruction if still running.
class Child {
 public:
  // argv[0] is the program; `env` entries are added to (or replace) this process's environment.
  Child(std::vector<std::string> argv, std::map<std::string, std::string> env = {});
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  void Signal(int sig);
  // Waits for exit; returns the exit code, or 128 + signal. -1 if it did not exit in time
  // (the child is then killed).
  int Wait(int timeout_ms = 60000);
  // Waits until stderr (or stdout) contains `needle`. False on timeout or exit without it.
  bool WaitForStderr(const std::string& needle, int timeout_ms = 20000);
  bool WaitForStdout(const std::string& needle, int timeout_ms = 20000);
  std::string Stdout() const;
  std::string Stderr() const;

 private:
  bool WaitFor(const std::string& file, const std::string& needle, int timeout_ms);
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  std::string out_path_, err_path_;
  TempDir dir_;
};

// The coloader binary under test, and a command line for it.
std::vector<std::string> Coloader(std::vector<std::string> args);

// Flat JSON objects, one per line: key -> raw value text (strings unquoted; an array of
// numbers as its items, comma-separated).
using JsonLine = std::map<std::string, std::string>;
std::vector<JsonLine> ParseJsonLines(const std::string& text);
uint64_t U64(const JsonLine& line, const std::string& key);
// The dataset indices a `consume --json --indices` line lists, in the order seen.
std::vector<int64_t> Indices(const JsonLine& line);
// A whole epoch of a dataset of n images seen exactly once (from `consume --json`): n samples,
// n distinct, dataset indices summing to n(n-1)/2.
void ExpectExactEpoch(const JsonLine& epoch, uint64_t n);

// Writes `count` small JPEG images (width x height, distinct content per image) into an
// ImageFolder tree under `root` with `classes` classes. Returns the number written.
int MakeImageFolder(const std::string& root, int count, int classes, int width = 48, int height = 40);

std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& bytes);

}  // namespace coloader::testing
