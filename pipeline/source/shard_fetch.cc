#include "pipeline/source/shard_fetch.h"

#define CURL_DISABLE_TYPECHECK  // curl_easy_setopt as the plain function it is (called through dlopen)
#include <curl/curl.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "common/log_line.h"
#include "common/process.h"
#include "common/unique_fd.h"
#include "pipeline/source/read.h"

extern char** environ;

namespace coloader {

namespace {

// One attempt's failure, and whether another attempt may succeed.
struct Failure {
  std::string why;
  bool retry = true;
};
using Attempt = std::optional<Failure>;  // nullopt: the bytes are in

constexpr int kMaxRedirects = 10;  // curl's own default is 30; a loop is told apart sooner

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// ---------------------------------------------------------------------------------------------
// Where a shard's bytes go as they arrive: kept in chunks of memory of their own (a growing shard
// is never copied while it grows, and each chunk goes back to the system the moment the final
// buffer has it, so a shard of S bytes peaks at S and a chunk), and inflated on the way when they are
// a gzip stream, told by its first two bytes (the compressed bytes are never all held). A gzip
// stream of several members is inflated whole, as gzip does. One cut short or broken keeps what
// inflated before the break (the tar index then names the shard cut short); a member that fails
// its CRC or length check is dropped whole, since its bytes are wrong somewhere; bytes after the
// last member that are not gzip are ignored. Each is logged. More than max_bytes of shard ends
// the transfer.

class ShardSink {
 public:
  ShardSink(const std::string& where, uint64_t max_bytes) : where_(where), max_bytes_(max_bytes) {}
  ~ShardSink() {
    if (inflating_) inflateEnd(&z_);
  }
  ShardSink(const ShardSink&) = delete;
  ShardSink& operator=(const ShardSink&) = delete;

  // Takes the next `n` bytes. false: take no more (too_large(), or a damaged gzip stream whose
  // rest is of no use); the transfer ends there.
  bool Add(const uint8_t* data, size_t n) {
    received_ += n;
    if (stopped_) return false;
    if (!decided_) {
      // The first two bytes tell a gzip stream; one byte alone waits for the next.
      head_.insert(head_.end(), data, data + n);
      if (head_.size() < 2) return true;
      decided_ = true;
      gzip_ = head_[0] == 0x1f && head_[1] == 0x8b;
      if (gzip_ && !StartInflating()) return false;
      std::vector<uint8_t> head;
      head.swap(head_);
      return gzip_ ? Inflate(head.data(), head.size()) : Keep(head.data(), head.size());
    }
    return gzip_ ? Inflate(data, n) : Keep(data, n);
  }

  bool too_large() const { return too_large_; }
  // It took no more because the gzip stream broke: what inflated before is the shard, the
  // transfer is done (not failed).
  bool done_early() const { return stopped_ && !too_large_ && error_.ok(); }
  bool gzip() const { return gzip_; }
  uint64_t received() const { return received_; }  // as sent (compressed, for a gzip stream)
  uint64_t kept() const { return kept_; }          // shard bytes (inflated)
  // A failure that no retry mends (zlib's own), set instead of a shard.
  const Status& error() const { return error_; }

  // The shard, once the transfer ended well: its chunks joined into one buffer (freed as they
  // are copied).
  Result<std::vector<uint8_t>> Finish() {
    if (!error_.ok()) return error_;
    if (!decided_) Keep(head_.data(), head_.size());  // fewer than two bytes in all
    if (gzip_ && damage_.empty() && !between_members_)
      damage_ = "its gzip stream is cut short";
    if (gzip_ && damage_.empty() && !magic_.empty())  // one stray byte after the last member
      damage_ = "bytes after the gzip stream that are not gzip";
    if (!damage_.empty()) {
      if (kept_ == 0) return Status::Invalid(where_ + ": " + damage_ + ", and nothing inflated before it");
      LogLine("[coloader] shard %s: %s after %llu compressed bytes; the %llu bytes inflated before it are kept\n",
              where_.c_str(), damage_.c_str(), static_cast<unsigned long long>(consumed_),
              static_cast<unsigned long long>(kept_));
    }
    std::vector<uint8_t> out;
    out.reserve(kept_);
    for (Chunk& c : chunks_) {
      out.insert(out.end(), c.data, c.data + c.size);
      c = Chunk();  // unmapped: back to the system now, not to malloc's arena
    }
    chunks_.clear();
    return out;
  }

