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
#include <initializer_list>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "common/socket.h"
#include "common/status.h"

namespace coloader {

class ZapHandler {
 public:
  // `allowed`: the public keys (Z85) that may connect; nullopt accepts every peer (--insecure).
  // `log` receives one line per refused peer.
  static Result<std::unique_ptr<ZapHandler>> Make(zmq::context_t& ctx, std::optional<std::set<std::string>> allowed,
                                                  std::function<void(const std::string&)> log);

  Socket& socket() { return sock_; }
  // Answers every pending request (non-blocking); fails only when its socket does.
  Status HandlePending();

  uint64_t accepted() const { return accepted_; }
  uint64_t refused() const { return refused_; }

  // The user id given to accepted peers: "curve:<key>" or "insecure:<address>". Messages from
  // tcp:// peers carry it (the User-Id property); from local peers it is absent.
  static constexpr const char* kDomain = "coloader";

 private:
  ZapHandler(std::optional<std::set<std::string>> allowed, std::function<void(const std::string&)> log)
      : allowed_(std::move(allowed)), log_(std::move(log)) {}
  Status Reply(std::initializer_list<zmq::const_buffer> frames);

  Socket sock_;
  std::optional<std::set<std::string>> allowed_;
  std::function<void(const std::string&)> log_;
  uint64_t accepted_ = 0, refused_ = 0;
};

}  // namespace coloader
