#include "producer/producer.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/curve.h"
#include "common/log.h"
#include "producer/dataset_source.h"
#include "producer/external_source.h"
#include "producer/producer_internal.h"
#include "producer/slot_layout.h"

namespace coloader {

namespace {

// Test hook: COLOADER_TEST_CRASH_AT=<point> makes the producer SIGKILL itself at that point of
// start-up (lock, ring, mailboxes, bind), leaving exactly what a crash there leaves, so that
// tests/shm/startup_kill_test.py can check that the next start reclaims it. Read nowhere else.
void CrashPointForTest(const char* point) {
  static const char* at = std::getenv("COLOADER_TEST_CRASH_AT");
  if (at != nullptr && std::strcmp(at, point) == 0) {
    LogLine("[coloader] test hook: SIGKILL at start-up point '%s'\n", point);
    ::raise(SIGKILL);
  }
}

}  // namespace

Producer::Producer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Producer::~Producer() {
  if (!impl_) return;
  impl_->source.reset();  // join its workers before the memory they write goes
  // Last to first: the first ring pinned the host memory and unregisters it before it is unmapped.
  while (!impl_->device_rings.empty()) impl_->device_rings.pop_back();
  impl_->router.Close();
  // Only a producer that holds the name removes what is under it: one that failed to take the
  // lock must not touch the running producer's socket.
  if (impl_->lock) {
    if (!impl_->shm.name().empty()) SharedMemory::Remove(impl_->shm.name());
    if (!impl_->mailboxes.name().empty()) SharedMemory::Remove(impl_->mailboxes.name());
    ::unlink(impl_->paths.socket.c_str());
    impl_->lock->Release();
  }
}

const std::string& Producer::endpoint() const { return impl_->paths.endpoint; }
const std::string& Producer::tcp_endpoint() const { return impl_->tcp_bound; }
ExternalSource* Producer::external_source() const { return dynamic_cast<ExternalSource*>(impl_->source.get()); }

void Producer::Stop(const char* why) {
  impl_->stop_why.store(why);
  impl_->stop_requested.store(true);
  impl_->stop_fd.Signal();  // async-signal-safe
}

namespace {
// A caller's schema, checked once where it is stated (each batch is then held to it): within
// what the wire protocol carries, and a slot of batch_size samples within what a ring may take.
Status CheckSchema(const ExternalOptions& o, uint32_t batch_size) {
  if (o.fields.empty() || o.fields.size() > kMaxFields)
    return Status::Invalid("a batch has 1 to " + std::to_string(kMaxFields) + " tensors, got " + std::to_string(o.fields.size()));
  if (o.structure.size() > kMaxStructureBytes)
    return Status::Invalid("the batch's structure takes " + std::to_string(o.structure.size()) + " bytes (at most " +
                           std::to_string(kMaxStructureBytes) + "): fewer or shorter keys");
  constexpr uint64_t kMaxSlotData = uint64_t{1} << 40;
  uint64_t sample = 0;
  for (const FieldSpec& f : o.fields) {
    const std::string name = f.path.empty() ? "the batch" : "field " + f.path;
    if (f.path.size() > kMaxStringBytes) return Status::Invalid(name.substr(0, 80) + "...: a path of at most 4096 bytes");
    if (f.dtype > kLastDType) return Status::Invalid(name + ": unknown dtype code " + std::to_string(static_cast<int>(f.dtype)));
    if (f.shape.size() > kMaxFieldDims)
      return Status::Invalid(name + " has " + std::to_string(f.shape.size()) + " dimensions per sample (at most " +
                             std::to_string(kMaxFieldDims) + "): reshape it in collate_fn");
    uint64_t bytes = DTypeSize(f.dtype);
    for (int64_t d : f.shape) {
      if (d < 1 || static_cast<uint64_t>(d) > kMaxSlotData / bytes)
        return Status::Invalid(name + ": a sample dimension of " + std::to_string(d) + " (each must be at least 1, "
                               "and a sample at most 1 TiB)");
      bytes *= static_cast<uint64_t>(d);
    }
    sample += bytes;
    if (sample > kMaxSlotData / batch_size)
      return Status::Invalid("a batch of " + std::to_string(batch_size) + " samples of " + HumanBytes(sample) +
                             " or more exceeds 1 TiB: a smaller batch_size");
  }
  return Status::OK();
}
}  // namespace

Result<std::unique_ptr<Producer>> Producer::Make(ProducerOptions opts) {
  if (opts.batch_size < 1 || opts.batch_size > 65536)
    return Status::Invalid("--batch-size must be between 1 and 65536, got " + std::to_string(opts.batch_size));
  if (opts.window < 2 || opts.window > 1024)
    return Status::Invalid("--window must be between 2 and 1024 slots, got " + std::to_string(opts.window));
  if (opts.spare_slots < 0) opts.spare_slots = static_cast<int>(std::max(1u, opts.window / 2));
  if (opts.spare_slots > 1024)
    return Status::Invalid("--spare-slots must be between 0 and 1024, got " + std::to_string(opts.spare_slots));
  if (!opts.forever && opts.epochs == 0)
    return Status::Invalid("--epochs must be at least 1 (or use --forever)");
  if (opts.min_consumers < 1)
    return Status::Invalid("--min-consumers must be at least 1");
  // In 64 bits: 2 * 2147483648 wrapped to 0 in 32 and passed, detaching healthy consumers.
  constexpr uint32_t kHour = 3'600'000;
  if (opts.heartbeat_ms < 10 || opts.heartbeat_ms > kHour)
    return Status::Invalid("--heartbeat-ms must be between 10 and 3600000 (an hour), got " +
                           std::to_string(opts.heartbeat_ms));
  if (opts.heartbeat_timeout_ms > 2 * kHour)
    return Status::Invalid("--heartbeat-timeout-ms must be at most 7200000 (two hours), got " +
                           std::to_string(opts.heartbeat_timeout_ms));
  if (uint64_t{opts.heartbeat_timeout_ms} < 2 * uint64_t{opts.heartbeat_ms})
    return Status::Invalid("--heartbeat-timeout-ms must be at least twice --heartbeat-ms (got " +
                           std::to_string(opts.heartbeat_timeout_ms) + " and " +
                           std::to_string(opts.heartbeat_ms) + ")");
  if (opts.external) {
    COLOADER_RETURN_NOT_OK(CheckSchema(*opts.external, opts.batch_size));
  } else {
    const DatasetOptions& d = opts.dataset;
    if (d.decode == DecodeMode::kGpu && opts.batch_size > kMaxGpuDecodeBatch)
      return Status::Invalid("--decode gpu takes --batch-size up to " + std::to_string(kMaxGpuDecodeBatch) +
                             ", got " + std::to_string(opts.batch_size) + ": use a smaller batch or --decode cpu");
    if (d.gpu_lanes < 1 || d.gpu_lanes > 16)
      return Status::Invalid("--gpu-lanes must be between 1 and 16, got " + std::to_string(d.gpu_lanes));
    if (d.image_size < 8 || d.image_size > 4096)
      return Status::Invalid("--image-size must be between 8 and 4096, got " + std::to_string(d.image_size));
    if ((d.output == DType::kBFloat16 || d.output == DType::kFloat16) && opts.devices.empty())
      return Status::Invalid(std::string("--output ") + DTypeName(d.output) +
                             " is produced on the GPU: add --device cuda:N, or use uint8 or float32");
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
    if (keys) COLOADER_RETURN_NOT_OK(CurveAvailable());
  } else if (!opts.curve_key_file.empty() || !opts.authorized_keys_file.empty() || opts.insecure) {
    return Status::Invalid("--curve-key, --authorized-keys and --insecure apply to a --tcp endpoint; give one");
  }
  if (opts.dataset.workers <= 0) opts.dataset.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto impl = std::make_unique<Impl>();
  impl->opts = std::move(opts);
  Status st;
  try {
    st = impl->Setup();
  } catch (const std::exception& e) {  // a resource failure (memory, threads): cleaned up below
    st = Status::IOError("setting up producer '" + impl->opts.name + "': " + ResourceFailure(e));
  }
  if (!st.ok()) {
    // Whatever Setup made before it failed (a ring, the mailboxes) goes with the lock: a
    // failed start leaves nothing in /dev/shm or the run directory.
    Producer cleanup(std::move(impl));
    return st;
  }
  return std::unique_ptr<Producer>(new Producer(std::move(impl)));
}

void Producer::Impl::WarnOfALargeRing(uint64_t bytes) const {
  const uint64_t memory = MachineMemoryBytes();
  if (memory == 0) return;
  if (std::optional<std::string> w = LargeRingWarning(bytes, memory))
    LogLineAt(LogLevel::kWarning, "[coloader %s] warning: %s\n", opts.name.c_str(), w->c_str());
}

Status Producer::Impl::CheckClassNames() const {
  // Every consumer's Welcome carries them: they must fit it whole.
  const std::vector<std::string>& classes = source->classes();
  uint64_t bytes = 0;
  for (const std::string& c : classes) bytes += 2 + c.size();
  if (classes.size() <= kMaxClasses && bytes <= kMaxClassNameBytes) return Status::OK();
  return Status::Invalid(opts.dataset.data + " has " + std::to_string(classes.size()) + " class folders (" +
                         HumanBytes(bytes) + " of names); coloader tells every consumer their names, at most " +
                         std::to_string(kMaxClasses) + " and " + HumanBytes(kMaxClassNameBytes) +
                         ": give the labels as a file list (one path,label per line) instead");
}

Status Producer::Impl::Setup() {
  COLOADER_ASSIGN_OR_RETURN(paths, PathsFor(opts.name));
  COLOADER_RETURN_NOT_OK(MakeSource());
  COLOADER_RETURN_NOT_OK(CheckClassNames());
  data_key = ComputeDataKey();
  COLOADER_RETURN_NOT_OK(CheckStart());
  COLOADER_RETURN_NOT_OK(ClaimName());
  {
    // Every consumer costs a connection and a pidfd: a third of what the descriptors allow below
    // the guard's high mark, so that workers, files and the guard's room are never short.
    rlimit lim{};
    const bool limited = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY;
    const uint64_t limit = limited ? lim.rlim_cur : uint64_t{1} << 20;
    max_sessions = static_cast<uint32_t>(std::clamp<uint64_t>(DescriptorGuard::MarksFor(limit).high / 3, 16, 4096));
  }
  const SlotLayouts layouts = MakeSlotLayouts(opts, paths.shm_name);
  COLOADER_RETURN_NOT_OK(CreateRing(layouts));

  SourceRing r;
  r.table = table;
  r.staging = staging;
  r.base = shm.data();
  TransformOptions& to = r.transform;
  const Recipe recipe =
      opts.dataset.recipe ? *opts.dataset.recipe : NamedRecipe(opts.dataset.augment, opts.dataset.image_size);
  ApplyRecipe(recipe, &to);
  to.output = staging.dtype == DType::kUInt8 ? DType::kUInt8 : DType::kFloat32;
  to.layout = staging.layout == TensorLayout::kNHWC ? TensorLayout::kNHWC : TensorLayout::kNCHW;
  to.dct_scaling = opts.dataset.dct_scaling;
  to.crop_decode = opts.dataset.crop_decode;
  to.erase_on_device = !opts.devices.empty();
  to.pixel_ops_on_device = !opts.devices.empty();  // the pixel ops' GPU twins (pixel_ops_device.h)
  COLOADER_RETURN_NOT_OK(MakeDeviceRings(layouts, to.normalize, to.erase, !to.pixel_ops.empty()));
  r.gpu.name = opts.name;
  r.gpu.mode = opts.dataset.decode;
  COLOADER_RETURN_NOT_OK(CheckRecipeFits(recipe));
  r.gpu.devices = opts.devices;
  r.gpu.stage.num_slots = table.num_slots;
  r.gpu.stage.batch_size = table.batch_size;
  r.gpu.stage.augment = to.augment;
  r.gpu.stage.lanes = opts.dataset.gpu_lanes;
  r.gpu.cpu_share = opts.dataset.cpu_share;
  COLOADER_RETURN_NOT_OK(source->Attach(r));
  COLOADER_ASSIGN_OR_RETURN(stop_fd, EventFd::Make());
  COLOADER_RETURN_NOT_OK(Bind());
  progress_tty = ::isatty(STDERR_FILENO);
  return Status::OK();
}

Status Producer::Impl::CheckRecipeFits(const Recipe& recipe) const {
  if (opts.dataset.recipe) LogLine("[coloader %s] recipe: %s\n", opts.name.c_str(), recipe.Describe().c_str());
  if (recipe.erase.p > 0 && opts.dataset.output == DType::kUInt8)
    return Status::Invalid("RandomErasing writes its value in the normalised tensor's units: it needs a float --output "
                           "(float32, bfloat16, float16), not uint8");
  return Status::OK();
}

Status Producer::Impl::MakeSource() {
  if (opts.external) {
    COLOADER_ASSIGN_OR_RETURN(source, ExternalSource::Make(opts.external->fields, opts.external->epoch_samples));
  } else {
    COLOADER_ASSIGN_OR_RETURN(source, DatasetSource::Open(opts));
  }
  return Status::OK();
}

Status Producer::Impl::ClaimName() {
  // Claim the name before touching the socket or ring, so a second producer of the same
  // name fails cleanly instead of stealing them.
  COLOADER_ASSIGN_OR_RETURN(NameLock l, NameLock::Acquire(paths.lock));
  lock.emplace(std::move(l));
  CrashPointForTest("lock");
  // We hold the name, so whoever made anything still under it is dead: take it back (before
  // measuring /dev/shm, where a crashed ring still takes room).
  if (std::vector<std::string> gone = RemoveProducerLeftovers(paths); !gone.empty()) {
    std::string list;
    for (const std::string& g : gone) list += (list.empty() ? "" : ", ") + g;
    const uint32_t prev = lock->previous_pid();
    LogLine("[coloader %s] reclaimed what a dead producer of this name%s left: %s\n", opts.name.c_str(),
            prev ? (" (pid " + std::to_string(prev) + ")").c_str() : "", list.c_str());
  }
  return Status::OK();
}

Status Producer::Impl::CreateRing(const SlotLayouts& layouts) {
  // A /dev/shm too small for the ring is said now, in one message with the ways out; the
  // reservation below makes sure it is never found later as a SIGBUS.
  const bool device = !opts.devices.empty();
  table = layouts.table;
  staging = layouts.staging;
  host_tensors = HostTensorReservation(layouts, device);
  auto too_small = [&]() -> Status {
    ShmSpace space;
    if (auto s = QueryShmSpace(); s.ok()) space = *s;
    return Status::IOError(ShmTooSmallMessage(opts, space));
  };
  if (auto space = QueryShmSpace(); space.ok() && space->free_bytes < ShmBytesAtStart(opts)) return too_small();
  WarnOfALargeRing(ShmBytesAtStart(opts));
  bool no_space = false;
  auto created = SharedMemory::Create(paths.shm_name, table.slot_bytes * table.num_slots,
                                      StartReservation(layouts, device), &no_space);
  if (!created.ok()) return no_space ? too_small() : created.status();
  shm = std::move(*created);
  CrashPointForTest("ring");
  ring = RingAccounting(table.num_slots);
  auto boxes = MailboxArea::Create(paths.mailbox_shm_name, kMailboxes, MailboxCapacity(table.num_slots), &no_space);
  if (!boxes.ok()) return no_space ? too_small() : boxes.status();
  mailboxes = std::move(*boxes);
  mailbox_used.assign(kMailboxes, false);
  CrashPointForTest("mailboxes");
  return Status::OK();
}

Status Producer::Impl::MakeDeviceRings(const SlotLayouts& layouts, const NormalizeParams& normalize,
                                       const EraseOptions& erase, bool pixel_ops) {
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
    d.normalize = normalize;
    d.erase = erase;
    d.pixel_ops = pixel_ops;
    d.fields = table.fields;
    d.host_base = shm.data();
    d.host_bytes = shm.size();
    d.host_pinned = StartReservation(layouts, true);  // pinning faults pages in: only reserved ones
    d.host_slot_bytes = table.slot_bytes;
    d.host_labels_offset = table.labels_offset;
    d.host_staging_offset = staging.data_offset;
    d.host_output_offset = table.data_offset;
    COLOADER_ASSIGN_OR_RETURN(std::unique_ptr<DeviceRing> r, DeviceRing::Make(d));
    device_rings.push_back(std::move(r));
  }
  return Status::OK();
}

