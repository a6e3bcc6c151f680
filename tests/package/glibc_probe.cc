// Built by test_glibc_floor.py with scripts/manylinux/glibc_floor.sh's link flags: the C++ the
// project's libraries use (threads, a steady-clock wait, shared_ptr, filesystem, streams,
// random_device, dlopen, exceptions), in one shared object that must need no glibc past 2.28
// and run on an older glibc than this machine's.
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <sys/stat.h>
#include <dlfcn.h>

// 0 when every part worked on `path` (an existing file); else which part failed.
extern "C" int probe(const char* path) {
  std::mutex m; std::condition_variable cv; bool done = false;
  auto text = std::make_shared<std::string>(path);
  std::thread t([&] { std::lock_guard<std::mutex> g(m); *text += "!"; done = true; cv.notify_one(); });
  { std::unique_lock<std::mutex> l(m); cv.wait_for(l, std::chrono::seconds(5), [&] { return done; }); }
  t.join();
  struct stat st {};
  if (stat(path, &st) != 0) return 1;
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) != static_cast<uintmax_t>(st.st_size)) return 2;
  std::ifstream f(path, std::ios::binary);
  char c = 0; f.get(c);
  std::random_device rd; (void)rd();
  void* h = dlopen("libm.so.6", RTLD_NOW); if (h) dlclose(h);
  try { throw std::runtime_error("caught"); } catch (const std::exception& e) { if (std::string(e.what()) != "caught") return 3; }
  return text->back() == '!' ? 0 : 4;
}
