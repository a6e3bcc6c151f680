#include "pipeline/source/tar_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace coloader {

namespace {

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::FromErrno(path + ": write failed", errno);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

}  // namespace

// One ustar member: a 512-byte header, the bytes, zeros to the next 512-byte boundary.
Status WriteTarMember(int fd, const std::string& name, const std::vector<uint8_t>& bytes, const std::string& path) {
  uint8_t h[512] = {};
  std::memcpy(h, name.data(), std::min<size_t>(name.size(), 99));
  std::snprintf(reinterpret_cast<char*>(h + 100), 8, "%07o", 0644);
  std::snprintf(reinterpret_cast<char*>(h + 108), 8, "%07o", 0);
  std::snprintf(reinterpret_cast<char*>(h + 116), 8, "%07o", 0);
  std::snprintf(reinterpret_cast<char*>(h + 124), 12, "%011llo", static_cast<unsigned long long>(bytes.size()));
  std::snprintf(reinterpret_cast<char*>(h + 136), 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (uint8_t c : h) sum += c;
  std::snprintf(reinterpret_cast<char*>(h + 148), 8, "%06o", sum);
  h[155] = ' ';
  COLOADER_RETURN_NOT_OK(WriteAll(fd, h, sizeof h, path));
  COLOADER_RETURN_NOT_OK(WriteAll(fd, bytes.data(), bytes.size(), path));
  static const uint8_t zeros[512] = {};
  return WriteAll(fd, zeros, (512 - bytes.size() % 512) % 512, path);
}

Status WriteTarEnd(int fd, const std::string& path) {
  static const uint8_t end[1024] = {};
  return WriteAll(fd, end, sizeof end, path);
}

}  // namespace coloader
