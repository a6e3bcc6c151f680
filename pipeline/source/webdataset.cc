#include "pipeline/source/webdataset.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <functional>
#include <system_error>

#include "common/unique_fd.h"
#include "pipeline/source/shard_fetch.h"
#include "pipeline/source/tar_index.h"
#include "toolbox/json_reader.h"

namespace coloader {

namespace fs = std::filesystem;

namespace {

// The image extensions a sample's image may have, in the order one is chosen when a key has
// several (torchvision's list, with WebDataset's usual "jpg" first).
constexpr const char* kImageMembers[] = {"jpg", "jpeg", "png", "webp", "ppm", "bmp", "pgm", "tif", "tiff"};

int ImageRank(const std::string& ext) {
  std::string lower = ext;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (size_t i = 0; i < std::size(kImageMembers); ++i)
    if (lower == kImageMembers[i]) return static_cast<int>(i);
  return -1;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// "{a..b}" (numbers) or "{x,y,z}": the alternatives, or an error naming the pattern.
Result<std::vector<std::string>> Alternatives(const std::string& body, const std::string& pattern) {
  std::vector<std::string> out;
  const size_t dots = body.find("..");
  if (dots == std::string::npos) {
    size_t start = 0;
    for (;;) {
      const size_t comma = body.find(',', start);
      out.push_back(body.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  }
  const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
  uint64_t lo = 0, hi = 0;
  auto number = [](const std::string& s, uint64_t* v) {
    return !s.empty() && std::from_chars(s.data(), s.data() + s.size(), *v).ptr == s.data() + s.size();
  };
  if (!number(a, &lo) || !number(b, &hi))
    return Status::Invalid(pattern + ": '{" + body + "}' is not a range of numbers like {000000..000146}");
  if (hi < lo) return Status::Invalid(pattern + ": the range {" + body + "} runs backwards");
  if (hi - lo >= 1'000'000) return Status::Invalid(pattern + ": the range {" + body + "} names over a million shards");
  const bool padded = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
  const size_t width = padded ? std::max(a.size(), b.size()) : 0;
  for (uint64_t v = lo; v <= hi; ++v) {
    std::string s = std::to_string(v);
    if (s.size() < width) s.insert(0, width - s.size(), '0');
    out.push_back(std::move(s));
  }
  return out;
}

Status Expand(const std::string& s, const std::string& pattern, std::vector<std::string>* out) {
  const size_t open = s.find('{');
  if (open == std::string::npos) {
    out->push_back(s);
    return Status::OK();
  }
  const size_t close = s.find('}', open);
  if (close == std::string::npos) return Status::Invalid(pattern + ": a '{' without its '}'");
  COLOADER_ASSIGN_OR_RETURN(std::vector<std::string> alts, Alternatives(s.substr(open + 1, close - open - 1), pattern));
  if (out->size() + alts.size() > 1'000'000)
    return Status::Invalid(pattern + ": names over a million shards");
  for (const std::string& alt : alts)
    COLOADER_RETURN_NOT_OK(Expand(s.substr(0, open) + alt + s.substr(close + 1), pattern, out));
  return Status::OK();
}

// A member's bytes, from wherever the shard is (a file or memory).
using ReadMember = std::function<Result<std::string>(const TarMember&)>;

// The label in a ".cls" member: an integer, surrounded by whitespace at most.
Result<int64_t> ReadLabel(const ReadMember& read, const TarMember& m, const std::string& shard) {
  const std::string where = shard + "[" + m.name + "]";
  if (m.size == 0 || m.size > 64) return Status::Invalid(where + ": a class label of " + std::to_string(m.size) + " bytes");
  COLOADER_ASSIGN_OR_RETURN(const std::string text, read(m));
  const char* b = text.data();
  const char* e = b + text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(*b))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(e[-1]))) --e;
  int64_t v = 0;
  const std::from_chars_result r = std::from_chars(b, e, v);
  if (r.ec == std::errc::result_out_of_range)  // v is left 0: never a label
    return Status::Invalid(where + ": class label " + std::string(b, e) + " is out of range (0 to " +
                           std::to_string(INT64_MAX) + ")");
  if (b == e || r.ec != std::errc() || r.ptr != e || v < 0)
    return Status::Invalid(where + ": '" + std::string(b, e) + "' is not a class label (a non-negative integer)");
  return v;
}

// The label in a ".json" member's top-level field `field`: a non-negative integer.
Result<int64_t> ReadJsonLabel(const ReadMember& read, const TarMember& m, const std::string& shard,
                              const std::string& field) {
  const std::string where = shard + "[" + m.name + "]";
  if (m.size > (1u << 20)) return Status::Invalid(where + ": a JSON member of " + std::to_string(m.size) + " bytes");
  COLOADER_ASSIGN_OR_RETURN(const std::string text, read(m));
  COLOADER_ASSIGN_OR_RETURN(const JsonValue json, ParseJson(text, where));
  const JsonValue* v = json.Find(field);
  if (!v) return Status::Invalid(where + ": no field \"" + field + "\" (--label-field)");
  if (!v->is_number() || v->number() < 0 || v->number() >= 9.2e18 ||
      v->number() != static_cast<double>(static_cast<int64_t>(v->number())))
    return v->ErrorAt(where + ": field \"" + field + "\" is not a class label (a non-negative integer)");
  return static_cast<int64_t>(v->number());
}

bool IsShardFile(const std::string& name) { return EndsWith(name, ".tar") || IsCompressedShard(name); }

}  // namespace

bool IsShardSource(const std::string& data) {
  if (IsRemoteShard(data)) return true;
  if (data.find('{') != std::string::npos && data.find('}') != std::string::npos) return true;
  if (IsShardFile(data)) return true;
  std::error_code ec;
  if (!fs::is_directory(data, ec)) return false;
  bool tars = false;
  for (const auto& e : fs::directory_iterator(data, ec)) {
    if (e.is_directory(ec)) return false;
    tars = tars || IsShardFile(e.path().filename().string());
  }
  return tars;
}

Result<std::vector<std::string>> ExpandShards(const std::string& data) {
  std::vector<std::string> shards;
  std::error_code ec;
  if (fs::is_directory(data, ec)) {
    for (const auto& e : fs::directory_iterator(data, ec))
      if (IsShardFile(e.path().filename().string())) shards.push_back(e.path().string());
    std::sort(shards.begin(), shards.end());
    if (shards.empty()) return Status::Invalid(data + ": holds no .tar (or .tar.gz) shard");
    return shards;
  }
  COLOADER_RETURN_NOT_OK(Expand(data, data, &shards));
  return shards;
}

namespace {

struct Tally {
  uint64_t without_image = 0, without_label = 0;
  uint64_t repeated = 0;        // samples cut where a key's member came again
  std::string first_repeated;   // the first such member, for the note
};

// The samples of one indexed shard, in archive order: consecutive members with one key make a
// sample, as WebDataset groups them.
void GroupSamples(const std::string& shard, uint32_t shard_no, const TarIndex& index, const ReadMember& read,
                  const std::string& label_field, std::vector<Sample>* samples, std::vector<std::string>* notes,
                  Tally* tally) {
  const std::vector<TarMember>& m = index.members;
  for (size_t i = 0; i < m.size();) {
    const size_t slash = m[i].name.rfind('/');
    const size_t dot = m[i].name.find('.', slash == std::string::npos ? 0 : slash + 1);
    const std::string key = m[i].name.substr(0, dot);
    const TarMember* image = nullptr;
    const TarMember* cls = nullptr;  // KEY.cls, or KEY.json with --label-field
    int best = -1;
    size_t j = i;
    std::vector<std::string> exts;  // the members taken so far: one of them again begins another sample
    for (; j < m.size() && m[j].name.size() > key.size() && m[j].name.compare(0, key.size(), key) == 0 &&
           m[j].name[key.size()] == '.';
         ++j) {
      const std::string ext = m[j].name.substr(key.size() + 1);
      if (std::find(exts.begin(), exts.end(), ext) != exts.end()) {
        // Two samples under one key, one after the other (shards concatenated, a writer's
        // bug): each keeps its own members, not the first's image with the second's label.
        if (tally->repeated++ == 0) tally->first_repeated = shard + "[" + m[j].name + "]";
        break;
      }
      exts.push_back(ext);
      const int rank = ImageRank(ext);
      if (rank >= 0 && (best < 0 || rank < best)) {
        best = rank;
        image = &m[j];
      }
      if (ext == (label_field.empty() ? "cls" : "json")) cls = &m[j];
    }
    if (j == i) ++j;  // a member with no extension: a key of its own, with no image
    i = j;
    if (!image) {
      ++tally->without_image;
      continue;
    }
    Sample s;
    s.path = shard;
    s.shard = shard_no;
    s.member = image->name;
    s.offset = image->offset;
    s.size = image->size;
    s.label = -1;
    if (cls) {
      Result<int64_t> label =
          label_field.empty() ? ReadLabel(read, *cls, shard) : ReadJsonLabel(read, *cls, shard, label_field);
      if (!label.ok()) {
        notes->push_back(label.status().message() + "; sample '" + key + "' is skipped");
        continue;
      }
      s.label = *label;
    } else {
      ++tally->without_label;
    }
    samples->push_back(std::move(s));
  }
}

// A local shard: indexed from its headers, labels read by pread.
Status ListLocalShard(const std::string& shard, uint32_t shard_no, const std::string& label_field,
                      std::vector<Sample>* samples, std::vector<std::string>* notes, Tally* tally) {
  std::error_code ec;
  if (!fs::exists(shard, ec)) return Status::NotFound(shard + ": no such shard (check the --data pattern's range)");
  COLOADER_ASSIGN_OR_RETURN(TarIndex index, IndexTar(shard));
  if (!index.damage.empty())
    notes->push_back(shard + ": " + index.damage + "; the " + std::to_string(index.members.size()) +
                     " members before it are served, the rest of the shard is skipped");
  const UniqueFd fd(::open(shard.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(shard + ": cannot open", errno);
  auto read = [&](const TarMember& m) -> Result<std::string> {
    std::string text(m.size, '\0');
    if (PreadFully(fd.get(), text.data(), m.size, m.offset) != static_cast<int64_t>(m.size))
      return Status::FromErrno(shard + "[" + m.name + "]: cannot read", errno);
    return text;
  };
  GroupSamples(shard, shard_no, index, read, label_field, samples, notes, tally);
  return Status::OK();
}

// A shard read whole (http(s)://, pipe:, .tar.gz): fetched whole once, to index it; a transfer that
// arrives cut short is fetched again (twice more at most) before its complete members are
// taken as they are.
Status ListStreamedShard(const std::string& shard, uint32_t shard_no, const FetchOptions& fetch,
                         const std::string& label_field, std::vector<Sample>* samples, std::vector<std::string>* notes,
                         Tally* tally) {
  std::error_code ec;
  if (!IsRemoteShard(shard) && !fs::exists(shard, ec))
    return Status::NotFound(shard + ": no such shard (check the --data pattern's range)");
  std::vector<uint8_t> bytes;
  TarIndex index;
  const int rounds = IsRemoteShard(shard) ? 3 : 1;  // a local file reads the same again
  for (int round = 0; round < rounds; ++round) {
    COLOADER_ASSIGN_OR_RETURN(bytes, FetchShard(shard, fetch));
    COLOADER_ASSIGN_OR_RETURN(index, IndexTarBytes(bytes.data(), bytes.size(), shard));
    if (index.damage.empty()) break;
  }
  if (!index.damage.empty())
    notes->push_back(shard + ": " + index.damage + (rounds > 1 ? " (in three fetches)" : "") + "; the " + std::to_string(index.members.size()) +
                     " members before it are served, the rest of the shard is skipped");
  auto read = [&](const TarMember& m) -> Result<std::string> {
    return std::string(reinterpret_cast<const char*>(bytes.data()) + m.offset, m.size);
  };
  GroupSamples(shard, shard_no, index, read, label_field, samples, notes, tally);
  return Status::OK();
}

}  // namespace

Status ListShardSamples(const std::vector<std::string>& shards, std::vector<Sample>* samples,
                        std::vector<std::string>* notes, const ShardListing& listing) {
  Tally tally;
  for (size_t k = 0; k < shards.size(); ++k) {
    const auto shard_no = static_cast<uint32_t>(k);
    if (IsReadWhole(shards[k])) {
      COLOADER_RETURN_NOT_OK(
          ListStreamedShard(shards[k], shard_no, listing.fetch, listing.label_field, samples, notes, &tally));
    } else {
      COLOADER_RETURN_NOT_OK(ListLocalShard(shards[k], shard_no, listing.label_field, samples, notes, &tally));
    }
  }
  if (tally.without_image)
    notes->push_back(std::to_string(tally.without_image) + " key(s) without an image member (" +
                     "jpg, jpeg, png, webp, ppm, bmp, pgm, tif, tiff) are left out");
  if (tally.repeated)
    notes->push_back(std::to_string(tally.repeated) + " time(s) a key's member came again right after its sample " +
                     "(first: " + tally.first_repeated + "): each repeat is read as a sample of its own, with its own " +
                     "label");
  if (tally.without_label)
    notes->push_back(std::to_string(tally.without_label) + " sample(s) without a " +
                     (listing.label_field.empty() ? std::string(".cls") : ".json") + " member have label -1");
  if (samples->empty())
    return Status::Invalid(shards.front() + (shards.size() > 1 ? " (and the other shards)" : "") +
                           ": no sample with an image member (KEY.jpg, KEY.png, ...)");
  return Status::OK();
}

}  // namespace coloader
