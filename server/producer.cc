#include "server/producer.h"

#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <zmq.hpp>

#include "common/align.h"
#include "common/curve.h"
#include "common/endpoint.h"
#include "common/mailbox.h"
#include "common/process.h"
#include "common/protocol.h"
#include "common/shm.h"
#include "server/dataset.h"
#include "server/device_ring.h"
#include "server/external_source.h"
#include "server/pipeline.h"
#include "server/ring.h"
#include "server/sampler.h"
#include "server/zap.h"

namespace coloader {

namespace {

constexpr uint64_t kPageBytes = 4096;
constexpr uint32_t kMailboxes = 256;  // local consumers served through shared-memory mailboxes
constexpr uint64_t kStrangerMessagesPerSecond = 1000;

// The host slot layout: dataset indices, labels, then the tensor on its own page. With a
// device, the workers' uint8 NHWC staging area follows (uploaded from there), and the tensor
// area is filled only for consumers on the host path.
struct SlotLayouts {
  SlotTable table;    // what consumers map
  SlotTable staging;  // what the workers write: the same slots, uint8 NHWC at the staging offset
};
SlotLayouts MakeSlotLayouts(const ProducerOptions& o, const std::string& shm_name) {
  SlotTable t;
  t.shm_name = shm_name;
  // K slots bound every consumer's lag; the spares let one keep old batches (tensors it
  // holds on to) while it goes on reading, without stalling the others.
  t.num_slots = o.window + static_cast<uint32_t>(o.spare_slots);
  t.batch_size = o.batch_size;
  t.height = static_cast<uint32_t>(o.image_size);
  t.width = static_cast<uint32_t>(o.image_size);
  t.channels = 3;
  if (o.external) {
    // C,H,W from the sample shape, leading dimensions filled with 1.
    int64_t chw[3] = {1, 1, 1};
    const size_t n = o.sample_shape.size();
    for (size_t i = 0; i < n; ++i) chw[3 - n + i] = o.sample_shape[i];
    t.channels = static_cast<uint32_t>(chw[0]);
    t.height = static_cast<uint32_t>(chw[1]);
    t.width = static_cast<uint32_t>(chw[2]);
  }
  t.dtype = o.output;
  t.layout = o.layout;
  t.indices_offset = 0;
  t.labels_offset = 8ull * o.batch_size;
  t.data_offset = RoundUp(16ull * o.batch_size, kPageBytes);
  uint64_t end = t.data_offset + uint64_t{o.batch_size} * t.sample_bytes();
  SlotTable staging = t;
  if (!o.devices.empty()) {
    staging.dtype = DType::kUInt8;
    staging.layout = TensorLayout::kNHWC;
    staging.data_offset = RoundUp(end, kPageBytes);
    end = staging.data_offset + uint64_t{o.batch_size} * staging.sample_bytes();
  }
  t.slot_bytes = staging.slot_bytes = RoundUp(end, kPageBytes);
  return {t, staging};
}

// Messages counted over one-second windows: how a flood is told from a busy consumer.
struct RateWindow {
  uint64_t start_ns = 0;
  uint64_t count = 0;
  // Counts one message at `now`; the count within the current second.
  uint64_t Add(uint64_t now) {
    if (now - start_ns >= 1'000'000'000) {
      start_ns = now;
      count = 0;
    }
    return ++count;
  }
};

struct Session {
  uint64_t id = 0;
  std::string identity;  // the ROUTER's routing id of this consumer's connection
  uint32_t pid = 0;
  uint32_t batch_size = 0;
  std::string name;
  bool waiting_for_epoch = false;
  bool device = false;  // reads the device ring (CUDA IPC); otherwise the host slots
  bool pending = false; // offered the device ring, has not said (Attach) which path it takes
  int mailbox = -1;     // its shared-memory mailbox, or -1: announcements go as Batch messages
  bool remote = false;  // came over tcp://: batches go as message payload, liveness by heartbeat
  size_t ring = 0;      // with `device`: which of the device rings it maps
  ProcessWatch watch;  // pidfd: readable when the consumer's process is gone
  uint64_t last_heard_ns = 0;
  uint64_t last_sent_ns = 0;
  uint64_t received = 0;
  uint64_t acked = 0;
  uint64_t first_seq = 0;   // the first batch announced to it
  uint64_t acked_upto = 0;  // one past the newest batch it has released: how far it has read
  RateWindow rate;              // its messages this second
  uint64_t received_at_rate = 0;  // `received` when that second began
};

// --decode: the GPU stage for gpu (and for auto where the first --device has a hardware JPEG
// decoder), nullptr for the CPU decoder. Says which was chosen, and why for auto.
Result<std::unique_ptr<GpuDecodeStage>> MakeGpuDecodeStage(const ProducerOptions& o, const SlotTable& table,
                                                           const AugmentOptions& augment) {
  const char* name = o.name.c_str();
  if (o.decode == DecodeMode::kCpu) return std::unique_ptr<GpuDecodeStage>();
  if (o.devices.empty()) {
    if (o.decode == DecodeMode::kGpu)
      return Status::Invalid("--decode gpu decodes on the GPU of the ring: add --device cuda:N");
    std::fprintf(stderr, "[coloader %s] decode: cpu (--decode auto: no --device)\n", name);
    return std::unique_ptr<GpuDecodeStage>();
  }
  if (o.decode == DecodeMode::kAuto) {
    std::string why;
    if (table.batch_size > kMaxGpuDecodeBatch) {
      std::fprintf(stderr, "[coloader %s] decode: cpu (--decode auto: batches over %u samples)\n", name,
                   kMaxGpuDecodeBatch);
      return std::unique_ptr<GpuDecodeStage>();
    }
    if (!GpuDecodeStage::HardwareAvailable(o.devices[0], &why)) {
      std::fprintf(stderr, "[coloader %s] decode: cpu (--decode auto: %s)\n", name, why.c_str());
      return std::unique_ptr<GpuDecodeStage>();
    }
  }
  GpuDecodeOptions g;
  g.device = o.devices[0];
  g.num_slots = table.num_slots;
  g.batch_size = table.batch_size;
  g.augment = augment;
  ASSIGN_OR_RETURN(std::unique_ptr<GpuDecodeStage> stage, GpuDecodeStage::Make(g));
  std::fprintf(stderr, "[coloader %s] decode: gpu (%s)\n", name, stage->description().c_str());
  return stage;
}

}  // namespace

struct Producer::Impl {
  ProducerOptions opts;
  ProducerPaths paths;
  std::optional<NameLock> lock;
  Dataset dataset;
  std::optional<Sampler> sampler;
  SlotTable table;
  SlotTable staging;
  SharedMemory shm;
  std::vector<std::unique_ptr<DeviceRing>> device_rings;  // one per --device GPU
  MailboxArea mailboxes;
  std::vector<bool> mailbox_used;
  std::unique_ptr<Pipeline> pipeline;
  std::unique_ptr<ExternalSource> external;  // instead of the pipeline, with opts.external
  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  std::unique_ptr<ZapHandler> zap;  // with a tcp:// endpoint: who may connect
  std::string tcp_bound;
  int stop_fd = -1;
  std::atomic<bool> stop_requested{false};

