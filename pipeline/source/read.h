// A sample's bytes, from its file or from its member of a tar shard: what every decoder reads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "pipeline/source/sample.h"

namespace coloader {

// Whether errno `err` is the machine's fault, not the file's: out of descriptors (EMFILE,
// ENFILE) or memory, interrupted, or a failing device (EIO). Such a read is no bad file.
bool MachineFault(int err);

// Reads a whole file into `out` (resized to fit). Errors name the path; an empty file is one.
// An open that fails for want of descriptors or memory is tried again for about 1.5 s; a
// failure that is the machine's fault is kUnavailable (the run stops: no bad file), any other
// the file's.
Status ReadWholeFile(const std::string& path, std::vector<uint8_t>* out);
// Reads the file at `path` a chunk (1 MiB) at a time, handing each to `take` until it returns
// false (then OK: the taker said why it stopped). Opened as ReadWholeFile opens; an empty file is
// an error naming it.
Status ReadFileInChunks(const std::string& path, const std::function<bool(const uint8_t*, size_t)>& take);
// A sample's bytes: its file, or its member of a shard. Errors name the file (and member).
Status ReadSample(const Sample& sample, std::vector<uint8_t>* out);

}  // namespace coloader
