#include "producer/zap.h"

#include <vector>

#include "common/curve.h"

namespace coloader {

Result<std::unique_ptr<ZapHandler>> ZapHandler::Make(zmq::context_t& ctx, std::optional<std::set<std::string>> allowed,
                                                     std::function<void(const std::string&)> log) {
  std::unique_ptr<ZapHandler> h(new ZapHandler(std::move(allowed), std::move(log)));
  Status st = [&]() -> Status {
    COLOADER_ASSIGN_OR_RETURN(h->sock_, Socket::Open(ctx, zmq::socket_type::rep));
    COLOADER_RETURN_NOT_OK(h->sock_.Set(zmq::sockopt::linger, 0));
    return h->sock_.Bind("inproc://zeromq.zap.01");
  }();
  if (!st.ok()) return Status::IOError("cannot start the ZAP handler: " + st.message());
  return h;
}

// One reply of a REP socket: every frame but the last says more follow.
Status ZapHandler::Reply(std::initializer_list<zmq::const_buffer> frames) {
  size_t left = frames.size();
  for (const zmq::const_buffer& f : frames)
    COLOADER_RETURN_NOT_OK(sock_.Send(f, --left ? zmq::send_flags::sndmore : zmq::send_flags::none).status());
  return Status::OK();
}

Status ZapHandler::HandlePending() {
  for (;;) {
    // A request: version, request id, domain, address, routing id, mechanism, credentials...
    std::vector<zmq::message_t> frames;
    do {
      zmq::message_t f;
      COLOADER_ASSIGN_OR_RETURN(bool got, sock_.Recv(&f, frames.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none));
      if (!got) return Status::OK();
      frames.push_back(std::move(f));
    } while (frames.back().more());
    if (frames.size() < 6) {
      // Not a ZAP request; a REP socket must still answer before it can read again.
      COLOADER_RETURN_NOT_OK(Reply({zmq::str_buffer("1.0"), zmq::str_buffer(""), zmq::str_buffer("500"),
                                    zmq::str_buffer("malformed ZAP request"), zmq::str_buffer(""), zmq::str_buffer("")}));
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
    const std::string code = ok ? "200" : "400", text = ok ? "OK" : why;
    // version, request id, status code and text, user id, no metadata
    COLOADER_RETURN_NOT_OK(Reply({zmq::buffer(frames[0].data(), frames[0].size()),
                                  zmq::buffer(frames[1].data(), frames[1].size()), zmq::buffer(code),
                                  zmq::buffer(text), zmq::buffer(user), zmq::str_buffer("")}));
  }
}

}  // namespace coloader
