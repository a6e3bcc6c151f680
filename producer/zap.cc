#include "producer/zap.h"

#include <vector>

#include "common/curve.h"

namespace coloader {

Result<std::unique_ptr<ZapHandler>> ZapHandler::Make(zmq::context_t& ctx, std::optional<std::set<std::string>> allowed,
                                                     std::function<void(const std::string&)> log) {
  std::unique_ptr<ZapHandler> h(new ZapHandler(ctx, std::move(allowed), std::move(log)));
  h->sock_.set(zmq::sockopt::linger, 0);
  try {
    h->sock_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return Status::IOError(std::string("cannot start the ZAP handler: ") + e.what());
  }
  return h;
}

void ZapHandler::HandlePending() {
  for (;;) {
    // A request: version, request id, domain, address, routing id, mechanism, credentials...
    std::vector<zmq::message_t> frames;
    do {
      zmq::message_t f;
      if (!sock_.recv(f, frames.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none)) return;
      frames.push_back(std::move(f));
    } while (frames.back().more());
    if (frames.size() < 6) {
      // Not a ZAP request; a REP socket must still answer before it can read again.
      sock_.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
      sock_.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
      sock_.send(zmq::str_buffer("500"), zmq::send_flags::sndmore);
      sock_.send(zmq::str_buffer("malformed ZAP request"), zmq::send_flags::sndmore);
      sock_.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
      sock_.send(zmq::str_buffer(""), zmq::send_flags::none);
      continue;
    }
    const std::string address = frames[3].to_string();
    const std::string mechanism = frames[5].to_string();
    std::string user, why;
    if (mechanism == "CURVE" && frames.size() >= 7) {
      const std::string key = Z85FromRaw(frames[6].to_string());
      if (!allowed_ || allowed_->count(key)) {
        user = "curve:" + key;
      } else {
        why = "public key " + key + " is not in --authorized-keys";
      }
    } else if (!allowed_) {
      user = "insecure:" + address;
    } else {
      why = "it did not use CURVE (mechanism " + mechanism + ")";
    }
    const bool ok = !user.empty();
    if (ok) {
      ++accepted_;
    } else {
      ++refused_;
      if (log_) log_("refused a tcp connection from " + address + ": " + why);
    }
    sock_.send(frames[0], zmq::send_flags::sndmore);  // version
    sock_.send(frames[1], zmq::send_flags::sndmore);  // request id
    sock_.send(zmq::buffer(std::string(ok ? "200" : "400")), zmq::send_flags::sndmore);
    sock_.send(zmq::buffer(ok ? std::string("OK") : why), zmq::send_flags::sndmore);
    sock_.send(zmq::buffer(user), zmq::send_flags::sndmore);
    sock_.send(zmq::str_buffer(""), zmq::send_flags::none);  // no metadata
  }
}

}  // namespace coloader
