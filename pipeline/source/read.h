// A sample's bytes, from its file or from its member of a tar shard: what every decoder reads.
#pragma once

#include <cstdint>
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
// A sample's bytes: its file, or its member of a shard. Errors name the file (and member).
Status ReadSample(const Sample& sample, std::vector<uint8_t>* out);

}  // namespace coloader
