// The fixture of the integration tests (integration_test, faults_test, tcp_test): a real
// `coloader serve` process, real `coloader consume` processes (or the client library in this
// process), real ZeroMQ sockets and real shared memory, in a run directory of the test's own.
//
// What a consumer saw is read from `consume --json`: per epoch the number of samples, how
// many were distinct, and the sum and xor of their dataset indices. For a dataset of N images
// an exact epoch has samples == unique == N and index_sum == N(N-1)/2.
#pragma once

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/consumer.h"

#include "tests/support/producer_test.h"
#include "tests/support/test_support.h"

namespace coloader {

// What every integration test uses of tests/support (test-only: brought into coloader here).
using testing::Child;
using testing::Coloader;
using testing::JsonLine;
using testing::ParseJsonLines;
using testing::U64;

constexpr int kImages = 103;  // a prime: no batch size used below divides it

class IntegrationTest : public testing::ProducerTest {
 protected:
  IntegrationTest() : ProducerTest({kImages, 5, 32, {}}) {}

  // Runs `coloader status --json` and returns its one line (empty if the producer is gone
  // and `must_answer` is false).
  testing::JsonLine StatusOf(const std::string& name, bool must_answer = true) {
    testing::Child status(testing::Coloader({"status", "--name", name, "--json"}), env_);
    const int rc = status.Wait(10000);
    if (must_answer) {
      EXPECT_EQ(rc, 0) << status.Stderr();
    }
    auto lines = testing::ParseJsonLines(status.Stdout());
    return lines.empty() ? testing::JsonLine{} : lines[0];
  }
  // Polls the producer's status (an explicit readiness signal) until `pred` holds.
  template <typename Pred>
  bool WaitForStatus(const std::string& name, Pred pred, int timeout_ms = 20000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      testing::JsonLine s = StatusOf(name);
      if (!s.empty() && pred(s)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static void ExpectExactEpoch(const testing::JsonLine& e, uint64_t n = kImages) { testing::ExpectExactEpoch(e, n); }
};

// A first reader in this process (for the late-join tests): it takes epoch 0's first batch and
// holds it, so that the producer waits inside epoch 0 (the window) while a second consumer
// starts, however slowly it starts on a loaded or instrumented machine; `then` runs meanwhile.
// Afterwards it reads all `epochs`, each of which must be exact.
template <typename Then>
void HoldEpochZeroWhile(const std::string& name, int epochs, Then then) {
  ConsumerOptions o;
  o.name = name;
  ASSERT_OK_AND_ASSIGN(auto first, Consumer::Connect(o));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    ASSERT_OK_AND_ASSIGN(bool more, first->NextEpoch());
    ASSERT_TRUE(more) << "epoch " << epoch;
    std::vector<int64_t> seen;
    for (int n = 0;; ++n) {
      ASSERT_OK_AND_ASSIGN(std::optional<Batch> b, first->Next());
      if (!b) break;
      seen.insert(seen.end(), b->indices(), b->indices() + b->size());
      if (epoch == 0 && n == 0) then();  // while this batch is held
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(kImages);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << "the first reader's epoch " << epoch;
  }
}

}  // namespace coloader
