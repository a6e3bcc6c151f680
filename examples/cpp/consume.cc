// A consumer of a coloader producer, the README's "In C++" made whole: it reads every epoch the
// producer serves and prints, per epoch, how many batches and samples it got and how many
// distinct dataset indices they covered (equal to the samples when each was seen exactly once).
//
//   consume --name NAME [--batch-size B] [--drop-last] [--timeout-ms T]
//
// Exit status 0 when the producer finished, 1 on an error (printed), 2 on a bad command line.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "client/consumer.h"

namespace {

int Usage(const char* why) {
  std::fprintf(stderr, "consume: %s\nusage: consume --name NAME [--batch-size B] [--drop-last] [--timeout-ms T]\n", why);
  return 2;
}

// Every epoch until the producer is done; errors come back as the Status that says what failed.
coloader::Status Run(const coloader::ConsumerOptions& opts) {
  coloader::Result<std::unique_ptr<coloader::Consumer>> connected = coloader::Consumer::Connect(opts);
  if (!connected.ok()) return connected.status();
  coloader::Consumer& consumer = **connected;
  for (;;) {
    coloader::Result<bool> more = consumer.NextEpoch();
    if (!more.ok()) return more.status();
    if (!*more) return coloader::Status::OK();
    uint64_t batches = 0, samples = 0;
    std::set<int64_t> seen;
    for (;;) {
      coloader::Result<std::optional<coloader::Batch>> next = consumer.Next();
      if (!next.ok()) return next.status();
      if (!*next) break;  // the end of this epoch
      const coloader::Batch& batch = **next;
      ++batches;
      samples += batch.size();
      seen.insert(batch.indices(), batch.indices() + batch.size());
    }  // each batch's lease ends here, which hands its slot back to the producer
    std::printf("epoch %llu%s: %llu batches, %llu samples, %zu unique\n",
                static_cast<unsigned long long>(consumer.epoch()), consumer.partial() ? " (partial)" : "",
                static_cast<unsigned long long>(batches), static_cast<unsigned long long>(samples), seen.size());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  coloader::ConsumerOptions opts;
  opts.client_name = "examples/cpp/consume";
  opts.wait_for_producer_ms = 10000;  // started together with the producer: give it time to appear
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--name" && has_value) {
      opts.name = argv[++i];
    } else if (flag == "--batch-size" && has_value) {
      opts.batch_size = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
      if (opts.batch_size == 0) return Usage("--batch-size must be a positive integer");
    } else if (flag == "--timeout-ms" && has_value) {
      opts.timeout_ms = std::atoi(argv[++i]);
    } else if (flag == "--drop-last") {
      opts.drop_last = true;
    } else {
      return Usage(("unknown or incomplete flag: " + flag).c_str());
    }
  }
  if (opts.name.empty()) return Usage("--name is required (the producer's `coloader serve --name`)");
  const coloader::Status st = Run(opts);
  if (!st.ok()) {
    std::fprintf(stderr, "consume: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