 private:
  static constexpr size_t kChunk = size_t{4} << 20;

  // kChunk bytes of memory of its own (mmap): unmapping gives it back to the system at once,
  // where free() would keep it in malloc's arena and the join would peak at twice the shard.
  struct Chunk {
    uint8_t* data = nullptr;
    size_t size = 0;
    Chunk() = default;
    Chunk(Chunk&& o) noexcept : data(std::exchange(o.data, nullptr)), size(std::exchange(o.size, 0)) {}
    Chunk& operator=(Chunk&& o) noexcept {
      if (this != &o) {
        if (data) ::munmap(data, kChunk);
        data = std::exchange(o.data, nullptr);
        size = std::exchange(o.size, 0);
      }
      return *this;
    }
    ~Chunk() {
      if (data) ::munmap(data, kChunk);
    }
  };

  bool Keep(const uint8_t* data, size_t n) {
    if (kept_ + n > max_bytes_) {
      too_large_ = stopped_ = true;
      return false;
    }
    kept_ += n;
    while (n > 0) {
      if (chunks_.empty() || chunks_.back().size == kChunk) {
        void* m = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
          error_ = Status::Unavailable("shard " + where_ + ": out of memory after " + std::to_string(kept_ - n) +
                                       " bytes");
          stopped_ = true;
          return false;
        }
        chunks_.emplace_back();
        chunks_.back().data = static_cast<uint8_t*>(m);
      }
      Chunk& c = chunks_.back();
      const size_t take = std::min(n, kChunk - c.size);
      std::memcpy(c.data + c.size, data, take);
      c.size += take;
      data += take;
      n -= take;
    }
    return true;
  }

  // The output back to `bytes` (a member that failed its check is dropped whole).
  void Truncate(uint64_t bytes) {
    while (!chunks_.empty() && kept_ - chunks_.back().size >= bytes) {
      kept_ -= chunks_.back().size;
      chunks_.pop_back();
    }
    if (!chunks_.empty()) {
      chunks_.back().size -= kept_ - bytes;
      kept_ = bytes;
    }
  }

  bool StartInflating() {
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) {
      error_ = Status::Internal("zlib's inflateInit2 failed");
      stopped_ = true;
      return false;
    }
    inflating_ = true;
    return true;
  }

  bool Inflate(const uint8_t* data, size_t n) {
    while (n > 0) {
      if (between_members_) {
        // After a member's end: another member, or bytes that are not gzip (ignored, and the
        // transfer ends). The next member's two magic bytes may come one call apart.
        magic_.push_back(*data++);
        --n;
        if (magic_.size() < 2) continue;
        const bool member = magic_[0] == 0x1f && magic_[1] == 0x8b;
        magic_.clear();
        if (!member) {
          damage_ = "bytes after the gzip stream that are not gzip";
          return Stop();
        }
        between_members_ = false;
        inflateReset(&z_);
        const uint8_t magic[2] = {0x1f, 0x8b};
        size_t left = 0;
        if (!InflateSome(magic, sizeof magic, &left)) return false;
        continue;
      }
      const size_t take = std::min<size_t>(n, UINT32_MAX);
      size_t left = 0;
      if (!InflateSome(data, take, &left)) return false;
      data += take - left;
      n -= take - left;
    }
    return true;
  }

  // Feeds `n` bytes to zlib until they are used or its member ends (`left`: what it did not use).
  bool InflateSome(const uint8_t* data, size_t n, size_t* left) {
    uint8_t buf[1 << 16];
    z_.next_in = const_cast<Bytef*>(data);
    z_.avail_in = static_cast<uInt>(n);
    *left = 0;
    for (;;) {
      z_.next_out = buf;
      z_.avail_out = sizeof buf;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      const size_t out = sizeof buf - z_.avail_out;
      if (out > 0 && !Keep(buf, out)) return false;
      if (rc == Z_STREAM_END) {
        verified_ = kept_;
        between_members_ = true;
        *left = z_.avail_in;
        consumed_ += n - *left;
        return true;
      }
      if (rc == Z_OK && (z_.avail_in > 0 || z_.avail_out == 0)) continue;  // more to do with this input
      if (rc == Z_OK || rc == Z_BUF_ERROR) break;  // every byte used: the next ones are needed
      if (rc == Z_MEM_ERROR) {
        error_ = Status::Unavailable("inflating shard " + where_ + ": out of memory");
        return Stop();
      }
      const std::string msg = z_.msg ? z_.msg : "error " + std::to_string(rc);
      if (msg == "incorrect data check" || msg == "incorrect length check") {
        Truncate(verified_);  // the member's bytes are wrong somewhere: none of them is kept
        damage_ = "a gzip member fails its check (zlib: " + msg + ") and is dropped";
      } else {
        damage_ = "its gzip stream is damaged (zlib: " + msg + ")";
      }
      consumed_ += n - z_.avail_in;
      return Stop();
    }
    consumed_ += n;
    return true;
  }

