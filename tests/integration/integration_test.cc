// Integration tests: a real `coloader serve` process, real `coloader consume` processes (or
// the client library in this process), real ZeroMQ sockets and real shared memory. Each test
// gets its own run directory, so tests never see each other's producers.
//
// What a consumer saw is read from `consume --json`: per epoch the number of samples, how
// many were distinct, and the sum and xor of their dataset indices. For a dataset of N images
// an exact epoch has samples == unique == N and index_sum == N(N-1)/2.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "client/consumer.h"
#include "common/endpoint.h"
#include "common/process.h"
#include "common/protocol.h"
#include "tests/support/producer_test.h"
#include "tests/support/test_support.h"

namespace coloader {
namespace {

namespace fs = std::filesystem;
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
  JsonLine StatusOf(const std::string& name, bool must_answer = true) {
    Child status(Coloader({"status", "--name", name, "--json"}), env_);
    const int rc = status.Wait(10000);
    if (must_answer) {
      EXPECT_EQ(rc, 0) << status.Stderr();
    }
    auto lines = ParseJsonLines(status.Stdout());
    return lines.empty() ? JsonLine{} : lines[0];
  }
  // Polls the producer's status (an explicit readiness signal) until `pred` holds.
  template <typename Pred>
  bool WaitForStatus(const std::string& name, Pred pred, int timeout_ms = 20000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      JsonLine s = StatusOf(name);
      if (!s.empty() && pred(s)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static void ExpectExactEpoch(const JsonLine& e, uint64_t n = kImages) { testing::ExpectExactEpoch(e, n); }
};

TEST_F(IntegrationTest, OneConsumerSeesEveryEpochExactlyOnce) {
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "3"});
  auto consumer = Consume("p", {"--batch-size", "16"});
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  auto epochs = ParseJsonLines(consumer->Stdout());
  ASSERT_EQ(epochs.size(), 3u) << consumer->Stdout();
  for (size_t e = 0; e < epochs.size(); ++e) {
    ExpectExactEpoch(epochs[e]);
    EXPECT_EQ(U64(epochs[e], "epoch"), e);
    EXPECT_EQ(U64(epochs[e], "batches"), 7u);  // ceil(103 / 16), the last one short
    EXPECT_EQ(U64(epochs[e], "expected_batches"), 7u);
  }
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, ConsumersWithAnyBatchSizeAreExactAndSeeTheSamePixels) {
  // Producer batches of 16; consumers of 1, 5, 16 and 40 (straddling up to four slots).
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "2", "--min-consumers", "4",
                              "--output", "uint8"});
  std::vector<std::unique_ptr<Child>> consumers;
  for (const char* b : {"1", "5", "16", "40"}) consumers.push_back(Consume("p", {"--batch-size", b, "--checksum"}));
  std::vector<std::vector<JsonLine>> seen;
  for (auto& c : consumers) {
    ASSERT_EQ(c->Wait(), 0) << c->Stderr();
    seen.push_back(ParseJsonLines(c->Stdout()));
    ASSERT_EQ(seen.back().size(), 2u) << c->Stdout();
    for (const auto& e : seen.back()) ExpectExactEpoch(e);
  }
  const uint64_t expected_batches[] = {103, 21, 7, 3};
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(U64(seen[i][0], "batches"), expected_batches[i]);
    // Same samples, same pixels, whether viewed in place or gathered across slots.
    for (size_t e = 0; e < 2; ++e) EXPECT_EQ(seen[i][e].at("content_hash"), seen[0][e].at("content_hash"));
  }
  // A different epoch is a different augmentation of the same images.
  EXPECT_NE(seen[0][0].at("content_hash"), seen[0][1].at("content_hash"));
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, ConsumerBatchesLargerThanTheWholeRingAreExact) {
  // Found by the soak: a consumer batch needing more slots than the ring has used to hold
  // every slot while it gathered and wait forever for one more. Here the ring holds 2 x 4
  // samples and the consumers ask for 30 and 9 (9: straddles three slots each time).
  auto producer = Serve("p", {"--batch-size", "4", "--epochs", "2", "--window", "2", "--spare-slots", "0",
                              "--min-consumers", "2", "--output", "uint8"});
  auto big = Consume("p", {"--batch-size", "30", "--checksum", "--timeout-ms", "20000"});
  auto small = Consume("p", {"--batch-size", "9", "--checksum", "--timeout-ms", "20000"});
  ASSERT_EQ(big->Wait(), 0) << big->Stderr();
  ASSERT_EQ(small->Wait(), 0) << small->Stderr();
  auto b = ParseJsonLines(big->Stdout()), s = ParseJsonLines(small->Stdout());
  ASSERT_EQ(b.size(), 2u) << big->Stdout();
  ASSERT_EQ(s.size(), 2u) << small->Stdout();
  for (size_t e = 0; e < 2; ++e) {
    ExpectExactEpoch(b[e]);
    ExpectExactEpoch(s[e]);
    EXPECT_EQ(U64(b[e], "batches"), 4u);  // ceil(103 / 30)
    EXPECT_EQ(b[e].at("content_hash"), s[e].at("content_hash"));  // the same pixels, gathered either way
  }
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, DropLastDropsOnlyTheShortTail) {
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "1"});
  auto consumer = Consume("p", {"--batch-size", "10", "--drop-last"});
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  auto epochs = ParseJsonLines(consumer->Stdout());
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_EQ(U64(epochs[0], "batches"), 10u);
  EXPECT_EQ(U64(epochs[0], "samples"), 100u);
  EXPECT_EQ(U64(epochs[0], "unique_samples"), 100u);
  EXPECT_EQ(U64(epochs[0], "expected_batches"), 10u);
}

TEST_F(IntegrationTest, LateJoinerGetsTheRestThenWholeEpochs) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "3", "--window", "3"});
  auto first = Consume("p", {"--step-ms", "15"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) {
    return U64(s, "batches_published") >= 3 && U64(s, "epoch") == 0;
  }));
  auto late = Consume("p");
  ASSERT_EQ(late->Wait(), 0) << late->Stderr();
  ASSERT_EQ(first->Wait(), 0) << first->Stderr();
  auto late_epochs = ParseJsonLines(late->Stdout());
  ASSERT_EQ(late_epochs.size(), 3u) << late->Stdout();
  EXPECT_EQ(late_epochs[0].at("partial"), "true");
  EXPECT_EQ(U64(late_epochs[0], "epoch"), 0u);
  EXPECT_LT(U64(late_epochs[0], "samples"), static_cast<uint64_t>(kImages));
  EXPECT_GT(U64(late_epochs[0], "samples"), 0u);
  EXPECT_EQ(U64(late_epochs[0], "samples"), U64(late_epochs[0], "unique_samples"));
  ExpectExactEpoch(late_epochs[1]);
  ExpectExactEpoch(late_epochs[2]);
  for (const auto& e : ParseJsonLines(first->Stdout())) ExpectExactEpoch(e);
}

