// The tcp:// endpoint: CURVE keys checked by the ZAP handler, batches sent as payload to
// consumers that cannot map the ring.
#include "producer/producer_internal.h"

#include <cstdio>
#include <cstring>
#include <set>

#include "common/curve.h"
#include "common/log.h"

namespace coloader {

namespace {
constexpr int kTcpHandshakeMs = 5000;
}  // namespace

Status Producer::Impl::BindTcp() {
  // libzmq copies a socket's options into each endpoint when it is bound: the ipc endpoint
  // above has neither CURVE nor a ZAP domain; this one has both (or ZAP alone, insecure).
  std::optional<std::set<std::string>> allowed;
  CurveKeyPair pair;
  if (!opts.insecure) {
    COLOADER_ASSIGN_OR_RETURN(pair, ReadCurveKeyPair(opts.curve_key_file));
    COLOADER_ASSIGN_OR_RETURN(allowed, ReadAuthorizedKeys(opts.authorized_keys_file));
  }
  const std::string name = opts.name;
  COLOADER_ASSIGN_OR_RETURN(zap, ZapHandler::Make(ctx, std::move(allowed), [name](const std::string& line) {
                     LogLine("[coloader %s] %s\n", name.c_str(), line.c_str());
                   }));
  COLOADER_RETURN_NOT_OK(router.Set(zmq::sockopt::zap_domain, std::string(ZapHandler::kDomain)));
  if (!opts.insecure) {
    COLOADER_RETURN_NOT_OK(router.Set(zmq::sockopt::curve_server, 1));
    COLOADER_RETURN_NOT_OK(router.Set(zmq::sockopt::curve_secretkey, pair.secret_key));
  }
  // A connection that has not finished its handshake (CURVE and the ZAP check) within this goes:
  // a peer without a key holds a descriptor for at most that long (libzmq's default is 30 s).
  COLOADER_RETURN_NOT_OK(router.Set(zmq::sockopt::handshake_ivl, kTcpHandshakeMs));
  COLOADER_RETURN_NOT_OK(router.Bind(opts.tcp_endpoint));
  COLOADER_ASSIGN_OR_RETURN(tcp_bound, router.LastEndpoint());
  COLOADER_ASSIGN_OR_RETURN(descriptor_guard, DescriptorGuard::Make(ctx, router, tcp_bound, [name](const std::string& line) {
                              LogLine("[coloader %s] %s\n", name.c_str(), line.c_str());
                            }));
  return Status::OK();
}

void Producer::Impl::SendWithPayload(Session& s, const BatchAnnouncement& a) {
  // A remote consumer cannot map the ring: the slot's indices, labels and tensor (or fields)
  // go along, packed as [int64 indices][int64 labels][data] for the batch's samples.
  const uint8_t* slot = shm.data() + uint64_t{a.slot} * table.slot_bytes;
  const uint64_t n = a.count, data = n * table.sample_bytes();
  zmq::message_t payload(16 * n + data);
  auto* out = payload.data<uint8_t>();
  std::memcpy(out, slot + table.indices_offset, 8 * n);
  std::memcpy(out + 8 * n, slot + table.labels_offset, 8 * n);
  out += 16 * n;
  for (const auto& [offset, bytes] : table.LeadingRanges(n)) {
    std::memcpy(out, slot + table.data_offset + offset, bytes);
    out += bytes;
  }
  std::vector<uint8_t> head = Encode(a);
  // A failed send: the connection is gone or its queue is full; the heartbeat timeout drops it.
  if (Queued(router.Send(zmq::buffer(s.identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) &&
      Queued(router.Send(zmq::buffer(head), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) &&
      Queued(router.Send(payload, zmq::send_flags::dontwait)))
    s.last_sent_ns = MonotonicNs();
}

}  // namespace coloader
