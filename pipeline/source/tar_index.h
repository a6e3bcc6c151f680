// The members of a tar file and where their bytes lie, read from the headers alone (each
// member's data is skipped, not read): what a WebDataset shard on a local file system needs for
// random access, one pread per sample. POSIX ustar with pax extended headers (path, size) and
// GNU long names, the forms Python's tarfile, GNU tar and webdataset's writer produce.
//
// Hand-written rather than libarchive: random access needs each member's data offset, which
// libarchive's reading API does not give; the format is 512-byte blocks with a checksum, and
// tests/fuzz covers this reader.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace coloader {

struct TarMember {
  std::string name;     // the member's path inside the archive
  uint64_t offset = 0;  // of its first data byte in the file
  uint64_t size = 0;
};

struct TarIndex {
  std::vector<TarMember> members;  // regular files only, in archive order
  // Empty for a whole archive; otherwise what stopped the reading (a file cut short inside a
  // member, a header whose checksum is wrong) and at which byte: the members before it are
  // complete and listed.
  std::string damage;
};

// Errors: the file cannot be opened or read, or it is not a tar file (its first header is not
// one). Damage after the first member is reported in TarIndex::damage, not as an error.
Result<TarIndex> IndexTar(const std::string& path);

// The same over bytes in memory (the fuzzer's entry; `path` names them in messages).
Result<TarIndex> IndexTarBytes(const uint8_t* data, size_t size, const std::string& path);

}  // namespace coloader