  // A damaged stream: what inflated so far is the shard; the rest of the transfer is not needed.
  bool Stop() {
    stopped_ = true;
    return false;
  }

  const std::string where_;
  const uint64_t max_bytes_;
  std::vector<Chunk> chunks_;
  std::vector<uint8_t> head_;   // the first byte, until the second tells gzip or not
  std::vector<uint8_t> magic_;  // between gzip members: the next one's first byte
  uint64_t received_ = 0, kept_ = 0, consumed_ = 0, verified_ = 0;
  bool decided_ = false, gzip_ = false, inflating_ = false, between_members_ = false;
  bool stopped_ = false, too_large_ = false;
  std::string damage_;
  Status error_;
  z_stream z_{};
};

// ---------------------------------------------------------------------------------------------
// http(s):// through libcurl, loaded on first use

struct CurlApi {
  decltype(&curl_global_init) global_init = nullptr;
  decltype(&curl_easy_init) init = nullptr;
  decltype(&curl_easy_setopt) setopt = nullptr;
  decltype(&curl_easy_perform) perform = nullptr;
  decltype(&curl_easy_getinfo) getinfo = nullptr;
  decltype(&curl_easy_cleanup) cleanup = nullptr;
  decltype(&curl_easy_strerror) strerror = nullptr;
};

Result<const CurlApi*> LoadCurl() {
  static CurlApi api;
  static Status loaded = Status::Internal("not loaded");
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = ::dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      loaded = Status::NotFound(std::string("http(s):// shards need libcurl, which this machine lacks (") + ::dlerror() +
                                "): install it (Debian/Ubuntu: apt install libcurl4), or fetch the shards with a "
                                "pipe: command, or copy them to a local file system");
      return;
    }
    auto sym = [h](const char* name) { return ::dlsym(h, name); };
    api.global_init = reinterpret_cast<decltype(api.global_init)>(sym("curl_global_init"));
    api.init = reinterpret_cast<decltype(api.init)>(sym("curl_easy_init"));
    api.setopt = reinterpret_cast<decltype(api.setopt)>(sym("curl_easy_setopt"));
    api.perform = reinterpret_cast<decltype(api.perform)>(sym("curl_easy_perform"));
    api.getinfo = reinterpret_cast<decltype(api.getinfo)>(sym("curl_easy_getinfo"));
    api.cleanup = reinterpret_cast<decltype(api.cleanup)>(sym("curl_easy_cleanup"));
    api.strerror = reinterpret_cast<decltype(api.strerror)>(sym("curl_easy_strerror"));
    if (!api.global_init || !api.init || !api.setopt || !api.perform || !api.getinfo || !api.cleanup || !api.strerror) {
      loaded = Status::Internal("libcurl.so.4 lacks curl_easy_* functions");
      return;
    }
    // Once, before any transfer (curl_global_init is not thread-safe; call_once serialises it).
    if (api.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      loaded = Status::Internal("curl_global_init failed");
      return;
    }
    loaded = Status::OK();
  });
  if (!loaded.ok()) return loaded;
  return &api;
}

size_t WriteToSink(char* data, size_t size, size_t n, void* user) {
  return static_cast<ShardSink*>(user)->Add(reinterpret_cast<const uint8_t*>(data), size * n) ? size * n : 0;
}

bool Cancelled(const FetchOptions& opts) { return opts.cancel && opts.cancel->load(); }

using Clock = std::chrono::steady_clock;

