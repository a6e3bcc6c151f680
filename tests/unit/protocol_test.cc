// The wire codec: every message round-trips, and every truncation, extension and corruption
// of a valid frame is an error value (never a crash, never an over-read under ASan).
#include "common/protocol.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace coloader {
namespace {

Welcome WelcomeWithDevice(Welcome w) {
  w.has_device = true;
  w.device.device = 0;
  w.device.device_uuid = std::string(16, 'u');
  w.device.mem_handle = std::string(kCudaIpcHandleBytes, 'm');
  for (uint32_t i = 0; i < w.slots.num_slots; ++i) w.device.event_handles.push_back(std::string(kCudaIpcHandleBytes, 'e'));
  w.device.labels_offset = 0;
  w.device.data_offset = 2048;
  w.device.dtype = DType::kBFloat16;
  w.device.slot_bytes = 2048 + 256ull * 224 * 224 * 3 * 2;
  return w;
}

// A caller-fed producer's Welcome: a language-model batch of three fields.
Welcome SchemaWelcome(Welcome w) {
  w.slots.height = w.slots.width = w.slots.channels = 1;
  w.slots.dtype = DType::kUInt8;
  w.slots.fields = {FieldSpec{"[\"input_ids\"]", DType::kInt64, {128}},
                    FieldSpec{"[\"attention_mask\"]", DType::kBool, {128}},
                    FieldSpec{"[\"pixel\"]", DType::kComplex64, {1, 1, 1, 1, 2, 3, 4, 5}},
                    FieldSpec{"#shapes", DType::kInt32, {2}, kFieldOnHost}};
  w.slots.structure = R"({"dict": [["input_ids", 0], ["attention_mask", 1], ["pixel", 2]]})";
  w.slots.slot_bytes = w.slots.data_offset + FieldsBytes(w.slots.fields, w.slots.batch_size);
  return w;
}

Hello Member(uint32_t rank, uint32_t world_size, int32_t node_rank = 0, int32_t num_nodes = 0) {
  Hello h;
  h.group = "g";
  h.rank = rank;
  h.world_size = world_size;
  h.node_rank = node_rank;
  h.num_nodes = num_nodes;
  return h;
}

std::vector<Message> Samples() {
  Welcome w;
  w.consumer_id = 7;
  w.producer_pid = 1234;
  w.heartbeat_ms = 500;
  w.heartbeat_timeout_ms = 5000;
  w.dataset_size = 1281167;
  w.epoch_samples = 1281167;
  w.slots.shm_name = "coloader-0-1-imagenet";
  w.slots.num_slots = 8;
  w.slots.batch_size = 256;
  w.slots.indices_offset = 0;
  w.slots.labels_offset = 2048;
  w.slots.data_offset = 4096;
  w.slots.height = w.slots.width = 224;
  w.slots.channels = 3;
  w.slots.dtype = DType::kFloat32;
  w.slots.layout = TensorLayout::kNCHW;
  w.slots.slot_bytes = 4096 + 256ull * 224 * 224 * 3 * 4;
  w.mailbox_name = "coloader-0-1-imagenet.mbox";
  w.mailbox_index = 3;
  w.mailbox_count = 256;
  w.mailbox_capacity = 16;
  w.seed = 17;
  w.data_key = "9f3a2b4c5d6e7f80";
  w.classes = {"n01440764", "n01443537", "n01484850"};
  w.no_catch_up = "the producer was started with --no-catch-up";
  w.node_rank = 1;
  w.num_nodes = 2;
  StatusReply r;
  r.name = "imagenet";
  r.pid = 99;
  r.state = 1;
  r.images_per_s = 1234.5;
  r.dropped_clients = 3;
  r.consumers.push_back({1, 100, 128, 50, 49, 1, 1, 0, "job-a", "", 0, 1, 0, 0, 12});
  r.consumers.push_back({2, 101, 96, 50, 47, 3, 3, 0, "job-b", "ddp-b", 1, 4, 1, 3, 61000});
  Hello member = Member(3, 4, 1, 2);
  member.pid = 4321;
  member.batch_size = 96;
  member.flags = kHelloExpectSeed;
  member.client_name = "rank 3";
  member.group = "ddp-b";
  member.expect_seed = 17;
  member.expect_data_key = "9f3a2b4c5d6e7f80";
  Hello plain;
  plain.pid = 4321;
  plain.batch_size = 128;
  plain.flags = kHelloWaitForEpoch | kHelloDevice;
  plain.client_name = "trainer";
  plain.device_uuid = std::string(16, 'g');
  return {plain,
          member,
          Bye{ByeReason::kGroupBroken, "rank 2 of group ddp-b left at epoch 3, batch 17"},
          w,
          Reject{RejectCode::kVersion, "version 3 is not supported"},
          BatchAnnouncement{42, 3, 1, 4096, 256, kBatchLastInEpoch, 123456789},
          Ack{42},
          Heartbeat{},
          Bye{ByeReason::kStopping, "asked to stop"},
          StatusRequest{},
          r,
          Attach{1},
          WelcomeWithDevice(w),
          End{90},
          Reclaim{41},
          SchemaWelcome(w),
          WelcomeWithDevice(SchemaWelcome(w)),
          Attach{0, kAttachNoCatchUp},
          BatchAnnouncement{kPrivateSeq | 7, 2, 0, 0, 256, kBatchLastInEpoch | kBatchMadeWhole, 987654321},
          Attach{1, kAttachResume, 3, 900, 1100}};
}

TEST(ProtocolTest, AnAttachWhoseResumeRangeContradictsItselfIsRejected) {
  for (const Attach& bad : {Attach{0, kAttachNoCatchUp | kAttachResume, 1, 0, 10}, Attach{0, 0, 1, 0, 10},
                            Attach{0, kAttachResume, 1, 10, 9}, Attach{0, 1 << 2}}) {
    auto bytes = Encode(bad);
    EXPECT_FALSE(Decode(bytes.data(), bytes.size()).ok()) << int{bad.flags} << " " << bad.resume_from;
  }
  auto good = Encode(Attach{0, kAttachResume, 2, 5, 5});  // an empty range: join at epoch 2's start
  EXPECT_TRUE(Decode(good.data(), good.size()).ok());
}

TEST(ProtocolTest, ASchemaTravelsWholeAndOneThatDoesNotFitItsSlotIsRejected) {
  const Welcome w = std::get<Welcome>(Samples()[15]);
  auto bytes = Encode(w);
  auto back = Decode(bytes.data(), bytes.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const SlotTable& t = std::get<Welcome>(*back).slots;
  ASSERT_EQ(t.fields.size(), 4u);
  EXPECT_EQ(t.fields[1].path, "[\"attention_mask\"]");
  EXPECT_EQ(t.fields[1].flags, 0);
  EXPECT_EQ(t.fields[3].flags, kFieldOnHost);
  EXPECT_EQ(t.fields[1].dtype, DType::kBool);
  EXPECT_EQ(t.fields[2].shape, (std::vector<int64_t>{1, 1, 1, 1, 2, 3, 4, 5}));  // kMaxFieldDims
  EXPECT_EQ(t.structure, w.slots.structure);
  EXPECT_EQ(t.sample_bytes(), 128u * 8 + 128 + 8u * 120 + 8);
  EXPECT_EQ(OnHostBytes(t.fields, 10), 256u);  // the flagged field alone: 10 samples of 8 bytes, rounded up
  EXPECT_EQ(OnHostOffsets(t.fields, 10), (std::vector<uint64_t>{0, 0, 0, 0}));

  auto rejected = [](Welcome bad) {
    auto b = Encode(bad);
    auto r = Decode(b.data(), b.size());
    return r.ok() ? std::string() : r.status().message();
  };
  Welcome small = w;
  small.slots.slot_bytes -= 1;  // one byte short of the last field's region
  EXPECT_NE(rejected(small).find("does not fit"), std::string::npos);
  Welcome unknown = w;
  unknown.slots.fields[0].dtype = static_cast<DType>(11);
  EXPECT_NE(rejected(unknown).find("unknown dtype"), std::string::npos);
  Welcome unknown_flags = w;
  unknown_flags.slots.fields[1].flags = 0x80;
  EXPECT_NE(rejected(unknown_flags).find("unknown flags"), std::string::npos);
  Welcome empty_dim = w;
  empty_dim.slots.fields[0].shape = {0};
  EXPECT_NE(rejected(empty_dim).find("bad shape"), std::string::npos);
  Welcome huge = w;  // dimensions whose product wraps 64 bits
  huge.slots.fields[0].shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_NE(rejected(huge).find("bad shape"), std::string::npos);
  Welcome device_small = std::get<Welcome>(Samples()[16]);
  device_small.device.slot_bytes = device_small.device.data_offset + 100;
  EXPECT_NE(rejected(device_small).find("does not fit"), std::string::npos);
}

TEST(ProtocolTest, EveryMessageRoundTrips) {
  for (const Message& m : Samples()) {
    std::vector<uint8_t> bytes = Encode(m);
    Result<Message> back = Decode(bytes.data(), bytes.size());
    ASSERT_TRUE(back.ok()) << MessageTypeName(m) << ": " << back.status().ToString();
    EXPECT_EQ(back->index(), m.index());
    EXPECT_EQ(Encode(*back), bytes) << MessageTypeName(m);
  }
}

TEST(ProtocolTest, FieldsSurvive) {
  auto bytes = Encode(BatchAnnouncement{42, 3, 1, 4096, 256, kBatchLastInEpoch, 123456789});
  auto m = Decode(bytes.data(), bytes.size());
  ASSERT_TRUE(m.ok());
  const auto& a = std::get<BatchAnnouncement>(*m);
  EXPECT_EQ(a.seq, 42u);
  EXPECT_EQ(a.slot, 3u);
  EXPECT_EQ(a.epoch, 1u);
  EXPECT_EQ(a.first, 4096u);
  EXPECT_EQ(a.count, 256u);
  EXPECT_EQ(a.flags, kBatchLastInEpoch);
  EXPECT_EQ(a.ready_ns, 123456789u);
}

TEST(ProtocolTest, GroupAndTopologyFieldsSurvive) {
  Hello h = Member(1, 2, 0, 1);
  h.group = "job-a";
  h.flags = kHelloExpectSeed;
  h.expect_seed = 99;
  h.expect_data_key = "abcdef";
  auto bytes = Encode(h);
  auto m = Decode(bytes.data(), bytes.size());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const auto& back = std::get<Hello>(*m);
  EXPECT_EQ(back.group, "job-a");
  EXPECT_EQ(back.rank, 1u);
  EXPECT_EQ(back.world_size, 2u);
  EXPECT_EQ(back.node_rank, 0);
  EXPECT_EQ(back.num_nodes, 1);
  EXPECT_EQ(back.expect_seed, 99u);
  EXPECT_EQ(back.expect_data_key, "abcdef");
  // A plain consumer's Hello: no group, one rank.
  auto plain = Decode(Encode(Hello{}).data(), Encode(Hello{}).size());
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(std::get<Hello>(*plain).group.empty());
  EXPECT_EQ(std::get<Hello>(*plain).world_size, 1u);
  auto wb = Encode(std::get<Welcome>(Samples()[3]));
  auto w = Decode(wb.data(), wb.size());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(std::get<Welcome>(*w).seed, 17u);
  EXPECT_EQ(std::get<Welcome>(*w).data_key, "9f3a2b4c5d6e7f80");
  EXPECT_EQ(std::get<Welcome>(*w).node_rank, 1);
  EXPECT_EQ(std::get<Welcome>(*w).num_nodes, 2);
  EXPECT_EQ(std::get<Welcome>(*w).classes, (std::vector<std::string>{"n01440764", "n01443537", "n01484850"}));
  auto bb = Encode(Bye{ByeReason::kGroupBroken, "rank 2 left"});
  auto b = Decode(bb.data(), bb.size());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(std::get<Bye>(*b).reason, ByeReason::kGroupBroken);
  EXPECT_STREQ(ByeReasonName(ByeReason::kGroupBroken), "group broken");
}

TEST(ProtocolTest, ImpossibleRanksAndNodesAreRejected) {
  // The producer indexes its group table by rank: the decoder bounds it first.
  for (Hello h : {Member(2, 2), Member(0, 0), Member(0, kMaxGroupSize + 1), Member(0, 1, 2, 2),
                  Member(0, 1, -1, 2), Member(0, 1, 0, -1)}) {
    auto bytes = Encode(h);
    auto m = Decode(bytes.data(), bytes.size());
    EXPECT_FALSE(m.ok()) << "rank " << h.rank << " of " << h.world_size << ", node " << h.node_rank << " of "
                         << h.num_nodes;
  }
  Welcome w = std::get<Welcome>(Samples()[3]);
  w.node_rank = 2;  // of 2
  auto bytes = Encode(w);
  EXPECT_NE(Decode(bytes.data(), bytes.size()).status().message().find("shard 2 of 2"), std::string::npos);
  // An unknown goodbye reason past the last one.
  auto bye = Encode(Bye{ByeReason::kGroupBroken, ""});
  bye[8] = 7;
  EXPECT_FALSE(Decode(bye.data(), bye.size()).ok());
}

TEST(ProtocolTest, EveryTruncationIsRejected) {
  for (const Message& m : Samples()) {
    std::vector<uint8_t> bytes = Encode(m);
    for (size_t n = 0; n < bytes.size(); ++n) {
      std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<long>(n));
      Result<Message> r = Decode(cut.data(), cut.size());
      EXPECT_FALSE(r.ok()) << MessageTypeName(m) << " cut to " << n << " bytes";
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
      }
    }
  }
}

