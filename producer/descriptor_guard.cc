#include "producer/descriptor_guard.h"

#include <dirent.h>
#include <sys/resource.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>

#include "common/process.h"

namespace coloader {

uint64_t OpenDescriptors() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  uint64_t n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n > 0 ? n - 1 : 0;  // the listing's own descriptor
}

DescriptorGuard::Marks DescriptorGuard::MarksFor(uint64_t limit) {
  Marks m;
  m.limit = limit;
  const uint64_t room = std::max<uint64_t>(64, limit / 4), band = std::max<uint64_t>(32, limit / 8);
  m.high = limit > room ? limit - room : limit / 2;
  m.low = m.high > band ? m.high - band : m.high / 2;
  return m;
}

DescriptorGuard::DescriptorGuard(Socket monitor, std::string endpoint, std::string monitor_address, Marks marks,
                                 std::function<void(const std::string&)> log)
    : monitor_(std::move(monitor)),
      endpoint_(std::move(endpoint)),
      monitor_address_(std::move(monitor_address)),
      marks_(marks),
      log_(std::move(log)) {}

DescriptorGuard::~DescriptorGuard() = default;

Result<std::unique_ptr<DescriptorGuard>> DescriptorGuard::Make(zmq::context_t& ctx, Socket& router, std::string endpoint,
                                                               std::function<void(const std::string&)> log) {
  rlimit lim{};
  const uint64_t limit = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY ? lim.rlim_cur : 1 << 20;
  // Every accepted or closed connection (and a failed handshake, which closes one) wakes the loop.
  static std::atomic<uint64_t> next{0};
  const std::string address = "inproc://coloader-descriptor-guard-" + std::to_string(next++);
  if (zmq_socket_monitor(router.handle(), address.c_str(),
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0)
    return Status::IOError(std::string("cannot watch the producer's connections: ") + zmq_strerror(zmq_errno()));
  COLOADER_ASSIGN_OR_RETURN(Socket monitor, Socket::Open(ctx, zmq::socket_type::pair));
  COLOADER_RETURN_NOT_OK(monitor.Set(zmq::sockopt::linger, 0));
  COLOADER_RETURN_NOT_OK(monitor.Connect(address));
  return std::unique_ptr<DescriptorGuard>(
      new DescriptorGuard(std::move(monitor), std::move(endpoint), address, MarksFor(limit), std::move(log)));
}

Status DescriptorGuard::Check(Socket& router) {
  bool events = false;
  for (int budget = 0; budget < 100000; ++budget) {  // each event is two frames: what, and where
    zmq::message_t frame;
    COLOADER_ASSIGN_OR_RETURN(const bool got, monitor_.Recv(&frame, zmq::recv_flags::dontwait));
    if (!got) break;
    events = true;
    while (frame.more()) COLOADER_RETURN_NOT_OK(monitor_.Recv(&frame, zmq::recv_flags::none).status());
  }
  if (!events && accepting_) return Status::OK();
  const uint64_t now = MonotonicNs();
  const uint64_t in_use = OpenDescriptors();
  if (accepting_ && in_use >= marks_.high) {
    COLOADER_RETURN_NOT_OK(router.Unbind(endpoint_));
    accepting_ = false;
    refused_since_ns_ = now;
    constexpr uint64_t kSecond = 1'000'000'000;
    pause_ns_ = rebound_ns_ != 0 && now - rebound_ns_ < 60 * kSecond ? std::min(pause_ns_ * 2, 32 * kSecond) : kSecond;
    log_(endpoint_ + ": " + std::to_string(in_use) + " of " + std::to_string(marks_.limit) +
         " descriptors in use (a flood of connections?): its connections are closed and no new ones accepted for " +
         std::to_string(pause_ns_ / kSecond) + " s, and until fewer than " + std::to_string(marks_.low) +
         " descriptors are in use; local consumers are served meanwhile");
  } else if (!accepting_ && in_use < marks_.low && now - refused_since_ns_ >= pause_ns_ &&
             now - last_rebind_try_ns_ >= 100'000'000) {
    last_rebind_try_ns_ = now;
    if (!router.Bind(endpoint_).ok()) return Status::OK();  // the port is busy a moment longer: next time
    accepting_ = true;
    rebound_ns_ = now;
    log_(endpoint_ + ": accepting tcp:// connections again (" + std::to_string(in_use) + " descriptors in use, " +
         std::to_string((now - refused_since_ns_) / 1'000'000) + " ms after it stopped)");
  }
  return Status::OK();
}

}  // namespace coloader