TEST_F(IntegrationTest, WaitForEpochJoinsAtTheNextBoundary) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "3", "--window", "3"});
  auto first = Consume("p", {"--step-ms", "15"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) {
    return U64(s, "batches_published") >= 3 && U64(s, "epoch") == 0;
  }));
  // Hold epoch 0 open (the stopped reader holds the window) until the waiter has attached, so
  // that it joins at epoch 1 however slowly it starts on a loaded machine.
  first->Signal(SIGSTOP);
  auto waiter = Consume("p", {"--wait-for-epoch"});
  ASSERT_TRUE(producer->WaitForStderr("waits for the next epoch", 20000)) << producer->Stderr();
  first->Signal(SIGCONT);
  ASSERT_EQ(waiter->Wait(), 0) << waiter->Stderr();
  auto epochs = ParseJsonLines(waiter->Stdout());
  ASSERT_EQ(epochs.size(), 2u) << waiter->Stdout();
  EXPECT_EQ(U64(epochs[0], "epoch"), 1u);
  ExpectExactEpoch(epochs[0]);
  ExpectExactEpoch(epochs[1]);
}

TEST_F(IntegrationTest, ProducerNeverRunsMoreThanTheWindowAhead) {
  // Spare slots make the ring larger than the window, so a producer that ignored the window
  // would fill the spares too and the bound below would fail; with --spare-slots 0 it could not.
  const uint64_t window = 3, spare = 3;
  auto producer = Serve("p", {"--batch-size", "4", "--epochs", "2", "--window", std::to_string(window),
                              "--spare-slots", std::to_string(spare)});
  auto slow = Consume("p", {"--step-ms", "30"});
  int checks = 0;
  uint64_t most_in_use = 0;
  for (int i = 0; i < 15 && slow->running(); ++i) {
    JsonLine s = StatusOf("p", /*must_answer=*/false);  // it may have just finished
    if (s.empty() || s.count("slots_in_use") == 0) continue;
    EXPECT_EQ(U64(s, "slots"), window + spare);
    // The window counts from how far the consumer has read: the batch it is reading (it
    // releases it when it takes the next) plus at most `window` published beyond it.
    EXPECT_LE(U64(s, "slots_in_use"), window + 1);
    most_in_use = std::max(most_in_use, U64(s, "slots_in_use"));
    ++checks;
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // spaced samples of a steady state
  }
  EXPECT_GT(checks, 3);
  EXPECT_GE(most_in_use, window) << "the producer should run ahead up to the window";
  ASSERT_EQ(slow->Wait(), 0) << slow->Stderr();
  for (const auto& e : ParseJsonLines(slow->Stdout())) ExpectExactEpoch(e);
}

TEST_F(IntegrationTest, ZeroCopyLeasesHoldTheSlotUntilReleased) {
  // No spare slots: the two leases hold the whole ring. Zero-copy views cannot be copied away
  // when the producer asks for their slots (Reclaim), so they hold them.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--window", "2", "--spare-slots", "0"});
  ConsumerOptions o;
  o.name = "p";
  o.zero_copy = true;
  ASSERT_OK_AND_ASSIGN(auto consumer, Consumer::Connect(o));
  ASSERT_OK_AND_ASSIGN(bool more, consumer->NextEpoch());
  ASSERT_TRUE(more);
  ASSERT_OK_AND_ASSIGN(std::optional<Batch> a, consumer->Next());
  ASSERT_OK_AND_ASSIGN(std::optional<Batch> b, consumer->Next());
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(a->gathered());
  // Both slots of the window are leased: the producer must stay at 2 published batches.
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "slots_in_use") == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // give a wrong producer time to overrun
  JsonLine s = StatusOf("p");
  EXPECT_EQ(U64(s, "batches_published"), 2u);
  // The data under a lease is stable while held: releasing `a` lets the producer write a new
  // batch into a's slot; b's indices, labels and pixels must not change meanwhile.
  EXPECT_EQ(a->size(), 8u);
  const std::vector<int64_t> b_indices(b->indices(), b->indices() + b->size());
  const std::vector<int64_t> b_labels(b->labels(), b->labels() + b->size());
  const auto* b_data = static_cast<const uint8_t*>(b->data());
  const std::vector<uint8_t> b_pixels(b_data, b_data + b->bytes());
  const int64_t a_first = a->indices()[0];
  a->Release();
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") == 3; }));
  EXPECT_EQ(std::vector<int64_t>(b->indices(), b->indices() + b->size()), b_indices);
  EXPECT_EQ(std::vector<int64_t>(b->labels(), b->labels() + b->size()), b_labels);
  EXPECT_TRUE(std::equal(b_pixels.begin(), b_pixels.end(), static_cast<const uint8_t*>(b->data())));
  // The ring has two slots and b holds one: the third batch was written into a's old slot, so
  // the checks above watched a real overwrite next door.
  ASSERT_OK_AND_ASSIGN(std::optional<Batch> c, consumer->Next());
  ASSERT_TRUE(c);
  EXPECT_NE(c->indices()[0], a_first);
}

TEST_F(IntegrationTest, KeptBatchesAreCopiedAwayWhenTheRingNeedsTheirSlots) {
  // The same ring of two slots, read with the default private views: the two kept batches do
  // not stop the producer. It asks for the older one back (Reclaim); the consumer copies what
  // the view still shares with the ring and acks, and what it holds never changes, though the
  // producer writes new batches into those slots.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--window", "2", "--spare-slots", "0"});
  ConsumerOptions o;
  o.name = "p";
  ASSERT_OK_AND_ASSIGN(auto consumer, Consumer::Connect(o));
  ASSERT_OK_AND_ASSIGN(bool more, consumer->NextEpoch());
  ASSERT_TRUE(more);
  std::vector<Batch> kept;
  std::vector<std::vector<uint8_t>> pixels;
  std::vector<std::vector<int64_t>> indices;
  for (int i = 0; i < 4; ++i) {  // two slots, four batches: two of them were copied away
    ASSERT_OK_AND_ASSIGN(std::optional<Batch> b, consumer->Next());
    ASSERT_TRUE(b);
    // A write goes to this process's own pages: the kept copy must keep it too.
    auto* data = static_cast<uint8_t*>(const_cast<void*>(b->data()));
    data[0] = static_cast<uint8_t>(0xA0 + i);
    const auto* p = static_cast<const uint8_t*>(b->data());
    pixels.emplace_back(p, p + b->bytes());
    indices.emplace_back(b->indices(), b->indices() + b->size());
    kept.push_back(std::move(*b));
  }
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 4; }));
  std::set<int64_t> seen;
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(kept[i].data());
    EXPECT_TRUE(std::equal(pixels[i].begin(), pixels[i].end(), p)) << "kept batch " << i << " changed";
    EXPECT_EQ(std::vector<int64_t>(kept[i].indices(), kept[i].indices() + kept[i].size()), indices[i]);
    seen.insert(indices[i].begin(), indices[i].end());
  }
  EXPECT_EQ(seen.size(), 32u);  // four distinct batches
  // Each lease is acked once, early or at its end: the producer would drop a double ack.
  kept.clear();
  for (;;) {
    ASSERT_OK_AND_ASSIGN(std::optional<Batch> b, consumer->Next());
    if (!b) break;
  }
  consumer.reset();
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
  EXPECT_EQ(producer->Stderr().find("did not hold"), std::string::npos) << producer->Stderr();
}