// One fetch of a shard, across its attempts: when it must end, and its progress line (a fetch
// that takes longer than progress_ms says how far it got every progress_ms).
struct Transfer {
  const std::string& where;
  const FetchOptions& opts;
  Clock::time_point start = Clock::now();
  Clock::time_point deadline = start + std::chrono::milliseconds(opts.deadline_ms);
  Clock::time_point next_report = start + std::chrono::milliseconds(opts.progress_ms);
  const ShardSink* sink = nullptr;  // this attempt's

  bool PastDeadline() const { return opts.deadline_ms > 0 && Clock::now() >= deadline; }
  int64_t MsLeft() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  }
  void Report() {
    const Clock::time_point now = Clock::now();
    if (opts.progress_ms <= 0 || now < next_report || sink == nullptr) return;
    next_report = now + std::chrono::milliseconds(opts.progress_ms);
    const double s = std::chrono::duration<double>(now - start).count();
    LogLine("[coloader] fetching shard %s: %.1f MiB%s in %.0f s (%.2f MiB/s)\n", where.c_str(),
            sink->received() / 1048576.0,
            sink->gzip() ? (" (" + std::to_string(sink->kept() >> 20) + " MiB inflated)").c_str() : "", s,
            sink->received() / 1048576.0 / std::max(s, 1e-3));
  }
  std::string DeadlineText() const {
    return "not done after the fetch's " + std::to_string(opts.deadline_ms / 1000) + " s (" +
           std::to_string(sink ? sink->received() : 0) + " bytes in)";
  }
};

int CurlProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  t->Report();
  return Cancelled(t->opts) || t->PastDeadline() ? 1 : 0;  // non-zero aborts the transfer
}

std::string TooLarge(const ShardSink& sink, const FetchOptions& opts) {
  return std::string(sink.gzip() ? "inflates to more than " : "larger than ") + std::to_string(opts.max_bytes) +
         " bytes (the cap on one shard: --max-shard-bytes)";
}

