#include "common/protocol.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace coloader {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kUInt8: return "uint8";
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kBool: return "bool";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat64: return "float64";
    case DType::kComplex64: return "complex64";
  }
  return "?";
}
const char* TensorLayoutName(TensorLayout l) { return l == TensorLayout::kNHWC ? "nhwc" : "nchw"; }
size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kUInt8:
    case DType::kBool:
    case DType::kInt8: return 1;
    case DType::kBFloat16:
    case DType::kFloat16:
    case DType::kInt16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kInt64:
    case DType::kFloat64:
    case DType::kComplex64: return 8;
  }
  return 1;
}

uint64_t FieldSpec::sample_bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // bounded where they are made or decoded
  return n;
}

namespace {

// Where each field's region of `capacity` samples begins, regions laid one after another and
// rounded up to 256 bytes; with `on_host_only`, the other fields take no room. The last entry
// is where the last region ends.
std::vector<uint64_t> Regions(const std::vector<FieldSpec>& fields, uint64_t capacity, bool on_host_only) {
  std::vector<uint64_t> offsets;
  offsets.reserve(fields.size() + 1);
  uint64_t at = 0;
  for (const FieldSpec& f : fields) {
    offsets.push_back(at);
    if (!on_host_only || (f.flags & kFieldOnHost)) at += (capacity * f.sample_bytes() + 255) / 256 * 256;
  }
  offsets.push_back(at);
  return offsets;
}

}  // namespace

std::vector<uint64_t> FieldOffsets(const std::vector<FieldSpec>& fields, uint64_t capacity) {
  std::vector<uint64_t> offsets = Regions(fields, capacity, false);
  offsets.pop_back();
  return offsets;
}

uint64_t FieldsBytes(const std::vector<FieldSpec>& fields, uint64_t capacity) {
  return Regions(fields, capacity, false).back();
}

std::vector<uint64_t> OnHostOffsets(const std::vector<FieldSpec>& fields, uint64_t capacity) {
  std::vector<uint64_t> offsets = Regions(fields, capacity, true);
  offsets.pop_back();
  return offsets;
}

uint64_t OnHostBytes(const std::vector<FieldSpec>& fields, uint64_t capacity) {
  return Regions(fields, capacity, true).back();
}

uint64_t SlotTable::sample_bytes() const {
  if (fields.empty()) return uint64_t{height} * width * channels * DTypeSize(dtype);
  uint64_t n = 0;
  for (const FieldSpec& f : fields) n += f.sample_bytes();
  return n;
}

uint64_t SlotTable::data_bytes(uint64_t capacity) const {
  return fields.empty() ? capacity * sample_bytes() : FieldsBytes(fields, capacity);
}

