// A named POSIX shared-memory region (shm_open + mmap), mapped once. The producer creates
// and finally removes it; consumers open it read-only (the mailboxes read-write), and may map
// parts of it privately (PrivateView): pages they write become their own.
//
// Space is reserved when a region is made: /dev/shm is a tmpfs, and a page of a tmpfs file is
// only allocated when first touched, so a region merely ftruncate'd to size on a full (or
// small, e.g. Docker's 64 MB) /dev/shm kills whoever touches an unbacked page with SIGBUS, the
// producer's workers or any consumer reading it. posix_fallocate on the tmpfs file allocates
// the pages now, or fails with ENOSPC now, where it can be said clearly.
//
// Move-only; unmaps on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace coloader {

// Where POSIX shared memory lives on Linux (glibc's shm_open opens files here).
constexpr const char* kShmDir = "/dev/shm";

// What the filesystem behind shm_open holds now.
struct ShmSpace {
  uint64_t free_bytes = 0;   // available to this user (statvfs f_bavail)
  uint64_t total_bytes = 0;  // its size (a tmpfs's size= option)
};
Result<ShmSpace> QueryShmSpace();

// "1.5 GiB", "64.0 MiB", "812 KiB": for messages.
std::string HumanBytes(uint64_t bytes);

class SharedMemory {
 public:
  // Byte ranges [offset, offset + length) of a region.
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

  // Creates `name` with `bytes` bytes, mode 0600, and reserves the space of `reserve` (all of
  // it when empty), replacing a leftover of a crashed producer of the same name (the caller
  // holds the name's lock, so nobody live owns it). When the
  // filesystem is full the status is kIOError and *no_space (if given) is set, so the caller
  // can say what it needed and the ways out; nothing is left behind on any failure.
  static Result<SharedMemory> Create(const std::string& name, size_t bytes, const Ranges& reserve = {},
                                     bool* no_space = nullptr);
  // Maps an existing region; `expected_bytes` guards against a table/region mismatch. The
  // descriptor stays open (fd()): it keeps the object alive for PrivateView after an unlink.
  static Result<SharedMemory> Open(const std::string& name, size_t expected_bytes, bool writable);
  // Removes the name (mappings stay valid until unmapped). True if something was removed.
  static bool Remove(const std::string& name);

  SharedMemory() = default;
  SharedMemory(SharedMemory&& o) noexcept { *this = std::move(o); }
  SharedMemory& operator=(SharedMemory&& o) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  // Reserves more of a region made by Create with a partial reservation (a part only some
  // readers need): ENOSPC sets *no_space as for Create. Reserving twice is harmless.
  Status Reserve(const Ranges& ranges, bool* no_space = nullptr);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  int fd() const { return fd_.get(); }  // -1 for a region made by Create

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  UniqueFd fd_;
};

// A private, copy-on-write mapping of part of an opened region: it reads what the region holds
// now, and a page this process writes becomes its own, invisible to every other process (and
// no longer following the region). Move-only; unmaps on destruction.
class PrivateView {
 public:
  // Maps [offset, offset + bytes) of `shm` (page-aligned offset) readable and writable.
  static Result<PrivateView> Map(const SharedMemory& shm, uint64_t offset, uint64_t bytes);

  PrivateView() = default;
  PrivateView(PrivateView&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PrivateView& operator=(PrivateView&& o) noexcept;
  PrivateView(const PrivateView&) = delete;
  PrivateView& operator=(const PrivateView&) = delete;
  ~PrivateView();

  // Copies every page not copied yet (MADV_POPULATE_WRITE: the kernel breaks copy-on-write page
  // by page, so a write made meanwhile on another thread is never lost): the view then refers
  // to nothing of the region, which may change under it without this view changing. Where the
  // kernel lacks it (before Linux 5.14, gVisor), DetachPageByPage.
  Status Detach();
  // The same by an atomic read-modify-write that changes nothing (an OR with 0) on one byte of
  // every page: each is a write fault, which copies the page, and no concurrent write is lost.
  void DetachPageByPage();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace coloader