Attempt FetchHttp(const CurlApi& curl, const std::string& url, Transfer& t, ShardSink* sink) {
  const FetchOptions& opts = t.opts;
  CURL* h = curl.init();
  if (!h) return Failure{"curl_easy_init failed", true};
  curl.setopt(h, CURLOPT_URL, url.c_str());
  curl.setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  curl.setopt(h, CURLOPT_MAXREDIRS, static_cast<long>(kMaxRedirects));
  curl.setopt(h, CURLOPT_NOSIGNAL, 1L);  // worker threads: no SIGALRM for DNS timeouts
  curl.setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts.connect_timeout_ms));
  const long stall_s = std::max(1, opts.stall_timeout_ms / 1000);
  curl.setopt(h, CURLOPT_LOW_SPEED_LIMIT,
              static_cast<long>(std::clamp<uint64_t>(opts.min_bytes_per_s, 1, uint64_t{1} << 32)));  // below this ...
  curl.setopt(h, CURLOPT_LOW_SPEED_TIME, stall_s);  // ... this long
  curl.setopt(h, CURLOPT_WRITEFUNCTION, &WriteToSink);
  curl.setopt(h, CURLOPT_WRITEDATA, sink);
  curl.setopt(h, CURLOPT_XFERINFOFUNCTION, &CurlProgress);
  curl.setopt(h, CURLOPT_XFERINFODATA, &t);
  curl.setopt(h, CURLOPT_NOPROGRESS, 0L);
  const CURLcode rc = curl.perform(h);
  long code = 0;
  curl.getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl.cleanup(h);
  if (code >= 400) {
    // Not found, forbidden, gone: asking again will not help. Busy (429) and server errors may pass.
    const bool retry = code == 408 || code == 429 || code >= 500;
    return Failure{"HTTP status " + std::to_string(code), retry};
  }
  if (sink->too_large()) return Failure{TooLarge(*sink, opts), false};
  if (sink->done_early()) return std::nullopt;  // a broken gzip stream: what inflated is the shard
  if (!sink->error().ok()) return Failure{sink->error().message(), false};
  if (rc == CURLE_TOO_MANY_REDIRECTS)
    return Failure{"more than " + std::to_string(kMaxRedirects) + " redirects (a redirect loop?); give the URL the "
                   "redirects end at", false};
  if (rc == CURLE_ABORTED_BY_CALLBACK && t.PastDeadline()) return Failure{t.DeadlineText(), false};
  if (rc == CURLE_OPERATION_TIMEDOUT && code > 0 && !Cancelled(opts))  // connected (a status came): too slow
    return Failure{"slower than " + std::to_string(opts.min_bytes_per_s) + " bytes/s for " + std::to_string(stall_s) +
                       " s after " + std::to_string(sink->received()) + " bytes", true};
  if (rc != CURLE_OK) {
    const bool permanent = rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT;
    return Failure{std::string(curl.strerror(rc)) + " after " + std::to_string(sink->received()) + " bytes", !permanent};
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// pipe:COMMAND through /bin/sh

Attempt FetchPipe(const std::string& command, Transfer& t, ShardSink* sink) {
  const FetchOptions& opts = t.opts;
  Result<Pipe> data = Pipe::Make();
  Result<Pipe> errors = Pipe::Make();
  if (!data.ok() || !errors.ok()) return Failure{"cannot make a pipe", true};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, data->write.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, errors->write.get(), STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // A process group of its own, so that a stalled pipeline (pipe:a | b) is ended whole.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  const int err = posix_spawn(&pid, "/bin/sh", &actions, &attr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  data->write.Reset();
  errors->write.Reset();
  if (err != 0) return Failure{std::string("cannot start /bin/sh: ") + std::strerror(err), false};
  std::string said;  // the command's stderr, its last 400 bytes kept for the message
  enum class Ended { kByItself, kSinkFull, kStalled, kCancelled, kDeadline } ended = Ended::kByItself;
  auto end = [&](Ended why) {
    ended = why;
    ::kill(-pid, SIGKILL);
  };
  uint8_t buf[1 << 16];
  pollfd fds[2] = {{data->read.get(), POLLIN, 0}, {errors->read.get(), POLLIN, 0}};
  int open_fds = 2;
  // The stall rule in stretches of stall_timeout: each must bring min_bytes_per_s per second.
  const auto window = std::chrono::milliseconds(opts.stall_timeout_ms);
  const uint64_t window_needs =
      std::max<uint64_t>(1, std::min<uint64_t>(opts.min_bytes_per_s, uint64_t{1} << 32) *
                                static_cast<uint64_t>(std::max(1, opts.stall_timeout_ms)) / 1000);
  auto window_start = Clock::now();
  uint64_t window_bytes = 0;
  while (open_fds > 0 && ended == Ended::kByItself) {
    const int n = ::poll(fds, 2, 1000);
    if (n < 0 && errno == EINTR) continue;
    t.Report();
    // Only the shard's bytes count as progress: a command may keep talking on stderr (a progress
    // meter) over a dead connection.
    if (fds[0].fd >= 0 && Clock::now() - window_start > window) {  // until stdout ends
      if (window_bytes < window_needs) {
        end(Ended::kStalled);
        break;
      }
      window_start = Clock::now();
      window_bytes = 0;
    }
    if (Cancelled(opts)) {
      end(Ended::kCancelled);
      break;
    }
    if (t.PastDeadline()) {
      end(Ended::kDeadline);
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      if (i == 0) {
        window_bytes += static_cast<uint64_t>(r);
        if (!sink->Add(buf, static_cast<size_t>(r))) {
          end(Ended::kSinkFull);
          break;
        }
      } else {
        said.append(reinterpret_cast<char*>(buf), static_cast<size_t>(r));
        if (said.size() > 400) said.erase(0, said.size() - 400);
      }
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  const std::string tail = said.empty() ? "" : " (it said: " + said + ")";
  if (ended == Ended::kSinkFull) {
    if (sink->done_early()) return std::nullopt;  // a broken gzip stream: what inflated is the shard
    if (!sink->error().ok()) return Failure{sink->error().message(), false};
    return Failure{"the command's output " + TooLarge(*sink, opts), false};
  }
  if (ended == Ended::kCancelled) return Failure{"cancelled", false};
  if (ended == Ended::kDeadline) return Failure{t.DeadlineText() + "; the command was stopped" + tail, false};
  if (ended == Ended::kStalled)
    return Failure{"the command wrote only " + std::to_string(window_bytes) + " bytes in " +
                       std::to_string(opts.stall_timeout_ms / 1000) + " s (slower than " +
                       std::to_string(opts.min_bytes_per_s) + " bytes/s; " + std::to_string(sink->received()) +
                       " bytes in all) and was stopped" + tail, true};
  if (WIFSIGNALED(status))
    return Failure{"the command was killed by signal " + std::to_string(WTERMSIG(status)) + " after " +
                       std::to_string(sink->received()) + " bytes" + tail, true};
  if (WEXITSTATUS(status) != 0)
    return Failure{"the command exited with status " + std::to_string(WEXITSTATUS(status)) + " after " +
                       std::to_string(sink->received()) + " bytes" + tail, true};
  return std::nullopt;
}

// A local .tar.gz, read a chunk at a time through the sink (inflated as it is read).
Status ReadLocal(const std::string& path, ShardSink* sink, const FetchOptions& opts) {
  COLOADER_RETURN_NOT_OK(ReadFileInChunks(path, [&](const uint8_t* data, size_t n) { return sink->Add(data, n); }));
  if (sink->too_large()) return Status::Invalid("shard " + path + " " + TooLarge(*sink, opts));
  return sink->error();
}

Result<std::vector<uint8_t>> Fetch(const std::string& where, const FetchOptions& opts) {
  if (!IsRemoteShard(where)) {
    ShardSink sink(where, opts.max_bytes);
    COLOADER_RETURN_NOT_OK(ReadLocal(where, &sink, opts));
    return sink.Finish();
  }
  const CurlApi* curl = nullptr;
  if (!StartsWith(where, "pipe:")) {
    COLOADER_ASSIGN_OR_RETURN(curl, LoadCurl());
  }
  Transfer t{where, opts};
  std::vector<std::string> whys;
  int pause_ms = opts.first_pause_ms;
  for (int attempt = 1; attempt <= opts.attempts; ++attempt) {
    ShardSink sink(where, opts.max_bytes);  // each attempt starts over
    t.sink = &sink;
    const Attempt failed = curl ? FetchHttp(*curl, where, t, &sink) : FetchPipe(where.substr(5), t, &sink);
    t.sink = nullptr;
    if (!failed) return sink.Finish();
    whys.push_back(failed->why);
    if (Cancelled(opts)) return Status::Cancelled("fetching shard " + where + ": cancelled");
    if (!failed->retry || attempt == opts.attempts) break;
    if (opts.deadline_ms > 0 && t.MsLeft() <= pause_ms) {
      whys.push_back("no time left for another attempt within the fetch's " + std::to_string(opts.deadline_ms / 1000) +
                     " s");
      break;
    }
    LogLine("[coloader] fetching shard %s failed (%s); attempt %d of %d in %.1f s\n", where.c_str(),
            failed->why.c_str(), attempt + 1, opts.attempts, pause_ms / 1000.0);
    for (int slept = 0; slept < pause_ms && !Cancelled(opts); slept += 50)
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, pause_ms - slept)));
    pause_ms *= 2;
  }
  std::string said;
  if (std::all_of(whys.begin(), whys.end(), [&](const std::string& w) { return w == whys.front(); })) {
    said = whys.size() == 1 ? whys.front() : std::to_string(whys.size()) + " attempts, each: " + whys.front();
  } else {
    for (size_t i = 0; i < whys.size(); ++i) said += (i ? "; " : "") + std::string("attempt ") + std::to_string(i + 1) + ": " + whys[i];
  }
  return Status::IOError("cannot fetch shard " + where + " (" + said + ")");
}

}  // namespace

bool IsRemoteShard(const std::string& where) {
  return StartsWith(where, "http://") || StartsWith(where, "https://") || StartsWith(where, "pipe:");
}

bool IsCompressedShard(const std::string& where) {
  auto ends = [&](const std::string& tail) {
    return where.size() >= tail.size() && where.compare(where.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends(".tar.gz") || ends(".tgz");
}

bool IsReadWhole(const std::string& where) { return IsRemoteShard(where) || IsCompressedShard(where); }

Result<std::vector<uint8_t>> FetchShard(const std::string& where, const FetchOptions& opts) {
  return Fetch(where, opts);
}

uint64_t DefaultMaxShardBytes() {
  // The cache holds up to 8 shards (kStreamedShardsHeld) and a fetch may be on its way: at one
  // sixteenth of the memory each, they stay within half of it.
  const uint64_t memory = MachineMemoryBytes();
  if (memory == 0) return uint64_t{4} << 30;
  return std::clamp<uint64_t>(memory / 16, uint64_t{256} << 20, uint64_t{64} << 30);
}

}  // namespace coloader
