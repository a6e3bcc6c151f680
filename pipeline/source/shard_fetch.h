// Where a shard's bytes come from: a local file, an http:// or https:// URL (libcurl), or
// "pipe:COMMAND" (a shell command that writes the shard to its standard output, such as a user's
// object-store copy: "pipe:aws s3 cp s3://bucket/train-000000.tar -"). A whole shard is fetched
// into memory; a failure that may pass (a connection refused or dropped mid-transfer, an HTTP
// 5xx or 429, a command that failed or wrote a cut-short shard) is retried with growing pauses,
// and the last one is the error, naming the URL or command and every attempt.
//
// libcurl is loaded when the first URL is fetched (dlopen of libcurl.so.4), not linked: the
// wheel stays free of libcurl and its TLS stack, and a machine without it hears how to get it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace coloader {

// http://, https:// or pipe:.
bool IsRemoteShard(const std::string& where);

// A gzip-compressed shard by its name: .tar.gz or .tgz.
bool IsCompressedShard(const std::string& where);

// Shards that are read whole into memory (fetched by FetchShard, held by a ShardCache) rather
// than in place by pread: streamed ones, and compressed ones, which cannot be read from the middle.
bool IsReadWhole(const std::string& where);

// The cap on one shard's bytes (inflated) by default: a sixteenth of the memory this process may
// use (the machine's, or its container's limit), within 256 MiB and 64 GiB. The cache holds at
// most 8 shards, so that all it holds stays within half of the memory.
uint64_t DefaultMaxShardBytes();

struct FetchOptions {
  int attempts = 4;            // in all, the first included
  int first_pause_ms = 500;    // then doubled after each failed attempt
  int connect_timeout_ms = 10000;
  // A transfer that moves fewer than min_bytes_per_s * stall_timeout bytes in any stretch of
  // stall_timeout fails (and is retried): a dead connection or one trickling a byte at a time.
  int stall_timeout_ms = 30000;
  uint64_t min_bytes_per_s = 1024;
  uint64_t max_bytes = DefaultMaxShardBytes();  // a shard larger than this is an error, not a retry
  // The whole fetch of one shard, every attempt and pause together: past it the fetch fails (an
  // endless body trickling just above the stall rule's pace ends here). 0: no deadline.
  int deadline_ms = 15 * 60 * 1000;
  // A fetch that takes longer says how far it got every progress_ms (0: never).
  int progress_ms = 30000;
  // When set and true, the fetch ends at once (within a second) with kCancelled: its owner is
  // shutting down.
  const std::atomic<bool>* cancel = nullptr;
};

// The shard's bytes, inflated as they arrive when they are a gzip stream (told by content, as
// images are; a stream of several gzip members is inflated whole, as gzip does). A gzip stream
// that is cut short or damaged gives what inflated before the damage, which the tar index then
// names as a shard cut short (the damage itself is logged). Bounded: max_bytes of shard (more
// is an error naming the cap), deadline_ms for the fetch, at most 10 redirects.
Result<std::vector<uint8_t>> FetchShard(const std::string& where, const FetchOptions& opts = {});

}  // namespace coloader
