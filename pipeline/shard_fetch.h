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

struct FetchOptions {
  int attempts = 4;            // in all, the first included
  int first_pause_ms = 500;    // then doubled after each failed attempt
  int connect_timeout_ms = 10000;
  int stall_timeout_ms = 30000;  // a transfer that moves no byte this long fails (and is retried)
  uint64_t max_bytes = uint64_t{64} << 30;  // a shard larger than this is an error, not a retry
  // When set and true, the fetch ends at once (within a second) with kCancelled: its owner is
  // shutting down.
  const std::atomic<bool>* cancel = nullptr;
};

Result<std::vector<uint8_t>> FetchShard(const std::string& where, const FetchOptions& opts = {});

}  // namespace coloader