Status Producer::Impl::Bind() {
  COLOADER_ASSIGN_OR_RETURN(router, Socket::Open(ctx, zmq::socket_type::router));
  COLOADER_RETURN_NOT_OK(router.Set(zmq::sockopt::linger, 0));
  COLOADER_RETURN_NOT_OK(router.Set(zmq::sockopt::router_mandatory, 1));
  COLOADER_RETURN_NOT_OK(router.Set(zmq::sockopt::sndhwm, 100000));
  COLOADER_RETURN_NOT_OK(router.Set(zmq::sockopt::maxmsgsize, kMaxInboundMessageBytes));  // on the tcp:// endpoint too
  COLOADER_RETURN_NOT_OK(router.Bind(paths.endpoint));
  ::chmod(paths.socket.c_str(), 0600);
  CrashPointForTest("bind");
  if (!opts.tcp_endpoint.empty()) COLOADER_RETURN_NOT_OK(BindTcp());
  return Status::OK();
}

Status Producer::Impl::ReserveHostTensors() {
  if (host_tensors.empty()) return Status::OK();
  bool no_space = false;
  Status st = shm.Reserve(host_tensors, &no_space);
  if (!st.ok()) {
    if (!no_space) return st;
    ShmSpace space;
    if (auto s = QueryShmSpace(); s.ok()) space = *s;
    return Status::IOError(std::string(kShmDir) + " has " + HumanBytes(space.free_bytes) +
                           " free, and the host copy of this GPU ring for host-path consumers needs " +
                           HumanBytes(TotalBytes(host_tensors)) + " (" + std::to_string(table.num_slots) + " slots x " +
                           HumanBytes(TotalBytes(host_tensors) / table.num_slots) +
                           "): read the device path (a consumer on this GPU, --device), or give " + kShmDir +
                           " more room (docker run --shm-size, a Kubernetes emptyDir with medium: Memory)");
  }
  LogLine("[coloader %s] reserved %s of %s for host-path consumers\n", opts.name.c_str(),
               HumanBytes(TotalBytes(host_tensors)).c_str(), kShmDir);
  host_tensors.clear();  // reserved for good
  return Status::OK();
}

