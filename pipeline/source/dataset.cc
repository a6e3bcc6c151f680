#include "pipeline/source/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "pipeline/source/read.h"
#include "pipeline/source/webdataset.h"

namespace coloader {

namespace fs = std::filesystem;

namespace {

// torchvision.datasets.folder.IMG_EXTENSIONS, in its order (the order only shows in messages).
constexpr const char* kImageExtensions[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                            ".pgm", ".tif",  ".tiff", ".webp"};

std::string AcceptedExtensionsList() {
  std::string out;
  for (const char* ext : kImageExtensions) {
    if (!out.empty()) out += ' ';
    out += ext;
  }
  return out;
}

std::string Trim(const std::string& s) {
  auto is_space = [](unsigned char c) { return std::isspace(c) != 0; };
  size_t begin = 0;
  size_t end = s.size();
  while (begin < end && is_space(s[begin])) ++begin;
  while (end > begin && is_space(s[end - 1])) --end;
  return s.substr(begin, end - begin);
}

// A line quoted back in an error message: long lines (or binary junk) are cut so the message
// stays readable.
std::string QuoteForMessage(const std::string& line) {
  constexpr size_t kMax = 100;
  if (line.size() <= kMax) return "'" + line + "'";
  return "'" + line.substr(0, kMax) + "...'";
}

// The directory-walk order of torchvision's make_dataset: it iterates
// `sorted(os.walk(class_dir, followlinks=True))`, i.e. every directory of the tree sorted by
// its full path string (which is not depth-first order: "a-b" sorts before "a/x"), and within
// each directory the file names sorted. Python sorts str by code point; for UTF-8 names that
// is byte order, which is what std::string's operator< gives (char_traits<char> compares as
// unsigned char).
//
// Like os.walk, an entry counts as a directory when it is one after following symlinks, and
// everything else (regular files, symlinks to files, even dangling symlinks) is a "file" that
// is kept when its name has an image extension. Unlike os.walk we remember the directories
// above the current one (device, inode), so a symlink loop is cut instead of followed until
// the path is too long. Unlike os.walk
// we do not silently skip a directory we cannot read: losing part of a class without a word
// would be worse than stopping with the path.
Status CollectClassImages(const fs::path& class_dir, std::vector<std::string>* images) {
  struct Dir {
    std::string path;
    std::vector<std::string> image_names;
  };
  using DirId = std::pair<dev_t, ino_t>;
  struct Pending {
    fs::path path;
    std::vector<DirId> ancestors;  // the directories above it on this walk, for loop checks
  };
  std::vector<Dir> dirs;
  std::vector<Pending> pending = {{class_dir, {}}};
  while (!pending.empty()) {
    Pending next = std::move(pending.back());
    pending.pop_back();
    const fs::path& dir = next.path;
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return Status::FromErrno(dir.string(), errno);
    const DirId id{st.st_dev, st.st_ino};
    // A directory that contains itself through a symlink. (The same folder reached through
    // two different symlinks is not a loop and is listed twice, as torchvision does.)
    if (std::find(next.ancestors.begin(), next.ancestors.end(), id) != next.ancestors.end()) {
      continue;
    }
    next.ancestors.push_back(id);

    Dir entry{dir.string(), {}};
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec) return Status::IOError(dir.string() + ": cannot list directory: " + ec.message());
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      const fs::directory_entry& child = *it;
      std::error_code type_ec;  // a dangling symlink has no target type: it is a "file"
      if (child.is_directory(type_ec)) {
        pending.push_back({child.path(), next.ancestors});
      } else {
        std::string name = child.path().filename().string();
        if (HasImageExtension(name)) entry.image_names.push_back(std::move(name));
      }
    }
    if (ec) return Status::IOError(dir.string() + ": cannot list directory: " + ec.message());
    std::sort(entry.image_names.begin(), entry.image_names.end());
    dirs.push_back(std::move(entry));
  }
  std::sort(dirs.begin(), dirs.end(),
            [](const Dir& a, const Dir& b) { return a.path < b.path; });
  for (const Dir& d : dirs) {
    for (const std::string& name : d.image_names) {
      images->push_back((fs::path(d.path) / name).string());
    }
  }
  return Status::OK();
}

}  // namespace

bool HasImageExtension(const std::string& filename) {
  // torchvision: filename.lower().endswith(IMG_EXTENSIONS). The extensions are ASCII, so an
  // ASCII lower-casing is enough. Note that a file named just ".jpg" counts, as there.
  for (const char* ext : kImageExtensions) {
    const size_t n = std::char_traits<char>::length(ext);
    if (filename.size() < n) continue;
    bool match = true;
    for (size_t i = 0; i < n && match; ++i) {
      const unsigned char c = static_cast<unsigned char>(filename[filename.size() - n + i]);
      match = std::tolower(c) == ext[i];
    }
    if (match) return true;
  }
  return false;
}

