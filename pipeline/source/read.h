// A sample's bytes, from its file or from its member of a tar shard: what every decoder reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "pipeline/source/sample.h"

namespace coloader {

// Reads a whole file into `out` (resized to fit). Errors name the path; an empty file is one.
Status ReadWholeFile(const std::string& path, std::vector<uint8_t>* out);
// A sample's bytes: its file, or its member of a shard. Errors name the file (and member).
Status ReadSample(const Sample& sample, std::vector<uint8_t>* out);

}  // namespace coloader