Result<Producer::RunEnd> Producer::Impl::Loop() {
  last_progress_ns = MonotonicNs();
  rate_mark_ns = last_progress_ns;
  for (;;) {
    SubmitWork();
    PublishReady();
    SubmitCatchUp(/*first_only=*/false);  // a consumer PublishReady moved on to its own batches
    if (!fatal.ok()) {
      Shutdown(ByeReason::kStopping, fatal.message());
      return fatal;
    }
    if (AllSubmitted() && done.empty() && done_private.empty() && InFlight() == 0 && !source->failure().ok()) {
      // The caller's data failed: what it published is out, and the consumers hear why the
      // stream ends here (their epoch is cut), not that it was delivered.
      ReportProgress(MonotonicNs(), true);
      const Status failed = source->failure();
      LogLineAt(LogLevel::kError, "[coloader %s] stopped: %s\n", opts.name.c_str(), failed.message().c_str());
      Shutdown(ByeReason::kStopping, failed.message());
      return failed;
    }
    // The shared stream is published whole: each consumer owed nothing hears it now (a loop
    // keeps its last batch bound while it asks for another epoch), one still catching up when
    // it is through.
    if (all_submitted && done.empty() && next_publish_seq == next_submit_seq && source->failure().ok()) AnnounceEnd();
    if (AllSubmitted() && done.empty() && done_private.empty() && InFlight() == 0) {
      AnnounceEnd();
      ReclaimAtEnd();
      if (ring.in_use() == 0) {
        ReportProgress(MonotonicNs(), true);
        Shutdown(ByeReason::kFinished, "the producer has delivered every epoch");
        return RunEnd::kDelivered;
      }
    }
    if (stop_requested.load()) {
      ReportProgress(MonotonicNs(), true);
      if (AllSubmitted() && done.empty() && done_private.empty() && InFlight() == 0 && source->failure().ok()) {
        // Stopped while consumers still held batches of a run that was published whole: each
        // was told the stream is complete (End), so this is a delivered run, not a cut one.
        Shutdown(ByeReason::kFinished, "the producer has delivered every epoch");
        return RunEnd::kDelivered;
      }
      Shutdown(ByeReason::kStopping, std::string("the producer was asked to stop (") + stop_why.load() + ")");
      return Status::Cancelled("stopped by signal");
    }

    std::vector<zmq::pollitem_t> items = {
        {router.handle(), 0, ZMQ_POLLIN, 0},
        {nullptr, source->event_fd(), ZMQ_POLLIN, 0},
        {nullptr, stop_fd.fd(), ZMQ_POLLIN, 0},
    };
    for (const auto& [id, s] : sessions)
      if (s.watch.valid() && s.exited_ns == 0) items.push_back({nullptr, s.watch.fd(), ZMQ_POLLIN, 0});
    if (zap) items.push_back({zap->socket().handle(), 0, ZMQ_POLLIN, 0});
    if (descriptor_guard) items.push_back({descriptor_guard->monitor(), 0, ZMQ_POLLIN, 0});
    const long timeout_ms = std::min<long>(opts.heartbeat_ms, 250);
    COLOADER_RETURN_NOT_OK(Poll(items, std::chrono::milliseconds(timeout_ms)).status());
    COLOADER_RETURN_NOT_OK(ReadMessages());
    if (zap) COLOADER_RETURN_NOT_OK(zap->HandlePending());
    if (descriptor_guard) COLOADER_RETURN_NOT_OK(descriptor_guard->Check(router));
    const uint64_t now = MonotonicNs();
    CheckLiveness(now);
    NoteReads(now);
    LagCatchUp(now);
    DetachStalled(now);
    TrimAfterChurn();
    ReportProgress(now, false);
    if (std::optional<std::string> alone = AloneTooLong(now)) {
      LogLineAt(LogLevel::kWarning, "[coloader %s] %s\n", opts.name.c_str(), alone->c_str());
      source->Stop(Status::OK());  // no error: a caller's next publish hears the run is over
      Shutdown(ByeReason::kFinished, *alone);
      return RunEnd::kConsumersLeft;
    }
  }
}