namespace {

// Fills `classes` (label order) and `samples` from an ImageFolder tree.
Status ListImageFolder(const std::string& root, std::vector<std::string>* classes,
                       std::vector<Sample>* samples) {
  // torchvision's find_classes: sorted(e.name for e in os.scandir(root) if e.is_dir()). Hidden
  // directories count as classes there too (a stray ".ipynb_checkpoints" is then reported as
  // an empty class below, by name, which is how the user finds it).
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec) return Status::IOError(root + ": cannot list directory: " + ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec)) classes->push_back(it->path().filename().string());
  }
  if (ec) return Status::IOError(root + ": cannot list directory: " + ec.message());
  if (classes->empty()) {
    return Status::Invalid(root + ": no class folders found; ImageFolder expects " +
                           "root/<class>/<image>");
  }
  std::sort(classes->begin(), classes->end());

  std::vector<std::string> empty_classes;
  for (size_t label = 0; label < classes->size(); ++label) {
    std::vector<std::string> images;
    COLOADER_RETURN_NOT_OK(CollectClassImages(fs::path(root) / (*classes)[label], &images));
    if (images.empty()) empty_classes.push_back((*classes)[label]);
    for (std::string& image : images) {
      samples->push_back(Sample::File(std::move(image), static_cast<int64_t>(label)));
    }
  }
  const std::string accepted = "accepted extensions (any case): " + AcceptedExtensionsList();
  if (samples->empty()) {
    return Status::Invalid(root + ": found " + std::to_string(classes->size()) +
                           " class folder(s) but no images in any of them; " + accepted);
  }
  if (!empty_classes.empty()) {
    // torchvision raises here too ("Found no valid file for the classes ..."): a class without
    // samples would still take a label, silently shifting what the model is trained on.
    std::string names;
    for (const std::string& name : empty_classes) names += (names.empty() ? "" : ", ") + name;
    return Status::Invalid(root + ": no images in class folder(s) " + names +
                           "; remove them or add images (" + accepted + ")");
  }
  return Status::OK();
}

// Fills `samples` from a "path,label" file list.
Status ParseFileList(const std::string& list_path, std::vector<Sample>* samples) {
  std::ifstream in(list_path);
  if (!in) return Status::FromErrno(list_path + ": cannot open file list", errno);
  const fs::path base = fs::path(list_path).parent_path();
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string trimmed = Trim(line);  // also drops the '\r' of CRLF files
    if (trimmed.empty() || trimmed[0] == '#') continue;
    const std::string where = list_path + ":" + std::to_string(line_no) + ": ";

    // Split at the last comma: labels never contain one, paths may.
    const size_t comma = trimmed.rfind(',');
    const bool has_comma = comma != std::string::npos;
    const std::string path = has_comma ? Trim(trimmed.substr(0, comma)) : "";
    const std::string label_text = has_comma ? Trim(trimmed.substr(comma + 1)) : "";
    if (path.empty() || label_text.empty()) {
      return Status::Invalid(where + "expected 'path,label', got " + QuoteForMessage(trimmed));
    }
    int64_t label = 0;
    const char* first = label_text.data();
    const char* last = first + label_text.size();
    const auto [end, err] = std::from_chars(first, last, label);
    if (err != std::errc() || end != last) {
      return Status::Invalid(where + "label " + QuoteForMessage(label_text) +
                             " is not an integer; expected 'path,label', got " +
                             QuoteForMessage(trimmed));
    }
    fs::path sample_path(path);
    if (sample_path.is_relative()) sample_path = base / sample_path;
    samples->push_back(Sample::File(sample_path.string(), label));
  }
  if (in.bad()) return Status::FromErrno(list_path + ": read failed", errno);
  if (samples->empty()) {
    return Status::Invalid(list_path + ": the file list has no samples; expected one " +
                           "'path,label' line per image (lines starting with # are comments)");
  }
  return Status::OK();
}

}  // namespace