TEST_F(IntegrationTest, ABatchCutShortByATimeoutDoesNotLeakIntoTheNextEpoch) {
  // `holder` keeps the two slots of the ring (zero-copy views, which hold their slots), so
  // `reader`'s batch of 20 gets the 16 samples of those slots and then times out. A new epoch
  // started then must not open with them.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "2", "--spare-slots", "0",
                              "--min-consumers", "2"});
  ConsumerOptions o;
  o.name = "p";
  o.timeout_ms = 20000;  // bounds the drain below should the producer stall
  o.zero_copy = true;
  ASSERT_OK_AND_ASSIGN(auto holder, Consumer::Connect(o));
  o.zero_copy = false;
  o.batch_size = 20;
  o.timeout_ms = 1500;
  ASSERT_OK_AND_ASSIGN(auto reader, Consumer::Connect(o));
  // Both attach (a first NextEpoch does) before the holder waits for the first batch, which
  // the producer publishes only once both are there (--min-consumers 2).
  ASSERT_EQ(holder->NextEpoch(0).status().code(), StatusCode::kAgain);
  ASSERT_EQ(reader->NextEpoch(0).status().code(), StatusCode::kAgain);
  ASSERT_OK_AND_ASSIGN(bool more, holder->NextEpoch());
  ASSERT_TRUE(more);
  ASSERT_OK_AND_ASSIGN(std::optional<Batch> h1, holder->Next());
  ASSERT_OK_AND_ASSIGN(std::optional<Batch> h2, holder->Next());
  ASSERT_OK_AND_ASSIGN(more, reader->NextEpoch());
  ASSERT_TRUE(more);
  ASSERT_EQ(reader->epoch(), 0u);
  Result<std::optional<Batch>> cut = reader->Next();
  ASSERT_EQ(cut.status().code(), StatusCode::kTimeout) << cut.status().ToString();
  // The holder lets go and reads on, so the producer goes on.
  h1.reset();
  h2.reset();
  std::thread drain([&] {
    for (;;) {
      Result<bool> epoch = holder->NextEpoch();
      if (!epoch.ok() || !*epoch) return;
      for (;;) {
        Result<std::optional<Batch>> b = holder->Next();
        if (!b.ok() || !*b) break;
      }
    }
  });
  struct Join {
    std::thread& t;
    ~Join() { t.join(); }
  } join{drain};
  ASSERT_OK_AND_ASSIGN(more, reader->NextEpoch());
  ASSERT_TRUE(more);
  EXPECT_EQ(reader->epoch(), 1u);
  EXPECT_FALSE(reader->partial());
  std::set<int64_t> seen;
  uint64_t samples = 0;
  for (;;) {
    ASSERT_OK_AND_ASSIGN(std::optional<Batch> b, reader->Next());
    if (!b) break;
    EXPECT_EQ(b->epoch(), 1u);
    samples += b->size();
    seen.insert(b->indices(), b->indices() + b->size());
  }
  EXPECT_EQ(samples, uint64_t{kImages});
  EXPECT_EQ(seen.size(), size_t{kImages});
  ASSERT_OK_AND_ASSIGN(more, reader->NextEpoch());
  EXPECT_FALSE(more);
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, KilledConsumerIsDetectedAndOthersStayExact) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "3", "--min-consumers", "3"});
  auto victim = Consume("p", {"--step-ms", "1000"});  // holds its slots and never lets go
  auto a = Consume("p", {"--batch-size", "5"});
  auto b = Consume("p", {"--batch-size", "13"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 2; }));
  const auto t0 = std::chrono::steady_clock::now();
  victim->Signal(SIGKILL);
  ASSERT_EQ(a->Wait(), 0) << a->Stderr();
  ASSERT_EQ(b->Wait(), 0) << b->Stderr();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto* c : {a.get(), b.get()}) {
    auto epochs = ParseJsonLines(c->Stdout());
    ASSERT_EQ(epochs.size(), 2u);
    for (const auto& e : epochs) ExpectExactEpoch(e);
  }
  // pidfd notices at once; far below the 1.5 s heartbeat timeout plus the work itself.
  EXPECT_LT(secs, 10.0);
  EXPECT_NE(producer->Stderr().find("exited"), std::string::npos) << producer->Stderr();
  EXPECT_EQ(producer->Wait(), 0);
}

TEST_F(IntegrationTest, SigtermTellsConsumersTheStreamStoppedAndWhere) {
  // A producer stopped before its epochs are served is not a normal end: each consumer is told
  // who stopped, how, and where its stream stopped, and exits with an error.
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--window", "3"});
  auto consumer = Consume("p", {"--step-ms", "5", "--epochs", "1000"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 20; }));
  producer->Signal(SIGTERM);
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
  EXPECT_EQ(consumer->Wait(10000), 1) << consumer->Stderr();
  const std::string err = consumer->Stderr();
  EXPECT_NE(err.find("stopped before serving all its epochs"), std::string::npos) << err;
  EXPECT_NE(err.find("SIGTERM"), std::string::npos) << err;
  EXPECT_NE(err.find("stream stopped at epoch"), std::string::npos) << err;
  auto epochs = ParseJsonLines(consumer->Stdout());
  ASSERT_FALSE(epochs.empty());
  // Everything delivered before the stop was distinct within its epoch.
  for (const auto& e : epochs) EXPECT_EQ(U64(e, "samples"), U64(e, "unique_samples"));
}

TEST_F(IntegrationTest, AnEpochPastTheLastEndsAtOnceWhateverIsHeld) {
  // A loop one epoch too long asks for another epoch while its last batch is still held: the
  // producer says the stream is complete as soon as it is published (End), not once every
  // slot is back, so the consumer learns at once that the stream finished.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  ConsumerOptions o;
  o.name = "p";
  o.timeout_ms = 5000;
  ASSERT_OK_AND_ASSIGN(auto consumer, Consumer::Connect(o));
  ASSERT_OK_AND_ASSIGN(bool more, consumer->NextEpoch());
  ASSERT_TRUE(more);
  std::optional<Batch> last;
  for (;;) {
    ASSERT_OK_AND_ASSIGN(std::optional<Batch> b, consumer->Next());
    if (!b) break;
    last = std::move(b);  // the previous one goes, the last one stays held
  }
  ASSERT_TRUE(last);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(more, consumer->NextEpoch());
  EXPECT_FALSE(more);
  EXPECT_TRUE(consumer->finished());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_TRUE(producer->running()) << "it waits for the last release before it exits";
  last.reset();
  consumer.reset();
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, SigkillOfProducerGivesConsumersAClearErrorNotAHang) {
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--window", "3"});
  auto c1 = Consume("p", {"--step-ms", "5"});
  auto c2 = Consume("p", {"--step-ms", "5", "--batch-size", "3"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return s.count("consumers") && U64(s, "batches_published") >= 10; }));
  const auto t0 = std::chrono::steady_clock::now();
  producer->Signal(SIGKILL);
  EXPECT_EQ(c1->Wait(5000), 1);
  EXPECT_EQ(c2->Wait(5000), 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 1.5 + 1.0);  // within the heartbeat timeout (pidfd makes it immediate)
  EXPECT_NE(c1->Stderr().find("exited without saying goodbye"), std::string::npos) << c1->Stderr();
  // The crashed producer's ring and socket are left behind, and the next start reclaims them.
  auto again = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  auto consumer = Consume("p");
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ExpectExactEpoch(ParseJsonLines(consumer->Stdout()).at(0));
  EXPECT_EQ(again->Wait(), 0);
}

