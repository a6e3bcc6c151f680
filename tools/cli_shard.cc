// `coloader shard`: converts an ImageFolder (or a file list) into WebDataset tar shards that
// `coloader serve --data 'OUT-{000000..N}.tar'` reads: per sample KEY.EXT (the image's bytes as
// they are, its extension lowercased) and KEY.cls (the label as text), KEY the sample's index in
// the source dataset (nine digits), so that a shard's sample can be traced back to its file.
// Samples go in a seeded permutation (--seed; --no-shuffle keeps the source's order), so that
// each shard holds a mix of classes, as WebDataset's own writers advise.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "common/unique_fd.h"
#include "pipeline/dataset.h"
#include "pipeline/sampler.h"
#include "pipeline/transform.h"
#include "tools/cli.h"

namespace coloader::cli {

namespace {

constexpr const char* kShardSynopsis =
    "coloader shard --data DIR --out 'train-%06d.tar' [--shard-size N] [--seed S | --no-shuffle]";

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

// One ustar member: a 512-byte header, the bytes, zeros to the next 512-byte boundary.
Status WriteMember(int fd, const std::string& name, const std::vector<uint8_t>& bytes, const std::string& path) {
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

std::string ShardName(const std::string& pattern, uint64_t n) {
  char buf[4096];
  std::snprintf(buf, sizeof buf, pattern.c_str(), static_cast<unsigned long long>(n));
  return buf;
}

}  // namespace

int Shard(const std::vector<std::string>& args) {
  std::string data, out;
  uint64_t shard_size = 10000, seed = 0;
  bool no_shuffle = false, quiet = false;
  Command cmd("shard", kShardSynopsis,
              "Write an ImageFolder (or a file list) as WebDataset tar shards: KEY.EXT and KEY.cls per sample, KEY "
              "its index in the source. `coloader serve --data` reads them back.");
  cmd.Add("--data", &data, "the ImageFolder directory or file list")->type_name("DIR");
  cmd.Add("--out", &out, "the shards' path, with one printf number: train-%06d.tar")->type_name("PATTERN");
  cmd.Add("--shard-size", &shard_size, "samples per shard")->check(AtLeast(1));
  cmd.Add("--seed", &seed, "the seed of the order samples are written in");
  cmd.Add("--no-shuffle", &no_shuffle, "write samples in the source's order (by class for an ImageFolder)");
  cmd.Add("--quiet", &quiet, "no progress lines");
  if (std::optional<int> exit = cmd.Parse(args)) return *exit;
  if (data.empty() || out.empty()) return cmd.UsageError("--data and --out are required");
  const size_t percent = out.find('%');
  if (percent == std::string::npos || out.find('%', percent + 1) != std::string::npos ||
      out.find_first_of("diu", percent) == std::string::npos)
    return cmd.UsageError("--out must hold exactly one printf number, like train-%06d.tar, got '" + out + "'");
  Result<Dataset> ds = Dataset::Open(data);
  if (!ds.ok()) {
    std::fprintf(stderr, "coloader shard: %s\n", ds.status().message().c_str());
    return 1;
  }
  if (!ds->shards().empty()) {
    std::fprintf(stderr, "coloader shard: %s is already WebDataset shards\n", data.c_str());
    return 2;
  }
  SamplerOptions so;
  so.shuffle = !no_shuffle;
  so.seed = seed;
  Result<Sampler> sampler = Sampler::Make(ds->size(), so);
  if (!sampler.ok()) {
    std::fprintf(stderr, "coloader shard: %s\n", sampler.status().message().c_str());
    return 1;
  }
  const std::vector<int64_t> order = sampler->EpochIndices(0);
  std::vector<uint8_t> bytes;
  UniqueFd fd;
  std::string shard_path;
  uint64_t shards = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i % shard_size == 0) {
      if (fd.valid()) {
        static const uint8_t end[1024] = {};
        if (Status st = WriteAll(fd.get(), end, sizeof end, shard_path); !st.ok()) {
          std::fprintf(stderr, "coloader shard: %s\n", st.message().c_str());
          return 1;
        }
      }
      shard_path = ShardName(out, shards++);
      fd = UniqueFd(::open(shard_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (!fd.valid()) {
        std::fprintf(stderr, "coloader shard: %s: cannot create (%s)%s\n", shard_path.c_str(), std::strerror(errno),
                     errno == EEXIST ? "; it exists already: remove the old shards or pick another --out" : "");
        return 1;
      }
    }
    const Sample& s = (*ds)[static_cast<size_t>(order[i])];
    char key[32];
    std::snprintf(key, sizeof key, "%09lld", static_cast<long long>(order[i]));
    std::string ext = std::filesystem::path(s.path).extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (ext.empty()) ext = ".jpg";
    Status st = ReadWholeFile(s.path, &bytes);
    if (st.ok()) st = WriteMember(fd.get(), key + ext, bytes, shard_path);
    const std::string label = std::to_string(s.label);
    if (st.ok()) st = WriteMember(fd.get(), std::string(key) + ".cls", std::vector<uint8_t>(label.begin(), label.end()),
                                  shard_path);
    if (!st.ok()) {
      std::fprintf(stderr, "coloader shard: %s\n", st.message().c_str());
      return 1;
    }
    if (!quiet && (i + 1) % 10000 == 0) std::fprintf(stderr, "coloader shard: %zu of %zu samples\n", i + 1, order.size());
  }
  static const uint8_t end[1024] = {};
  if (Status st = WriteAll(fd.get(), end, sizeof end, shard_path); !st.ok()) {
    std::fprintf(stderr, "coloader shard: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("wrote %zu samples into %llu shard(s): %s to %s\n", order.size(), static_cast<unsigned long long>(shards),
              ShardName(out, 0).c_str(), ShardName(out, shards - 1).c_str());
  return 0;
}

}  // namespace coloader::cli
