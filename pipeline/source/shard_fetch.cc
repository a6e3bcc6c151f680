#include "pipeline/source/shard_fetch.h"

#define CURL_DISABLE_TYPECHECK  // curl_easy_setopt as the plain function it is (called through dlopen)
#include <curl/curl.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "common/log.h"
#include "common/process.h"
#include "common/unique_fd.h"
#include "pipeline/source/read.h"
#include "pipeline/source/shard_sink.h"
#include "toolbox/shared_library.h"

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
    Result<SharedLibrary> lib = SharedLibrary::Open({"libcurl.so.4"});
    if (!lib.ok()) {
      loaded = Status::NotFound("http(s):// shards need libcurl, which this machine lacks (" + lib.status().message() +
                                "): install it (Debian/Ubuntu: apt install libcurl4), or fetch the shards with a "
                                "pipe: command, or copy them to a local file system");
      return;
    }
    lib->Bind(api.global_init, "curl_global_init");
    lib->Bind(api.init, "curl_easy_init");
    lib->Bind(api.setopt, "curl_easy_setopt");
    lib->Bind(api.perform, "curl_easy_perform");
    lib->Bind(api.getinfo, "curl_easy_getinfo");
    lib->Bind(api.cleanup, "curl_easy_cleanup");
    lib->Bind(api.strerror, "curl_easy_strerror");
    if (!lib->complete()) {
      loaded = Status::Internal(lib->path() + " lacks " + lib->missing());
      return;
    }
    lib->Keep();  // the table is the process's
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
    LogLineAt(LogLevel::kWarning, "[coloader] fetching shard %s failed (%s); attempt %d of %d in %.1f s\n",
              where.c_str(), failed->why.c_str(), attempt + 1, opts.attempts, pause_ms / 1000.0);
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
