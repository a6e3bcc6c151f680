// Writing tar shards, beside their reader (tar_index.h): ustar members as `coloader shard`
// writes them and tar_index reads them back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace coloader {

// One ustar member on `fd`: a 512-byte header (mode 0644, `name` cut to 99 bytes), the bytes,
// zeros to the next 512-byte boundary. Errors name `path`, the archive's.
Status WriteTarMember(int fd, const std::string& name, const std::vector<uint8_t>& bytes, const std::string& path);
// The archive's end: two 512-byte blocks of zeros.
Status WriteTarEnd(int fd, const std::string& path);

}  // namespace coloader
