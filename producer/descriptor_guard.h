// Keeps a producer's descriptors below its limit however many peers connect to its tcp://
// endpoint, key or no key. libzmq accepts every connection offered to an endpoint (a descriptor
// each, held until the peer goes or the handshake deadline passes); once the process is out of
// descriptors, every file open fails and libzmq's ipc listener aborts the process (libzmq 4.3
// asserts on EMFILE there), so a flood of keyless connections took the producer down.
//
// The guard watches the router's connections (a socket monitor: each accepted or closed
// connection wakes it) and the descriptors in use (/proc/self/fd). Above a high mark it stops
// accepting on the tcp:// endpoint: it unbinds it, which closes every connection libzmq accepted
// there (remote consumers then meet a closed connection and say so) and has the kernel refuse new
// ones. It binds the endpoint again once the descriptors are below a low mark and a pause has
// passed, a pause that doubles (1 s to 32 s) while floods follow each other within a minute, so
// that a flood that never stops costs a few reconnections a minute, not a flapping endpoint. The
// ipc:// endpoint and the workers' files keep the room between the high mark and the limit.
// Connections that have not finished their handshake go after 5 s (ZMQ_HANDSHAKE_IVL, tcp.cc).
//
// The guard reacts after libzmq's accepts (libzmq offers no cap on them): on a loaded machine a
// fast flood can reach the limit for a moment before the endpoint is unbound. libzmq's tcp
// listener survives that (it drops the connection); a local consumer connecting in that moment
// would meet libzmq's ipc abort, so the room above the high mark is generous (a quarter of the
// limit) to make the moment rare, not impossible.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <zmq.hpp>

#include "common/socket.h"
#include "common/status.h"

namespace coloader {

class DescriptorGuard {
 public:
  struct Marks {
    uint64_t limit = 0;  // RLIMIT_NOFILE (soft)
    uint64_t high = 0;   // stop accepting tcp:// connections at this many descriptors in use
    uint64_t low = 0;    // accept again below this many
  };
  // The marks for a descriptor limit: room of a quarter of the limit (at least 64) kept above
  // the high mark, and an eighth (at least 32) between the marks.
  static Marks MarksFor(uint64_t limit);

  // Watches `router`'s connections; `endpoint` is its tcp:// endpoint as bound (port resolved).
  static Result<std::unique_ptr<DescriptorGuard>> Make(zmq::context_t& ctx, Socket& router, std::string endpoint,
                                                       std::function<void(const std::string&)> log);
  ~DescriptorGuard();
  DescriptorGuard(const DescriptorGuard&) = delete;
  DescriptorGuard& operator=(const DescriptorGuard&) = delete;

  // The monitor's socket, to poll for ZMQ_POLLIN with the router.
  void* monitor() { return monitor_.handle(); }
  // After each poll: drains the monitor's events, and unbinds or binds the endpoint again as the
  // descriptors in use ask. Errors are the socket's (a failed rebind is retried, not an error).
  Status Check(Socket& router);
  bool accepting() const { return accepting_; }
  const Marks& marks() const { return marks_; }

 private:
  DescriptorGuard(Socket router_monitor_peer, std::string endpoint, std::string monitor_address, Marks marks,
                  std::function<void(const std::string&)> log);

  Socket monitor_;
  std::string endpoint_;
  std::string monitor_address_;
  Marks marks_;
  std::function<void(const std::string&)> log_;
  bool accepting_ = true;
  uint64_t refused_since_ns_ = 0;
  uint64_t last_rebind_try_ns_ = 0;
  uint64_t pause_ns_ = 0;  // before binding again: 1 s, doubled per flood within a minute of the last
  uint64_t rebound_ns_ = 0;
};

// The descriptors this process has open (entries of /proc/self/fd, less the listing's own).
uint64_t OpenDescriptors();

}  // namespace coloader