  RingAccounting ring{1};
  std::map<uint64_t, std::unique_ptr<BatchJob>> done;  // completed, waiting to publish in order
  std::unordered_map<std::string, Session> sessions;   // by routing id
  uint64_t next_consumer_id = 1;

  // Where production stands.
  bool started = false;       // min_consumers reached once
  uint64_t epoch = 0;         // epoch being submitted
  uint64_t position = 0;      // samples submitted in that epoch
  std::vector<int64_t> epoch_indices;
  bool all_submitted = false;
  uint64_t next_submit_seq = 0;
  uint64_t next_publish_seq = 0;
  uint64_t published_epoch = 0, published_position = 0;

  // Statistics.
  uint64_t start_ns = 0;
  uint64_t batches_published = 0, samples_published = 0;
  std::unordered_set<int64_t> bad_indices;
  uint64_t bad_events = 0;
  uint64_t rejected_messages = 0;
  // Sessions ended with Bye(rejected): a malformed message, an ack for a batch it does not
  // hold, a second Hello or Attach, a producer's message, a flood, or a full mailbox. Not
  // counted: consumers that left, exited, were detached by the heartbeat or came too late.
  uint64_t dropped_clients = 0;
  // Messages this second from each peer without a session (forgotten every second).
  std::unordered_map<std::string, RateWindow> stranger_rates;
  uint64_t strangers_since_ns = 0;
  double rate_batches = 0, rate_images = 0;
  uint64_t rate_mark_ns = 0, rate_mark_batches = 0, rate_mark_samples = 0;
  uint64_t last_progress_ns = 0;
  bool progress_tty = false;
  Status fatal;  // set when --on-bad-file fail hits

  uint64_t EpochsWanted() const { return opts.forever ? UINT64_MAX : opts.epochs; }
  uint64_t epoch_samples() const { return external ? opts.epoch_samples : sampler->epoch_size(); }
  uint64_t dataset_size() const { return external ? opts.epoch_samples : dataset.size(); }
  size_t InFlight() const { return pipeline ? pipeline->in_flight() : 0; }
  int SourceFd() const { return external ? external->event_fd() : pipeline->event_fd(); }

  Status Setup();
  Status Loop();
  void Shutdown(ByeReason reason, const std::string& message);

