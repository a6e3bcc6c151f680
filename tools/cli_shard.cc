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
#include "pipeline/source/dataset.h"
#include "pipeline/source/sampler.h"
#include "pipeline/source/read.h"
#include "pipeline/source/tar_writer.h"
#include "tools/cli.h"

namespace coloader::cli {

namespace {

constexpr const char* kShardSynopsis =
    "coloader shard --data DIR --out 'train-%06d.tar' [--shard-size N] [--seed S | --no-shuffle]";

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
        if (Status st = WriteTarEnd(fd.get(), shard_path); !st.ok()) {
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
    if (st.ok()) st = WriteTarMember(fd.get(), key + ext, bytes, shard_path);
    const std::string label = std::to_string(s.label);
    if (st.ok()) st = WriteTarMember(fd.get(), std::string(key) + ".cls", std::vector<uint8_t>(label.begin(), label.end()),
                                  shard_path);
    if (!st.ok()) {
      std::fprintf(stderr, "coloader shard: %s\n", st.message().c_str());
      return 1;
    }
    if (!quiet && (i + 1) % 10000 == 0) std::fprintf(stderr, "coloader shard: %zu of %zu samples\n", i + 1, order.size());
  }
  if (Status st = WriteTarEnd(fd.get(), shard_path); !st.ok()) {
    std::fprintf(stderr, "coloader shard: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("wrote %zu samples into %llu shard(s): %s to %s\n", order.size(), static_cast<unsigned long long>(shards),
              ShardName(out, 0).c_str(), ShardName(out, shards - 1).c_str());
  return 0;
}

}  // namespace coloader::cli
