// The producer's ZAP handler (ZeroMQ RFC 27): libzmq asks it about every tcp:// connection
// before the handshake completes, and it accepts a CURVE client only if the client's public key
// is listed (--authorized-keys), or anyone with --insecure. Local ipc:// connections never
// reach it (they are bound without a ZAP domain; the run directory's 0700 guards them).
//
// It serves the producer's own context on inproc://zeromq.zap.01 and is polled by the
// producer's session loop, which must answer promptly: libzmq holds the handshake meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <zmq.hpp>

#include "common/status.h"

namespace coloader {

class ZapHandler {
 public:
  // `allowed`: the public keys (Z85) that may connect; nullopt accepts every peer (--insecure).
  // `log` receives one line per refused peer.
  static Result<std::unique_ptr<ZapHandler>> Make(zmq::context_t& ctx, std::optional<std::set<std::string>> allowed,
                                                  std::function<void(const std::string&)> log);

  zmq::socket_t& socket() { return sock_; }
  // Answers every pending request (non-blocking).
  void HandlePending();

  uint64_t accepted() const { return accepted_; }
  uint64_t refused() const { return refused_; }

  // The user id given to accepted peers: "curve:<key>" or "insecure:<address>". Messages from
  // tcp:// peers carry it (the User-Id property); from local peers it is absent.
  static constexpr const char* kDomain = "coloader";

 private:
  ZapHandler(zmq::context_t& ctx, std::optional<std::set<std::string>> allowed,
             std::function<void(const std::string&)> log)
      : sock_(ctx, zmq::socket_type::rep), allowed_(std::move(allowed)), log_(std::move(log)) {}
  zmq::socket_t sock_;
  std::optional<std::set<std::string>> allowed_;
  std::function<void(const std::string&)> log_;
  uint64_t accepted_ = 0, refused_ = 0;
};

}  // namespace coloader