std::optional<std::string> Producer::Impl::AloneTooLong(uint64_t now) {
  if (opts.alone_timeout_ms == 0 || !started) return std::nullopt;
  if (!sessions.empty()) {  // attached, or still shaking hands
    alone_since_ns = 0;
    return std::nullopt;
  }
  if (alone_since_ns == 0) alone_since_ns = now;
  if (now - alone_since_ns < uint64_t{opts.alone_timeout_ms} * 1'000'000) return std::nullopt;
  return std::string("every consumer left and none came back for " + SecondsText(opts.alone_timeout_ms) +
                       ": the run ends early, " +
                       std::to_string(batches_published) + " batch(es) (" + std::to_string(samples_published) +
                       " samples) published" +
                       (batches_published ? ", the last in epoch " + std::to_string(published_epoch) : ""));
}

// Drains the socket: each message is [routing id][payload].
Status Producer::Impl::ReadMessages() {
  for (int budget = 0; budget < 10000; ++budget) {
    zmq::message_t identity, payload;
    COLOADER_ASSIGN_OR_RETURN(bool got, router.Recv(&identity, zmq::recv_flags::dontwait));
    if (!got) break;
    if (!identity.more()) continue;
    // A message's frames arrive together: the rest are there to read.
    COLOADER_RETURN_NOT_OK(router.Recv(&payload, zmq::recv_flags::none).status());
    bool extra = payload.more();
    while (extra) {  // frames beyond the one we expect: swallow them and count the message
      zmq::message_t junk;
      COLOADER_RETURN_NOT_OK(router.Recv(&junk, zmq::recv_flags::none).status());
      extra = junk.more();
      if (!extra) ++rejected_messages;
    }
    // Only tcp:// peers passed the ZAP handler, which gave them a user id.
    const char* user = zmq_msg_gets(payload.handle(), "User-Id");
    HandleMessage(identity.to_string(), payload.data<uint8_t>(), payload.size(), user && *user);
  }
  return Status::OK();
}

void Producer::Impl::Shutdown(ByeReason reason, const std::string& message) {
  if (source) source->Stop(Status::Disconnected("the producer stopped"));  // a caller blocked in Publish hears it
  for (auto& [identity, s] : sessions) Send(identity, Bye{reason, message});
  // Give the goodbyes a moment to leave: consumers mapped the ring and keep reading what they
  // hold after we unlink it, so only the messages need to get out.
  if (router.is_open()) (void)router.Set(zmq::sockopt::linger, 1000);
  sessions.clear();
}

Result<Producer::RunEnd> Producer::Run() {
  Result<RunEnd> end = Status::Internal("the loop did not run");
  try {
    end = impl_->Loop();
  } catch (const std::exception& e) {  // a resource failure: the caller still destroys (cleans up) us
    impl_->Shutdown(ByeReason::kStopping, std::string("the producer failed: ") + ResourceFailure(e));
    end = Status::IOError("producer '" + impl_->opts.name + "': " + ResourceFailure(e));
  }
  // However the loop ended (a socket error returns without Shutdown), a caller waiting on the
  // source hears it; the first reason given stays.
  if (!end.ok()) impl_->source->Stop(Status::Disconnected("the producer stopped: " + end.status().message()));
  return end;
}

}  // namespace coloader