TEST_F(IntegrationTest, TwoProducersSideBySide) {
  auto p1 = Serve("one", {"--batch-size", "8", "--epochs", "1"});
  auto p2 = Serve("two", {"--batch-size", "16", "--epochs", "1"});
  // The same name twice is refused while the first holds it, naming the holder.
  Child dup(Coloader({"serve", "--data", data_, "--name", "one", "--quiet"}), env_);
  EXPECT_EQ(dup.Wait(), 1);
  EXPECT_NE(dup.Stderr().find("(pid " + std::to_string(p1->pid())), std::string::npos)
      << dup.Stderr();
  auto c1 = Consume("one");
  auto c2 = Consume("two");
  ASSERT_EQ(c1->Wait(), 0) << c1->Stderr();
  ASSERT_EQ(c2->Wait(), 0) << c2->Stderr();
  ExpectExactEpoch(ParseJsonLines(c1->Stdout()).at(0));
  ExpectExactEpoch(ParseJsonLines(c2->Stdout()).at(0));
  EXPECT_EQ(U64(ParseJsonLines(c1->Stdout()).at(0), "batches"), 13u);
  EXPECT_EQ(U64(ParseJsonLines(c2->Stdout()).at(0), "batches"), 7u);
}

TEST_F(IntegrationTest, CleansUpSharedMemoryAndKeepsTheRunDirPrivate) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  struct stat st {};
  ASSERT_EQ(::stat(run_dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((run_dir_ + "/p.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
  ASSERT_OK_AND_ASSIGN(ProducerPaths paths, PathsFor("p"));
  EXPECT_TRUE(fs::exists("/dev/shm/" + paths.shm_name));
  auto consumer = Consume("p");
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
  EXPECT_FALSE(fs::exists("/dev/shm/" + paths.shm_name));
  EXPECT_FALSE(fs::exists(run_dir_ + "/p.sock"));
  EXPECT_FALSE(fs::exists(run_dir_ + "/p.lock"));
}

TEST_F(IntegrationTest, AnotherUserCannotConnect) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create a second local user";
  if (::system("id coloader-probe >/dev/null 2>&1 || useradd --system --no-create-home coloader-probe") != 0)
    GTEST_SKIP() << "cannot create a second local user (useradd)";
  // Let the other user reach the run directory's parent: only the run directory itself
  // (0700) and the socket (0600) keep it out.
  ::chmod(tmp_.path().c_str(), 0711);
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  auto as_other = [&](std::vector<std::string> args) {
    args = Coloader(args);
    args.insert(args.begin(), {"/usr/bin/setpriv", "--reuid=coloader-probe", "--regid=coloader-probe",
                               "--clear-groups", "--"});
    return std::make_unique<Child>(args, env_);
  };
  if (as_other({"help"})->Wait() != 0)
    GTEST_SKIP() << "the second user cannot run " << Coloader({})[0] << " (its directories are private)";
  auto by_name = as_other({"consume", "--name", "p"});
  EXPECT_EQ(by_name->Wait(), 1);
  EXPECT_NE(by_name->Stderr().find("belongs to uid 0"), std::string::npos) << by_name->Stderr();
  auto by_path = as_other({"consume", "--endpoint", "ipc://" + run_dir_ + "/p.sock"});
  EXPECT_EQ(by_path->Wait(), 1);
  EXPECT_NE(by_path->Stderr().find("permission denied"), std::string::npos) << by_path->Stderr();
  // The owner is served as usual.
  auto mine = Consume("p");
  ASSERT_EQ(mine->Wait(), 0) << mine->Stderr();
  ExpectExactEpoch(ParseJsonLines(mine->Stdout()).at(0));
}

// ---- bad input ------------------------------------------------------------------------------

TEST_F(IntegrationTest, BadDataPathsAreNamed) {
  const std::string empty = tmp_.path() + "/empty";
  fs::create_directories(empty);
  const std::string no_images = tmp_.path() + "/noimg";
  fs::create_directories(no_images + "/cls");
  testing::WriteFile(no_images + "/cls/readme.txt", "hello");
  for (const std::string& path : {tmp_.path() + "/missing", empty, no_images}) {
    Child serve(Coloader({"serve", "--data", path, "--name", "p", "--quiet"}), env_);
    EXPECT_NE(serve.Wait(), 0);
    EXPECT_NE(serve.Stderr().find(path), std::string::npos) << serve.Stderr();
  }
}

TEST_F(IntegrationTest, WrongFlagsAreRejectedWithUsage) {
  const std::vector<std::vector<std::string>> bad = {
      {"serve", "--data", data_, "--name", "p", "--batch-size", "abc"},
      {"serve", "--data", data_, "--name", "p", "--augment", "sideways"},
      {"serve", "--data", data_, "--name", "p", "--bogus"},
      {"serve", "--data", data_},
      {"serve", "--data", data_, "--name", "bad/name"},
      {"serve", "--data", data_, "--name", "p", "--window", "1"},
      {"serve", "--data", data_, "--name", "p", "--gpu-wait", "sometimes"},
      {"serve", "--data", data_, "--name", "p", "--decode", "gpu", "--device", "cuda:0", "--batch-size", "65536"},
      {"consume"},
      {"frobnicate"},
  };
  for (const auto& args : bad) {
    Child c(Coloader(args), env_);
    EXPECT_EQ(c.Wait(), 2) << args.back() << ": " << c.Stderr();
    EXPECT_FALSE(c.Stderr().empty());
  }
}

TEST_F(IntegrationTest, ConsumerOfAMissingProducerFailsClearly) {
  Child c(Coloader({"consume", "--name", "nobody", "--wait-ms", "0"}), env_);
  EXPECT_EQ(c.Wait(10000), 1);
  EXPECT_NE(c.Stderr().find("no producer named 'nobody'"), std::string::npos) << c.Stderr();
  Child s(Coloader({"status", "--name", "nobody"}), env_);
  EXPECT_EQ(s.Wait(10000), 1);
}

TEST_F(IntegrationTest, SignalsDuringTheHandshakeAreNotErrors) {
  // zmq::poll throws EINTR when a signal handler runs; Connect must keep waiting to its deadline
  // and say Timeout, never let the exception out. The producer is stopped, so it never answers.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  producer->Signal(SIGSTOP);
  struct sigaction action {};
  action.sa_handler = [](int) {};  // returns: interrupted calls fail with EINTR (no SA_RESTART)
  struct sigaction previous {};
  ASSERT_EQ(::sigaction(SIGALRM, &action, &previous), 0);
  itimerval every_2ms{{0, 2000}, {0, 2000}};
  ASSERT_EQ(::setitimer(ITIMER_REAL, &every_2ms, nullptr), 0);
  ConsumerOptions o;
  o.name = "p";
  o.connect_timeout_ms = 400;
  auto connected = Consumer::Connect(o);
  itimerval off{};
  ::setitimer(ITIMER_REAL, &off, nullptr);
  ::sigaction(SIGALRM, &previous, nullptr);
  ASSERT_FALSE(connected.ok());
  EXPECT_EQ(connected.status().code(), StatusCode::kTimeout) << connected.status().ToString();
  producer->Signal(SIGCONT);
  producer->Signal(SIGTERM);
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, MalformedEndpointsAreNamedNotFatal) {
  for (const char* command : {"status", "consume"}) {
    for (const char* endpoint : {"bogus", "tcp://", "nosuch://x"}) {
      SCOPED_TRACE(std::string(command) + " --endpoint " + endpoint);
      std::vector<std::string> args = {command, "--endpoint", endpoint};
      if (std::string(command) == "consume") args.insert(args.end(), {"--connect-timeout-ms", "1000"});
      Child c(Coloader(args), env_);
      EXPECT_EQ(c.Wait(10000), 1) << c.Stderr();
      EXPECT_NE(c.Stderr().find(std::string("'") + endpoint + "'"), std::string::npos) << c.Stderr();
    }
  }
}

TEST_F(IntegrationTest, StoppedConsumerIsDetachedAfterTheTimeoutAndToldWhenItResumes) {
  // SIGSTOP: alive (its pidfd stays quiet) but silent. The others wait at most the heartbeat
  // timeout (1.5 s here), then it is detached; resumed, it learns so and exits with an error.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "2", "--min-consumers", "2"});
  auto stopped = Consume("p", {"--step-ms", "20"});
  auto other = Consume("p", {"--batch-size", "5"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 2; }));
  stopped->Signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(other->Wait(), 0) << other->Stderr();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& e : ParseJsonLines(other->Stdout())) ExpectExactEpoch(e);
  EXPECT_LT(secs, 1.5 + 5.0);  // the timeout, plus two epochs of work on a loaded machine
  EXPECT_NE(producer->Stderr().find("went silent"), std::string::npos) << producer->Stderr();
  stopped->Signal(SIGCONT);
  EXPECT_EQ(stopped->Wait(), 1);
  EXPECT_NE(stopped->Stderr().find("detached"), std::string::npos) << stopped->Stderr();
}

