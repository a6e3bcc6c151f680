// Where a shard's bytes go as they arrive: kept in chunks of memory of their own (a growing shard
// is never copied while it grows, and each chunk goes back to the system the moment the final
// buffer has it, so a shard of S bytes peaks at S and a chunk), and inflated on the way when
// they are a gzip stream, told by its first two bytes (the compressed bytes are never all held). A gzip
// stream of several members is inflated whole, as gzip does. One cut short or broken keeps what
// inflated before the break (the tar index then names the shard cut short); a member that fails
// its CRC or length check is dropped whole, since its bytes are wrong somewhere; bytes after the
// last member that are not gzip are ignored. Each is logged. More than max_bytes of shard ends
// the transfer. shard_fetch.cc makes one per attempt of a fetch.
#pragma once

#include <sys/mman.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace coloader {

class ShardSink {
 public:
  ShardSink(const std::string& where, uint64_t max_bytes) : where_(where), max_bytes_(max_bytes) {}
  ~ShardSink() {
    if (inflating_) inflateEnd(&z_);
  }
  ShardSink(const ShardSink&) = delete;
  ShardSink& operator=(const ShardSink&) = delete;

  // Takes the next `n` bytes. false: take no more (too_large(), or a damaged gzip stream whose
  // rest is of no use); the transfer ends there.
  bool Add(const uint8_t* data, size_t n);

  bool too_large() const { return too_large_; }
  // It took no more because the gzip stream broke: what inflated before is the shard, the
  // transfer is done (not failed).
  bool done_early() const { return stopped_ && !too_large_ && error_.ok(); }
  bool gzip() const { return gzip_; }
  uint64_t received() const { return received_; }  // as sent (compressed, for a gzip stream)
  uint64_t kept() const { return kept_; }          // shard bytes (inflated)
  // A failure that no retry mends (zlib's own), set instead of a shard.
  const Status& error() const { return error_; }

  // The shard, once the transfer ended well: its chunks joined into one buffer (freed as they
  // are copied).
  Result<std::vector<uint8_t>> Finish();

 private:
  static constexpr size_t kChunk = size_t{4} << 20;

  // kChunk bytes of memory of its own (mmap): unmapping gives it back to the system at once,
  // where free() would keep it in malloc's arena and the join would peak at twice the shard.
  struct Chunk {
    uint8_t* data = nullptr;
    size_t size = 0;
    Chunk() = default;
    Chunk(Chunk&& o) noexcept : data(std::exchange(o.data, nullptr)), size(std::exchange(o.size, 0)) {}
    Chunk& operator=(Chunk&& o) noexcept {
      if (this != &o) {
        if (data) ::munmap(data, kChunk);
        data = std::exchange(o.data, nullptr);
        size = std::exchange(o.size, 0);
      }
      return *this;
    }
    ~Chunk() {
      if (data) ::munmap(data, kChunk);
    }
  };

  bool Keep(const uint8_t* data, size_t n);

  // The output back to `bytes` (a member that failed its check is dropped whole).
  void Truncate(uint64_t bytes);

  bool StartInflating();

  bool Inflate(const uint8_t* data, size_t n);

  // Feeds `n` bytes to zlib until they are used or its member ends (`left`: what it did not use).
  bool InflateSome(const uint8_t* data, size_t n, size_t* left);

  // A damaged stream: what inflated so far is the shard; the rest of the transfer is not needed.
  bool Stop() {
    stopped_ = true;
    return false;
  }

  const std::string where_;
  const uint64_t max_bytes_;
  std::vector<Chunk> chunks_;
  std::vector<uint8_t> head_;   // the first byte, until the second tells gzip or not
  std::vector<uint8_t> magic_;  // between gzip members: the next one's first byte
  uint64_t received_ = 0, kept_ = 0, consumed_ = 0, verified_ = 0;
  bool decided_ = false, gzip_ = false, inflating_ = false, between_members_ = false;
  bool stopped_ = false, too_large_ = false;
  std::string damage_;
  Status error_;
  z_stream z_{};
};

}  // namespace coloader
