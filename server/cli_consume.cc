// The reference consumer: iterates epochs through the client library and reports what it
// saw, computed from the dataset indices carried with every batch. Tests and users check a
// producer's semantics with it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "client/consumer.h"
#include "common/json.h"
#include "common/process.h"
#include "server/cli.h"

namespace coloader::cli {

namespace {

constexpr const char* kConsumeUsage =
    "coloader consume --name NAME | --endpoint EP [--batch-size B] [--epochs N] [--drop-last]\n"
    "                 [--wait-for-epoch] [--json] [--checksum] [--step-ms MS] [--timeout-ms MS] [--device]\n"
    "                 [--wait-ms MS (wait for the producer to start)]\n"
    "                 [--endpoint tcp://HOST:PORT --curve-key FILE --server-key KEY|FILE]";

uint64_t Fnv1a(const uint8_t* p, uint64_t n, uint64_t h) {
  for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int Consume(const std::vector<std::string>& args) {
  ConsumerOptions o;
  uint64_t epochs = 0;  // 0: until the producer finishes
  bool json = false, checksum = false, help = false;
  int step_ms = 0;
  Flags f("consume", kConsumeUsage);
  f.AddString("name", &o.name);
  f.AddString("endpoint", &o.endpoint);
  f.AddU32("batch-size", &o.batch_size);
  f.AddUInt("epochs", &epochs);
  f.AddBool("drop-last", &o.drop_last);
  f.AddBool("wait-for-epoch", &o.wait_for_epoch);
  f.AddBool("device", &o.device);
  f.AddBool("json", &json);
  f.AddBool("checksum", &checksum);
  f.AddInt("step-ms", &step_ms);
  f.AddInt("timeout-ms", &o.timeout_ms);
  f.AddInt("connect-timeout-ms", &o.connect_timeout_ms);
  f.AddInt("wait-ms", &o.wait_for_producer_ms);
  f.AddString("curve-key", &o.curve_key_file);
  f.AddString("server-key", &o.curve_server_key);
  f.AddBool("help", &help);
  Status st = f.Parse(args);
  if (help) {
    std::printf("usage: %s\n", kConsumeUsage);
    return 0;
  }
  if (st.ok() && o.name.empty() && o.endpoint.empty()) st = f.Error("--name (or --endpoint) is required");
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 2;
  }
  o.client_name = "coloader consume";
  auto consumer = Consumer::Connect(o);
  if (!consumer.ok()) {
    std::fprintf(stderr, "coloader consume: %s\n", consumer.status().message().c_str());
    return 1;
  }
  Consumer& c = **consumer;
  if (o.device && !c.on_device()) {
    std::fprintf(stderr, "coloader consume: using the host path: %s\n", c.fallback_reason().c_str());
  }
  std::vector<uint8_t> host_copy;
  const uint64_t dataset_size = c.welcome().dataset_size;
  uint64_t done_epochs = 0;
  while (epochs == 0 || done_epochs < epochs) {
    const uint64_t epoch_asked_ns = MonotonicNs();
    Result<bool> more = c.NextEpoch();
    if (!more.ok()) {
      std::fprintf(stderr, "coloader consume: %s\n", more.status().message().c_str());
      return 1;
    }
    if (!*more) break;
    std::vector<uint8_t> seen(dataset_size, 0);
    uint64_t batches = 0, samples = 0, unique = 0, index_sum = 0, index_xor = 0, content = 0;
    std::vector<double> handoff_us, queued_next_us;
    // The longest this consumer waited for data (the epoch's first batch included): what a
    // stalled peer or producer costs it. The fault stress test bounds it by the timeout.
    uint64_t max_wait_ns = MonotonicNs() - epoch_asked_ns;
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const uint64_t asked_ns = MonotonicNs();
      Result<std::optional<Batch>> next = c.Next();
      if (!next.ok()) {
        std::fprintf(stderr, "coloader consume: %s\n", next.status().message().c_str());
        return 1;
      }
      if (!*next) break;
      const uint64_t got_ns = MonotonicNs();
      max_wait_ns = std::max(max_wait_ns, got_ns - asked_ns);
      Batch& b = **next;
      // Hand-off latency counts only batches that became ready while we were waiting;
      // the others sat in our queue because we were busy, which measures us, not the transport.
      if (b.ready_ns() >= asked_ns) {
        handoff_us.push_back(static_cast<double>(got_ns - b.ready_ns()) * 1e-3);
      } else {
        // Already announced when asked: the cost of Next() itself (slicing, mapping, the
        // device path's stream wait), without the transport.
        queued_next_us.push_back(static_cast<double>(got_ns - asked_ns) * 1e-3);
      }
      ++batches;
      samples += b.size();
      const uint64_t sample_bytes = b.bytes() / std::max<uint32_t>(1, b.size());
      const uint8_t* pixels = static_cast<const uint8_t*>(b.data());
      if (checksum && b.device() >= 0) {  // hash what the GPU holds, byte for byte
        host_copy.resize(b.bytes());
        if (Status st = b.CopyTo(host_copy.data()); !st.ok()) {
          std::fprintf(stderr, "coloader consume: %s\n", st.message().c_str());
          return 1;
        }
        pixels = host_copy.data();
      }
      for (uint32_t i = 0; i < b.size(); ++i) {
        const auto idx = static_cast<uint64_t>(b.indices()[i]);
        index_sum += idx;
        index_xor ^= idx;
        if (idx < seen.size() && !seen[idx]) {
          seen[idx] = 1;
          ++unique;
        }
        if (checksum) {
          // Order-independent: a sum over samples of a hash of (index, label, pixels), so
          // consumers with different batch sizes can be compared sample for sample.
          const uint8_t* px = pixels + i * sample_bytes;
          uint64_t h = Fnv1a(reinterpret_cast<const uint8_t*>(&b.indices()[i]), 8, 1469598103934665603ull);
          h = Fnv1a(reinterpret_cast<const uint8_t*>(&b.labels()[i]), 8, h);
          content += Fnv1a(px, sample_bytes, h);
        }
      }
      if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++done_epochs;
    if (json) {
      JsonWriter w;
      w.BeginObject()
          .Field("epoch", c.epoch())
          .Field("partial", c.partial())
          .Field("batches", batches)
          .Field("samples", samples)
          .Field("unique_samples", unique)
          .Field("index_sum", index_sum)
          .Field("index_xor", index_xor)
          .Field("images_per_s", secs > 0 ? static_cast<double>(samples) / secs : 0.0)
          .Field("expected_batches", c.size())
          .Field("handoff_p50_us", Percentile(handoff_us, 0.5))
          .Field("handoff_p99_us", Percentile(handoff_us, 0.99))
          .Field("handoff_samples", static_cast<uint64_t>(handoff_us.size()))
          .Field("queued_next_p50_us", Percentile(queued_next_us, 0.5))
          .Field("max_wait_ms", static_cast<double>(max_wait_ns) * 1e-6)
          .Field("path", c.on_device() ? "device" : "host");
      if (checksum) w.Field("content_hash", content);
      w.EndObject();
      std::printf("%s\n", w.str().c_str());
    } else {
      std::printf("epoch %llu%s: %llu batches, %llu samples (%llu unique), %.0f images/s\n",
                  static_cast<unsigned long long>(c.epoch()), c.partial() ? " (partial)" : "",
                  static_cast<unsigned long long>(batches), static_cast<unsigned long long>(samples),
                  static_cast<unsigned long long>(unique), secs > 0 ? static_cast<double>(samples) / secs : 0.0);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace coloader::cli
