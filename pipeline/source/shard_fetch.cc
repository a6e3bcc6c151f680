#include "pipeline/source/shard_fetch.h"

#define CURL_DISABLE_TYPECHECK  // curl_easy_setopt as the plain function it is (called through dlopen)
#include <curl/curl.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
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

#include "common/log_line.h"
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

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

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

struct Sink {
  std::vector<uint8_t>* out;
  uint64_t max_bytes;
  bool too_large = false;
};

size_t WriteToSink(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  if (sink->out->size() + size * n > sink->max_bytes) {
    sink->too_large = true;
    return 0;  // ends the transfer
  }
  sink->out->insert(sink->out->end(), data, data + size * n);
  return size * n;
}

bool Cancelled(const FetchOptions& opts) { return opts.cancel && opts.cancel->load(); }

int CurlProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return Cancelled(*static_cast<const FetchOptions*>(user)) ? 1 : 0;  // non-zero aborts the transfer
}

Attempt FetchHttp(const CurlApi& curl, const std::string& url, const FetchOptions& opts, std::vector<uint8_t>* out) {
  CURL* h = curl.init();
  if (!h) return Failure{"curl_easy_init failed", true};
  Sink sink{out, opts.max_bytes};
  curl.setopt(h, CURLOPT_URL, url.c_str());
  curl.setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  curl.setopt(h, CURLOPT_NOSIGNAL, 1L);  // worker threads: no SIGALRM for DNS timeouts
  curl.setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts.connect_timeout_ms));
  const long stall_s = std::max(1, opts.stall_timeout_ms / 1000);
  curl.setopt(h, CURLOPT_LOW_SPEED_LIMIT,
              static_cast<long>(std::clamp<uint64_t>(opts.min_bytes_per_s, 1, uint64_t{1} << 32)));  // below this ...
  curl.setopt(h, CURLOPT_LOW_SPEED_TIME, stall_s);  // ... this long
  curl.setopt(h, CURLOPT_WRITEFUNCTION, &WriteToSink);
  curl.setopt(h, CURLOPT_WRITEDATA, &sink);
  curl.setopt(h, CURLOPT_XFERINFOFUNCTION, &CurlProgress);
  curl.setopt(h, CURLOPT_XFERINFODATA, &opts);
  curl.setopt(h, CURLOPT_NOPROGRESS, 0L);
  const CURLcode rc = curl.perform(h);
  long code = 0;
  curl.getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl.cleanup(h);
  if (sink.too_large) return Failure{"larger than " + std::to_string(opts.max_bytes) + " bytes", false};
  if (rc == CURLE_OPERATION_TIMEDOUT && code > 0 && !Cancelled(opts))  // connected (a status came): too slow
    return Failure{"slower than " + std::to_string(opts.min_bytes_per_s) + " bytes/s for " + std::to_string(stall_s) +
                       " s after " + std::to_string(out->size()) + " bytes", true};
  if (rc != CURLE_OK) {
    const bool permanent = rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT;
    return Failure{std::string(curl.strerror(rc)) + " after " + std::to_string(out->size()) + " bytes", !permanent};
  }
  if (code >= 400) {
    // Not found, forbidden, gone: asking again will not help. Busy (429) and server errors may pass.
    const bool retry = code == 408 || code == 429 || code >= 500;
    return Failure{"HTTP status " + std::to_string(code), retry};
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// pipe:COMMAND through /bin/sh

Attempt FetchPipe(const std::string& command, const FetchOptions& opts, std::vector<uint8_t>* out) {
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
  enum class Ended { kByItself, kTooLarge, kStalled, kCancelled } ended = Ended::kByItself;
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
  auto window_start = std::chrono::steady_clock::now();
  uint64_t window_bytes = 0;
  while (open_fds > 0 && ended == Ended::kByItself) {
    const int n = ::poll(fds, 2, 1000);
    if (n < 0 && errno == EINTR) continue;
    // Only the shard's bytes count as progress: a command may keep talking on stderr (a progress
    // meter) over a dead connection.
    if (fds[0].fd >= 0 && std::chrono::steady_clock::now() - window_start > window) {  // until stdout ends
      if (window_bytes < window_needs) {
        end(Ended::kStalled);
        break;
      }
      window_start = std::chrono::steady_clock::now();
      window_bytes = 0;
    }
    if (Cancelled(opts)) {
      end(Ended::kCancelled);
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
        if (out->size() + static_cast<size_t>(r) > opts.max_bytes) {
          end(Ended::kTooLarge);
          break;
        }
        out->insert(out->end(), buf, buf + r);
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
  if (ended == Ended::kTooLarge) return Failure{"wrote more than " + std::to_string(opts.max_bytes) + " bytes", false};
  if (ended == Ended::kCancelled) return Failure{"cancelled", false};
  if (ended == Ended::kStalled)
    return Failure{"the command wrote only " + std::to_string(window_bytes) + " bytes in " +
                       std::to_string(opts.stall_timeout_ms / 1000) + " s (slower than " +
                       std::to_string(opts.min_bytes_per_s) + " bytes/s; " + std::to_string(out->size()) +
                       " bytes in all) and was stopped" + tail, true};
  if (WIFSIGNALED(status))
    return Failure{"the command was killed by signal " + std::to_string(WTERMSIG(status)) + " after " +
                       std::to_string(out->size()) + " bytes" + tail, true};
  if (WEXITSTATUS(status) != 0)
    return Failure{"the command exited with status " + std::to_string(WEXITSTATUS(status)) + " after " +
                       std::to_string(out->size()) + " bytes" + tail, true};
  return std::nullopt;
}

Result<std::vector<uint8_t>> FetchRaw(const std::string& where, const FetchOptions& opts) {
  std::vector<uint8_t> bytes;
  if (!IsRemoteShard(where)) {
    COLOADER_RETURN_NOT_OK(ReadWholeFile(where, &bytes));
    return bytes;
  }
  const CurlApi* curl = nullptr;
  if (!StartsWith(where, "pipe:")) {
    COLOADER_ASSIGN_OR_RETURN(curl, LoadCurl());
  }
  std::vector<std::string> whys;
  int pause_ms = opts.first_pause_ms;
  for (int attempt = 1; attempt <= opts.attempts; ++attempt) {
    bytes.clear();
    const Attempt failed = curl ? FetchHttp(*curl, where, opts, &bytes) : FetchPipe(where.substr(5), opts, &bytes);
    if (!failed) return bytes;
    whys.push_back(failed->why);
    if (Cancelled(opts)) return Status::Cancelled("fetching shard " + where + ": cancelled");
    if (!failed->retry || attempt == opts.attempts) break;
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

// A gzip stream inflated whole (members one after another, as `cat a.gz b.gz` makes them).
// A stream cut short or broken keeps what inflated before the break (the tar index then names
// the shard cut short); a member that fails its CRC or length check is dropped whole, since its
// bytes are wrong somewhere; bytes after the last member that are not gzip are ignored. Each is
// logged. Nothing left at all is an error naming the shard.
Result<std::vector<uint8_t>> Gunzip(const std::string& where, const std::vector<uint8_t>& in, uint64_t max_bytes) {
  struct Inflater {
    z_stream z{};
    bool live = false;
    ~Inflater() {
      if (live) inflateEnd(&z);
    }
  } inf;
  z_stream& z = inf.z;
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return Status::Internal("zlib's inflateInit2 failed");
  inf.live = true;
  std::vector<uint8_t> out;
  out.reserve(std::min<uint64_t>(max_bytes, in.size() + in.size() / 8));
  z.next_in = const_cast<Bytef*>(in.data());
  z.avail_in = static_cast<uInt>(std::min<size_t>(in.size(), UINT32_MAX));
  size_t fed = z.avail_in;  // how much of `in` has been handed to zlib
  size_t verified = 0;      // output of the members that passed their checks
  std::string damage;
  uint8_t buf[1 << 16];
  for (;;) {
    z.next_out = buf;
    z.avail_out = sizeof buf;
    const int rc = inflate(&z, Z_NO_FLUSH);
    out.insert(out.end(), buf, buf + (sizeof buf - z.avail_out));
    if (out.size() > max_bytes)
      return Status::Invalid("shard " + where + " inflates to more than " + std::to_string(max_bytes) + " bytes");
    if (z.avail_in == 0 && fed < in.size()) {  // over 4 GiB of input: hand zlib the next part
      z.next_in = const_cast<Bytef*>(in.data() + fed);
      z.avail_in = static_cast<uInt>(std::min<size_t>(in.size() - fed, UINT32_MAX));
      fed += z.avail_in;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_STREAM_END) {
      verified = out.size();
      if (z.avail_in == 0) break;  // the last member
      if (z.avail_in < 2 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b) {
        damage = std::to_string(in.size() - (fed - z.avail_in)) + " bytes after the gzip stream that are not gzip";
        break;
      }
      inflateReset(&z);  // another member follows
      continue;
    }
    if (rc == Z_MEM_ERROR) return Status::IOError("inflating shard " + where + ": out of memory");
    const std::string msg = z.msg ? z.msg : "error " + std::to_string(rc);
    if (rc == Z_BUF_ERROR && z.avail_in == 0) {
      damage = "its gzip stream is cut short";
    } else if (msg == "incorrect data check" || msg == "incorrect length check") {
      out.resize(verified);  // the member's bytes are wrong somewhere: none of them is kept
      damage = "a gzip member fails its check (zlib: " + msg + ") and is dropped";
    } else {
      damage = "its gzip stream is damaged (zlib: " + msg + ")";
    }
    break;
  }
  if (!damage.empty()) {
    if (out.empty()) return Status::Invalid(where + ": " + damage + ", and nothing inflated before it");
    LogLine("[coloader] shard %s: %s after %llu compressed bytes; the %zu bytes inflated before it are kept\n",
            where.c_str(), damage.c_str(), static_cast<unsigned long long>(fed - z.avail_in), out.size());
  }
  return out;
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
  COLOADER_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, FetchRaw(where, opts));
  if (bytes.size() < 2 || bytes[0] != 0x1f || bytes[1] != 0x8b) return bytes;
  return Gunzip(where, bytes, opts.max_bytes);
}

}  // namespace coloader