TEST_F(IntegrationTest, ConsumersResumedLongAfterTheTimeoutLearnTheyWereDetached) {
  // Found by the fault stress test: a consumer resumed after a stop longer than the timeout
  // counted its own stop as producer silence and reported "not heard from" before reading the
  // producer's goodbye waiting in its socket. Several at once make the race near certain.
  // --min-consumers: all five are connected before anything is published, so none is stopped
  // before it has joined (one that had not joined would simply read on, forever, once resumed).
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--window", "2", "--min-consumers", "5"});
  std::vector<std::unique_ptr<Child>> stopped;
  for (int i = 0; i < 4; ++i) stopped.push_back(Consume("p", {"--batch-size", std::to_string(3 + i)}));
  auto other = Consume("p", {"--step-ms", "2"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 4; }));
  for (auto& c : stopped) c->Signal(SIGSTOP);
  // Detached after 1.5 s; stay stopped well past that, while the other consumer goes on.
  ASSERT_TRUE(producer->WaitForStderr("went silent", 10000)) << producer->Stderr();
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // the fault itself: a long stop
  for (auto& c : stopped) c->Signal(SIGCONT);
  for (auto& c : stopped) {
    EXPECT_EQ(c->Wait(10000), 1);
    EXPECT_NE(c->Stderr().find("detached"), std::string::npos) << c->Stderr();
    EXPECT_EQ(c->Stderr().find("not been heard from"), std::string::npos) << c->Stderr();
  }
  EXPECT_TRUE(other->running()) << other->Stderr();
  producer->Signal(SIGTERM);
  EXPECT_EQ(other->Wait(10000), 1) << other->Stderr();
  EXPECT_NE(other->Stderr().find("stopped before serving all its epochs"), std::string::npos) << other->Stderr();
  // The consumer that kept reading saw whole epochs while the others were stopped; the last
  // one, cut by the SIGTERM, is not whole and is not checked.
  int whole = 0;
  for (const auto& e : ParseJsonLines(other->Stdout())) {
    if (e.at("partial") == "true" || U64(e, "samples") != kImages) continue;
    ExpectExactEpoch(e);
    ++whole;
  }
  EXPECT_GT(whole, 0) << other->Stdout();
  EXPECT_EQ(producer->Wait(10000), 0);
}

TEST_F(IntegrationTest, FileVanishingAfterTheListingIsSkippedAndNamed) {
  const std::string data = tmp_.path() + "/vanishing";
  testing::MakeImageFolder(data, 30, 2);
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"}, data);  // listed 30 files
  const std::string gone = data + "/class1/img00007.jpg";
  ASSERT_EQ(std::remove(gone.c_str()), 0);
  auto consumer = Consume("p");
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  // Its place is taken by the next good sample of its batch: 30 samples, 29 of them distinct.
  EXPECT_EQ(U64(ParseJsonLines(consumer->Stdout()).at(0), "samples"), 30u);
  EXPECT_EQ(U64(ParseJsonLines(consumer->Stdout()).at(0), "unique_samples"), 29u);
  ASSERT_EQ(producer->Wait(), 0);
  EXPECT_NE(producer->Stderr().find(gone), std::string::npos) << producer->Stderr();
}

