#include "pipeline/source/shard_cache.h"

#include <algorithm>

#include "common/process.h"

namespace coloader {

ShardCache::ShardCache(std::vector<std::string> shards, size_t capacity, FetchOptions opts)
    : shards_(std::move(shards)), capacity_(std::max<size_t>(capacity, 2)), opts_(opts) {
  opts_.cancel = &cancel_;
  // Without a thread (the thread limit), reading still works: each shard is fetched by its
  // first reader.
  if (Result<std::thread> t = StartThread("the shard read-ahead thread", [this] { ReadAheadLoop(); }); t.ok())
    thread_ = std::move(*t);
}

ShardCache::~ShardCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cancel_.store(true);  // a fetch under way (the read-ahead's, or a reader's) ends within a second
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t ShardCache::fetches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fetches_;
}

Result<ShardCache::Bytes> ShardCache::Get(uint32_t shard) {
  std::unique_lock<std::mutex> lock(mu_);
  return FetchLocked(shard, lock);
}

void ShardCache::WillRead(uint32_t shard) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(shard);
    if (it != entries_.end() && (it->second.bytes || it->second.fetching)) return;
    if (std::find(ahead_.begin(), ahead_.end(), shard) != ahead_.end()) return;
    if (ahead_.size() >= capacity_ / 2) return;  // its reader fetches it, if the queue has not by then
    ahead_.push_back(shard);
  }
  cv_.notify_all();
}

Result<ShardCache::Bytes> ShardCache::FetchLocked(uint32_t shard, std::unique_lock<std::mutex>& lock) {
  Entry& e = entries_[shard];  // std::map: the reference stays valid while others are added
  if (e.fetching) {
    // Another thread fetches it: wait for that fetch, and take its outcome, failure included.
    const uint64_t round = e.fetch_round;
    cv_.wait(lock, [&] { return !e.fetching || e.fetch_round != round; });
    if (!e.bytes && !e.error.ok()) return e.error;
  }
  e.used = ++tick_;
  if (e.bytes) return e.bytes;
  e.fetching = true;
  ++e.fetch_round;
  lock.unlock();
  Result<std::vector<uint8_t>> got = FetchShard(shards_[shard], opts_);
  lock.lock();
  e.fetching = false;
  ++fetches_;
  cv_.notify_all();
  if (!got.ok()) {
    e.error = got.status();
    return e.error;
  }
  // Kept here as well as in the entry: making room may let go of this very entry (others were
  // read while it was on its way), and its reader still gets it.
  Bytes bytes = std::make_shared<const std::vector<uint8_t>>(std::move(*got));
  e.bytes = bytes;
  e.error = Status::OK();
  e.used = ++tick_;
  EvictLocked();
  return bytes;
}

void ShardCache::EvictLocked() {
  size_t held = 0;
  for (const auto& [id, e] : entries_) held += e.bytes ? 1 : 0;
  while (held > capacity_) {
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second.bytes && (oldest == entries_.end() || it->second.used < oldest->second.used)) oldest = it;
    oldest->second.bytes.reset();  // readers that hold it keep it until they are done
    --held;
  }
}

void ShardCache::ReadAheadLoop() {
  NameThisThread("cl-shard-fetch");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !ahead_.empty(); });
    if (stopping_) return;
    const uint32_t shard = ahead_.front();
    ahead_.pop_front();
    // Fetched ahead, it counts as used now: it is what the next batches read.
    (void)FetchLocked(shard, lock);  // a failure is kept for the reader, which fetches again
  }
}

}  // namespace coloader