  // The back-pressure rule: the producer runs at most `window` batches ahead of how far each
  // live consumer has read: the announcements it has taken from its mailbox (batches go to a
  // session with consecutive numbers from its first), or for one without a mailbox the newest
  // batch it has released. A consumer that keeps an old batch (a tensor it holds on to) but
  // reads on is not behind and does not hold back the others: the kept slot is one of the
  // spares. One that stops reading stays behind, and the producer waits for it.
  bool WithinWindow() const {
    const uint64_t on_the_way = next_submit_seq - next_publish_seq;
    for (const auto& [id, s] : sessions) {
      if (s.pending || s.received == 0) continue;
      const uint64_t read_upto = s.mailbox >= 0
                                     ? s.first_seq + mailboxes.at(static_cast<uint32_t>(s.mailbox)).taken()
                                     : std::max(s.acked_upto, s.first_seq);
      if (next_publish_seq - read_upto + on_the_way >= opts.window) return false;
    }
    return on_the_way < opts.window;
  }
  size_t ActiveSessions() const {
    return static_cast<size_t>(std::count_if(sessions.begin(), sessions.end(),
                                             [](const auto& kv) { return !kv.second.pending; }));
  }
  void SubmitWork();
  void PublishReady();
  void HandleMessage(const std::string& identity, const uint8_t* data, size_t size, bool remote);
  bool Flooding(Session& s, uint64_t now);
  void HandleHello(const std::string& identity, const Hello& hello, bool remote);
  Status BindTcp();
  void SendWithPayload(Session& s, const BatchAnnouncement& a);
  void DropSession(const std::string& identity, const char* why, std::optional<Bye> bye);
  bool Send(const std::string& identity, const Message& m);
  void SendToSession(Session& s, const Message& m);
  void CheckLiveness(uint64_t now);
  StatusReply MakeStatus() const;
  void ReportProgress(uint64_t now, bool final_line);
};

Producer::Producer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Producer::~Producer() {
  if (!impl_) return;
  impl_->pipeline.reset();     // join workers before the memory they write goes
  // Last to first: the first ring pinned the host memory and unregisters it before it is unmapped.
  while (!impl_->device_rings.empty()) impl_->device_rings.pop_back();
  if (!impl_->shm.name().empty()) SharedMemory::Remove(impl_->shm.name());
  if (!impl_->mailboxes.name().empty()) SharedMemory::Remove(impl_->mailboxes.name());
  impl_->router.close();
  ::unlink(impl_->paths.socket.c_str());
  if (impl_->lock) impl_->lock->Release();
  if (impl_->stop_fd >= 0) ::close(impl_->stop_fd);
}

const std::string& Producer::endpoint() const { return impl_->paths.endpoint; }
const std::string& Producer::tcp_endpoint() const { return impl_->tcp_bound; }
ExternalSource* Producer::external_source() const { return impl_->external.get(); }

void Producer::Stop() {
  impl_->stop_requested.store(true);
  uint64_t one = 1;
  (void)!::write(impl_->stop_fd, &one, sizeof(one));  // write(2) is async-signal-safe
}

Result<std::unique_ptr<Producer>> Producer::Make(ProducerOptions opts) {
  if (opts.batch_size < 1 || opts.batch_size > 65536)
    return Status::Invalid("--batch-size must be between 1 and 65536, got " + std::to_string(opts.batch_size));
  if (opts.decode == DecodeMode::kGpu && opts.batch_size > kMaxGpuDecodeBatch)
    return Status::Invalid("--decode gpu takes --batch-size up to " + std::to_string(kMaxGpuDecodeBatch) +
                           ", got " + std::to_string(opts.batch_size) + ": use a smaller batch or --decode cpu");
  if (opts.image_size < 8 || opts.image_size > 4096)
    return Status::Invalid("--image-size must be between 8 and 4096, got " + std::to_string(opts.image_size));
  if (opts.window < 2 || opts.window > 1024)
    return Status::Invalid("--window must be between 2 and 1024 slots, got " + std::to_string(opts.window));
  if (opts.spare_slots < 0) opts.spare_slots = static_cast<int>(std::max(1u, opts.window / 2));
  if (opts.spare_slots > 1024)
    return Status::Invalid("--spare-slots must be between 0 and 1024, got " + std::to_string(opts.spare_slots));
  if (!opts.forever && opts.epochs == 0)
    return Status::Invalid("--epochs must be at least 1 (or use --forever)");
  if (opts.min_consumers < 1)
    return Status::Invalid("--min-consumers must be at least 1");
  if (opts.heartbeat_ms < 10 || opts.heartbeat_timeout_ms < 2 * opts.heartbeat_ms)
    return Status::Invalid("--heartbeat-timeout-ms must be at least twice --heartbeat-ms (got " +
                           std::to_string(opts.heartbeat_timeout_ms) + " and " +
                           std::to_string(opts.heartbeat_ms) + ")");
  const bool half = opts.output == DType::kBFloat16 || opts.output == DType::kFloat16;
  if (half && opts.devices.empty() && !opts.external)
    return Status::Invalid(std::string("--output ") + DTypeName(opts.output) + " is produced on the GPU: add --device cuda:N, or use uint8 or float32");
  if (opts.external) {
    if (opts.sample_shape.empty() || opts.sample_shape.size() > 3)
      return Status::Invalid("a sample shape needs 1 to 3 dimensions, got " + std::to_string(opts.sample_shape.size()));
    for (int64_t d : opts.sample_shape)
      if (d < 1 || d > 65536) return Status::Invalid("sample dimension " + std::to_string(d) + " is out of range (1 to 65536)");
  }
  if (!opts.tcp_endpoint.empty()) {
    if (opts.tcp_endpoint.rfind("tcp://", 0) != 0)
      return Status::Invalid("--tcp must be a tcp:// endpoint (e.g. tcp://0.0.0.0:5555), got '" + opts.tcp_endpoint + "'");
    const bool keys = !opts.curve_key_file.empty() || !opts.authorized_keys_file.empty();
    if (keys && opts.insecure) return Status::Invalid("give CURVE keys or --insecure, not both");
    if (!keys && !opts.insecure)
      return Status::Invalid("refusing to serve " + opts.tcp_endpoint + " without authentication: give --curve-key FILE "
                             "(the producer's key pair, from `coloader keygen --out NAME`) and --authorized-keys FILE "
                             "(the consumers' .pub keys), or --insecure to accept anyone who can reach the port");
    if (keys && (opts.curve_key_file.empty() || opts.authorized_keys_file.empty()))
      return Status::Invalid("CURVE needs both --curve-key (this producer's key pair) and --authorized-keys");
    if (keys) RETURN_NOT_OK(CurveAvailable());
  } else if (!opts.curve_key_file.empty() || !opts.authorized_keys_file.empty() || opts.insecure) {
    return Status::Invalid("--curve-key, --authorized-keys and --insecure apply to a --tcp endpoint; give one");
  }
  if (opts.workers <= 0) opts.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto impl = std::make_unique<Impl>();
  impl->opts = std::move(opts);
  RETURN_NOT_OK(impl->Setup());
  return std::unique_ptr<Producer>(new Producer(std::move(impl)));
}

Status Producer::Impl::Setup() {
  ASSIGN_OR_RETURN(paths, PathsFor(opts.name));
  if (!opts.external) {
    ASSIGN_OR_RETURN(dataset, Dataset::Open(opts.data));
    SamplerOptions so;
    so.shuffle = opts.shuffle;
    so.seed = opts.seed;
    so.rank = opts.rank;
    so.world_size = opts.world_size;
    ASSIGN_OR_RETURN(Sampler s, Sampler::Make(dataset.size(), so));
    sampler.emplace(std::move(s));
  }

  // Claim the name before touching the socket or ring, so a second producer of the same
  // name fails cleanly instead of stealing them; leftovers of a crashed one are replaced.
  ASSIGN_OR_RETURN(NameLock l, NameLock::Acquire(paths.lock));
  lock.emplace(std::move(l));

  SlotLayouts layouts = MakeSlotLayouts(opts, paths.shm_name);
  table = layouts.table;
  staging = layouts.staging;
  ASSIGN_OR_RETURN(shm, SharedMemory::Create(paths.shm_name, table.slot_bytes * table.num_slots));
  ring = RingAccounting(table.num_slots);
  // A consumer never has more than `window` announcements outstanding; twice that is slack.
  uint32_t capacity = 8;
  while (capacity < 2 * table.num_slots) capacity *= 2;
  ASSIGN_OR_RETURN(mailboxes, MailboxArea::Create(paths.shm_name + ".mbox", kMailboxes, capacity));
  mailbox_used.assign(kMailboxes, false);

  TransformOptions to;
  to.augment.mode = opts.augment;
  to.augment.size = opts.image_size;
  to.output = staging.dtype == DType::kUInt8 ? OutputType::kUInt8 : OutputType::kFloat32;
  to.layout = staging.layout == TensorLayout::kNHWC ? Layout::kNHWC : Layout::kNCHW;
  to.dct_scaling = opts.dct_scaling;
  to.crop_decode = opts.crop_decode;
  for (size_t i = 0; i < opts.devices.size(); ++i) {
    DeviceRingOptions d;
    d.device = opts.devices[i];
    d.register_host = i == 0;
    d.num_slots = table.num_slots;
    d.batch_size = table.batch_size;
    d.height = table.height;
    d.width = table.width;
    d.dtype = table.dtype;
    d.layout = table.layout;
    d.normalize = to.normalize;
    d.host_base = shm.data();
    d.host_bytes = shm.size();
    d.host_slot_bytes = table.slot_bytes;
    d.host_labels_offset = table.labels_offset;
    d.host_staging_offset = staging.data_offset;
    d.host_output_offset = table.data_offset;
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceRing> r, DeviceRing::Make(d));
    device_rings.push_back(std::move(r));
  }
  if (opts.external) {
    ASSIGN_OR_RETURN(external, ExternalSource::Make(table, shm.data()));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<GpuDecodeStage> gpu, MakeGpuDecodeStage(opts, table, to.augment));
    ASSIGN_OR_RETURN(pipeline, Pipeline::Make(&dataset, to, opts.workers, opts.seed, staging, std::move(gpu)));
  }

  stop_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (stop_fd < 0) return Status::FromErrno("eventfd", errno);

  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::router_mandatory, 1);
  router.set(zmq::sockopt::sndhwm, 100000);
  try {
    router.bind(paths.endpoint);
  } catch (const zmq::error_t& e) {
    return Status::IOError("cannot bind " + paths.endpoint + ": " + e.what());
  }
  ::chmod(paths.socket.c_str(), 0600);
  if (!opts.tcp_endpoint.empty()) RETURN_NOT_OK(BindTcp());
  progress_tty = ::isatty(STDERR_FILENO);
  return Status::OK();
}

