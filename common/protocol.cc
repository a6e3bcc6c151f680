#include "common/protocol.h"

#include <cstring>
#include <type_traits>

namespace coloader {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kUInt8: return "uint8";
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "?";
}
const char* TensorLayoutName(TensorLayout l) { return l == TensorLayout::kNHWC ? "nhwc" : "nchw"; }
size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kUInt8: return 1;
    case DType::kFloat32: return 4;
    case DType::kBFloat16:
    case DType::kFloat16: return 2;
  }
  return 1;
}

const char* ByeReasonName(ByeReason r) {
  switch (r) {
    case ByeReason::kFinished: return "finished";
    case ByeReason::kStopping: return "stopping";
    case ByeReason::kDetached: return "detached";
    case ByeReason::kLeaving: return "leaving";
    case ByeReason::kRejected: return "rejected";
    case ByeReason::kGroupBroken: return "group broken";
  }
  return "?";
}

const char* ProducerStateName(uint8_t state) {
  switch (state) {
    case 0: return "waiting for consumers";
    case 1: return "running";
    case 2: return "finished";
    case 3: return "stopping";
    case 4: return "every batch published, waiting for consumers to release the last";
  }
  return "?";
}

namespace {

// Little-endian writer. The machines this runs on are little-endian x86-64 and arm64; the
// static_assert keeps a big-endian port from silently speaking another protocol.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "protocol assumes little-endian hosts");

// Bounds that keep the slot-table arithmetic from 64-bit overflow: with these a sample is at
// most 2^50 bytes, and sizes are compared by division, never by a product that could wrap.
constexpr uint64_t kMaxSlots = 1u << 16, kMaxBatch = 1u << 20, kMaxSide = 1u << 16;
constexpr uint64_t kMaxRingBytes = uint64_t{1} << 44;

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void PutString(const std::string& s) {
    // Longer strings are cut rather than sent: they are names and messages for humans.
    size_t n = s.size() < kMaxStringBytes ? s.size() : kMaxStringBytes;
    Put<uint16_t>(static_cast<uint16_t>(n));
    out_.insert(out_.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  }
  std::vector<uint8_t> Take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  template <typename T>
  bool Get(T* v) {
    if (n_ - pos_ < sizeof(T)) return Fail(sizeof(T));
    std::memcpy(v, d_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    uint16_t len = 0;
    if (!Get(&len)) return false;
    if (len > kMaxStringBytes) {
      error_ = "string length " + std::to_string(len) + " exceeds " + std::to_string(kMaxStringBytes);
      return false;
    }
    if (n_ - pos_ < len) return Fail(len);
    s->assign(reinterpret_cast<const char*>(d_ + pos_), len);
    pos_ += len;
    return true;
  }
  bool AtEnd() const { return pos_ == n_; }
  size_t remaining() const { return n_ - pos_; }
  const std::string& error() const { return error_; }
  void SetError(std::string e) { error_ = std::move(e); }

 private:
  bool Fail(size_t want) {
    error_ = "truncated: needed " + std::to_string(want) + " more bytes at offset " +
             std::to_string(pos_) + " of " + std::to_string(n_);
    return false;
  }
  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
  std::string error_;
};

MessageType TypeOf(const Message& m) {
  static constexpr MessageType kTypes[] = {
      MessageType::kHello,     MessageType::kWelcome, MessageType::kReject,
      MessageType::kBatch,     MessageType::kAck,     MessageType::kHeartbeat,
      MessageType::kBye,       MessageType::kStatusRequest, MessageType::kStatusReply,
      MessageType::kAttach,    MessageType::kEnd,     MessageType::kReclaim};
  return kTypes[m.index()];
}

void PutSlotTable(Writer& w, const SlotTable& t) {
  w.PutString(t.shm_name);
  w.Put(t.num_slots);
  w.Put(t.slot_bytes);
  w.Put(t.batch_size);
  w.Put(t.indices_offset);
  w.Put(t.labels_offset);
  w.Put(t.data_offset);
  w.Put(t.height);
  w.Put(t.width);
  w.Put(t.channels);
  w.Put(static_cast<uint8_t>(t.dtype));
  w.Put(static_cast<uint8_t>(t.layout));
}

bool GetSlotTable(Reader& r, SlotTable* t) {
  uint8_t dtype = 0, layout = 0;
  if (!(r.GetString(&t->shm_name) && r.Get(&t->num_slots) && r.Get(&t->slot_bytes) &&
        r.Get(&t->batch_size) && r.Get(&t->indices_offset) && r.Get(&t->labels_offset) &&
        r.Get(&t->data_offset) && r.Get(&t->height) && r.Get(&t->width) && r.Get(&t->channels) &&
        r.Get(&dtype) && r.Get(&layout)))
    return false;
  if (dtype > static_cast<uint8_t>(DType::kFloat16)) {
    r.SetError("unknown dtype " + std::to_string(dtype));
    return false;
  }
  if (layout > static_cast<uint8_t>(TensorLayout::kNCHW)) {
    r.SetError("unknown layout " + std::to_string(layout));
    return false;
  }
  t->dtype = static_cast<DType>(dtype);
  t->layout = static_cast<TensorLayout>(layout);
  // The table describes memory the consumer will map and index: it must be self-consistent,
  // and no sum or product below may wrap (each factor is bounded first).
  const uint64_t p = t->batch_size;
  if (t->num_slots == 0 || t->num_slots > kMaxSlots || p == 0 || p > kMaxBatch || t->channels == 0 ||
      t->channels > kMaxSide || t->height == 0 || t->height > kMaxSide || t->width == 0 || t->width > kMaxSide ||
      t->slot_bytes > kMaxRingBytes / t->num_slots || t->indices_offset > t->slot_bytes ||
      t->labels_offset > t->slot_bytes || t->data_offset > t->slot_bytes ||
      8 * p > t->slot_bytes - t->indices_offset || 8 * p > t->slot_bytes - t->labels_offset ||
      t->sample_bytes() > (t->slot_bytes - t->data_offset) / p) {
    r.SetError("inconsistent slot table");
    return false;
  }
  return true;
}

void Encode(Writer& w, const Hello& m) {
  w.Put(m.pid);
  w.Put(m.pid_ns);
  w.Put(m.start_time);
  w.Put(m.batch_size);
  w.Put(m.flags);
  w.PutString(m.client_name);
  w.PutString(m.device_uuid);
  w.PutString(m.group);
  w.Put(m.rank);
  w.Put(m.world_size);
  w.Put(m.node_rank);
  w.Put(m.num_nodes);
  w.Put(m.expect_seed);
  w.PutString(m.expect_data_key);
}
bool DecodeBody(Reader& r, Hello* m) {
  if (!(r.Get(&m->pid) && r.Get(&m->pid_ns) && r.Get(&m->start_time) && r.Get(&m->batch_size) &&
        r.Get(&m->flags) && r.GetString(&m->client_name) &&
        r.GetString(&m->device_uuid) && r.GetString(&m->group) && r.Get(&m->rank) && r.Get(&m->world_size) &&
        r.Get(&m->node_rank) && r.Get(&m->num_nodes) && r.Get(&m->expect_seed) && r.GetString(&m->expect_data_key)))
    return false;
  // The producer acts on these (a rank indexes its group's table): bound them here.
  if (m->world_size < 1 || m->world_size > kMaxGroupSize || m->rank >= m->world_size) {
    r.SetError("rank " + std::to_string(m->rank) + " of a group of " + std::to_string(m->world_size) +
               " (1 to " + std::to_string(kMaxGroupSize) + " ranks)");
    return false;
  }
  if (m->num_nodes < 0 || (m->num_nodes > 0 && (m->node_rank < 0 || m->node_rank >= m->num_nodes))) {
    r.SetError("node " + std::to_string(m->node_rank) + " of " + std::to_string(m->num_nodes));
    return false;
  }
  return true;
}

void PutDeviceTable(Writer& w, const DeviceTable& d) {
  w.Put(d.device);
  w.PutString(d.device_uuid);
  w.PutString(d.mem_handle);
  w.Put(static_cast<uint32_t>(d.event_handles.size()));
  for (const std::string& e : d.event_handles) w.PutString(e);
  w.Put(d.slot_bytes);
  w.Put(d.labels_offset);
  w.Put(d.data_offset);
  w.Put(static_cast<uint8_t>(d.dtype));
  w.Put(static_cast<uint8_t>(d.layout));
}

bool GetDeviceTable(Reader& r, const SlotTable& host, DeviceTable* d) {
  uint32_t events = 0;
  uint8_t dtype = 0, layout = 0;
  if (!(r.Get(&d->device) && r.GetString(&d->device_uuid) && r.GetString(&d->mem_handle) && r.Get(&events)))
    return false;
  if (events != host.num_slots) {
    r.SetError("device table has " + std::to_string(events) + " events for " + std::to_string(host.num_slots) + " slots");
    return false;
  }
  d->event_handles.resize(events);
  for (std::string& e : d->event_handles)
    if (!r.GetString(&e)) return false;
  if (!(r.Get(&d->slot_bytes) && r.Get(&d->labels_offset) && r.Get(&d->data_offset) && r.Get(&dtype) &&
        r.Get(&layout)))
    return false;
  if (dtype > static_cast<uint8_t>(DType::kFloat16) || layout > static_cast<uint8_t>(TensorLayout::kNCHW)) {
    r.SetError("unknown device dtype or layout");
    return false;
  }
  d->dtype = static_cast<DType>(dtype);
  d->layout = static_cast<TensorLayout>(layout);
  const uint64_t p = host.batch_size;
  const uint64_t sample = uint64_t{host.height} * host.width * host.channels * DTypeSize(d->dtype);
  if (d->mem_handle.size() != kCudaIpcHandleBytes || d->device < 0 || d->slot_bytes > kMaxRingBytes ||
      d->labels_offset > d->slot_bytes || d->data_offset > d->slot_bytes ||
      8 * p > d->slot_bytes - d->labels_offset || sample > (d->slot_bytes - d->data_offset) / p) {
    r.SetError("inconsistent device table");
    return false;
  }
  for (const std::string& e : d->event_handles) {
    if (e.size() != kCudaIpcHandleBytes) {
      r.SetError("event handle of " + std::to_string(e.size()) + " bytes");
      return false;
    }
  }
  return true;
}

void Encode(Writer& w, const Welcome& m) {
  w.Put(m.consumer_id);
  w.Put(m.producer_pid);
  w.Put(m.producer_pid_ns);
  w.Put(m.producer_start_time);
  w.Put(m.heartbeat_ms);
  w.Put(m.heartbeat_timeout_ms);
  w.Put(m.dataset_size);
  w.Put(m.epoch_samples);
  PutSlotTable(w, m.slots);
  w.Put(static_cast<uint8_t>(m.has_device ? 1 : 0));
  if (m.has_device) PutDeviceTable(w, m.device);
  w.PutString(m.mailbox_name);
  w.Put(m.mailbox_index);
  w.Put(m.mailbox_count);
  w.Put(m.mailbox_capacity);
  w.Put(m.seed);
  w.PutString(m.data_key);
  w.Put(m.node_rank);
  w.Put(m.num_nodes);
}
bool DecodeBody(Reader& r, Welcome* m) {
  uint8_t has_device = 0;
  if (!(r.Get(&m->consumer_id) && r.Get(&m->producer_pid) && r.Get(&m->producer_pid_ns) &&
        r.Get(&m->producer_start_time) && r.Get(&m->heartbeat_ms) &&
        r.Get(&m->heartbeat_timeout_ms) && r.Get(&m->dataset_size) && r.Get(&m->epoch_samples) &&
        GetSlotTable(r, &m->slots) && r.Get(&has_device)))
    return false;
  if (has_device > 1) {
    r.SetError("bad device flag");
    return false;
  }
  m->has_device = has_device == 1;
  if (m->has_device && !GetDeviceTable(r, m->slots, &m->device)) return false;
  if (!(r.GetString(&m->mailbox_name) && r.Get(&m->mailbox_index) && r.Get(&m->mailbox_count) &&
        r.Get(&m->mailbox_capacity) && r.Get(&m->seed) && r.GetString(&m->data_key) && r.Get(&m->node_rank) &&
        r.Get(&m->num_nodes)))
    return false;
  if (m->num_nodes < 1 || m->node_rank < 0 || m->node_rank >= m->num_nodes) {
    r.SetError("producer shard " + std::to_string(m->node_rank) + " of " + std::to_string(m->num_nodes));
    return false;
  }
  if (!m->mailbox_name.empty() &&
      (m->mailbox_index >= m->mailbox_count || m->mailbox_capacity == 0 || m->mailbox_count > 65536 ||
       m->mailbox_capacity > 65536)) {
    r.SetError("inconsistent mailbox table");
    return false;
  }
  return true;
}

void Encode(Writer& w, const Reject& m) {
  w.Put(static_cast<uint16_t>(m.code));
  w.PutString(m.reason);
}
bool DecodeBody(Reader& r, Reject* m) {
  uint16_t code = 0;
  if (!(r.Get(&code) && r.GetString(&m->reason))) return false;
  if (code < 1 || code > static_cast<uint16_t>(RejectCode::kMismatch)) {
    r.SetError("unknown reject code " + std::to_string(code));
    return false;
  }
  m->code = static_cast<RejectCode>(code);
  return true;
}

void Encode(Writer& w, const BatchAnnouncement& m) {
  w.Put(m.seq);
  w.Put(m.slot);
  w.Put(m.epoch);
  w.Put(m.first);
  w.Put(m.count);
  w.Put(m.flags);
  w.Put(m.ready_ns);
}
bool DecodeBody(Reader& r, BatchAnnouncement* m) {
  return r.Get(&m->seq) && r.Get(&m->slot) && r.Get(&m->epoch) && r.Get(&m->first) &&
         r.Get(&m->count) && r.Get(&m->flags) && r.Get(&m->ready_ns);
}

void Encode(Writer& w, const Attach& m) { w.Put(m.device); }
bool DecodeBody(Reader& r, Attach* m) {
  if (!r.Get(&m->device)) return false;
  if (m->device > 1) {
    r.SetError("bad device flag " + std::to_string(m->device));
    return false;
  }
  return true;
}

void Encode(Writer& w, const End& m) { w.Put(m.epochs); }
bool DecodeBody(Reader& r, End* m) { return r.Get(&m->epochs); }
void Encode(Writer& w, const Reclaim& m) { w.Put(m.seq); }
bool DecodeBody(Reader& r, Reclaim* m) { return r.Get(&m->seq); }

void Encode(Writer& w, const Ack& m) { w.Put(m.seq); }
bool DecodeBody(Reader& r, Ack* m) { return r.Get(&m->seq); }

void Encode(Writer&, const Heartbeat&) {}
bool DecodeBody(Reader&, Heartbeat*) { return true; }
void Encode(Writer&, const StatusRequest&) {}
bool DecodeBody(Reader&, StatusRequest*) { return true; }

void Encode(Writer& w, const Bye& m) {
  w.Put(static_cast<uint16_t>(m.reason));
  w.PutString(m.message);
}
bool DecodeBody(Reader& r, Bye* m) {
  uint16_t reason = 0;
  if (!(r.Get(&reason) && r.GetString(&m->message))) return false;
  if (reason < 1 || reason > static_cast<uint16_t>(ByeReason::kGroupBroken)) {
    r.SetError("unknown bye reason " + std::to_string(reason));
    return false;
  }
  m->reason = static_cast<ByeReason>(reason);
  return true;
}

void Encode(Writer& w, const StatusReply& m) {
  w.PutString(m.name);
  w.Put(m.pid);
  w.Put(m.state);
  w.Put(m.epoch);
  w.Put(m.position);
  w.Put(m.epoch_samples);
  w.Put(m.batches_published);
  w.Put(m.samples_published);
  w.Put(m.batches_per_s);
  w.Put(m.images_per_s);
  w.Put(m.cpu_seconds);
  w.Put(m.uptime_seconds);
  w.Put(m.num_slots);
  w.Put(m.slots_in_use);
  w.Put(m.bad_files);
  w.Put(m.rejected_messages);
  w.Put(m.dropped_clients);
  w.Put(static_cast<uint32_t>(m.consumers.size()));
  for (const ConsumerStatus& c : m.consumers) {
    w.Put(c.id);
    w.Put(c.pid);
    w.Put(c.batch_size);
    w.Put(c.received);
    w.Put(c.acked);
    w.Put(c.lag);
    w.Put(c.held);
    w.Put(c.path);
    w.PutString(c.name);
    w.PutString(c.group);
    w.Put(c.rank);
    w.Put(c.world_size);
    w.Put(c.waiting);
    w.Put(c.unread);
    w.Put(c.idle_ms);
  }
}
bool DecodeBody(Reader& r, StatusReply* m) {
  uint32_t n = 0;
  if (!(r.GetString(&m->name) && r.Get(&m->pid) && r.Get(&m->state) && r.Get(&m->epoch) &&
        r.Get(&m->position) && r.Get(&m->epoch_samples) && r.Get(&m->batches_published) &&
        r.Get(&m->samples_published) && r.Get(&m->batches_per_s) && r.Get(&m->images_per_s) &&
        r.Get(&m->cpu_seconds) && r.Get(&m->uptime_seconds) && r.Get(&m->num_slots) &&
        r.Get(&m->slots_in_use) && r.Get(&m->bad_files) && r.Get(&m->rejected_messages) && r.Get(&m->dropped_clients) &&
        r.Get(&n)))
    return false;
  if (n > kMaxStatusConsumers) {
    r.SetError("consumer count " + std::to_string(n) + " exceeds " + std::to_string(kMaxStatusConsumers));
    return false;
  }
  m->consumers.resize(n);
  for (ConsumerStatus& c : m->consumers) {
    if (!(r.Get(&c.id) && r.Get(&c.pid) && r.Get(&c.batch_size) && r.Get(&c.received) &&
          r.Get(&c.acked) && r.Get(&c.lag) && r.Get(&c.held) && r.Get(&c.path) &&
          r.GetString(&c.name) && r.GetString(&c.group) && r.Get(&c.rank) && r.Get(&c.world_size) &&
          r.Get(&c.waiting) && r.Get(&c.unread) && r.Get(&c.idle_ms)))
      return false;
  }
  return true;
}

template <typename T>
Result<Message> DecodeAs(Reader& r, const char* type_name) {
  T m;
  if (!DecodeBody(r, &m)) {
    return Status::Protocol(std::string("malformed ") + type_name + " message: " + r.error());
  }
  if (!r.AtEnd()) {
    return Status::Protocol(std::string("malformed ") + type_name + " message: " +
                            std::to_string(r.remaining()) + " trailing bytes");
  }
  return Message(std::move(m));
}

}  // namespace

const char* MessageTypeName(const Message& m) {
  static constexpr const char* kNames[] = {"Hello", "Welcome",   "Reject",
                                           "Batch", "Ack",       "Heartbeat",
                                           "Bye",   "StatusRequest", "StatusReply",
                                           "Attach", "End",     "Reclaim"};
  return kNames[m.index()];
}

std::vector<uint8_t> Encode(const Message& m) {
  Writer w;
  w.Put(kProtocolMagic);
  w.Put(kProtocolVersion);
  w.Put(static_cast<uint16_t>(TypeOf(m)));
  std::visit([&w](const auto& body) { Encode(w, body); }, m);
  return w.Take();
}

Result<uint16_t> PeekVersion(const uint8_t* data, size_t size) {
  Reader r(data, size);
  uint32_t magic = 0;
  uint16_t version = 0;
  if (!(r.Get(&magic) && r.Get(&version))) {
    return Status::Protocol("message of " + std::to_string(size) + " bytes is shorter than the " +
                            std::to_string(kHeaderBytes) + "-byte header");
  }
  if (magic != kProtocolMagic) return Status::Protocol("not a coloader message (bad magic)");
  return version;
}

Result<Message> Decode(const uint8_t* data, size_t size) {
  COLOADER_ASSIGN_OR_RETURN(uint16_t version, PeekVersion(data, size));
  if (version != kProtocolVersion) {
    return Status::Protocol("protocol version " + std::to_string(version) +
                            " is not supported (this build speaks version " +
                            std::to_string(kProtocolVersion) + "); use matching coloader builds");
  }
  Reader r(data + 6, size - 6);
  uint16_t type = 0;
  if (!r.Get(&type)) return Status::Protocol("truncated header");
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello: return DecodeAs<Hello>(r, "Hello");
    case MessageType::kWelcome: return DecodeAs<Welcome>(r, "Welcome");
    case MessageType::kReject: return DecodeAs<Reject>(r, "Reject");
    case MessageType::kBatch: return DecodeAs<BatchAnnouncement>(r, "Batch");
    case MessageType::kAck: return DecodeAs<Ack>(r, "Ack");
    case MessageType::kHeartbeat: return DecodeAs<Heartbeat>(r, "Heartbeat");
    case MessageType::kBye: return DecodeAs<Bye>(r, "Bye");
    case MessageType::kStatusRequest: return DecodeAs<StatusRequest>(r, "StatusRequest");
    case MessageType::kStatusReply: return DecodeAs<StatusReply>(r, "StatusReply");
    case MessageType::kAttach: return DecodeAs<Attach>(r, "Attach");
    case MessageType::kEnd: return DecodeAs<End>(r, "End");
    case MessageType::kReclaim: return DecodeAs<Reclaim>(r, "Reclaim");
  }
  return Status::Protocol("unknown message type " + std::to_string(type));
}

}  // namespace coloader
