// Streamed shards (http(s)://, pipe:) held whole in memory while their samples are read: at most
// `capacity` shards, the least recently used let go first (a shard still being read stays alive
// with its readers). Fetch ahead of need: the pipeline names the samples of every batch it is
// given (WillRead), so the shards of the batches the producer has submitted (its --window) are
// fetched on a thread of their own while earlier batches decode. One fetch per shard at a time;
// other readers of it wait for that one, and share its failure rather than fetch again. At most
// capacity / 2 shards wait to be fetched ahead, so that fetching ahead never lets go of the
// shards it fetched before they are read.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "pipeline/source/shard_fetch.h"

namespace coloader {

class ShardCache {
 public:
  using Bytes = std::shared_ptr<const std::vector<uint8_t>>;

  ShardCache(std::vector<std::string> shards, size_t capacity, FetchOptions opts);
  ~ShardCache();  // stops the read-ahead thread
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  // Shard `shard`'s bytes: from memory, or fetched now (with FetchOptions' retries); the error
  // names the URL or command.
  Result<Bytes> Get(uint32_t shard);
  // Queues `shard` for the read-ahead thread (nothing when it is held or on its way).
  void WillRead(uint32_t shard);

  uint64_t fetches() const;  // shards fetched so far (for the banner and tests)

 private:
  struct Entry {
    Bytes bytes;
    bool fetching = false;
    uint64_t fetch_round = 0;  // fetches of it begun so far
    Status error;  // the last fetch's failure, given to the readers that waited for it
    uint64_t used = 0;
  };
  Result<Bytes> FetchLocked(uint32_t shard, std::unique_lock<std::mutex>& lock);
  void EvictLocked();
  void ReadAheadLoop();

  const std::vector<std::string> shards_;
  const size_t capacity_;
  FetchOptions opts_;
  std::atomic<bool> cancel_{false};  // set by the destructor: a fetch under way ends
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, Entry> entries_;
  std::deque<uint32_t> ahead_;
  uint64_t tick_ = 0, fetches_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace coloader