TEST(ProtocolTest, TrailingBytesAreRejected) {
  for (const Message& m : Samples()) {
    std::vector<uint8_t> bytes = Encode(m);
    bytes.push_back(0);
    Result<Message> r = Decode(bytes.data(), bytes.size());
    ASSERT_FALSE(r.ok()) << MessageTypeName(m);
    EXPECT_NE(r.status().message().find("trailing"), std::string::npos);
  }
}

TEST(ProtocolTest, BadMagicVersionAndTypeAreNamed) {
  auto bytes = Encode(Ack{1});
  auto bad = bytes;
  bad[0] ^= 0xFF;
  EXPECT_NE(Decode(bad.data(), bad.size()).status().message().find("magic"), std::string::npos);
  bad = bytes;
  bad[4] = kProtocolVersion + 1;
  const std::string other = "version " + std::to_string(kProtocolVersion + 1);
  auto r = Decode(bad.data(), bad.size());
  EXPECT_NE(r.status().message().find(other), std::string::npos) << r.status().ToString();
  ASSERT_TRUE(PeekVersion(bad.data(), bad.size()).ok());
  EXPECT_EQ(*PeekVersion(bad.data(), bad.size()), kProtocolVersion + 1);
  bad = bytes;
  bad[6] = 200;
  EXPECT_NE(Decode(bad.data(), bad.size()).status().message().find("unknown message type"), std::string::npos);
}