TEST_F(IntegrationTest, ConsumerStartedBeforeItsProducerWaitsForIt) {
  // Jobs launched together with their producer may come up first.
  auto consumer = Consume("p", {"--wait-ms", "20000"});
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "1"});
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ExpectExactEpoch(ParseJsonLines(consumer->Stdout()).at(0));
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, CorruptFilesAreSkippedAndCountedOrFailTheRun) {
  const std::string data = tmp_.path() + "/withbad";
  testing::MakeImageFolder(data, 40, 2);
  testing::WriteFile(data + "/class0/zz_text.jpg", "this is not an image");
  std::string jpeg = testing::ReadFile(data + "/class1/img00001.jpg");
  testing::WriteFile(data + "/class1/zz_truncated.jpg", jpeg.substr(0, jpeg.size() / 2));
  {
    auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2"}, data);
    auto consumer = Consume("p", {"--batch-size", "7"});
    ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
    ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
    for (const auto& e : ParseJsonLines(consumer->Stdout())) {
      EXPECT_EQ(U64(e, "samples"), 42u);  // every position filled: two good samples twice
      EXPECT_EQ(U64(e, "unique_samples"), 40u);
    }
    EXPECT_NE(producer->Stderr().find("zz_text.jpg"), std::string::npos) << producer->Stderr();
    EXPECT_NE(producer->Stderr().find("zz_truncated.jpg"), std::string::npos) << producer->Stderr();
  }
  {
    auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--on-bad-file", "fail"}, data);
    auto consumer = Consume("p");
    EXPECT_EQ(producer->Wait(), 1);
    EXPECT_NE(producer->Stderr().find("zz_t"), std::string::npos) << producer->Stderr();
    // Told the producer stopped, naming the bad file, or, when the bad file came in the first
    // batch and the producer stopped while the consumer was still mapping its ring, that.
    EXPECT_EQ(consumer->Wait(), 1) << consumer->Stderr();
    const std::string err = consumer->Stderr();
    EXPECT_TRUE(err.find("the producer stopped while this consumer was connecting") != std::string::npos ||
                (err.find("stopped before serving all its epochs") != std::string::npos &&
                 err.find("zz_t") != std::string::npos))
        << err;
  }
}

// Sends raw frames to the producer's socket as a hostile or outdated peer would.
class RawPeer {
 public:
  explicit RawPeer(const std::string& endpoint) : sock_(ctx_, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.connect(endpoint);
  }
  void Send(const std::vector<uint8_t>& bytes) { sock_.send(zmq::buffer(bytes), zmq::send_flags::none); }
  std::optional<std::vector<uint8_t>> Receive(int timeout_ms) {
    zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    zmq::message_t m;
    if (!(item.revents & ZMQ_POLLIN) || !sock_.recv(m, zmq::recv_flags::dontwait)) return std::nullopt;
    return std::vector<uint8_t>(m.data<uint8_t>(), m.data<uint8_t>() + m.size());
  }

 private:
  zmq::context_t ctx_{1};
  zmq::socket_t sock_;
};

TEST_F(IntegrationTest, ProducerGoneBetweenWelcomeAndMappingIsSaidAsSuch) {
  // Found by the fault stress test: a producer that exits right after its Welcome has already
  // unlinked its ring when the consumer maps it. The consumer must say the producer stopped,
  // not report a missing file. A stand-in producer answers the Hello with the Welcome of a
  // process that is still stopping (a child that exits 300 ms later: a producer unlinks its
  // ring a moment before it ends) and a ring that does not exist.
  const pid_t gone = ::fork();
  if (gone == 0) {
    ::usleep(300 * 1000);
    ::_exit(0);
  }
  ASSERT_GT(gone, 0);

  const std::string endpoint = "ipc://" + tmp_.path() + "/stand-in.sock";
  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  router.set(zmq::sockopt::linger, 0);
  router.bind(endpoint);
  Child consumer(Coloader({"consume", "--endpoint", endpoint, "--json"}), env_);

  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, std::chrono::milliseconds(10000));
  ASSERT_TRUE(item.revents & ZMQ_POLLIN) << "no Hello from the consumer: " << consumer.Stderr();
  zmq::message_t identity, hello;
  ASSERT_TRUE(router.recv(identity, zmq::recv_flags::none));
  ASSERT_TRUE(router.recv(hello, zmq::recv_flags::none));
  ASSERT_TRUE(std::holds_alternative<Hello>(*Decode(hello.data<uint8_t>(), hello.size())));

  Welcome w;
  w.consumer_id = 1;
  w.producer_pid = static_cast<uint32_t>(gone);
  const ProcessIdentity who = IdentityOf(gone);
  w.producer_pid_ns = who.pid_ns;
  w.producer_start_time = who.start_time;
  w.heartbeat_ms = 100;
  w.heartbeat_timeout_ms = 1000;
  w.dataset_size = w.epoch_samples = 16;
  w.slots.shm_name = "coloader-test-never-made-" + std::to_string(::getpid());
  w.slots.num_slots = 2;
  w.slots.batch_size = 8;
  w.slots.indices_offset = 0;
  w.slots.labels_offset = 64;
  w.slots.data_offset = 4096;
  w.slots.height = w.slots.width = 8;
  w.slots.channels = 3;
  w.slots.dtype = DType::kUInt8;
  w.slots.layout = TensorLayout::kNCHW;
  w.slots.slot_bytes = 4096 + 8 * 8 * 8 * 3;
  const std::vector<uint8_t> bytes = Encode(w);
  router.send(identity, zmq::send_flags::sndmore);
  router.send(zmq::buffer(bytes), zmq::send_flags::none);

  EXPECT_EQ(consumer.Wait(10000), 1) << consumer.Stderr();
  EXPECT_NE(consumer.Stderr().find("the producer stopped while this consumer was connecting"), std::string::npos)
      << consumer.Stderr();
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
}

TEST_F(IntegrationTest, MalformedAndOutdatedPeersAreRejectedAndOthersCarryOn) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  ASSERT_OK_AND_ASSIGN(ProducerPaths paths, PathsFor("p"));
  RawPeer peer(paths.endpoint);
  peer.Send({1, 2, 3});                                   // shorter than a header
  peer.Send(std::vector<uint8_t>(64, 0xAB));              // bad magic
  std::vector<uint8_t> hello = Encode(Hello{1, 0, 0, 8, 0, "x", "", "", 0, 1, 0, 0, 0, ""});
  hello.resize(hello.size() - 1);                         // truncated Hello
  peer.Send(hello);
  std::vector<uint8_t> future = Encode(Hello{1, 0, 0, 8, 0, "from the future", "", "", 0, 1, 0, 0, 0, ""});
  future[4] = 99;                                         // another protocol version
  peer.Send(future);
  auto reply = peer.Receive(5000);
  ASSERT_TRUE(reply.has_value());
  auto m = Decode(reply->data(), reply->size());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto* reject = std::get_if<Reject>(&*m);
  ASSERT_NE(reject, nullptr);
  EXPECT_EQ(reject->code, RejectCode::kVersion);
  EXPECT_NE(reject->reason.find("99"), std::string::npos);
  // The producer carries on and serves a well-behaved consumer exactly.
  auto consumer = Consume("p");
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ExpectExactEpoch(ParseJsonLines(consumer->Stdout()).at(0));
  EXPECT_EQ(producer->Wait(), 0);
  EXPECT_NE(producer->Stderr().find("rejected a message"), std::string::npos);
}

