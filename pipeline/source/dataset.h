// Sources of samples: an ImageFolder tree (root/<class>/<image>, classes sorted by name as
// torchvision does, images chosen by torchvision's extension list, case-insensitively), a
// file list (one "path,label" per line; relative paths are relative to the list's folder), or
// WebDataset tar shards (webdataset.h). Every sample has a stable dataset index: its position
// in this list (for shards: shard order, then position in the shard).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "pipeline/source/sample.h"
#include "pipeline/source/shard_cache.h"

namespace coloader {

// How many streamed shards are held in memory at most (ShardCache's capacity): the ones the
// submitted batches read, and the next.
inline constexpr size_t kStreamedShardsHeld = 8;

class Dataset {
 public:
  // `path` is a directory (ImageFolder, or one of .tar shards), a regular file (file list, or
  // one .tar shard) or a brace pattern of shards (train-{000000..000146}.tar). Errors name the
  // path and say what to do: missing path, empty directory, no class folders, no images.
  // What was skipped while listing (a shard cut short, keys without an image) goes to `notes`.
  // `label_field`: with shards, the label from this integer field of KEY.json (not KEY.cls).
  // `fetch`: how shards read whole (http(s)://, pipe:, .tar.gz) are fetched and bounded.
  static Result<Dataset> Open(const std::string& path, std::vector<std::string>* notes = nullptr,
                              const std::string& label_field = "", const FetchOptions& fetch = {});

  size_t size() const { return samples_.size(); }
  const Sample& operator[](size_t i) const { return samples_[i]; }
  const std::vector<Sample>& samples() const { return samples_; }
  // Class names in label order (ImageFolder); for a file list, empty.
  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& source() const { return source_; }
  // Shards in order (empty unless the source is WebDataset shards).
  const std::vector<std::string>& shards() const { return shards_; }
  // Shards read whole (http(s)://, pipe:, .tar.gz) are read in one stretch per epoch: the samples
  // of each, for the sampler's blocks (SamplerOptions::blocks). Empty otherwise.
  const std::vector<uint64_t>& stream_blocks() const { return stream_blocks_; }

  // A sample's bytes: its file, its member of a local shard (pread), or of a shard read whole
  // (from memory, fetched when needed). Errors name the file or URL and the member.
  Status Read(const Sample& sample, std::vector<uint8_t>* out) const;
  // Says that these samples will be read soon: their streamed shards are fetched ahead (nothing
  // for local data).
  void WillRead(const std::vector<int64_t>& indices) const;

 private:
  std::string source_;
  std::vector<std::string> classes_;
  std::vector<std::string> shards_;
  std::vector<uint64_t> stream_blocks_;
  std::shared_ptr<ShardCache> cache_;  // shared by copies of this dataset
  std::vector<Sample> samples_;
};

// torchvision's IMG_EXTENSIONS test, case-insensitive.
bool HasImageExtension(const std::string& filename);

}  // namespace coloader