std::vector<std::pair<uint64_t, uint64_t>> SlotTable::LeadingRanges(uint64_t n) const {
  if (fields.empty()) return {{0, n * sample_bytes()}};
  std::vector<std::pair<uint64_t, uint64_t>> out;
  const std::vector<uint64_t> offsets = FieldOffsets(fields, batch_size);
  for (size_t f = 0; f < fields.size(); ++f) out.emplace_back(offsets[f], n * fields[f].sample_bytes());
  return out;
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
  void PutLongString(const std::string& s) {  // one the reader needs whole (a structure)
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  // One field of a message's field list (Fields below).
  template <typename T>
  bool Field(const T& v) {
    Put(v);
    return true;
  }
  bool Field(const std::string& s) {
    PutString(s);
    return true;
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
  bool GetString(std::string* s) { return GetCounted<uint16_t>(s, kMaxStringBytes); }
  bool GetLongString(std::string* s, size_t max) { return GetCounted<uint32_t>(s, max); }
  // One field of a message's field list (Fields below).
  template <typename T>
  bool Field(T& v) {
    return Get(&v);
  }
  bool Field(std::string& s) { return GetString(&s); }
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
  // A string of a Length-typed byte count, at most `max` bytes.
  template <typename Length>
  bool GetCounted(std::string* s, size_t max) {
    Length len = 0;
    if (!Get(&len)) return false;
    if (len > max) {
      error_ = "string length " + std::to_string(len) + " exceeds " + std::to_string(max);
      return false;
    }
    if (n_ - pos_ < len) return Fail(len);
    s->assign(reinterpret_cast<const char*>(d_ + pos_), len);
    pos_ += len;
    return true;
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

// One field list per message, read by both directions: Fields(io, m) hands every field to
// io.Field() in wire order, where io is the Writer (m const) or the Reader. Enums travel as
// their fixed underlying type; what a decoded message must satisfy is checked apart, in
// Valid(). Counted lists (a device table's events, a status reply's consumers) and the
// Welcome's optional device table are written out in both directions by hand.
template <typename M, typename T>
constexpr bool kIs = std::is_same_v<std::remove_const_t<M>, T>;

template <typename IO, typename M>
std::enable_if_t<kIs<M, SlotTable>, bool> Fields(IO& io, M& t) {
  return io.Field(t.shm_name) && io.Field(t.num_slots) && io.Field(t.slot_bytes) && io.Field(t.batch_size) &&
         io.Field(t.indices_offset) && io.Field(t.labels_offset) && io.Field(t.data_offset) && io.Field(t.height) &&
         io.Field(t.width) && io.Field(t.channels) && io.Field(t.dtype) && io.Field(t.layout);
}
template <typename IO, typename M>
std::enable_if_t<kIs<M, Hello>, bool> Fields(IO& io, M& m) {
  return io.Field(m.pid) && io.Field(m.pid_ns) && io.Field(m.start_time) && io.Field(m.batch_size) &&
         io.Field(m.flags) && io.Field(m.client_name) && io.Field(m.device_uuid) && io.Field(m.group) &&
         io.Field(m.rank) && io.Field(m.world_size) && io.Field(m.node_rank) && io.Field(m.num_nodes) &&
         io.Field(m.expect_seed) && io.Field(m.expect_data_key);
}
// A Welcome up to its slot table, and after its device table.
template <typename IO, typename M>
std::enable_if_t<kIs<M, Welcome>, bool> Fields(IO& io, M& m) {
  return io.Field(m.consumer_id) && io.Field(m.producer_pid) && io.Field(m.producer_pid_ns) &&
         io.Field(m.producer_start_time) && io.Field(m.heartbeat_ms) && io.Field(m.heartbeat_timeout_ms) &&
         io.Field(m.dataset_size) && io.Field(m.epoch_samples) && Fields(io, m.slots);
}
template <typename IO, typename M>
bool WelcomeTail(IO& io, M& m) {
  return io.Field(m.mailbox_name) && io.Field(m.mailbox_index) && io.Field(m.mailbox_count) &&
         io.Field(m.mailbox_capacity) && io.Field(m.seed) && io.Field(m.data_key) && io.Field(m.node_rank) &&
         io.Field(m.num_nodes) && io.Field(m.no_catch_up);
}
template <typename IO, typename M>
std::enable_if_t<kIs<M, Reject>, bool> Fields(IO& io, M& m) {
  return io.Field(m.code) && io.Field(m.reason);
}
template <typename IO, typename M>
std::enable_if_t<kIs<M, BatchAnnouncement>, bool> Fields(IO& io, M& m) {
  return io.Field(m.seq) && io.Field(m.slot) && io.Field(m.epoch) && io.Field(m.first) && io.Field(m.count) &&
         io.Field(m.flags) && io.Field(m.ready_ns);
}
template <typename IO, typename M>
std::enable_if_t<kIs<M, Attach>, bool> Fields(IO& io, M& m) {
  return io.Field(m.device) && io.Field(m.flags) && io.Field(m.resume_epoch) && io.Field(m.resume_from) &&
         io.Field(m.resume_to);
}
template <typename IO, typename M>
std::enable_if_t<kIs<M, End>, bool> Fields(IO& io, M& m) { return io.Field(m.epochs); }
template <typename IO, typename M>
std::enable_if_t<kIs<M, Reclaim> || kIs<M, Ack>, bool> Fields(IO& io, M& m) { return io.Field(m.seq); }
template <typename IO, typename M>
std::enable_if_t<kIs<M, Heartbeat> || kIs<M, StatusRequest>, bool> Fields(IO&, M&) { return true; }
template <typename IO, typename M>
std::enable_if_t<kIs<M, Bye>, bool> Fields(IO& io, M& m) {
  return io.Field(m.reason) && io.Field(m.message);
}
// A status reply up to its consumer count.
template <typename IO, typename M>
std::enable_if_t<kIs<M, StatusReply>, bool> Fields(IO& io, M& m) {
  return io.Field(m.name) && io.Field(m.pid) && io.Field(m.state) && io.Field(m.epoch) && io.Field(m.position) &&
         io.Field(m.epoch_samples) && io.Field(m.batches_published) && io.Field(m.samples_published) &&
         io.Field(m.batches_per_s) && io.Field(m.images_per_s) && io.Field(m.cpu_seconds) &&
         io.Field(m.uptime_seconds) && io.Field(m.num_slots) && io.Field(m.slots_in_use) && io.Field(m.bad_files) &&
         io.Field(m.rejected_messages) && io.Field(m.dropped_clients) && io.Field(m.decode);
}
template <typename IO, typename M>
std::enable_if_t<kIs<M, ConsumerStatus>, bool> Fields(IO& io, M& c) {
  return io.Field(c.id) && io.Field(c.pid) && io.Field(c.batch_size) && io.Field(c.received) &&
         io.Field(c.acked) && io.Field(c.lag) && io.Field(c.held) && io.Field(c.path) && io.Field(c.name) &&
         io.Field(c.group) && io.Field(c.rank) && io.Field(c.world_size) && io.Field(c.waiting) &&
         io.Field(c.unread) && io.Field(c.idle_ms);
}
// A device table up to its event count, and after its events.
template <typename IO, typename M>
bool DeviceTableHead(IO& io, M& d) {
  return io.Field(d.device) && io.Field(d.device_uuid) && io.Field(d.mem_handle);
}
template <typename IO, typename M>
bool DeviceTableTail(IO& io, M& d) {
  return io.Field(d.slot_bytes) && io.Field(d.labels_offset) && io.Field(d.data_offset) && io.Field(d.dtype) &&
         io.Field(d.layout);
}

// ---- what a decoded message must satisfy ----------------------------------------------------

bool Invalid(Reader& r, std::string why) {
  r.SetError(std::move(why));
  return false;
}

// Every field's dtype known and its regions for `p` samples within `room` bytes: checked by
// division, so that nothing below wraps (each dimension is bounded first).
bool ValidFields(Reader& r, const std::vector<FieldSpec>& fields, uint64_t p, uint64_t room) {
  uint64_t used = 0;
  for (const FieldSpec& f : fields) {
    if (f.dtype > kLastDType)
      return Invalid(r, "field " + f.path + ": unknown dtype " + std::to_string(static_cast<int>(f.dtype)));
    if (f.flags & ~kKnownFieldFlags)
      return Invalid(r, "field " + f.path + ": unknown flags " + std::to_string(static_cast<int>(f.flags)));
    uint64_t bytes = DTypeSize(f.dtype);
    for (int64_t d : f.shape) {
      if (d < 1 || static_cast<uint64_t>(d) > kMaxRingBytes / bytes) return Invalid(r, "field " + f.path + ": bad shape");
      bytes *= static_cast<uint64_t>(d);
    }
    if (bytes > kMaxRingBytes / p) return Invalid(r, "field " + f.path + " does not fit its slot");
    const uint64_t region = (p * bytes + 255) / 256 * 256;  // at most 2^44 + 255
    if (region > room - used) return Invalid(r, "field " + f.path + " does not fit its slot");
    used += region;
  }
  return true;
}

bool Valid(Reader& r, const SlotTable& t) {
  if (t.dtype > kLastImageDType) return Invalid(r, "unknown dtype " + std::to_string(static_cast<int>(t.dtype)));
  if (t.layout > TensorLayout::kNCHW)
    return Invalid(r, "unknown layout " + std::to_string(static_cast<int>(t.layout)));
  // The table describes memory the consumer will map and index: it must be self-consistent,
  // and no sum or product below may wrap (each factor is bounded first).
  const uint64_t p = t.batch_size;
  if (t.num_slots == 0 || t.num_slots > kMaxSlots || p == 0 || p > kMaxBatch || t.channels == 0 ||
      t.channels > kMaxSide || t.height == 0 || t.height > kMaxSide || t.width == 0 || t.width > kMaxSide ||
      t.slot_bytes > kMaxRingBytes / t.num_slots || t.indices_offset > t.slot_bytes ||
      t.labels_offset > t.slot_bytes || t.data_offset > t.slot_bytes || 8 * p > t.slot_bytes - t.indices_offset ||
      8 * p > t.slot_bytes - t.labels_offset)
    return Invalid(r, "inconsistent slot table");
  if (!t.fields.empty()) return ValidFields(r, t.fields, p, t.slot_bytes - t.data_offset);
  if (t.sample_bytes() > (t.slot_bytes - t.data_offset) / p) return Invalid(r, "inconsistent slot table");
  return true;
}

// The schema follows the slot table's fixed fields: a count, each field, the structure.
void PutSchema(Writer& w, const SlotTable& t) {
  w.Put(static_cast<uint16_t>(t.fields.size()));
  for (const FieldSpec& f : t.fields) {
    w.PutString(f.path);
    w.Put(f.dtype);
    w.Put(f.flags);
    w.Put(static_cast<uint8_t>(f.shape.size()));
    for (int64_t d : f.shape) w.Put(d);
  }
  w.PutLongString(t.structure);
}
bool GetSchema(Reader& r, SlotTable* t) {
  uint16_t n = 0;
  if (!r.Get(&n)) return false;
  if (n > kMaxFields) return Invalid(r, std::to_string(n) + " fields (at most " + std::to_string(kMaxFields) + ")");
  t->fields.resize(n);
  for (FieldSpec& f : t->fields) {
    uint8_t ndim = 0;
    if (!(r.GetString(&f.path) && r.Get(&f.dtype) && r.Get(&f.flags) && r.Get(&ndim))) return false;
    if (ndim > kMaxFieldDims) return Invalid(r, "field of " + std::to_string(ndim) + " dimensions");
    f.shape.resize(ndim);
    for (int64_t& d : f.shape)
      if (!r.Get(&d)) return false;
  }
  return r.GetLongString(&t->structure, kMaxStructureBytes);
}

bool Valid(Reader& r, const Hello& m) {
  // The producer acts on these (a rank indexes its group's table): bound them here.
  if (m.world_size < 1 || m.world_size > kMaxGroupSize || m.rank >= m.world_size)
    return Invalid(r, "rank " + std::to_string(m.rank) + " of a group of " + std::to_string(m.world_size) +
                          " (1 to " + std::to_string(kMaxGroupSize) + " ranks)");
  if (m.num_nodes < 0 || (m.num_nodes > 0 && (m.node_rank < 0 || m.node_rank >= m.num_nodes)))
    return Invalid(r, "node " + std::to_string(m.node_rank) + " of " + std::to_string(m.num_nodes));
  return true;
}

bool Valid(Reader& r, const SlotTable& host, const DeviceTable& d) {
  if (d.dtype > kLastImageDType || d.layout > TensorLayout::kNCHW) return Invalid(r, "unknown device dtype or layout");
  const uint64_t p = host.batch_size;
  const uint64_t sample = uint64_t{host.height} * host.width * host.channels * DTypeSize(d.dtype);
  if (d.mem_handle.size() != kCudaIpcHandleBytes || d.device < 0 || d.slot_bytes > kMaxRingBytes ||
      d.labels_offset > d.slot_bytes || d.data_offset > d.slot_bytes || 8 * p > d.slot_bytes - d.labels_offset ||
      (host.fields.empty() && sample > (d.slot_bytes - d.data_offset) / p))
    return Invalid(r, "inconsistent device table");
  // The fields lie in a device slot as in a host one (FieldOffsets for the producer's batch size).
  if (!host.fields.empty() && !ValidFields(r, host.fields, p, d.slot_bytes - d.data_offset)) return false;
  for (const std::string& e : d.event_handles)
    if (e.size() != kCudaIpcHandleBytes) return Invalid(r, "event handle of " + std::to_string(e.size()) + " bytes");
  return true;
}

bool Valid(Reader& r, const Welcome& m) {
  if (m.num_nodes < 1 || m.node_rank < 0 || m.node_rank >= m.num_nodes)
    return Invalid(r, "producer shard " + std::to_string(m.node_rank) + " of " + std::to_string(m.num_nodes));
  if (!m.mailbox_name.empty() && (m.mailbox_index >= m.mailbox_count || m.mailbox_capacity == 0 ||
                                  m.mailbox_count > 65536 || m.mailbox_capacity > 65536))
    return Invalid(r, "inconsistent mailbox table");
  return true;
}

bool Valid(Reader& r, const Reject& m) {
  if (m.code < RejectCode::kVersion || m.code > RejectCode::kMismatch)
    return Invalid(r, "unknown reject code " + std::to_string(static_cast<int>(m.code)));
  return true;
}

bool Valid(Reader& r, const Attach& m) {
  if (m.device > 1) return Invalid(r, "bad device flag " + std::to_string(m.device));
  if (m.flags & ~(kAttachNoCatchUp | kAttachResume))
    return Invalid(r, "unknown attach flags " + std::to_string(m.flags));
  if ((m.flags & kAttachNoCatchUp) && (m.flags & kAttachResume))
    return Invalid(r, "an Attach both without catch-up and resumed by the producer");
  if (!(m.flags & kAttachResume) && (m.resume_epoch || m.resume_from || m.resume_to))
    return Invalid(r, "a resume range without kAttachResume");
  if (m.resume_from > m.resume_to) return Invalid(r, "a resume range that ends before it begins");
  return true;
}

bool Valid(Reader& r, const Bye& m) {
  if (m.reason < ByeReason::kFinished || m.reason > ByeReason::kGroupBroken)
    return Invalid(r, "unknown bye reason " + std::to_string(static_cast<int>(m.reason)));
  return true;
}

template <typename M>
bool Valid(Reader&, const M&) {
  return true;
}

// ---- the messages -----------------------------------------------------------------------------

template <typename M>
void Encode(Writer& w, const M& m) {
  Fields(w, m);
}
template <typename M>
bool DecodeBody(Reader& r, M* m) {
  return Fields(r, *m) && Valid(r, *m);
}

void PutDeviceTable(Writer& w, const DeviceTable& d) {
  DeviceTableHead(w, d);
  w.Put(static_cast<uint32_t>(d.event_handles.size()));
  for (const std::string& e : d.event_handles) w.PutString(e);
  DeviceTableTail(w, d);
}

bool GetDeviceTable(Reader& r, const SlotTable& host, DeviceTable* d) {
  uint32_t events = 0;
  if (!(DeviceTableHead(r, *d) && r.Get(&events))) return false;
  if (events != host.num_slots)
    return Invalid(r, "device table has " + std::to_string(events) + " events for " + std::to_string(host.num_slots) +
                          " slots");
  d->event_handles.resize(events);
  for (std::string& e : d->event_handles)
    if (!r.GetString(&e)) return false;
  return DeviceTableTail(r, *d) && Valid(r, host, *d);
}

void Encode(Writer& w, const Welcome& m) {
  Fields(w, m);
  PutSchema(w, m.slots);
  w.Put(static_cast<uint8_t>(m.has_device ? 1 : 0));
  if (m.has_device) PutDeviceTable(w, m.device);
  WelcomeTail(w, m);
  const size_t classes = std::min<size_t>(m.classes.size(), kMaxClasses);
  w.Put(static_cast<uint32_t>(classes));
  for (size_t i = 0; i < classes; ++i) w.PutString(m.classes[i]);
}
bool DecodeBody(Reader& r, Welcome* m) {
  uint8_t has_device = 0;
  if (!(Fields(r, *m) && GetSchema(r, &m->slots) && Valid(r, m->slots) && r.Get(&has_device))) return false;
  if (has_device > 1) return Invalid(r, "bad device flag");
  m->has_device = has_device == 1;
  if (m->has_device && !GetDeviceTable(r, m->slots, &m->device)) return false;
  uint32_t classes = 0;
  if (!(WelcomeTail(r, *m) && r.Get(&classes))) return false;
  // Each name takes at least its 2-byte length: a count the message cannot hold is refused
  // before anything is allocated for it.
  if (classes > kMaxClasses || classes > r.remaining() / 2)
    return Invalid(r, std::to_string(classes) + " class names in " + std::to_string(r.remaining()) + " bytes");
  m->classes.resize(classes);
  for (std::string& c : m->classes)
    if (!r.GetString(&c)) return false;
  return Valid(r, *m);
}

void Encode(Writer& w, const StatusReply& m) {
  Fields(w, m);
  w.Put(static_cast<uint32_t>(m.consumers.size()));
  for (const ConsumerStatus& c : m.consumers) Fields(w, c);
}
bool DecodeBody(Reader& r, StatusReply* m) {
  uint32_t n = 0;
  if (!(Fields(r, *m) && r.Get(&n))) return false;
  if (n > kMaxStatusConsumers)
    return Invalid(r, "consumer count " + std::to_string(n) + " exceeds " + std::to_string(kMaxStatusConsumers));
  m->consumers.resize(n);
  for (ConsumerStatus& c : m->consumers)
    if (!Fields(r, c)) return false;
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
