#include "pipeline/source/tar_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "common/unique_fd.h"

namespace coloader {

namespace {

constexpr uint64_t kBlock = 512;

// Reads up to `n` bytes at `offset` into `out`; returns how many (fewer at the end), or -1.
using ReadAt = std::function<int64_t(uint64_t offset, size_t n, uint8_t* out)>;

// A numeric header field: octal text (NUL or space terminated), or GNU's base-256 (the first
// byte's high bit set) for sizes beyond 8 GiB. false when it is neither.
bool ParseNumber(const uint8_t* field, size_t len, uint64_t* out) {
  uint64_t v = 0;
  if (field[0] & 0x80) {
    if (field[0] & 0x40) return false;  // negative
    v = field[0] & 0x3f;
    for (size_t i = 1; i < len; ++i) {
      if (v >> 56) return false;
      v = (v << 8) | field[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < len && field[i] == ' ') ++i;
  bool any = false;
  for (; i < len && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v >> 60) return false;
    v = v * 8 + (field[i] - '0');
    any = true;
  }
  if (i < len && field[i] != '\0' && field[i] != ' ') return false;
  *out = v;
  return any;
}

bool ChecksumMatches(const uint8_t* h) {
  uint64_t want = 0;
  if (!ParseNumber(h + 148, 8, &want)) return false;
  uint64_t sum = 0;
  int64_t signed_sum = 0;  // some old writers summed signed chars
  for (uint64_t i = 0; i < kBlock; ++i) {
    const uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
    sum += c;
    signed_sum += static_cast<int8_t>(c);
  }
  return want == sum || static_cast<int64_t>(want) == signed_sum;
}

std::string Field(const uint8_t* f, size_t len) {
  return std::string(reinterpret_cast<const char*>(f), strnlen(reinterpret_cast<const char*>(f), len));
}

// The records of a pax extended header ("LEN key=value\n"...) that matter here.
void ParsePax(const std::string& text, std::string* path, uint64_t* size, bool* has_size) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t space = text.find(' ', pos);
    if (space == std::string::npos) return;
    uint64_t len = 0;
    for (size_t i = pos; i < space; ++i) {
      if (text[i] < '0' || text[i] > '9' || len > text.size()) return;
      len = len * 10 + static_cast<uint64_t>(text[i] - '0');
    }
    if (len == 0 || pos + len > text.size() || len < space - pos + 2) return;
    const std::string record = text.substr(space + 1, pos + len - space - 2);  // without the newline
    const size_t eq = record.find('=');
    if (eq != std::string::npos) {
      const std::string key = record.substr(0, eq), value = record.substr(eq + 1);
      if (key == "path") *path = value;
      if (key == "size") {
        uint64_t v = 0;
        bool ok = !value.empty();
        for (char c : value) {
          if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) ok = false;
          else v = v * 10 + static_cast<uint64_t>(c - '0');
        }
        if (ok) {
          *size = v;
          *has_size = true;
        }
      }
    }
    pos += len;
  }
}

std::string At(uint64_t offset) { return "at byte " + std::to_string(offset); }

Result<TarIndex> Index(const ReadAt& read_at, uint64_t file_size, const std::string& path) {
  TarIndex index;
  uint8_t h[kBlock] = {};
  uint64_t pos = 0;
  std::string next_name;  // from a GNU long name or a pax header, for the member that follows
  uint64_t next_size = 0;
  bool next_has_size = false;
  auto damaged = [&](const std::string& why) -> Result<TarIndex> {
    if (index.members.empty() && pos == 0) {
      // gzip's magic (h starts zeroed: a short read never matches). Read in place, so not
      // inflated: the name did not say .gz.
      if (h[0] == 0x1f && h[1] == 0x8b)
        return Status::Invalid(path + ": a gzip-compressed tar file; name it .tar.gz (or .tgz) to be read as one");
      return Status::Invalid(path + ": not a tar file (" + why + "); a WebDataset shard is a tar archive of "
                             "KEY.jpg, KEY.cls, ... members");
    }
    index.damage = why + " " + At(pos);
    return index;
  };
  for (;;) {
    const int64_t got = read_at(pos, kBlock, h);
    if (got < 0) return Status::FromErrno(path + ": read failed " + At(pos), errno);
    if (got == 0 && pos > 0) return index;  // the end, without end-of-archive blocks
    if (got < static_cast<int64_t>(kBlock)) return damaged("the file ends inside a header");
    if (std::all_of(h, h + kBlock, [](uint8_t c) { return c == 0; })) return index;  // end of archive
    if (!ChecksumMatches(h)) return damaged("a header whose checksum is wrong");
    uint64_t size = 0;
    if (!ParseNumber(h + 124, 12, &size)) return damaged("a header with an unreadable size");
    const char type = static_cast<char>(h[156]);
    const uint64_t data = pos + kBlock;
    if (size > file_size || data + size > file_size) {
      if (type == '0' || type == '\0' || type == '7') {
        const std::string name = !next_name.empty() ? next_name : Field(h, 100);
        return damaged("the file is cut short inside member '" + name + "' (" + std::to_string(size) +
                       " bytes from byte " + std::to_string(data) + ", the file has " + std::to_string(file_size) + ")");
      }
      return damaged("the file is cut short inside a header's data");
    }
    if (type == 'x' || type == 'L') {  // the next member's path (and size): read this data
      if (size > (uint64_t{1} << 20)) return damaged("an extended header of " + std::to_string(size) + " bytes");
      std::string text(size, '\0');
      if (read_at(data, size, reinterpret_cast<uint8_t*>(text.data())) != static_cast<int64_t>(size))
        return damaged("an extended header that cannot be read");
      if (type == 'L') {
        next_name = text.substr(0, text.find('\0'));
      } else {
        ParsePax(text, &next_name, &next_size, &next_has_size);
      }
    } else {
      if (type == '0' || type == '\0' || type == '7') {
        TarMember m;
        if (!next_name.empty()) {
          m.name = next_name;
        } else {
          const std::string prefix = Field(h + 345, 155), name = Field(h, 100);
          const bool ustar = std::memcmp(h + 257, "ustar", 5) == 0;
          m.name = ustar && !prefix.empty() ? prefix + "/" + name : name;
        }
        m.offset = data;
        m.size = next_has_size ? next_size : size;
        if (next_has_size && (m.size > file_size || data + m.size > file_size))
          return damaged("the file is cut short inside member '" + m.name + "'");
        if (next_has_size) size = m.size;
        index.members.push_back(std::move(m));
      }
      next_name.clear();
      next_has_size = false;
      next_size = 0;
    }
    pos = data + (size + kBlock - 1) / kBlock * kBlock;
  }
}

}  // namespace

Result<TarIndex> IndexTar(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(path + ": cannot open", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(path + ": cannot stat", errno);
  if (!S_ISREG(st.st_mode)) return Status::Invalid(path + ": not a regular file");
  auto read_at = [&](uint64_t offset, size_t n, uint8_t* out) { return PreadFully(fd.get(), out, n, offset); };
  return Index(read_at, static_cast<uint64_t>(st.st_size), path);
}

Result<TarIndex> IndexTarBytes(const uint8_t* data, size_t size, const std::string& path) {
  auto read_at = [&](uint64_t offset, size_t n, uint8_t* out) -> int64_t {
    if (offset >= size) return 0;
    const size_t take = std::min<uint64_t>(n, size - offset);
    std::memcpy(out, data + offset, take);
    return static_cast<int64_t>(take);
  };
  return Index(read_at, size, path);
}

}  // namespace coloader
