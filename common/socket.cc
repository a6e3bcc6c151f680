#include "common/socket.h"

namespace coloader {

Status Socket::Failure(const std::string& what, const zmq::error_t& e) {
  return Status::IOError(what + ": " + e.what());
}

Result<Socket> Socket::Open(zmq::context_t& ctx, zmq::socket_type type) {
  try {
    return Socket(zmq::socket_t(ctx, type));
  } catch (const zmq::error_t& e) {  // EMFILE (too many open sockets), a terminated context
    return Failure("opening a ZeroMQ socket", e);
  }
}

Result<std::string> Socket::LastEndpoint() {
  try {
    return sock_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Failure("reading the bound endpoint", e);
  }
}

Status Socket::Bind(const std::string& endpoint) {
  try {
    sock_.bind(endpoint);
    return Status::OK();
  } catch (const zmq::error_t& e) {
    return Failure("cannot bind " + endpoint, e);
  }
}

Status Socket::Unbind(const std::string& endpoint) {
  try {
    sock_.unbind(endpoint);
    return Status::OK();
  } catch (const zmq::error_t& e) {
    return Failure("cannot unbind " + endpoint, e);
  }
}

Status Socket::Connect(const std::string& endpoint) {
  try {
    sock_.connect(endpoint);
    return Status::OK();
  } catch (const zmq::error_t& e) {
    return Failure("cannot connect to '" + endpoint + "'", e);
  }
}

Result<bool> Socket::Send(zmq::const_buffer data, zmq::send_flags flags) {
  try {
    return sock_.send(data, flags).has_value();
  } catch (const zmq::error_t& e) {
    return Failure("send", e);
  }
}

Result<bool> Socket::Send(zmq::message_t& message, zmq::send_flags flags) {
  try {
    return sock_.send(message, flags).has_value();
  } catch (const zmq::error_t& e) {
    return Failure("send", e);
  }
}

Result<bool> Socket::Recv(zmq::message_t* message, zmq::recv_flags flags) {
  for (;;) {
    try {
      return sock_.recv(*message, flags).has_value();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return Failure("recv", e);
      // A signal: under dontwait nothing was read (the caller polls again); a blocking read
      // (the rest of a message whose first frame came) is read again.
      if (flags == zmq::recv_flags::dontwait) return false;
    }
  }
}

Result<int> Poll(std::vector<zmq::pollitem_t>& items, std::chrono::milliseconds timeout) {
  try {
    return zmq::poll(items.data(), items.size(), timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;
    return Status::IOError(std::string("poll: ") + e.what());
  }
}

}  // namespace coloader
