// WebDataset shards as a dataset: tar files whose members are grouped into samples by key (the
// member's path up to the first dot of its file name: "a/000123.jpg" and "a/000123.cls" are the
// sample "a/000123"). The image is the first member with an image extension (jpg, jpeg, png,
// webp, ppm, bmp, pgm, tif, tiff, in that order; decoded by content, as every file is); the
// label is the integer text of the ".cls" member, or a named integer field of the ".json"
// member (--label-field). Other members are ignored.
//
// Shards on a local file system are indexed at start from their headers alone (tar_index.h) and
// read by pread, one sample at a time, so every sample has its global index (shard order, then
// position in the shard), the sampler's global permutation applies unchanged, and resume,
// consumer groups and exactness checks work as for an ImageFolder.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "pipeline/source/sample.h"
#include "pipeline/source/shard_fetch.h"

namespace coloader {

// Whether --data names shards: a brace pattern ("{0..9}"), a path ending in ".tar", or a
// directory holding .tar files and no subdirectory, or a streamed shard (http://, https://, pipe:).
bool IsShardSource(const std::string& data);

// The shard paths `data` names, in order: a brace pattern expanded ("train-{000..146}.tar",
// zero-padded to the first number's width; several braces multiply), the .tar files of a
// directory sorted by name, or the one file. Errors: an empty or backwards range, a directory
// without .tar files.
Result<std::vector<std::string>> ExpandShards(const std::string& data);

// Lists every sample of `shards` into `samples`. A shard that cannot be opened, or is not a
// tar file, is an error naming it; a shard cut short keeps the samples before the damage, and
// keys without an image are left out: both are said in `notes`.
// How shards are listed: how streamed ones are fetched, and where labels come from.
struct ShardListing {
  FetchOptions fetch;
  // "": the label is KEY.cls; otherwise this top-level integer field of KEY.json.
  std::string label_field;
};

// Streamed shards (http(s)://, pipe:; shard_fetch.h) are fetched once here to be indexed.
Status ListShardSamples(const std::vector<std::string>& shards, std::vector<Sample>* samples,
                        std::vector<std::string>* notes, const ShardListing& listing = {});

}  // namespace coloader
