// One sample of a dataset: where its image's bytes are (a file, or a member of a tar shard) and
// its label.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace coloader {

struct Sample {
  std::string path;  // the image file, or the shard that holds it
  int64_t label = 0;
  // In a shard: the image member's name and where its bytes lie in `path`.
  std::string member;
  uint64_t offset = 0, size = 0;
  uint32_t shard = 0;  // its shard's position in the dataset's list

  static Sample File(std::string path, int64_t label) {
    Sample s;
    s.path = std::move(path);
    s.label = label;
    return s;
  }
  bool in_archive() const { return !member.empty(); }
  // For messages: the file, or "shard.tar[member]".
  std::string where() const { return in_archive() ? path + "[" + member + "]" : path; }
};

}  // namespace coloader
