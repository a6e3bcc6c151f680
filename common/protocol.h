// The wire protocol between a producer (ZeroMQ ROUTER) and its consumers (DEALER).
//
// Every message is one ZeroMQ frame: an 8-byte header (magic "CLDR", version, type) and a
// fixed, little-endian body. The decoder checks every length and enum and rejects trailing
// bytes, so a malformed frame is an error value, never a crash or an over-read.
//
// Conversation:
//   consumer -> Hello                    (protocol version, pid, batch size, flags; its consumer
//                                         group and rank, its node, what a resumed state expects)
//   producer -> Welcome | Reject         (slot table once: shared memory name and layout)
//   consumer -> Attach                   (when it starts reading: which path it reads; until then
//                                         it gets no batches, counts for nothing and holds no one
//                                         back, so a refused resume state or an idle Loader
//                                         changes nothing)
//   producer -> Batch ...                (one small announcement per producer batch)
//   consumer -> Ack ...                  (one per Batch, when the consumer no longer reads it)
//   producer -> Reclaim                  (the ring is full of batches this consumer read past and
//                                         keeps: copy what you keep and ack)
//   producer -> End                      (every epoch is published: nothing more will come)
//   both     -> Heartbeat                (when idle; a missing peer is detected by timeout)
//   either   -> Bye                      (producer finished / stopping / detached you / your group
//                                         broke; consumer leaving, or a group member finished)
//   status tool -> StatusRequest, producer -> StatusReply
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace coloader {

inline constexpr uint32_t kProtocolMagic = 0x52444c43;  // "CLDR" read as little-endian
// Bump it with every change to a message's body, so that mismatched builds get a Reject
// naming the versions rather than "truncated" or "trailing bytes". 2: StatusReply gained
// dropped_clients. 3: consumer groups and topology (Hello, Welcome, ConsumerStatus, Bye's
// kGroupBroken). 4: every consumer attaches (Attach), End, Reclaim, ConsumerStatus's unread
// and idle_ms, the PID namespace and start time of each side (Hello, Welcome). 5: a caller-fed
// producer's schema (Welcome's fields and structure), the dtypes beyond the image pipeline's.
// 6: StatusReply's decode (the CPU's share of each batch beside the JPEG engines). 8: catch-up
// (Batch's kBatchMadeWhole, Welcome's no_catch_up, Attach's flags). 9: a resumed state the
// producer serves (Attach's kAttachResume and resume range).
inline constexpr uint16_t kProtocolVersion = 10;
inline constexpr size_t kHeaderBytes = 8;
inline constexpr size_t kMaxStringBytes = 4096;
inline constexpr size_t kMaxStatusConsumers = 4096;
// The largest message a producer accepts: a Hello with every string at kMaxStringBytes is
// ~17 KiB. libzmq drops a peer that sends more (ZMQ_MAXMSGSIZE), so a flood can pin at most
// the receive high-water mark times this per peer, not gigabytes.
inline constexpr int64_t kMaxInboundMessageBytes = 64 * 1024;
// What a consumer accepts on a local (ipc://) connection: a StatusReply listing
// kMaxStatusConsumers consumers with names of kMaxStringBytes is under 40 MiB. Over tcp:// a
// batch travels as its payload, a slot's bytes (at most kMaxRingBytes / 1 slot, bounded here).
inline constexpr int64_t kMaxLocalReplyBytes = 64ll << 20;
inline constexpr int64_t kMaxRemoteBatchBytes = 16ll << 30;
inline constexpr uint32_t kMaxGroupSize = 65536;

enum class MessageType : uint16_t {
  kHello = 1,
  kWelcome = 2,
  kReject = 3,
  kBatch = 4,
  kAck = 5,
  kHeartbeat = 6,
  kBye = 7,
  kStatusRequest = 8,
  kStatusReply = 9,
  kAttach = 10,
  kEnd = 11,
  kReclaim = 12,
};

// Element type and layout of a tensor as it lies in a slot. The image pipeline produces the
// first four; a caller-fed producer's fields (FieldSpec) may have any of them.
enum class DType : uint8_t {
  kUInt8 = 0, kFloat32 = 1, kBFloat16 = 2, kFloat16 = 3,
  kBool = 4, kInt8 = 5, kInt16 = 6, kInt32 = 7, kInt64 = 8, kFloat64 = 9, kComplex64 = 10,
};
inline constexpr DType kLastImageDType = DType::kFloat16;
inline constexpr DType kLastDType = DType::kComplex64;
enum class TensorLayout : uint8_t { kNHWC = 0, kNCHW = 1 };
const char* DTypeName(DType t);
const char* TensorLayoutName(TensorLayout l);
size_t DTypeSize(DType t);

// One tensor of a caller-fed producer's batches (coloader.Producer): the batch is a structure
// (a tensor, or nested tuples, lists and dicts of them) whose leaves are these fields, every
// one with the batch's samples along its first dimension. The structure itself travels as
// text (SlotTable::structure) that only the bindings read; the producer checks each batch
// against the fields before it is published.
inline constexpr size_t kMaxFields = 256;
inline constexpr size_t kMaxFieldDims = 8;
// At most this many class names in a Welcome (ImageNet-21k has 21,841), of at most this many
// bytes in all: a Welcome stays well within what a consumer takes (kMaxLocalReplyBytes).
inline constexpr uint32_t kMaxClasses = 1u << 20;
inline constexpr uint64_t kMaxClassNameBytes = 16ull << 20;
inline constexpr size_t kMaxStructureBytes = 1 << 20;
enum FieldFlags : uint8_t {
  // Also readable in host memory on the device path (Batch::host_field): small per-sample
  // facts the bindings need before they touch the device, such as the samples' shapes.
  kFieldOnHost = 1 << 0,
};
inline constexpr uint8_t kKnownFieldFlags = kFieldOnHost;
struct FieldSpec {
  std::string path;            // where it sits, as its user writes it: ["input_ids"], [1]["mask"]
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;  // one sample's (empty: one scalar per sample); the most it holds
  uint8_t flags = 0;           // FieldFlags
  uint64_t sample_bytes() const;
};
// A batch of `capacity` samples holds its fields one after another (field-major), each in a
// region of capacity x sample bytes rounded up to 256: where each region begins, from the
// start of the batch's data, and how many bytes they take together. A slot is laid out so
// for the producer's batch size; a consumer's gathered batch so for its own.
std::vector<uint64_t> FieldOffsets(const std::vector<FieldSpec>& fields, uint64_t capacity);
uint64_t FieldsBytes(const std::vector<FieldSpec>& fields, uint64_t capacity);
// The same layout over the kFieldOnHost fields alone (the others take no room): the host copy
// of those fields that a batch gathered on the device keeps beside it.
std::vector<uint64_t> OnHostOffsets(const std::vector<FieldSpec>& fields, uint64_t capacity);
uint64_t OnHostBytes(const std::vector<FieldSpec>& fields, uint64_t capacity);

enum HelloFlags : uint8_t {
  kHelloWaitForEpoch = 1 << 0,  // start at the next epoch boundary, not mid-epoch
  kHelloDevice = 1 << 1,        // wants batches in the producer's GPU memory (CUDA IPC)
  kHelloExpectSeed = 1 << 2,    // expect_seed is set: refuse me if the producer's seed differs
};

struct Hello {
  uint32_t pid = 0;
  // Who `pid` is (common/process.h): its PID namespace and start time. The producer watches the
  // pid (pidfd) only when both match what it sees; else by heartbeat.
  uint64_t pid_ns = 0, start_time = 0;
  uint32_t batch_size = 0;  // the consumer's own batch size (for status; slicing is client-side)
  uint8_t flags = 0;
  std::string client_name;
  std::string device_uuid;  // with kHelloDevice: the GPU the consumer computes on (16 bytes)
  // Consumer group (common/split.h): the W ranks of one data-parallel job on this producer.
  // Empty group: a plain consumer. The producer serves a group only once all W are attached.
  std::string group;
  uint32_t rank = 0, world_size = 1;
  // Topology the consumer states (num_nodes 0: not stated, not checked): which node's share
  // of the global permutation it expects this producer to serve (its --rank/--world-size).
  int32_t node_rank = 0, num_nodes = 0;
  // What a resumed state expects (absent: not checked): the seed (with kHelloExpectSeed) and
  // the data key of the producer it was saved from.
  uint64_t expect_seed = 0;
  std::string expect_data_key;
};

// Where the ring lives and how a slot is laid out. Sent once, in Welcome.
struct SlotTable {
  std::string shm_name;     // POSIX shared memory object holding every slot
  uint32_t num_slots = 0;
  uint64_t slot_bytes = 0;  // stride between slots
  uint32_t batch_size = 0;  // the producer's batch size P (samples per full slot)
  uint64_t indices_offset = 0;  // within a slot: int64 dataset indices [P]
  uint64_t labels_offset = 0;   // within a slot: int64 labels [P]
  uint64_t data_offset = 0;     // within a slot: the tensor, P * sample_bytes
  uint32_t height = 0, width = 0, channels = 0;
  DType dtype = DType::kUInt8;
  TensorLayout layout = TensorLayout::kNHWC;
  // A caller-fed producer's schema: when `fields` is not empty, the data area holds them
  // (FieldOffsets) instead of one height x width x channels tensor, and labels are -1.
  std::vector<FieldSpec> fields;
  std::string structure;  // how the fields nest, for the bindings (coloader/_structure.py)
  uint64_t sample_bytes() const;
  // The data of a batch of `capacity` samples: the tensor, or every field's region.
  uint64_t data_bytes(uint64_t capacity) const;
  // Where the first `n` samples of a slot lie in its data area, as (offset, bytes): one range
  // of the tensor, or one per field. A remote batch's payload packs them one after another.
  std::vector<std::pair<uint64_t, uint64_t>> LeadingRanges(uint64_t n) const;
};

// The ring's GPU side, sent to consumers that asked for device delivery. One allocation
// holds every slot (one IPC handle); each slot has an interprocess event that the producer
// records after the slot's batch is complete on the GPU.
inline constexpr size_t kCudaIpcHandleBytes = 64;
struct DeviceTable {
  int32_t device = -1;            // the producer's CUDA device ordinal
  std::string device_uuid;        // 16 bytes: consumers match it against their own devices
  std::string mem_handle;         // cudaIpcMemHandle_t, 64 bytes
  std::vector<std::string> event_handles;  // cudaIpcEventHandle_t per slot, 64 bytes each
  uint64_t slot_bytes = 0;        // stride between device slots
  uint64_t labels_offset = 0;     // within a device slot: int64 labels [P]
  uint64_t data_offset = 0;       // within a device slot: the tensor
  DType dtype = DType::kFloat32;
  TensorLayout layout = TensorLayout::kNCHW;
};

struct Welcome {
  uint64_t consumer_id = 0;
  uint32_t producer_pid = 0;
  uint64_t producer_pid_ns = 0, producer_start_time = 0;  // as Hello's: who producer_pid is
  uint32_t heartbeat_ms = 0;          // how often each side speaks when idle
  uint32_t heartbeat_timeout_ms = 0;  // silence longer than this means the peer is gone
  uint64_t dataset_size = 0;
  uint64_t epoch_samples = 0;         // samples per epoch (nominal; bad files may reduce it)
  SlotTable slots;                    // host memory: indices, labels, and the host tensor
  bool has_device = false;            // device delivery: the tensor (and labels) on the GPU
  DeviceTable device;
  // Local consumers get announcements through a shared-memory mailbox (common/mailbox.h)
  // rather than as Batch messages; empty name: Batch messages.
  std::string mailbox_name;
  uint32_t mailbox_index = 0, mailbox_count = 0, mailbox_capacity = 0;
  // What the producer serves: its sampler's seed, a key of its data and settings (two
  // producers over the same files, labels and augmentation/output settings have the same
  // key), and its node shard (--rank of --world-size).
  uint64_t seed = 0;
  std::string data_key;
  int32_t node_rank = 0, num_nodes = 1;
  // The class names in label order (an ImageFolder's folders); empty when the producer has none
  // (a file list, shards, a caller-fed producer).
  std::vector<std::string> classes;
  // Why a consumer that joins mid-epoch gets only the rest of that epoch (empty: this producer
  // catches it up on the samples it missed; see kBatchMadeWhole).
  std::string no_catch_up;
};

// kMismatch: the consumer states a group, topology, seed or data key this producer does not
// serve (the reason names both sides).
enum class RejectCode : uint16_t { kVersion = 1, kBadHello = 2, kFull = 3, kMismatch = 4 };
struct Reject {
  RejectCode code = RejectCode::kBadHello;
  std::string reason;
};

enum BatchFlags : uint8_t {
  kBatchLastInEpoch = 1 << 0,
  // The consumer's epoch began past its start (it joined mid-epoch), and the producer will serve
  // it the samples it missed before this epoch's last batch: the epoch is whole, not partial.
  kBatchMadeWhole = 1 << 1,
};
// Batches the producer decodes again for one consumer alone (catch-up) are numbered apart from
// the shared stream's, whose numbers go up by one: their `seq` has this bit set.
inline constexpr uint64_t kPrivateSeq = 1ull << 63;
inline bool IsPrivateSeq(uint64_t seq) { return (seq & kPrivateSeq) != 0; }

struct BatchAnnouncement {
  uint64_t seq = 0;    // producer-wide batch number, increasing by one
  uint32_t slot = 0;
  uint64_t epoch = 0;
  uint64_t first = 0;  // position of the first sample within the epoch
  uint32_t count = 0;  // samples in this batch (0..P; fewer at the epoch's end or after skips)
  uint8_t flags = 0;
  uint64_t ready_ns = 0;  // CLOCK_MONOTONIC when the slot became ready (hand-off latency)
};

struct Ack {
  uint64_t seq = 0;
};

// The consumer starts reading. `device`: it mapped the device ring the Welcome offered (1),
// or reads host memory (0: none was offered, or it could not open the IPC handle).
enum AttachFlags : uint8_t {
  // It walks its epoch by positions (a group member, or a resumed state): serve it only the
  // shared stream, without catch-up (a resumed one knows what it has read).
  kAttachNoCatchUp = 1 << 0,
  // It resumes a saved state and is owed the rest of that epoch: positions [resume_from,
  // resume_to) of epoch resume_epoch, each taken modulo the epoch's samples (the rest of an
  // epoch that began at resume_to - epoch_samples, as a caught-up one does), decoded for it
  // alone; then the shared stream, caught up like a late joiner. An empty range: its saved
  // epoch was complete, and it joins at the start of resume_epoch.
  kAttachResume = 1 << 1,
};
struct Attach {
  uint8_t device = 0;
  uint8_t flags = 0;
  uint64_t resume_epoch = 0;
  uint64_t resume_from = 0, resume_to = 0;
};

// Every epoch is published: nothing more will come to this consumer, which may still read and
// hold what it was given. `epochs`: how many the producer served.
struct End {
  uint64_t epochs = 0;
};

// The ring has no free slot, and this consumer keeps batch `seq`, which it has read past: a
// consumer that can copy what it keeps (the default) does so and acks it; one that cannot
// (zero-copy) goes on holding it, and is detached if it holds the others back too long.
struct Reclaim {
  uint64_t seq = 0;
};

struct Heartbeat {};

enum class ByeReason : uint16_t {
  kFinished = 1,   // producer: every requested epoch was delivered; consumer: a group member
                   // leaving after its whole share of the epoch (the others read on)
  kStopping = 2,   // producer: asked to stop (SIGTERM/SIGINT)
  kDetached = 3,   // producer: you were too slow or silent and were detached
  kLeaving = 4,    // consumer: closing
  kRejected = 5,   // producer: your message broke the protocol
  kGroupBroken = 6,  // producer: another member of your group left; the group is over
};
const char* ByeReasonName(ByeReason r);
struct Bye {
  ByeReason reason = ByeReason::kLeaving;
  std::string message;
};

struct StatusRequest {};

struct ConsumerStatus {
  uint64_t id = 0;
  uint32_t pid = 0;
  uint32_t batch_size = 0;
  uint64_t received = 0;  // batches announced to it
  uint64_t acked = 0;     // batches it released
  uint64_t lag = 0;       // producer batches published since the oldest it still holds
  uint32_t held = 0;      // slots it holds now
  uint8_t path = 0;       // 0: host shared memory; 1 + N: the device ring on cuda:N
  std::string name;
  std::string group;      // empty: not in a group
  uint32_t rank = 0, world_size = 1;
  uint8_t waiting = 0;    // 1: attached, waiting for the rest of its group
  uint64_t unread = 0;    // batches announced to it that it has not taken yet
  uint64_t idle_ms = 0;   // since it last took a batch (or attached)
};

struct StatusReply {
  std::string name;
  uint32_t pid = 0;
  uint8_t state = 0;  // 0 waiting for consumers, 1 running, 2 finished, 3 stopping, 4 draining
  uint64_t epoch = 0;
  uint64_t position = 0;  // samples produced in the current epoch
  uint64_t epoch_samples = 0;
  uint64_t batches_published = 0;
  uint64_t samples_published = 0;
  double batches_per_s = 0, images_per_s = 0;
  double cpu_seconds = 0;    // producer process CPU time (user + system)
  double uptime_seconds = 0;
  uint32_t num_slots = 0, slots_in_use = 0;
  uint64_t bad_files = 0;
  uint64_t rejected_messages = 0;
  // Sessions the producer ended with Bye(kRejected): for a malformed message, an ack for a
  // batch not held, a second Hello or Attach, a producer's message, a flood of messages, or a
  // mailbox left to fill up. Leaving, exiting and heartbeat detaches are not counted.
  uint64_t dropped_clients = 0;
  // With GPU decoding: what the CPU workers decode of each batch now, and why ("" without).
  std::string decode;
  std::vector<ConsumerStatus> consumers;
};
const char* ProducerStateName(uint8_t state);

using Message = std::variant<Hello, Welcome, Reject, BatchAnnouncement, Ack, Heartbeat, Bye,
                             StatusRequest, StatusReply, Attach, End, Reclaim>;

std::vector<uint8_t> Encode(const Message& m);
// Any byte string in, a message or a kProtocolError naming what was wrong out.
Result<Message> Decode(const uint8_t* data, size_t size);
// Reads only the header: lets the producer tell "wrong version" from "garbage".
Result<uint16_t> PeekVersion(const uint8_t* data, size_t size);
const char* MessageTypeName(const Message& m);

}  // namespace coloader