Status Dataset::Read(const Sample& sample, std::vector<uint8_t>* out) const {
  if (!cache_ || !sample.in_archive()) return ReadSample(sample, out);
  // A shard that cannot be fetched (after its retries), or comes back other than it was indexed,
  // failed whole (the network, the server, the file changed or gone): not bad files to skip and
  // fill in silently, but the run's end, said (kUnavailable).
  Result<ShardCache::Bytes> got = cache_->Get(sample.shard);
  if (!got.ok()) {
    if (got.status().code() == StatusCode::kCancelled) return got.status();
    return Status::Unavailable(got.status().message() + " (the shard failed whole during the epochs, not its samples': "
                               "none is skipped as a bad file)");
  }
  const ShardCache::Bytes& shard = *got;
  if (sample.offset + sample.size > shard->size())
    return Status::Unavailable(sample.where() + ": the shard came back shorter than when it was indexed (it changed "
                               "on its server while the run read it)");
  out->assign(shard->begin() + static_cast<std::ptrdiff_t>(sample.offset),
              shard->begin() + static_cast<std::ptrdiff_t>(sample.offset + sample.size));
  return Status::OK();
}

void Dataset::WillRead(const std::vector<int64_t>& indices) const {
  if (!cache_) return;
  int64_t last = -1;  // a batch's samples come a shard at a time: name each shard once
  for (int64_t index : indices) {
    const uint32_t shard = samples_[static_cast<size_t>(index)].shard;
    if (shard != last) cache_->WillRead(shard);
    last = shard;
  }
}

// Samples are only listed here, never opened: whether each file exists and decodes is found
// out by the decoder when it reads it (a stat per file would make opening ImageNet take
// seconds to minutes on a network filesystem). In particular a file list may name files that
// do not exist; they are reported at read time with their path.
Result<Dataset> Dataset::Open(const std::string& path, std::vector<std::string>* notes,
                              const std::string& label_field, const FetchOptions& fetch) {
  if (!label_field.empty() && !IsShardSource(path))
    return Status::Invalid("--label-field " + label_field + " applies to WebDataset shards, and " + path +
                           " is not shards (an ImageFolder's labels are its class folders)");
  if (IsShardSource(path)) {
    Dataset dataset;
    dataset.source_ = path;
    COLOADER_ASSIGN_OR_RETURN(dataset.shards_, ExpandShards(path));
    const auto whole = std::count_if(dataset.shards_.begin(), dataset.shards_.end(), IsReadWhole);
    if (whole > 0 && whole < static_cast<std::ptrdiff_t>(dataset.shards_.size()))
      return Status::Invalid(path + ": mixes shards read in place (local .tar) with shards read whole (http(s)://, " +
                             "pipe:, .tar.gz); give one kind");
    std::vector<std::string> ignored;
    ShardListing listing;
    listing.label_field = label_field;
    listing.fetch = fetch;
    COLOADER_RETURN_NOT_OK(ListShardSamples(dataset.shards_, &dataset.samples_, notes ? notes : &ignored, listing));
    if (whole > 0) {
      dataset.stream_blocks_.assign(dataset.shards_.size(), 0);
      for (const Sample& s : dataset.samples_) ++dataset.stream_blocks_[s.shard];
      dataset.stream_blocks_.erase(std::remove(dataset.stream_blocks_.begin(), dataset.stream_blocks_.end(), 0u),
                                   dataset.stream_blocks_.end());
      dataset.cache_ = std::make_shared<ShardCache>(dataset.shards_, kStreamedShardsHeld, fetch);
    }
    return dataset;
  }
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows symlinks
  if (st.type() == fs::file_type::not_found) {
    return Status::NotFound(path + ": no such file or directory; pass --data an ImageFolder " +
                            "directory (root/<class>/<image>), a file list (path,label per " +
                            "line) or WebDataset shards (train-{000000..000146}.tar)");
  }
  if (ec) return Status::IOError(path + ": " + ec.message());

  Dataset dataset;
  dataset.source_ = path;
  if (st.type() == fs::file_type::directory) {
    COLOADER_RETURN_NOT_OK(ListImageFolder(path, &dataset.classes_, &dataset.samples_));
    return dataset;
  }
  if (st.type() == fs::file_type::regular) {
    if (HasImageExtension(path)) {
      // A common slip: pointing --data at one image. Parsing it as a list would only report
      // binary junk on "line 1".
      return Status::Invalid(path + ": is an image, not a file list; pass --data the " +
                             "ImageFolder directory (root/<class>/<image>) or a file list " +
                             "(path,label per line)");
    }
    COLOADER_RETURN_NOT_OK(ParseFileList(path, &dataset.samples_));
    return dataset;
  }
  return Status::Invalid(path + ": is neither a directory nor a regular file; pass --data an " +
                         "ImageFolder directory (root/<class>/<image>) or a file list " +
                         "(path,label per line)");
}

}  // namespace coloader
