// Writes the seed corpus of protocol_fuzz: a few valid encodings of every message type, one
// file each, named after what they hold. Run it again when the protocol changes (the
// fuzz_regression_test checks that every seed still decodes):
//   build/tests/make_protocol_corpus tests/fuzz/corpus/protocol
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/protocol.h"

namespace coloader {
namespace {

SlotTable HostSlots() {
  SlotTable t;
  t.shm_name = "/coloader-1000-train-ring";
  t.num_slots = 4;
  t.batch_size = 8;
  t.height = t.width = 32;
  t.channels = 3;
  t.dtype = DType::kFloat32;
  t.layout = TensorLayout::kNCHW;
  t.indices_offset = 0;
  t.labels_offset = 64;
  t.data_offset = 128;
  t.slot_bytes = t.data_offset + t.batch_size * t.sample_bytes();
  return t;
}

Welcome HostWelcome() {
  Welcome w;
  w.consumer_id = 7;
  w.producer_pid = 4242;
  w.heartbeat_ms = 100;
  w.heartbeat_timeout_ms = 1500;
  w.dataset_size = 103;
  w.epoch_samples = 103;
  w.slots = HostSlots();
  w.classes = {"cat", "dog", "horse"};
  return w;
}

std::vector<std::pair<std::string, Message>> Samples() {
  std::vector<std::pair<std::string, Message>> s;
  Hello hello;
  hello.pid = 4321;
  hello.batch_size = 128;
  hello.flags = kHelloWaitForEpoch;
  hello.client_name = "trainer";
  s.push_back({"hello", hello});
  hello.flags = kHelloWaitForEpoch | kHelloDevice;
  hello.client_name = "";
  s.push_back({"hello-device", hello});
  Hello member;  // rank 1 of a 4-rank group on node 0 of 2, resuming a saved state
  member.pid = 4322;
  member.batch_size = 64;
  member.flags = kHelloExpectSeed;
  member.group = "job-a";
  member.rank = 1;
  member.world_size = 4;
  member.node_rank = 0;
  member.num_nodes = 2;
  member.expect_seed = 7;
  member.expect_data_key = "0123456789abcdef";
  s.push_back({"hello-group", member});

  s.push_back({"welcome-host", HostWelcome()});
  Welcome mailbox = HostWelcome();
  mailbox.mailbox_name = "/coloader-1000-train-mailbox";
  mailbox.mailbox_index = 1;
  mailbox.mailbox_count = 4;
  mailbox.mailbox_capacity = 8;
  s.push_back({"welcome-mailbox", mailbox});
  Welcome device = mailbox;
  device.has_device = true;
  device.device.device = 0;
  device.device.device_uuid = std::string(16, '\x5a');
  device.device.mem_handle = std::string(kCudaIpcHandleBytes, '\x01');
  device.device.event_handles.assign(device.slots.num_slots, std::string(kCudaIpcHandleBytes, '\x02'));
  device.device.labels_offset = 0;
  device.device.data_offset = 256;
  device.device.slot_bytes = 256 + device.slots.batch_size * device.slots.sample_bytes();
  s.push_back({"welcome-device", device});
  Welcome schema = mailbox;  // a caller-fed producer's: three fields and their structure
  schema.slots.height = schema.slots.width = schema.slots.channels = 1;
  schema.slots.dtype = DType::kUInt8;
  schema.slots.fields = {
      FieldSpec{"[\"input_ids\"]", DType::kInt64, {16}}, FieldSpec{"[\"attention_mask\"]", DType::kBool, {16}},
      FieldSpec{"[\"labels\"]", DType::kInt64, {}}, FieldSpec{"#shapes", DType::kInt32, {2}, kFieldOnHost}};
  schema.slots.structure = R"({"dict": [["input_ids", 0], ["attention_mask", 1], ["labels", 2]]})";
  schema.slots.slot_bytes = schema.slots.data_offset + FieldsBytes(schema.slots.fields, schema.slots.batch_size);
  s.push_back({"welcome-schema", schema});

  s.push_back({"reject-version", Reject{RejectCode::kVersion, "version 3 is not supported"}});
  s.push_back({"reject-full", Reject{RejectCode::kFull, "8 consumers already"}});
  s.push_back({"batch", BatchAnnouncement{42, 3, 1, 4096, 256, 0, 123456789}});
  s.push_back({"batch-last", BatchAnnouncement{43, 0, 1, 4352, 7, kBatchLastInEpoch, 123456790}});
  s.push_back({"ack", Ack{42}});
  s.push_back({"attach-host", Attach{0}});
  s.push_back({"attach-device", Attach{1}});
  s.push_back({"attach-no-catch-up", Attach{0, kAttachNoCatchUp}});
  s.push_back({"attach-resume", Attach{0, kAttachResume, 2, 300, 600}});
  s.push_back({"batch-caught-up",
               BatchAnnouncement{kPrivateSeq | 5, 2, 1, 0, 256, kBatchLastInEpoch | kBatchMadeWhole, 123456791}});
  s.push_back({"end", End{90}});
  s.push_back({"reclaim", Reclaim{41}});
  s.push_back({"heartbeat", Heartbeat{}});
  s.push_back({"bye-finished", Bye{ByeReason::kFinished, ""}});
  s.push_back({"bye-rejected", Bye{ByeReason::kRejected, "Ack for a batch never announced"}});
  s.push_back({"bye-group-broken", Bye{ByeReason::kGroupBroken, "rank 2 of group job-a left at epoch 3, batch 17"}});
  s.push_back({"status-request", StatusRequest{}});

  StatusReply idle;
  idle.name = "train";
  idle.pid = 4242;
  s.push_back({"status-reply-idle", idle});
  StatusReply busy = idle;
  busy.state = 1;
  busy.epoch = 2;
  busy.position = 512;
  busy.epoch_samples = 1000;
  busy.batches_published = 80;
  busy.samples_published = 20480;
  busy.batches_per_s = 12.5;
  busy.images_per_s = 3200;
  busy.cpu_seconds = 1.25;
  busy.uptime_seconds = 6.5;
  busy.dropped_clients = 2;
  busy.decode = "cpu 22% of each batch (--cpu-share auto: demand at 128% of the engines, cpu at most 48%)";
  busy.num_slots = 4;
  busy.slots_in_use = 2;
  busy.consumers.push_back({1, 100, 128, 50, 49, 1, 1, 0, "job-a", "", 0, 1, 0, 0, 12});
  busy.consumers.push_back({2, 101, 96, 50, 47, 3, 3, 1, "job-b", "", 0, 1, 0, 3, 61000});
  s.push_back({"status-reply-busy", busy});
  return s;
}

}  // namespace
}  // namespace coloader

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  for (const auto& [name, message] : coloader::Samples()) {
    const std::vector<uint8_t> bytes = coloader::Encode(message);
    if (!coloader::Decode(bytes.data(), bytes.size()).ok()) {
      std::fprintf(stderr, "%s: the sample does not decode (fix the sample)\n", name.c_str());
      return 1;
    }
    const std::string path = std::string(argv[1]) + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "%s: cannot write\n", path.c_str());
      return 1;
    }
  }
  return 0;
}
