// A named POSIX shared-memory region (Boost.Interprocess), mapped once. The producer creates
// and finally removes it; consumers open it read-only. Move-only; unmaps on destruction.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"

namespace coloader {

class SharedMemory {
 public:
  // Creates `name` with `bytes` bytes, mode 0600, replacing a leftover of a crashed producer
  // of the same name (the caller holds the name's lock, so nobody live owns it).
  static Result<SharedMemory> Create(const std::string& name, size_t bytes);
  // Maps an existing region; `expected_bytes` guards against a table/region mismatch.
  static Result<SharedMemory> Open(const std::string& name, size_t expected_bytes, bool writable);
  // Removes the name (mappings stay valid until unmapped). True if something was removed.
  static bool Remove(const std::string& name);

  SharedMemory();
  SharedMemory(SharedMemory&&) noexcept;
  SharedMemory& operator=(SharedMemory&&) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  uint8_t* data() const;
  size_t size() const;
  const std::string& name() const { return name_; }

 private:
  struct Impl;  // keeps Boost.Interprocess out of this header
  std::unique_ptr<Impl> impl_;
  std::string name_;
};

}  // namespace coloader
