// ZeroMQ behind Status: cppzmq reports every failure by throwing zmq::error_t, and this is the
// one place where those exceptions are caught. The producer, the consumer and the tools call
// sockets only through Socket and Poll, so a socket call's failure is a value their callers
// must look at, never an exception that crosses a Status function.
//
// Conventions: a call that would block under dontwait is not an error (Send and Recv say
// false); a signal during Poll (EINTR) is a poll that saw nothing; every other failure is
// kIOError with the call, the endpoint where there is one, and libzmq's words.
#pragma once

#include <chrono>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"

namespace coloader {

class Socket {
 public:
  Socket() = default;  // closed: Open() it
  Socket(Socket&&) = default;
  Socket& operator=(Socket&&) = default;

  static Result<Socket> Open(zmq::context_t& ctx, zmq::socket_type type);

  bool is_open() const { return static_cast<bool>(sock_); }
  // For poll items and libzmq's C calls (zmq_socket_monitor); owned by this Socket.
  void* handle() { return sock_.handle(); }
  void Close() { sock_.close(); }

  // Any of cppzmq's zmq::sockopt options, with its value type.
  template <typename Option, typename Value>
  Status Set(Option option, const Value& value) {
    try {
      sock_.set(option, value);
      return Status::OK();
    } catch (const zmq::error_t& e) {
      return Failure("setting a socket option", e);
    }
  }
  Result<std::string> LastEndpoint();

  Status Bind(const std::string& endpoint);
  Status Unbind(const std::string& endpoint);  // stops accepting there; its connections stay
  Status Connect(const std::string& endpoint);

  // One frame: copied from `data`, or the message itself (no copy). True when queued; false
  // when dontwait is given and the peer's queue is full (or no peer is connected yet);
  // kIOError when the peer is gone (a router's EHOSTUNREACH) or the socket failed.
  Result<bool> Send(zmq::const_buffer data, zmq::send_flags flags);
  Result<bool> Send(zmq::message_t& message, zmq::send_flags flags);
  // One frame into `message`: false when dontwait is given and none is waiting (or a signal came
  // first); a blocking read interrupted by a signal is read again.
  Result<bool> Recv(zmq::message_t* message, zmq::recv_flags flags);

 private:
  explicit Socket(zmq::socket_t sock) : sock_(std::move(sock)) {}
  static Status Failure(const std::string& what, const zmq::error_t& e);

  zmq::socket_t sock_;
};

// A Send's outcome where the caller only needs to know whether the frame went: queued, rather
// than refused for a full queue or failed (the callers' liveness checks tell those apart).
inline bool Queued(const Result<bool>& sent) { return sent.ok() && *sent; }

// Waits up to `timeout` for the items' events (zmq::poll); returns how many are ready, 0 when
// a signal interrupted the wait (the caller's loop checks its state and polls again).
Result<int> Poll(std::vector<zmq::pollitem_t>& items, std::chrono::milliseconds timeout);

}  // namespace coloader