// A consumer that said Hello properly and then misbehaves: each kind of misbehaviour gets a
// Bye(kRejected) naming it, is counted, and costs the producer and the other consumers nothing.
TEST_F(IntegrationTest, HostileConnectedClientsAreDroppedCountedAndOthersCarryOn) {
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--window", "3"});
  auto honest = Consume("p", {"--batch-size", "5"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 3; }));
  ASSERT_OK_AND_ASSIGN(ProducerPaths paths, PathsFor("p"));

  // Says Hello as a remote consumer would (pid 0: batches come as messages), waits for its
  // Welcome and first batch, then runs `misbehave`; returns the Bye it got.
  auto attack = [&](const std::function<void(RawPeer&, const BatchAnnouncement&)>& misbehave) -> std::optional<Bye> {
    RawPeer peer(paths.endpoint);
    peer.Send(Encode(Hello{0, 0, 0, 8, 0, "hostile", "", "", 0, 1, 0, 0, 0, ""}));
    std::optional<BatchAnnouncement> first;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    bool misbehaved = false;
    while (std::chrono::steady_clock::now() < deadline) {
      auto bytes = peer.Receive(200);
      if (!bytes) continue;
      auto m = Decode(bytes->data(), bytes->size());
      if (!m.ok()) return std::nullopt;
      if (std::holds_alternative<Welcome>(*m)) peer.Send(Encode(Attach{0}));  // starts reading
      if (auto* a = std::get_if<BatchAnnouncement>(&*m); a && !misbehaved) {
        first = *a;
        misbehave(peer, *first);
        misbehaved = true;
      }
      if (auto* bye = std::get_if<Bye>(&*m)) return *bye;
    }
    return std::nullopt;
  };
  struct Case {
    const char* what;
    std::function<void(RawPeer&, const BatchAnnouncement&)> misbehave;
    const char* expect;  // in the Bye's message
  };
  const std::vector<Case> cases = {
      {"ack for a batch it never got", [](RawPeer& p, const BatchAnnouncement& a) { p.Send(Encode(Ack{a.seq + 1000})); },
       "do not hold"},
      {"ack far out of range", [](RawPeer& p, const BatchAnnouncement&) { p.Send(Encode(Ack{uint64_t{1} << 62})); },
       "do not hold"},
      {"ack twice", [](RawPeer& p, const BatchAnnouncement& a) {
         p.Send(Encode(Ack{a.seq}));
         p.Send(Encode(Ack{a.seq}));
       }, "do not hold"},
      {"unknown message type", [](RawPeer& p, const BatchAnnouncement&) {
         std::vector<uint8_t> m = Encode(Heartbeat{});
         m[6] = 77;  // the type field
         p.Send(m);
       }, "type"},
      {"a producer's message", [](RawPeer& p, const BatchAnnouncement& a) { p.Send(Encode(a)); }, "unexpected"},
      {"flood", [](RawPeer& p, const BatchAnnouncement&) {
         const std::vector<uint8_t> hb = Encode(Heartbeat{});
         for (int i = 0; i < 20000; ++i) p.Send(hb);
       }, "messages in one second"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::optional<Bye> bye = attack(c.misbehave);
    ASSERT_TRUE(bye.has_value()) << "no goodbye for: " << c.what;
    EXPECT_EQ(bye->reason, ByeReason::kRejected);
    EXPECT_NE(bye->message.find(c.expect), std::string::npos) << bye->message;
  }
  JsonLine s = StatusOf("p");
  EXPECT_GE(U64(s, "dropped_clients"), cases.size());
  EXPECT_GE(U64(s, "rejected_messages"), cases.size());
  EXPECT_TRUE(honest->running()) << honest->Stderr();
  // The honest consumer went on throughout and still sees exact epochs.
  const uint64_t published = U64(s, "batches_published");
  ASSERT_TRUE(WaitForStatus("p", [&](const JsonLine& t) { return U64(t, "batches_published") >= published + 30; }));
  producer->Signal(SIGTERM);
  ASSERT_EQ(honest->Wait(10000), 1) << honest->Stderr();  // stopped mid-stream: said so
  EXPECT_NE(honest->Stderr().find("stopped before serving all its epochs"), std::string::npos) << honest->Stderr();
  auto epochs = ParseJsonLines(honest->Stdout());
  ASSERT_GE(epochs.size(), 2u);
  for (size_t i = 0; i + 1 < epochs.size(); ++i) ExpectExactEpoch(epochs[i]);
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

// The tcp:// endpoint a producer printed ("also serving on tcp://HOST:PORT (...)").
std::string TcpEndpointOf(Child& producer) {
  EXPECT_TRUE(producer.WaitForStderr("also serving on tcp://", 20000)) << producer.Stderr();
  const std::string err = producer.Stderr();
  const size_t at = err.find("tcp://", err.find("also serving on"));
  return at == std::string::npos ? "" : err.substr(at, err.find(' ', at) - at);
}

TEST_F(IntegrationTest, TcpConsumersNeedAListedCurveKeyAndSeeExactEpochs) {
  for (const char* who : {"server", "client", "stranger"}) {
    Child keygen(Coloader({"keygen", "--out", tmp_.path() + "/" + who}), env_);
    ASSERT_EQ(keygen.Wait(), 0) << keygen.Stderr();
  }
  struct stat st {};
  ASSERT_EQ(::stat((tmp_.path() + "/client.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string k = tmp_.path() + "/";
  testing::WriteFile(k + "authorized", "# who may connect\n" + testing::ReadFile(k + "client.pub"));
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--tcp", "tcp://127.0.0.1:*", "--curve-key",
                              k + "server.key", "--authorized-keys", k + "authorized"});
  const std::string ep = TcpEndpointOf(*producer);
  ASSERT_FALSE(ep.empty());
  // Listed key: whole epochs, exactly, with batches carried as payload (no shared memory).
  Child good(Coloader({"consume", "--endpoint", ep, "--curve-key", k + "client.key", "--server-key", k + "server.pub",
                       "--batch-size", "5", "--epochs", "2", "--json", "--checksum"}), env_);
  ASSERT_EQ(good.Wait(), 0) << good.Stderr();
  auto epochs = ParseJsonLines(good.Stdout());
  ASSERT_EQ(epochs.size(), 2u) << good.Stdout();
  for (const auto& e : epochs) ExpectExactEpoch(e);
  // An unlisted key, a wrong server key, no keys at all: each refused with a clear reason.
  Child stranger(Coloader({"consume", "--endpoint", ep, "--curve-key", k + "stranger.key", "--server-key",
                           k + "server.pub"}), env_);
  EXPECT_EQ(stranger.Wait(), 1);
  EXPECT_NE(stranger.Stderr().find("refused this consumer's key"), std::string::npos) << stranger.Stderr();
  Child wrong_server(Coloader({"consume", "--endpoint", ep, "--curve-key", k + "client.key", "--server-key",
                               k + "stranger.pub", "--connect-timeout-ms", "3000"}), env_);
  EXPECT_EQ(wrong_server.Wait(), 1);
  EXPECT_NE(wrong_server.Stderr().find("--server-key"), std::string::npos) << wrong_server.Stderr();
  // Without keys: refused, and told which flags it lacks. The wording depends on where the
  // handshake broke off (a refusal, or the connection closed mid-handshake, which on a busy
  // machine comes first), so the test checks what the user must learn, not one phrasing.
  Child keyless(Coloader({"consume", "--endpoint", ep, "--connect-timeout-ms", "3000"}), env_);
  EXPECT_EQ(keyless.Wait(), 1);
  EXPECT_NE(keyless.Stderr().find("CURVE keys"), std::string::npos) << keyless.Stderr();
  EXPECT_NE(keyless.Stderr().find("--curve-key"), std::string::npos) << keyless.Stderr();
  EXPECT_NE(keyless.Stderr().find("--server-key"), std::string::npos) << keyless.Stderr();
  EXPECT_NE(producer->Stderr().find("is not in --authorized-keys"), std::string::npos) << producer->Stderr();
  // Its status, over tcp with a listed key, from wherever the operator is.
  Child status(Coloader({"status", "--endpoint", ep, "--curve-key", k + "client.key", "--server-key", k + "server.pub",
                         "--json"}), env_);
  ASSERT_EQ(status.Wait(), 0) << status.Stderr();
  EXPECT_NE(status.Stdout().find("\"pid\":" + std::to_string(producer->pid())), std::string::npos) << status.Stdout();
  // Without keys the request is dropped in the handshake: the timeout names the likely cause.
  Child keyless_status(Coloader({"status", "--endpoint", ep, "--timeout-ms", "1000"}), env_);
  EXPECT_EQ(keyless_status.Wait(), 1);
  EXPECT_NE(keyless_status.Stderr().find("--curve-key"), std::string::npos) << keyless_status.Stderr();
  producer->Signal(SIGTERM);
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, TcpConsumerWaitsOutAProducerThatDropsItMidHandshake) {
  // A producer restarting on its port closes the connections it had accepted mid-handshake.
  // Stood in for by a plain listener that does just that; the consumer must keep trying until
  // its deadline and meet the producer that then binds the port, not give up blaming its keys.
  for (const char* who : {"server", "client"}) {
    Child keygen(Coloader({"keygen", "--out", tmp_.path() + "/" + who}), env_);
    ASSERT_EQ(keygen.Wait(), 0) << keygen.Stderr();
  }
  const std::string k = tmp_.path() + "/";
  testing::WriteFile(k + "authorized", testing::ReadFile(k + "client.pub"));
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(::listen(listener, 8), 0);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  Child c(Coloader({"consume", "--endpoint", ep, "--curve-key", k + "client.key", "--server-key", k + "server.pub",
                    "--connect-timeout-ms", "20000", "--batch-size", "5", "--json"}), env_);
  for (int dropped = 0; dropped < 3; ++dropped) {
    pollfd p{listener, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 10000), 1) << "the consumer did not (re)connect: " << c.Stderr();
    const int conn = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(conn, 0);
    ::close(conn);
  }
  ::close(listener);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the old code has given up by now
  EXPECT_TRUE(c.running()) << c.Stderr();
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--tcp", ep, "--curve-key", k + "server.key",
                              "--authorized-keys", k + "authorized"});
  ASSERT_EQ(c.Wait(), 0) << c.Stderr();
  ExpectExactEpoch(ParseJsonLines(c.Stdout()).at(0));
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, TcpWithoutKeysRefusesToStartUnlessInsecure) {
  Child refused(Coloader({"serve", "--data", data_, "--name", "p", "--tcp", "tcp://127.0.0.1:*", "--quiet"}), env_);
  EXPECT_EQ(refused.Wait(), 2);
  EXPECT_NE(refused.Stderr().find("without authentication"), std::string::npos) << refused.Stderr();
  EXPECT_NE(refused.Stderr().find("--insecure"), std::string::npos) << refused.Stderr();
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--tcp", "tcp://127.0.0.1:*", "--insecure"});
  EXPECT_NE(producer->Stderr().find("INSECURE"), std::string::npos) << producer->Stderr();
  // Asked for the device path, a remote consumer is told why it gets the host path.
  Child c(Coloader({"consume", "--endpoint", TcpEndpointOf(*producer), "--batch-size", "7", "--json", "--device"}),
          env_);
  ASSERT_EQ(c.Wait(), 0) << c.Stderr();
  ExpectExactEpoch(ParseJsonLines(c.Stdout()).at(0));
  EXPECT_NE(c.Stderr().find("over tcp:// read the host path"), std::string::npos) << c.Stderr();
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, TcpConsumerThatVanishesIsDetachedByHeartbeatAndOthersStayExact) {
  // A remote consumer has no pidfd: when it dies, the heartbeat timeout (1.5 s) frees its slots.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "3", "--min-consumers", "2",
                              "--tcp", "tcp://127.0.0.1:*", "--insecure"});
  Child remote(Coloader({"consume", "--endpoint", TcpEndpointOf(*producer), "--step-ms", "1000"}), env_);
  auto local = Consume("p", {"--batch-size", "6"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 2; }));
  remote.Signal(SIGKILL);
  ASSERT_EQ(local->Wait(), 0) << local->Stderr();
  auto epochs = ParseJsonLines(local->Stdout());
  ASSERT_EQ(epochs.size(), 2u);
  for (const auto& e : epochs) ExpectExactEpoch(e);
  EXPECT_NE(producer->Stderr().find("went silent"), std::string::npos) << producer->Stderr();
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, StatusReportsConsumersAndThroughput) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "3"});
  auto consumer = Consume("p", {"--step-ms", "20", "--batch-size", "6"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 3; }));
  Child status(Coloader({"status", "--name", "p", "--json"}), env_);
  ASSERT_EQ(status.Wait(), 0);
  const std::string out = status.Stdout();
  EXPECT_NE(out.find("\"consumers\":[{"), std::string::npos) << out;
  EXPECT_NE(out.find("\"batch_size\":6"), std::string::npos) << out;
  EXPECT_NE(out.find("\"pid\":" + std::to_string(consumer->pid())), std::string::npos) << out;
  EXPECT_NE(out.find("\"state\":\"running\""), std::string::npos) << out;
  Child table(Coloader({"status", "--name", "p"}), env_);
  ASSERT_EQ(table.Wait(), 0);
  EXPECT_NE(table.Stdout().find("images/s"), std::string::npos);
  consumer->Signal(SIGKILL);
}

TEST_F(IntegrationTest, TheProducersLogLinesSayWhen) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  auto consumer = Consume("p", {});
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ASSERT_EQ(producer->Wait(20000), 0) << producer->Stderr();
  // Every line of the producer's own log: local date and time to the millisecond, then the
  // name (the progress line is off under --quiet).
  const std::regex stamped(R"(^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} \[coloader p\] .+)");
  std::istringstream lines(producer->Stderr());
  int seen = 0;
  for (std::string line; std::getline(lines, line);) {
    EXPECT_TRUE(std::regex_match(line, stamped)) << line;
    ++seen;
  }
  EXPECT_GE(seen, 3) << producer->Stderr();  // serving, connected, done at least
}

}  // namespace
}  // namespace coloader
