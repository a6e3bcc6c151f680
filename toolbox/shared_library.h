// A shared library loaded at run time (dlopen) and its entry points: for the libraries one
// binary runs with or without (libcurl for http(s):// shards, nvJPEG for GPU decode, NVML for
// the planner's GPU inventory).
//
//   COLOADER_ASSIGN_OR_RETURN(SharedLibrary lib, SharedLibrary::Open({"libnvidia-ml.so.1"}));
//   InitFn init = nullptr;
//   lib.Bind(init, "nvmlInit_v2");
//   if (!lib.complete()) return Status::NotFound(lib.path() + " lacks " + lib.missing());
//
// The library is closed with the object, unless Keep() hands it to the process: for function
// tables kept in statics for the process's life.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace coloader {

class SharedLibrary {
 public:
  // The first of `candidates` (file names or paths) that loads, with RTLD_NOW | RTLD_LOCAL;
  // NotFound naming every candidate and the loader's reason otherwise.
  static Result<SharedLibrary> Open(const std::vector<std::string>& candidates);

  SharedLibrary(SharedLibrary&& other) noexcept;
  SharedLibrary& operator=(SharedLibrary&& other) noexcept;
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  ~SharedLibrary();

  // Looks `name` up into `fn` (nullptr when absent, which complete() then reports).
  template <typename Fn>
  void Bind(Fn& fn, const char* name) {
    fn = reinterpret_cast<Fn>(Lookup(name));
    if (!fn) missing_ += (missing_.empty() ? "" : ", ") + std::string(name);
  }
  // The same for an entry point the caller can do without (newer versions only).
  template <typename Fn>
  void BindOptional(Fn& fn, const char* name) {
    fn = reinterpret_cast<Fn>(Lookup(name));
  }
  bool complete() const { return missing_.empty(); }
  // The entry points Bind did not find, comma-separated.
  const std::string& missing() const { return missing_; }
  // The file the loader opened (resolved through the loader's search path when it can tell),
  // or the candidate that loaded.
  std::string path() const;
  // Leaves the library loaded for the rest of the process. Call it last: the object then holds
  // nothing (path() and Bind() no longer see the library).
  void Keep() { handle_ = nullptr; }

 private:
  void* Lookup(const char* name) const;
  SharedLibrary(void* handle, std::string candidate) : handle_(handle), candidate_(std::move(candidate)) {}
  void* handle_ = nullptr;
  std::string candidate_;
  std::string missing_;
};

}  // namespace coloader
