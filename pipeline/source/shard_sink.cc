#include "pipeline/source/shard_sink.h"

#include <algorithm>
#include <cstring>

#include "common/log.h"

namespace coloader {

bool ShardSink::Add(const uint8_t* data, size_t n) {
  received_ += n;
  if (stopped_) return false;
  if (!decided_) {
    // The first two bytes tell a gzip stream; one byte alone waits for the next.
    head_.insert(head_.end(), data, data + n);
    if (head_.size() < 2) return true;
    decided_ = true;
    gzip_ = head_[0] == 0x1f && head_[1] == 0x8b;
    if (gzip_ && !StartInflating()) return false;
    std::vector<uint8_t> head;
    head.swap(head_);
    return gzip_ ? Inflate(head.data(), head.size()) : Keep(head.data(), head.size());
  }
  return gzip_ ? Inflate(data, n) : Keep(data, n);
}

Result<std::vector<uint8_t>> ShardSink::Finish() {
  if (!error_.ok()) return error_;
  if (!decided_) Keep(head_.data(), head_.size());  // fewer than two bytes in all
  if (gzip_ && damage_.empty() && !between_members_)
    damage_ = "its gzip stream is cut short";
  if (gzip_ && damage_.empty() && !magic_.empty())  // one stray byte after the last member
    damage_ = "bytes after the gzip stream that are not gzip";
  if (!damage_.empty()) {
    if (kept_ == 0) return Status::Invalid(where_ + ": " + damage_ + ", and nothing inflated before it");
    LogLineAt(LogLevel::kWarning,
              "[coloader] shard %s: %s after %llu compressed bytes; the %llu bytes inflated before it are kept\n",
              where_.c_str(), damage_.c_str(), static_cast<unsigned long long>(consumed_),
              static_cast<unsigned long long>(kept_));
  }
  std::vector<uint8_t> out;
  out.reserve(kept_);
  for (Chunk& c : chunks_) {
    out.insert(out.end(), c.data, c.data + c.size);
    c = Chunk();  // unmapped: back to the system now, not to malloc's arena
  }
  chunks_.clear();
  return out;
}

bool ShardSink::Keep(const uint8_t* data, size_t n) {
  if (kept_ + n > max_bytes_) {
    too_large_ = stopped_ = true;
    return false;
  }
  kept_ += n;
  while (n > 0) {
    if (chunks_.empty() || chunks_.back().size == kChunk) {
      void* m = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) {
        error_ = Status::Unavailable("shard " + where_ + ": out of memory after " + std::to_string(kept_ - n) +
                                     " bytes");
        stopped_ = true;
        return false;
      }
      chunks_.emplace_back();
      chunks_.back().data = static_cast<uint8_t*>(m);
    }
    Chunk& c = chunks_.back();
    const size_t take = std::min(n, kChunk - c.size);
    std::memcpy(c.data + c.size, data, take);
    c.size += take;
    data += take;
    n -= take;
  }
  return true;
}

void ShardSink::Truncate(uint64_t bytes) {
  while (!chunks_.empty() && kept_ - chunks_.back().size >= bytes) {
    kept_ -= chunks_.back().size;
    chunks_.pop_back();
  }
  if (!chunks_.empty()) {
    chunks_.back().size -= kept_ - bytes;
    kept_ = bytes;
  }
}

bool ShardSink::StartInflating() {
  if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) {
    error_ = Status::Internal("zlib's inflateInit2 failed");
    stopped_ = true;
    return false;
  }
  inflating_ = true;
  return true;
}

bool ShardSink::Inflate(const uint8_t* data, size_t n) {
  while (n > 0) {
    if (between_members_) {
      // After a member's end: another member, or bytes that are not gzip (ignored, and the
      // transfer ends). The next member's two magic bytes may come one call apart.
      magic_.push_back(*data++);
      --n;
      if (magic_.size() < 2) continue;
      const bool member = magic_[0] == 0x1f && magic_[1] == 0x8b;
      magic_.clear();
      if (!member) {
        damage_ = "bytes after the gzip stream that are not gzip";
        return Stop();
      }
      between_members_ = false;
      inflateReset(&z_);
      const uint8_t magic[2] = {0x1f, 0x8b};
      size_t left = 0;
      if (!InflateSome(magic, sizeof magic, &left)) return false;
      continue;
    }
    const size_t take = std::min<size_t>(n, UINT32_MAX);
    size_t left = 0;
    if (!InflateSome(data, take, &left)) return false;
    data += take - left;
    n -= take - left;
  }
  return true;
}

bool ShardSink::InflateSome(const uint8_t* data, size_t n, size_t* left) {
  uint8_t buf[1 << 16];
  z_.next_in = const_cast<Bytef*>(data);
  z_.avail_in = static_cast<uInt>(n);
  *left = 0;
  for (;;) {
    z_.next_out = buf;
    z_.avail_out = sizeof buf;
    const int rc = inflate(&z_, Z_NO_FLUSH);
    const size_t out = sizeof buf - z_.avail_out;
    if (out > 0 && !Keep(buf, out)) return false;
    if (rc == Z_STREAM_END) {
      verified_ = kept_;
      between_members_ = true;
      *left = z_.avail_in;
      consumed_ += n - *left;
      return true;
    }
    if (rc == Z_OK && (z_.avail_in > 0 || z_.avail_out == 0)) continue;  // more to do with this input
    if (rc == Z_OK || rc == Z_BUF_ERROR) break;  // every byte used: the next ones are needed
    if (rc == Z_MEM_ERROR) {
      error_ = Status::Unavailable("inflating shard " + where_ + ": out of memory");
      return Stop();
    }
    const std::string msg = z_.msg ? z_.msg : "error " + std::to_string(rc);
    if (msg == "incorrect data check" || msg == "incorrect length check") {
      Truncate(verified_);  // the member's bytes are wrong somewhere: none of them is kept
      damage_ = "a gzip member fails its check (zlib: " + msg + ") and is dropped";
    } else {
      damage_ = "its gzip stream is damaged (zlib: " + msg + ")";
    }
    consumed_ += n - z_.avail_in;
    return Stop();
  }
  consumed_ += n;
  return true;
}

}  // namespace coloader
