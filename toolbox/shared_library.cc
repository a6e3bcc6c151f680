#include "toolbox/shared_library.h"

#include <dlfcn.h>
#include <link.h>

#include <utility>

namespace coloader {

Result<SharedLibrary> SharedLibrary::Open(const std::vector<std::string>& candidates) {
  std::string tried;
  for (const std::string& c : candidates) {
    if (void* h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) return SharedLibrary(h, c);
    const char* why = ::dlerror();
    tried += (tried.empty() ? "" : "; ") + (why ? std::string(why) : c + ": cannot be loaded");
  }
  return Status::NotFound(tried.empty() ? std::string("no library to load") : tried);
}

SharedLibrary::SharedLibrary(SharedLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      candidate_(std::move(other.candidate_)),
      missing_(std::move(other.missing_)) {}

SharedLibrary& SharedLibrary::operator=(SharedLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_) ::dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    candidate_ = std::move(other.candidate_);
    missing_ = std::move(other.missing_);
  }
  return *this;
}

SharedLibrary::~SharedLibrary() {
  if (handle_) ::dlclose(handle_);
}

void* SharedLibrary::Lookup(const char* name) const { return handle_ ? ::dlsym(handle_, name) : nullptr; }

std::string SharedLibrary::path() const {
  link_map* map = nullptr;
  if (handle_ && ::dlinfo(handle_, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name)
    return map->l_name;
  return candidate_;
}

}  // namespace coloader
