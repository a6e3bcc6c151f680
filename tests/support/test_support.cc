#include "tests/support/test_support.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <turbojpeg.h>

#include <random>

extern char** environ;

namespace coloader::testing {

namespace fs = std::filesystem;

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "coloader-test-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) std::abort();
  path_ = tmpl;
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

Child::Child(std::vector<std::string> argv, std::map<std::string, std::string> env) {
  out_path_ = dir_.path() + "/stdout";
  err_path_ = dir_.path() + "/stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_strings;
  for (auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& s : argv) args.push_back(s.data());
  args.push_back(nullptr);
  if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data()) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&actions);
}

Child::~Child() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
}

bool Child::running() {
  if (pid_ <= 0 || reaped_) return false;
  pid_t r = ::waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) reaped_ = true;
  return !reaped_;
}

void Child::Signal(int sig) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

int Child::Wait(int timeout_ms) {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!reaped_) {
    pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
      reaped_ = true;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

bool Child::WaitFor(const std::string& file, const std::string& needle, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (ReadFile(file).find(needle) != std::string::npos) return true;
    if (!running()) return ReadFile(file).find(needle) != std::string::npos;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool Child::WaitForStderr(const std::string& needle, int timeout_ms) { return WaitFor(err_path_, needle, timeout_ms); }
bool Child::WaitForStdout(const std::string& needle, int timeout_ms) { return WaitFor(out_path_, needle, timeout_ms); }
std::string Child::Stdout() const { return ReadFile(out_path_); }
std::string Child::Stderr() const { return ReadFile(err_path_); }

std::vector<std::string> Coloader(std::vector<std::string> args) {
  // The build tree's binary, unless the tests run elsewhere (the GPU machine) and say where.
  const char* env = std::getenv("COLOADER_BINARY");
  args.insert(args.begin(), env && *env ? env : COLOADER_BINARY);
  return args;
}

std::vector<JsonLine> ParseJsonLines(const std::string& text) {
  std::vector<JsonLine> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    JsonLine obj;
    size_t i = 1;
    while (i < line.size()) {
      size_t k0 = line.find('"', i);
      if (k0 == std::string::npos) break;
      size_t k1 = line.find('"', k0 + 1);
      std::string key = line.substr(k0 + 1, k1 - k0 - 1);
      size_t v0 = line.find(':', k1) + 1;
      std::string value;
      size_t next;
      if (line[v0] == '"') {
        size_t v1 = line.find('"', v0 + 1);
        value = line.substr(v0 + 1, v1 - v0 - 1);
        next = v1 + 1;
      } else if (line[v0] == '[') {  // an array of numbers: its items, comma-separated
        size_t v1 = line.find(']', v0 + 1);
        value = line.substr(v0 + 1, v1 - v0 - 1);
        next = v1 + 1;
      } else {
        next = line.find_first_of(",}", v0);
        value = line.substr(v0, next - v0);
      }
      obj[key] = value;
      i = next + 1;
    }
    out.push_back(std::move(obj));
  }
  return out;
}

std::vector<int64_t> Indices(const JsonLine& line) {
  std::vector<int64_t> out;
  auto it = line.find("indices");
  if (it == line.end()) return out;
  std::stringstream ss(it->second);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

uint64_t U64(const JsonLine& line, const std::string& key) {
  auto it = line.find(key);
  if (it == line.end()) {
    ADD_FAILURE() << "missing key " << key;
    return 0;
  }
  return std::strtoull(it->second.c_str(), nullptr, 10);
}

void ExpectExactEpoch(const JsonLine& e, uint64_t n) {
  auto partial = e.find("partial");
  EXPECT_TRUE(partial != e.end() && partial->second == "false");
  EXPECT_EQ(U64(e, "samples"), n);
  EXPECT_EQ(U64(e, "unique_samples"), n);
  EXPECT_EQ(U64(e, "index_sum"), n * (n - 1) / 2);
}

int MakeImageFolder(const std::string& root, int count, int classes, int width, int height) {
  // Encoded with TurboJPEG rather than OpenCV so the tests run where only the decoder's own
  // libraries are present (the GPU machine).
  fs::create_directories(root);
  for (int c = 0; c < classes; ++c) fs::create_directories(root + "/class" + std::to_string(c));
  tjhandle tj = tjInitCompress();
  std::mt19937 rng(12345);
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int i = 0; i < count; ++i) {
    // Noise plus an image-specific rectangle: every image distinct, every crop textured.
    for (auto& v : rgb) v = static_cast<uint8_t>(rng());
    for (int y = 0; y < (i * 7) % height; ++y)
      for (int x = i % width; x < width; ++x) {
        uint8_t* px = &rgb[(static_cast<size_t>(y) * width + x) * 3];
        px[0] = static_cast<uint8_t>(i);
        px[1] = static_cast<uint8_t>(255 - i);
        px[2] = 128;
      }
    unsigned char* jpeg = nullptr;
    unsigned long size = 0;
    tjCompress2(tj, rgb.data(), width, 0, height, TJPF_RGB, &jpeg, &size, TJSAMP_420, 90, 0);
    char name[64];
    std::snprintf(name, sizeof(name), "/class%d/img%05d.jpg", i % classes, i);
    WriteFile(root + name, std::string(reinterpret_cast<char*>(jpeg), size));
    tjFree(jpeg);
  }
  tjDestroy(tj);
  return count;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

}  // namespace coloader::testing