bool Producer::Impl::Send(const std::string& identity, const Message& m) {
  std::vector<uint8_t> bytes = Encode(m);
  try {
    if (!router.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return false;
    return router.send(zmq::buffer(bytes), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    return false;  // EHOSTUNREACH: the peer's connection is gone
  }
}

void Producer::Impl::SendToSession(Session& s, const Message& m) {
  if (Send(s.identity, m)) {
    s.last_sent_ns = MonotonicNs();
  }
  // A failed send means the connection is gone or its queue is full; liveness checks drop it.
}

Status Producer::Impl::BindTcp() {
  // libzmq copies a socket's options into each endpoint when it is bound: the ipc endpoint
  // above has neither CURVE nor a ZAP domain; this one has both (or ZAP alone, insecure).
  std::optional<std::set<std::string>> allowed;
  CurveKeyPair pair;
  if (!opts.insecure) {
    ASSIGN_OR_RETURN(pair, ReadCurveKeyPair(opts.curve_key_file));
    ASSIGN_OR_RETURN(allowed, ReadAuthorizedKeys(opts.authorized_keys_file));
  }
  const std::string name = opts.name;
  ASSIGN_OR_RETURN(zap, ZapHandler::Make(ctx, std::move(allowed), [name](const std::string& line) {
                     std::fprintf(stderr, "[coloader %s] %s\n", name.c_str(), line.c_str());
                   }));
  try {
    router.set(zmq::sockopt::zap_domain, ZapHandler::kDomain);
    if (!opts.insecure) {
      router.set(zmq::sockopt::curve_server, 1);
      router.set(zmq::sockopt::curve_secretkey, pair.secret_key);
    }
    router.bind(opts.tcp_endpoint);
    tcp_bound = router.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Status::IOError("cannot bind " + opts.tcp_endpoint + ": " + e.what());
  }
  return Status::OK();
}

void Producer::Impl::SendWithPayload(Session& s, const BatchAnnouncement& a) {
  // A remote consumer cannot map the ring: the slot's indices, labels and tensor go along,
  // packed as [int64 indices][int64 labels][tensor] for the batch's samples.
  const uint8_t* slot = shm.data() + uint64_t{a.slot} * table.slot_bytes;
  const uint64_t n = a.count, tensor = n * table.sample_bytes();
  zmq::message_t payload(16 * n + tensor);
  auto* out = payload.data<uint8_t>();
  std::memcpy(out, slot + table.indices_offset, 8 * n);
  std::memcpy(out + 8 * n, slot + table.labels_offset, 8 * n);
  std::memcpy(out + 16 * n, slot + table.data_offset, tensor);
  std::vector<uint8_t> head = Encode(a);
  try {
    if (router.send(zmq::buffer(s.identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
        router.send(zmq::buffer(head), zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
        router.send(payload, zmq::send_flags::dontwait))
      s.last_sent_ns = MonotonicNs();
  } catch (const zmq::error_t&) {
    // The connection is gone; the heartbeat timeout drops the session.
  }
}

void Producer::Impl::DropSession(const std::string& identity, const char* why,
                                 std::optional<Bye> bye) {
  auto it = sessions.find(identity);
  if (it == sessions.end()) return;
  Session& s = it->second;
  if (bye) Send(identity, *bye);
  if (bye && bye->reason == ByeReason::kRejected) ++dropped_clients;
  uint32_t freed = ring.DropConsumer(s.id);
  if (s.mailbox >= 0) {
    mailboxes.at(static_cast<uint32_t>(s.mailbox)).Reset(0);
    mailbox_used[static_cast<size_t>(s.mailbox)] = false;
  }
  std::fprintf(stderr, "[coloader %s] consumer %llu (pid %u) %s; %u slot(s) reclaimed\n",
               opts.name.c_str(), static_cast<unsigned long long>(s.id), s.pid, why, freed);
  sessions.erase(it);
}

void Producer::Impl::HandleHello(const std::string& identity, const Hello& hello, bool remote) {
  if (sessions.count(identity)) {
    ++rejected_messages;
    DropSession(identity, "sent a second Hello", Bye{ByeReason::kRejected, "duplicate Hello"});
    return;
  }
  Session s;
  s.id = next_consumer_id++;
  s.identity = identity;
  s.pid = hello.pid;
  s.batch_size = hello.batch_size;
  s.name = hello.client_name;
  s.waiting_for_epoch = (hello.flags & kHelloWaitForEpoch) != 0;
  s.remote = remote;
  if ((hello.flags & kHelloDevice) != 0 && !remote) {
    // The ring on the consumer's own GPU; with no UUID given, the first ring.
    for (size_t i = 0; i < device_rings.size(); ++i) {
      if (hello.device_uuid.empty() || device_rings[i]->table().device_uuid == hello.device_uuid) {
        s.device = true;
        s.ring = i;
        break;
      }
    }
  }
  // A consumer offered device memory first tries to map it; it is not counted, and gets no
  // batches, until it says which path it will read (so a fallback loses nothing).
  s.pending = s.device;
  s.last_heard_ns = MonotonicNs();
  if (hello.pid > 0 && !remote) {  // a remote pid names a process on another machine
    // Local consumers are watched through a pidfd, so their death is seen at once. A pid we
    // cannot watch (another pid namespace, already gone) falls back to the heartbeat.
    if (auto w = ProcessWatch::Open(static_cast<int>(hello.pid)); w.ok()) s.watch = std::move(*w);
  }
  Welcome w;
  w.consumer_id = s.id;
  w.producer_pid = static_cast<uint32_t>(::getpid());
  w.heartbeat_ms = opts.heartbeat_ms;
  w.heartbeat_timeout_ms = opts.heartbeat_timeout_ms;
  w.dataset_size = dataset_size();
  w.epoch_samples = epoch_samples();
  w.slots = table;
  if (remote) w.slots.shm_name.clear();  // no shared memory: batches come with their payload
  if (s.device) {
    w.has_device = true;
    w.device = device_rings[s.ring]->table();
  }
  if (s.watch.valid()) {
    // A local process (we could open its pidfd): give it a mailbox.
    for (uint32_t i = 0; i < kMailboxes; ++i) {
      if (mailbox_used[i]) continue;
      mailbox_used[i] = true;
      mailboxes.at(i).Reset(s.id);
      s.mailbox = static_cast<int>(i);
      w.mailbox_name = mailboxes.name();
      w.mailbox_index = i;
      w.mailbox_count = mailboxes.count();
      w.mailbox_capacity = mailboxes.capacity();
      break;
    }
  }
  if (!Send(identity, w)) {
    if (s.mailbox >= 0) mailbox_used[static_cast<size_t>(s.mailbox)] = false;
    return;
  }
  s.last_sent_ns = MonotonicNs();
  std::fprintf(stderr, "[coloader %s] consumer %llu attached (pid %u, batch size %u, %s path%s)\n",
               opts.name.c_str(), static_cast<unsigned long long>(s.id), s.pid, s.batch_size,
               s.device ? "device" : "host", s.waiting_for_epoch ? ", waits for the next epoch" : "");
  sessions.emplace(identity, std::move(s));
  if (all_submitted && done.empty() && InFlight() == 0) {
    // Nothing more will be produced: say so at once rather than let it wait.
    DropSession(identity, "attached after the last epoch",
                Bye{ByeReason::kFinished, "the producer has delivered every epoch"});
  }
}

bool Producer::Impl::Flooding(Session& s, uint64_t now) {
  // What a consumer needs per second: an ack per batch it was given (at most the ring's worth
  // outstanding, plus what it was given this second) and a heartbeat per interval. Allowing
  // several times that keeps a busy consumer far from the limit; a peer sending thousands of
  // messages a second is not reading batches.
  if (s.rate.count == 0 || now - s.rate.start_ns >= 1'000'000'000) s.received_at_rate = s.received;
  const uint64_t needed = (s.received - s.received_at_rate) + table.num_slots + 1000 / opts.heartbeat_ms;
  return s.rate.Add(now) > 4 * needed + 100;
}

void Producer::Impl::HandleMessage(const std::string& identity, const uint8_t* data, size_t size, bool remote) {
  auto it = sessions.find(identity);
  const uint64_t now = MonotonicNs();
  if (it != sessions.end()) {
    it->second.last_heard_ns = now;
    if (Flooding(it->second, now)) {
      ++rejected_messages;
      DropSession(identity, "flooded the producer with messages",
                  Bye{ByeReason::kRejected, "more than " + std::to_string(it->second.rate.count - 1) +
                                                " messages in one second: far more than a consumer needs"});
      return;
    }
  } else {
    // Peers without a session (status queries, stragglers of dropped consumers, garbage) get
    // a bounded share of the loop each: beyond it they are neither answered nor logged.
    if (now - strangers_since_ns >= 1'000'000'000) {
      stranger_rates.clear();
      strangers_since_ns = now;
    }
    if (stranger_rates[identity].Add(now) > kStrangerMessagesPerSecond) {
      ++rejected_messages;
      return;
    }
  }
  Result<Message> decoded = Decode(data, size);
  if (!decoded.ok()) {
    ++rejected_messages;
    auto version = PeekVersion(data, size);
    if (version.ok() && *version != kProtocolVersion) {
      // A consumer built for another protocol version: tell it in a Reject it can read the
      // header of, then forget it.
      Send(identity, Reject{RejectCode::kVersion, decoded.status().message()});
    }
    // A stream of garbage is logged in samples, not line for line.
    if (rejected_messages <= 20 || rejected_messages % 1000 == 0)
      std::fprintf(stderr, "[coloader %s] rejected a message (%llu so far): %s\n", opts.name.c_str(),
                   static_cast<unsigned long long>(rejected_messages), decoded.status().message().c_str());
    if (it != sessions.end()) {
      DropSession(identity, "broke the protocol", Bye{ByeReason::kRejected, decoded.status().message()});
    }
    return;
  }
  Message& m = *decoded;
  if (auto* hello = std::get_if<Hello>(&m)) {
    HandleHello(identity, *hello, remote);
  } else if (std::holds_alternative<StatusRequest>(m)) {
    Send(identity, MakeStatus());
  } else if (it == sessions.end()) {
    // Heartbeats and acks from a consumer we dropped are expected stragglers; anything else
    // from a stranger is counted.
    if (!std::holds_alternative<Heartbeat>(m) && !std::holds_alternative<Ack>(m) &&
        !std::holds_alternative<Bye>(m))
      ++rejected_messages;
  } else if (auto* ack = std::get_if<Ack>(&m)) {
    if (ring.Release(it->second.id, ack->seq)) {
      ++it->second.acked;
      it->second.acked_upto = std::max(it->second.acked_upto, ack->seq + 1);
    } else {
      ++rejected_messages;
      DropSession(identity, "acked a batch it did not hold",
                  Bye{ByeReason::kRejected, "ack for batch " + std::to_string(ack->seq) + " that you do not hold"});
    }
  } else if (auto* attach = std::get_if<Attach>(&m)) {
    if (!it->second.pending) {
      ++rejected_messages;
      DropSession(identity, "sent Attach twice", Bye{ByeReason::kRejected, "unexpected Attach"});
    } else {
      it->second.pending = false;
      it->second.device = attach->device != 0;
      std::fprintf(stderr, "[coloader %s] consumer %llu reads the %s path%s\n", opts.name.c_str(),
                   static_cast<unsigned long long>(it->second.id), it->second.device ? "device" : "host",
                   it->second.device ? (" (cuda:" + std::to_string(device_rings[it->second.ring]->device()) + ")").c_str() : "");
    }
  } else if (std::holds_alternative<Heartbeat>(m)) {
    // last_heard_ns is already updated
  } else if (std::holds_alternative<Bye>(m)) {
    DropSession(identity, "left", std::nullopt);
  } else {
    ++rejected_messages;
    DropSession(identity, "sent a message only a producer sends",
                Bye{ByeReason::kRejected, std::string("unexpected ") + MessageTypeName(m)});
  }
}

void Producer::Impl::SubmitWork() {
  if (!started) {
    if (ActiveSessions() < opts.min_consumers) return;
    started = true;
    start_ns = rate_mark_ns = MonotonicNs();
    if (!external) epoch_indices = sampler->EpochIndices(0);
  }
  if (external) {
    // The caller fills the slots: grant it every free one, take back what it returns.
    for (uint32_t slot : external->TakeReturned()) {
      ring.Abandon(slot);
      --next_submit_seq;  // granted, never filled
    }
    if (external->finished()) {
      all_submitted = true;
      return;
    }
    while (WithinWindow()) {
      std::optional<uint32_t> slot = ring.Acquire();
      if (!slot) break;
      external->Grant(*slot);
      ++next_submit_seq;  // counts as on its way until the caller's batch is published
    }
    return;
  }
  // Keep the workers fed while there is a free slot; each batch is published in order later.
  while (!all_submitted && fatal.ok() && WithinWindow()) {
    std::optional<uint32_t> slot = ring.Acquire();
    if (!slot) break;
    // The slot's previous uploads may still be reading its staging area.
    Status idle;
    for (auto& r : device_rings)
      if (idle.ok()) idle = r->WaitIdle(*slot);
    if (!idle.ok()) {
      fatal = idle;
      ring.Abandon(*slot);
      break;
    }
    auto job = std::make_unique<BatchJob>();
    job->seq = next_submit_seq++;
    job->slot = *slot;
    job->epoch = epoch;
    job->first = position;
    const uint64_t count = std::min<uint64_t>(opts.batch_size, epoch_indices.size() - position);
    job->indices.assign(epoch_indices.begin() + static_cast<std::ptrdiff_t>(position),
                        epoch_indices.begin() + static_cast<std::ptrdiff_t>(position + count));
    job->slot_base = shm.data() + uint64_t{*slot} * table.slot_bytes;
    position += count;
    job->last_in_epoch = position == epoch_indices.size();
    pipeline->Submit(std::move(job));
    if (position == epoch_indices.size()) {
      ++epoch;
      position = 0;
      if (epoch >= EpochsWanted()) {
        all_submitted = true;
      } else {
        epoch_indices = sampler->EpochIndices(epoch);
      }
    }
  }
}

void Producer::Impl::PublishReady() {
  for (auto& job : external ? external->TakeCompleted() : pipeline->TakeCompleted())
    done.emplace(job->seq, std::move(job));
  // Publish strictly in sequence order, and only when someone is there to take it: a batch
  // with no consumer at all waits in its slot (back-pressure) instead of being thrown away.
  while (!done.empty() && done.begin()->first == next_publish_seq && ActiveSessions() > 0) {
    std::unique_ptr<BatchJob> job = std::move(done.begin()->second);
    done.erase(done.begin());
    ++next_publish_seq;

    if (!job->fatal.ok()) {
      if (fatal.ok()) fatal = job->fatal;
      ring.Abandon(job->slot);
      return;
    }
    uint32_t count = static_cast<uint32_t>(job->indices.size());
    if (!job->failures.empty()) {
      std::sort(job->failures.begin(), job->failures.end());
      for (const auto& [pos, reason] : job->failures) {
        ++bad_events;
        const int64_t index = job->indices[pos];
        const bool first_time = bad_indices.insert(index).second;
        if (opts.on_bad_file == OnBadFile::kFail) {
          if (fatal.ok()) fatal = Status::Invalid(reason + " (stopping: --on-bad-file fail)");
        } else if (first_time) {
          std::fprintf(stderr, "[coloader %s] skipped bad file: %s\n", opts.name.c_str(), reason.c_str());
        }
      }
      if (!fatal.ok()) {
        ring.Abandon(job->slot);
        return;
      }
      count = pipeline ? pipeline->Compact(*job) : count;
    }

    if (!device_rings.empty()) {
      // One upload per GPU that has a consumer now; a host copy if anyone reads the host path.
      std::vector<bool> in_use(device_rings.size(), false);
      bool host_readers = false;
      for (const auto& [id, s] : sessions) {
        if (s.pending) continue;
        if (s.device) in_use[s.ring] = true;
        else host_readers = true;
      }
      if (host_readers) in_use[0] = true;  // the host copy comes down from the first ring
      Status st;
      for (size_t i = 0; i < device_rings.size() && st.ok(); ++i)
        if (in_use[i])
          st = device_rings[i]->Upload(job->slot, count, pipeline ? pipeline->DeviceStaging(job->slot) : nullptr,
                                       pipeline ? pipeline->DecodeDevice() : -1);
      if (st.ok() && host_readers) st = device_rings[0]->DownloadToHost(job->slot, count);
      if (!st.ok()) {
        fatal = st;
        ring.Abandon(job->slot);
        return;
      }
    }

    BatchAnnouncement a;
    a.seq = job->seq;
    a.slot = job->slot;
    a.epoch = job->epoch;
    a.first = job->first;
    a.count = count;
    a.flags = job->last_in_epoch ? kBatchLastInEpoch : 0;
    a.ready_ns = MonotonicNs();
    std::vector<uint64_t> holders;
    std::vector<std::string> stuck;
    for (auto& [identity, s] : sessions) {
      if (s.pending) continue;
      if (s.waiting_for_epoch) {
        if (job->first != 0) continue;
        s.waiting_for_epoch = false;  // joins at this epoch's start
      }
      if (s.mailbox >= 0 && !mailboxes.at(static_cast<uint32_t>(s.mailbox)).Push(a)) {
        stuck.push_back(identity);  // more outstanding than the window allows: not ours to fix
        continue;
      }
      holders.push_back(s.id);
      if (s.received++ == 0) s.first_seq = job->seq;
      if (s.remote) SendWithPayload(s, a);
      else if (s.mailbox < 0) SendToSession(s, a);
    }
    ring.Publish(job->slot, job->seq, holders);
    for (const std::string& identity : stuck)
      DropSession(identity, "let its mailbox fill up", Bye{ByeReason::kRejected, "mailbox overflow"});
    ++batches_published;
    samples_published += count;
    published_epoch = job->epoch;
    published_position = job->first + job->indices.size();
  }
}

void Producer::Impl::CheckLiveness(uint64_t now) {
  std::vector<std::pair<std::string, const char*>> dead;
  for (auto& [identity, s] : sessions) {
    if (s.watch.valid() && s.watch.Exited()) {
      dead.emplace_back(identity, "exited");
    } else if (now - s.last_heard_ns > uint64_t{opts.heartbeat_timeout_ms} * 1000000) {
      dead.emplace_back(identity, "went silent (heartbeat timeout)");
    } else if (now - s.last_sent_ns > uint64_t{opts.heartbeat_ms} * 1000000) {
      SendToSession(s, Heartbeat{});
    }
  }
  for (auto& [identity, why] : dead) {
    const bool silent = why[0] == 'w';
    DropSession(identity, why,
                silent ? std::optional<Bye>(Bye{ByeReason::kDetached,
                                                "no heartbeat for " + std::to_string(opts.heartbeat_timeout_ms) +
                                                    " ms; you were detached and your slots reclaimed"})
                       : std::nullopt);
  }
}

StatusReply Producer::Impl::MakeStatus() const {
  StatusReply r;
  r.name = opts.name;
  r.pid = static_cast<uint32_t>(::getpid());
  const bool produced_all = all_submitted && done.empty() && InFlight() == 0;
  r.state = stop_requested ? 3 : !started ? 0 : !produced_all ? 1 : ring.in_use() > 0 ? 4 : 2;
  r.epoch = published_epoch;
  r.position = published_position;
  r.epoch_samples = epoch_samples();
  r.batches_published = batches_published;
  r.samples_published = samples_published;
  r.batches_per_s = rate_batches;
  r.images_per_s = rate_images;
  r.cpu_seconds = ProcessCpuSeconds();
  r.uptime_seconds = start_ns ? static_cast<double>(MonotonicNs() - start_ns) * 1e-9 : 0.0;
  r.num_slots = ring.num_slots();
  r.slots_in_use = ring.in_use();
  r.bad_files = bad_indices.size();
  r.rejected_messages = rejected_messages;
  r.dropped_clients = dropped_clients;
  for (const auto& [identity, s] : sessions) {
    ConsumerStatus c;
    c.id = s.id;
    c.pid = s.pid;
    c.batch_size = s.batch_size;
    c.received = s.received;
    c.acked = s.acked;
    c.held = ring.HeldBy(s.id);
    auto oldest = ring.OldestHeldBy(s.id);
    c.lag = oldest ? next_publish_seq - *oldest : 0;
    c.name = s.name;
    c.path = s.device ? static_cast<uint8_t>(1 + device_rings[s.ring]->device()) : 0;
    r.consumers.push_back(std::move(c));
  }
  return r;
}

void Producer::Impl::ReportProgress(uint64_t now, bool final_line) {
  const double dt = static_cast<double>(now - rate_mark_ns) * 1e-9;
  if (final_line && start_ns > 0) {
    // The closing line reports the whole run, not its last moments.
    const double run = static_cast<double>(now - start_ns) * 1e-9;
    rate_batches = run > 0 ? static_cast<double>(batches_published) / run : 0;
    rate_images = run > 0 ? static_cast<double>(samples_published) / run : 0;
  } else if (dt >= 1.0) {
    rate_batches = dt > 0 ? static_cast<double>(batches_published - rate_mark_batches) / dt : 0;
    rate_images = dt > 0 ? static_cast<double>(samples_published - rate_mark_samples) / dt : 0;
    rate_mark_ns = now;
    rate_mark_batches = batches_published;
    rate_mark_samples = samples_published;
  }
  if (opts.progress_interval_ms <= 0) return;
  // On a terminal the line is redrawn every interval; in a log, one line every 10 intervals.
  const uint64_t interval = uint64_t(opts.progress_interval_ms) * 1000000 * (progress_tty ? 1 : 10);
  if (!final_line && now - last_progress_ns < interval) return;
  last_progress_ns = now;
  uint64_t slowest = 0;
  for (const auto& [id, s] : sessions) {
    auto oldest = ring.OldestHeldBy(s.id);
    if (oldest) slowest = std::max<uint64_t>(slowest, next_publish_seq - *oldest);
  }
  const double pct = epoch_samples() ? 100.0 * static_cast<double>(published_position) / static_cast<double>(epoch_samples()) : 0.0;
  std::fprintf(stderr,
               "%s[coloader %s] %s epoch %llu %5.1f%% | %6.1f batches/s %8.0f images/s | consumers %zu | "
               "slowest lag %llu | slots %u/%u | bad files %zu%s",
               progress_tty && !final_line ? "\r" : "", opts.name.c_str(),
               started ? "" : "waiting for consumers |", static_cast<unsigned long long>(published_epoch), pct,
               rate_batches, rate_images, sessions.size(), static_cast<unsigned long long>(slowest),
               ring.in_use(), ring.num_slots(), bad_indices.size(), progress_tty && !final_line ? "   " : "\n");
  std::fflush(stderr);
}

Status Producer::Impl::Loop() {
  last_progress_ns = MonotonicNs();
  rate_mark_ns = last_progress_ns;
  for (;;) {
    SubmitWork();
    PublishReady();
    if (!fatal.ok()) {
      Shutdown(ByeReason::kStopping, fatal.message());
      return fatal;
    }
    if (all_submitted && done.empty() && InFlight() == 0 && ring.in_use() == 0) {
      ReportProgress(MonotonicNs(), true);
      Shutdown(ByeReason::kFinished, "the producer has delivered every epoch");
      return Status::OK();
    }
    if (stop_requested.load()) {
      ReportProgress(MonotonicNs(), true);
      Shutdown(ByeReason::kStopping, "the producer was asked to stop");
      return Status::Cancelled("stopped by signal");
    }

    std::vector<zmq::pollitem_t> items = {
        {router.handle(), 0, ZMQ_POLLIN, 0},
        {nullptr, SourceFd(), ZMQ_POLLIN, 0},
        {nullptr, stop_fd, ZMQ_POLLIN, 0},
    };
    for (const auto& [id, s] : sessions)
      if (s.watch.valid()) items.push_back({nullptr, s.watch.fd(), ZMQ_POLLIN, 0});
    if (zap) items.push_back({zap->socket().handle(), 0, ZMQ_POLLIN, 0});
    const long timeout_ms = std::min<long>(opts.heartbeat_ms, 250);
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return Status::IOError(std::string("poll: ") + e.what());
    }
    // Drain the socket: each message is [routing id][payload].
    for (int budget = 0; budget < 10000; ++budget) {
      zmq::message_t identity, payload;
      if (!router.recv(identity, zmq::recv_flags::dontwait)) break;
      if (!identity.more()) continue;
      (void)router.recv(payload, zmq::recv_flags::none);
      bool extra = payload.more();
      while (extra) {  // frames beyond the one we expect: swallow them and count the message
        zmq::message_t junk;
        (void)router.recv(junk, zmq::recv_flags::none);
        extra = junk.more();
        if (!extra) ++rejected_messages;
      }
      // Only tcp:// peers passed the ZAP handler, which gave them a user id.
      const char* user = zmq_msg_gets(payload.handle(), "User-Id");
      HandleMessage(identity.to_string(), payload.data<uint8_t>(), payload.size(), user && *user);
    }
    if (zap) zap->HandlePending();
    const uint64_t now = MonotonicNs();
    CheckLiveness(now);
    ReportProgress(now, false);
  }
}

void Producer::Impl::Shutdown(ByeReason reason, const std::string& message) {
  if (external) external->Stop();  // a caller blocked in Publish learns that it is over
  for (auto& [identity, s] : sessions) Send(identity, Bye{reason, message});
  // Give the goodbyes a moment to leave: consumers mapped the ring and keep reading what they
  // hold after we unlink it, so only the messages need to get out.
  router.set(zmq::sockopt::linger, 1000);
  sessions.clear();
}

Status Producer::Run() { return impl_->Loop(); }

}  // namespace coloader
