// Sources of samples: an ImageFolder tree (root/<class>/<image>, classes sorted by name as
// torchvision does, images chosen by torchvision's extension list, case-insensitively) or a
// file list (one "path,label" per line; relative paths are relative to the list's folder).
// Every sample has a stable dataset index: its position in this list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace coloader {

struct Sample {
  std::string path;
  int64_t label = 0;
};

class Dataset {
 public:
  // `path` is a directory (ImageFolder) or a regular file (file list). Errors name the path
  // and say what to do: missing path, empty directory, no class folders, no images.
  static Result<Dataset> Open(const std::string& path);

  size_t size() const { return samples_.size(); }
  const Sample& operator[](size_t i) const { return samples_[i]; }
  const std::vector<Sample>& samples() const { return samples_; }
  // Class names in label order (ImageFolder); for a file list, empty.
  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::string> classes_;
  std::vector<Sample> samples_;
};

// torchvision's IMG_EXTENSIONS test, case-insensitive.
bool HasImageExtension(const std::string& filename);

}  // namespace coloader
