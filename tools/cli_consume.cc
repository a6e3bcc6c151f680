// The reference consumer: iterates epochs through the client library and reports what it
// saw, computed from the dataset indices carried with every batch. Tests and users check a
// producer's semantics with it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

#include "client/consumer.h"
#include "common/process.h"
#include "toolbox/json.h"
#include "tools/cli.h"

namespace coloader::cli {

namespace {

constexpr const char* kConsumeSynopsis = "coloader consume --name NAME | --endpoint EP [options]";

uint64_t Fnv1a(const uint8_t* p, uint64_t n, uint64_t h) {
  for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// What `consume` prints about its reading (the flags that are not ConsumerOptions fields).
struct ConsumeFlags {
  uint64_t epochs = 0;  // 0: until the producer finishes
  bool json = false, checksum = false, list_indices = false;
  int step_ms = 0;
};

// What one epoch held, from the indices (and with --checksum the pixels) of its batches.
struct EpochTally {
  explicit EpochTally(uint64_t dataset_size) : seen(dataset_size, 0) {}
  std::vector<uint8_t> seen;
  std::vector<uint64_t> indices;  // with --indices: every sample's dataset index, in order
  uint64_t batches = 0, samples = 0, unique = 0, index_sum = 0, index_xor = 0, content = 0;
  std::vector<double> handoff_us, queued_next_us;
  // The longest this consumer waited for data (the epoch's first batch included): what a
  // stalled peer or producer costs it. The fault stress test bounds it by the timeout.
  uint64_t max_wait_ns = 0;
  double seconds = 0;

  void Count(const Batch& b, const uint8_t* pixels, const ConsumeFlags& f) {
    ++batches;
    samples += b.size();
    const uint64_t sample_bytes = b.bytes() / std::max<uint32_t>(1, b.size());
    for (uint32_t i = 0; i < b.size(); ++i) {
      const auto idx = static_cast<uint64_t>(b.indices()[i]);
      index_sum += idx;
      index_xor ^= idx;
      if (f.list_indices) indices.push_back(idx);
      if (idx < seen.size() && !seen[idx]) {
        seen[idx] = 1;
        ++unique;
      }
      if (f.checksum) {
        // Order-independent: a sum over samples of a hash of (index, label, pixels), so
        // consumers with different batch sizes can be compared sample for sample.
        const uint8_t* px = pixels + i * sample_bytes;
        uint64_t h = Fnv1a(reinterpret_cast<const uint8_t*>(&b.indices()[i]), 8, 1469598103934665603ull);
        h = Fnv1a(reinterpret_cast<const uint8_t*>(&b.labels()[i]), 8, h);
        content += Fnv1a(px, sample_bytes, h);
      }
    }
  }
};

// Reads the epoch NextEpoch() began into `t`.
Status ReadEpoch(Consumer& c, const ConsumeFlags& f, uint64_t epoch_asked_ns, EpochTally& t) {
  std::vector<uint8_t> host_copy;
  t.max_wait_ns = MonotonicNs() - epoch_asked_ns;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const uint64_t asked_ns = MonotonicNs();
    COLOADER_ASSIGN_OR_RETURN(std::optional<Batch> next, c.Next());
    if (!next) break;
    const uint64_t got_ns = MonotonicNs();
    t.max_wait_ns = std::max(t.max_wait_ns, got_ns - asked_ns);
    Batch& b = *next;
    // Hand-off latency counts only batches that became ready while we were waiting;
    // the others sat in our queue because we were busy, which measures us, not the transport.
    if (b.ready_ns() >= asked_ns) {
      t.handoff_us.push_back(static_cast<double>(got_ns - b.ready_ns()) * 1e-3);
    } else {
      // Already announced when asked: the cost of Next() itself (slicing, mapping, the
      // device path's stream wait), without the transport.
      t.queued_next_us.push_back(static_cast<double>(got_ns - asked_ns) * 1e-3);
    }
    const uint8_t* pixels = static_cast<const uint8_t*>(b.data());
    if (f.checksum && !c.slots().fields.empty())
      return Status::Invalid("--checksum hashes an image producer's tensors; this producer's batches are the fields "
                             "of a coloader.Producer: leave --checksum out");
    if (f.checksum && b.device() >= 0) {  // hash what the GPU holds, byte for byte
      host_copy.resize(b.bytes());
      COLOADER_RETURN_NOT_OK(b.CopyTo(host_copy.data()));
      pixels = host_copy.data();
    }
    t.Count(b, pixels, f);
    if (f.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f.step_ms));
  }
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

// One line per epoch: a JSON object with --json, else a sentence.
void ReportEpoch(const Consumer& c, const ConsumerOptions& o, const ConsumeFlags& f, const EpochTally& t) {
  const double images_per_s = t.seconds > 0 ? static_cast<double>(t.samples) / t.seconds : 0.0;
  if (f.json) {
    JsonWriter w;
    w.BeginObject()
        .Field("epoch", c.epoch())
        .Field("partial", c.partial())
        .Field("batches", t.batches)
        .Field("samples", t.samples)
        .Field("unique_samples", t.unique)
        .Field("index_sum", t.index_sum)
        .Field("index_xor", t.index_xor)
        .Field("images_per_s", images_per_s)
        .Field("expected_batches", c.size())
        .Field("handoff_p50_us", Percentile(t.handoff_us, 0.5))
        .Field("handoff_p99_us", Percentile(t.handoff_us, 0.99))
        .Field("handoff_samples", static_cast<uint64_t>(t.handoff_us.size()))
        .Field("queued_next_p50_us", Percentile(t.queued_next_us, 0.5))
        .Field("max_wait_ms", static_cast<double>(t.max_wait_ns) * 1e-6)
        .Field("path", c.on_device() ? "device" : "host");
    // Why an epoch joined mid-way is the rest only (the producer does not catch this one up).
    if (c.partial() && !c.producer().no_catch_up.empty()) w.Field("no_catch_up", c.producer().no_catch_up);
    if (f.checksum) w.Field("content_hash", t.content);
    if (!o.group.empty()) {
      w.Field("group", o.group)
          .Field("rank", static_cast<uint64_t>(o.rank))
          .Field("world_size", static_cast<uint64_t>(o.world_size))
          .Field("split_begin", c.split_begin())
          .Field("split_origin", c.split_origin());
    }
    if (f.list_indices) {
      w.BeginArray("indices");
      for (uint64_t idx : t.indices) w.Value(idx);
      w.EndArray();
    }
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("epoch %llu%s: %llu batches, %llu samples (%llu unique), %.0f images/s\n",
                static_cast<unsigned long long>(c.epoch()), c.partial() ? " (partial)" : "",
                static_cast<unsigned long long>(t.batches), static_cast<unsigned long long>(t.samples),
                static_cast<unsigned long long>(t.unique), images_per_s);
  }
  std::fflush(stdout);
}

void AddConsumeFlags(Command& cmd, ConsumerOptions& o, ConsumeFlags& f) {
  cmd.Add("--name", &o.name, "the producer's name (coloader serve --name)")->type_name("NAME");
  cmd.Add("--endpoint", &o.endpoint, "or its ZeroMQ endpoint (tcp://HOST:PORT for a producer elsewhere)")
      ->type_name("EP");
  cmd.Add("--batch-size", &o.batch_size, "this consumer's batch size (0: the producer's)");
  cmd.Add("--epochs", &f.epochs, "stop after this many epochs (0: when the producer finishes)");
  cmd.Add("--drop-last", &o.drop_last, "drop each epoch's last batch if it is short");
  cmd.Add("--wait-for-epoch", &o.wait_for_epoch, "join at the next epoch boundary, not mid-epoch");
  cmd.Add("--device", &o.device, "batches in the producer's GPU memory where it has a device ring");
  cmd.Add("--zero-copy", &o.zero_copy,
          "read the producer's memory itself (read-only on the host) instead of this consumer's own copy");
  cmd.Add("--json", &f.json, "one JSON object per epoch");
  cmd.Add("--checksum", &f.checksum, "add an order-independent hash of every sample's index, label and pixels");
  cmd.Add("--step-ms", &f.step_ms, "sleep this long per batch (a slow training step)")->check(AtLeast(0));
  cmd.Add("--timeout-ms", &o.timeout_ms, "give up on a batch after this long (0: wait while the producer lives)")
      ->check(AtLeast(0));
  cmd.Add("--connect-timeout-ms", &o.connect_timeout_ms, "the handshake's deadline")->check(AtLeast(1));
  cmd.Add("--wait-ms", &o.wait_for_producer_ms,
          "wait this long for a producer that is not running yet (default 60000; 0: fail at once)")
      ->check(AtLeast(0));
  cmd.Add("--group", &o.group, "the consumer group (the ranks of one data-parallel job share this name)")
      ->type_name("G");
  cmd.Add("--rank", &o.rank, "this member's rank in the group (with --group)");
  cmd.Add("--world-size", &o.world_size, "the group's size (with --group)");
  cmd.Add("--node-rank", &o.node_rank, "this node's index (checked against the producer's --rank)");
  cmd.Add("--num-nodes", &o.num_nodes, "the number of nodes (checked against the producer's --world-size)");
  cmd.Add("--indices", &f.list_indices, "with --json: list every sample's dataset index, in order");
  cmd.Add("--curve-key", &o.curve_key_file, "this consumer's key pair, for a tcp:// producer (coloader keygen)")
      ->type_name("FILE");
  cmd.Add("--server-key", &o.curve_server_key, "the producer's public key (Z85 text or its .pub file)")
      ->type_name("KEY|FILE");
}

}  // namespace

int Consume(const std::vector<std::string>& args) {
  ConsumerOptions o;
  ConsumeFlags f;
  Command cmd("consume", kConsumeSynopsis,
              "The reference consumer: iterates epochs from a producer and reports what it saw (batches, samples, "
              "the dataset indices' sum and xor), so a producer's semantics can be checked.");
  AddConsumeFlags(cmd, o, f);
  if (std::optional<int> exit = cmd.Parse(args)) return *exit;
  if (o.name.empty() && o.endpoint.empty()) return cmd.UsageError("--name (or --endpoint) is required");
  if (o.group.empty() && (cmd.Given("--rank") || cmd.Given("--world-size")))
    return cmd.UsageError("--rank and --world-size need --group NAME (the name all ranks of the job share)");
  if (!o.group.empty() && o.rank >= o.world_size)
    return cmd.UsageError("--rank " + std::to_string(o.rank) + " is outside --world-size " + std::to_string(o.world_size));
  o.client_name = o.group.empty() ? "coloader consume"
                                   : "coloader consume (" + o.group + " rank " + std::to_string(o.rank) + ")";
  auto consumer = Consumer::Connect(o);
  if (!consumer.ok()) {
    std::fprintf(stderr, "coloader consume: %s\n", consumer.status().message().c_str());
    return 1;
  }
  Consumer& c = **consumer;
  if (o.device && !c.on_device()) {
    std::fprintf(stderr, "coloader consume: using the host path: %s\n", c.fallback_reason().c_str());
  }
  for (uint64_t done = 0; f.epochs == 0 || done < f.epochs; ++done) {
    const uint64_t epoch_asked_ns = MonotonicNs();
    Result<bool> more = c.NextEpoch();
    if (!more.ok()) {
      std::fprintf(stderr, "coloader consume: %s\n", more.status().message().c_str());
      return 1;
    }
    if (!*more) break;
    EpochTally tally(c.producer().dataset_size);
    if (Status st = ReadEpoch(c, f, epoch_asked_ns, tally); !st.ok()) {
      std::fprintf(stderr, "coloader consume: %s\n", st.message().c_str());
      return 1;
    }
    ReportEpoch(c, o, f, tally);
  }
  return 0;
}

}  // namespace coloader::cli