// The wire format is pinned to the version: a fingerprint (FNV-1a) of every sample's encoding,
// version bytes left out. A change to any message body changes it: bump kProtocolVersion and
// record the new pair (when only the samples above changed, re-record at the same version).
TEST(ProtocolTest, TheWireFormatIsPinnedToTheProtocolVersion) {
  uint64_t h = 1469598103934665603ull;
  for (const Message& m : Samples()) {
    std::vector<uint8_t> bytes = Encode(m);
    bytes[4] = bytes[5] = 0;
    for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  }
  EXPECT_EQ(kProtocolVersion, 10) << "record this build's fingerprint for the new version: " << h;
  EXPECT_EQ(h, 4668887443755283212ull) << "the wire format changed without a new kProtocolVersion (it is "
                                       << kProtocolVersion << ")";
}

TEST(ProtocolTest, AClassCountTheWelcomeCannotHoldIsRefusedBeforeAllocating) {
  Welcome w = std::get<Welcome>(Samples()[3]);
  w.classes.clear();
  std::vector<uint8_t> bytes = Encode(w);
  // The count is the last field: claim a million names in a message that ends there.
  ASSERT_GE(bytes.size(), 4u);
  const uint32_t claimed = 1000000;
  std::memcpy(bytes.data() + bytes.size() - 4, &claimed, 4);
  Result<Message> r = Decode(bytes.data(), bytes.size());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1000000 class names in 0 bytes"), std::string::npos) << r.status().ToString();
}

TEST(ProtocolTest, InconsistentSlotTableIsRejected) {
  Welcome w = std::get<Welcome>(Samples()[3]);
  w.slots.slot_bytes = 100;  // smaller than the tensor it claims to hold
  auto bytes = Encode(w);
  auto r = Decode(bytes.data(), bytes.size());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("slot table"), std::string::npos);
}

TEST(ProtocolTest, RandomCorruptionNeverCrashes) {
  std::mt19937_64 rng(1);
  int accepted = 0;
  for (const Message& m : Samples()) {
    const std::vector<uint8_t> bytes = Encode(m);
    for (int trial = 0; trial < 2000; ++trial) {
      std::vector<uint8_t> b = bytes;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<uint8_t>(rng());
      Result<Message> r = Decode(b.data(), b.size());
      if (r.ok()) {
        ++accepted;  // a flip in a free-form field is still a valid message: it must re-encode
        auto again = Encode(*r);
        EXPECT_EQ(again.size(), b.size());
      }
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace coloader
