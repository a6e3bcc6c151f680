// Integration tests of what a consumer sees: exact epochs at any batch size, joining late or
// at a boundary, the window, kept and zero-copy batches, how a stream ends, status and logs
// (the fixture: integration_fixture.h).
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
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "client/consumer.h"
#include "common/endpoint.h"
#include "common/process.h"
#include "common/protocol.h"
#include "tests/integration/integration_fixture.h"
#include "tests/support/test_support.h"


namespace coloader {
namespace {

namespace fs = std::filesystem;

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

// Catch-up: a consumer that joins mid-epoch reads the rest of it with the others, then what it
// missed, decoded again for it alone: its first epoch is whole, and so is every one after it.
TEST_F(IntegrationTest, LateJoinerIsCaughtUpOnWhatItMissed) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "3", "--window", "3"});
  std::unique_ptr<Child> late;
  HoldEpochZeroWhile("p", 3, [&] {
    late = Consume("p", {"--batch-size", "7"});
    ASSERT_TRUE(producer->WaitForStderr("consumer 2 attached", 20000)) << producer->Stderr();
  });
  ASSERT_TRUE(late);
  ASSERT_EQ(late->Wait(), 0) << late->Stderr();
  auto late_epochs = ParseJsonLines(late->Stdout());
  ASSERT_EQ(late_epochs.size(), 3u) << late->Stdout();
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(U64(late_epochs[e], "epoch"), e);
    EXPECT_EQ(late_epochs[e].at("partial"), "false") << "epoch " << e;
    EXPECT_EQ(U64(late_epochs[e], "samples"), static_cast<uint64_t>(kImages)) << "epoch " << e;
    EXPECT_EQ(U64(late_epochs[e], "unique_samples"), static_cast<uint64_t>(kImages)) << "epoch " << e;
    EXPECT_EQ(U64(late_epochs[e], "batches"), (kImages + 6u) / 7u) << "epoch " << e;
  }
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
}

// Resume while shared: a job caught up from position P (its epoch runs P..N-1, then 0..P-1)
// saves its state, once within the shared part and once within the part decoded for it, and
// is closed; restarted from the state while another job reads on in epoch 1, it gets exactly
// the positions of epoch 0 it had not read (the producer serves them, wrapping round the
// epoch's end), then whole epochs 1 and 2.
TEST_F(IntegrationTest, AJobResumedWhileAnotherReadsOnGetsExactlyTheRestOfItsEpoch) {
  for (const bool in_own_part : {false, true}) {
    SCOPED_TRACE(in_own_part ? "saved within the part decoded for it" : "saved within the shared part");
    const std::string name = in_own_part ? "own" : "shared";
    // Spare slots enough for B's batches while the holder, waiting for C, keeps its window full.
    auto producer = Serve(name, {"--batch-size", "8", "--epochs", "3", "--window", "3", "--spare-slots", "6"});
    std::atomic<int> stage{0};  // 1: the holder holds epoch 0's first batch; 2: B attached; 3: C attached
    auto wait_stage = [&](int at_least) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (stage.load() < at_least && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      return stage.load() >= at_least;
    };
    std::vector<std::vector<int64_t>> held_epochs(3);
    std::thread holder([&] {
      ConsumerOptions o;
      o.name = name;
      auto first = Consumer::Connect(o);
      if (!first.ok()) return;
      for (int epoch = 0; epoch < 3; ++epoch) {
        auto more = (*first)->NextEpoch();
        if (!more.ok() || !*more) return;
        for (int n = 0;; ++n) {
          auto b = (*first)->Next();
          if (!b.ok() || !*b) break;
          held_epochs[epoch].insert(held_epochs[epoch].end(), (*b)->indices(), (*b)->indices() + (*b)->size());
          if (epoch == 0 && n == 0) {  // the producer stays mid-epoch 0 while B joins
            stage = 1;
            if (!wait_stage(2)) return;
          }
          if (epoch == 1 && n == 0 && !wait_stage(3)) return;  // ... and in epoch 1 while C comes
        }
      }
    });
    struct Joiner {  // an assertion that returns early lets the holder read on, and joins it
      std::thread& t;
      std::atomic<int>& stage;
      ~Joiner() {
        stage = 99;
        if (t.joinable()) t.join();
      }
    } joiner{holder, stage};
    ASSERT_TRUE(wait_stage(1));
    ConsumerOptions ob;
    ob.name = name;
    ob.batch_size = 5;
    ob.timeout_ms = 20000;  // a stall fails the test, saying who holds the producer back
    ASSERT_OK_AND_ASSIGN(auto b, Consumer::Connect(ob));
    ASSERT_OK(b->NextEpoch(0).status());  // attaches; its first batch comes once the holder reads on
    ASSERT_TRUE(producer->WaitForStderr("consumer 2 attached", 20000)) << producer->Stderr();
    stage = 2;
    ASSERT_OK_AND_ASSIGN(bool more, b->NextEpoch());
    ASSERT_TRUE(more);
    const uint64_t begin = b->split_begin();
    ASSERT_GT(begin, 0u);  // it joined mid-epoch
    const uint64_t shared_part = kImages - begin;
    // Saved 2 batches into the shared part, or 2 batches into its own.
    const uint64_t save_at = in_own_part ? shared_part + 10 : 10;
    ASSERT_LT(save_at, static_cast<uint64_t>(kImages));
    std::vector<int64_t> seen;
    while (b->samples_seen() < save_at) {
      ASSERT_OK_AND_ASSIGN(std::optional<Batch> batch, b->Next());
      ASSERT_TRUE(batch);
      seen.insert(seen.end(), batch->indices(), batch->indices() + batch->size());
    }
    const uint64_t epoch = b->epoch(), samples = b->samples_seen();
    EXPECT_EQ(b->split_begin(), begin);
    EXPECT_EQ(samples, seen.size());
    b.reset();  // the job dies

    // As load_state_dict() on a Loader made before: Resume() checks the state (its positions
    // wrap round the epoch's end when saved in its own part) before the first epoch.
    ASSERT_OK_AND_ASSIGN(auto c, Consumer::Connect(ob));
    ASSERT_OK(c->Resume(epoch, begin, samples));
    // The holder reads on once C is attached (C's batches need the slots the holder frees).
    ASSERT_OK(c->NextEpoch(0).status());
    ASSERT_TRUE(producer->WaitForStderr("consumer 3 attached", 20000)) << producer->Stderr();
    stage = 3;
    std::vector<std::vector<int64_t>> c_epochs;
    for (;;) {
      ASSERT_OK_AND_ASSIGN(bool again, c->NextEpoch());
      if (!again) break;
      c_epochs.emplace_back();
      EXPECT_EQ(c->epoch(), c_epochs.size() - 1);
      EXPECT_EQ(c->partial(), c_epochs.size() == 1) << "epoch " << c->epoch();
      for (;;) {
        Result<std::optional<Batch>> next = c->Next();
        ASSERT_TRUE(next.ok()) << next.status().ToString() << "\n" << producer->Stderr();
        std::optional<Batch> batch = *std::move(next);
        if (!batch) break;
        c_epochs.back().insert(c_epochs.back().end(), batch->indices(), batch->indices() + batch->size());
      }
    }
    EXPECT_EQ(c->resume_note(), "");
    stage = 99;
    holder.join();
    std::vector<int64_t> all(kImages);
    std::iota(all.begin(), all.end(), 0);
    ASSERT_EQ(c_epochs.size(), 3u);
    std::vector<int64_t> epoch0 = seen;
    epoch0.insert(epoch0.end(), c_epochs[0].begin(), c_epochs[0].end());
    std::sort(epoch0.begin(), epoch0.end());
    EXPECT_EQ(epoch0, all) << "what B read and C got of epoch 0";
    for (size_t e = 1; e < 3; ++e) {
      std::sort(c_epochs[e].begin(), c_epochs[e].end());
      EXPECT_EQ(c_epochs[e], all) << "C's epoch " << e;
    }
    for (size_t e = 0; e < 3; ++e) {
      std::sort(held_epochs[e].begin(), held_epochs[e].end());
      EXPECT_EQ(held_epochs[e], all) << "the holder's epoch " << e;
    }
    EXPECT_NE(producer->Stderr().find("resumes a saved state: " + std::to_string(kImages - samples) +
                                      " sample(s) of epoch 0 decoded again for it"),
              std::string::npos)
        << producer->Stderr();
    ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
  }
}

// Issue 39, test 1: a job joining in each of three epochs, while two others read on, gets whole
// epochs, at batch sizes that do and do not divide N. This process holds a batch of epoch k so
// that the producer stays mid-epoch (the window) until the k-th late job has attached.
TEST_F(IntegrationTest, JobsJoiningInEachEpochGetWholeEpochsWhileOthersReadOn) {
  // Both shared readers from the start (the other reads on by itself); the late ones are 3, 4, 5.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "6", "--window", "3", "--min-consumers", "2"});
  auto other = Consume("p", {"--batch-size", "5", "--checksum"});
  ASSERT_TRUE(producer->WaitForStderr("consumer 1 attached", 20000)) << producer->Stderr();
  const std::vector<std::string> sizes = {"7", "103", "1"};
  std::vector<std::unique_ptr<Child>> late;
  ConsumerOptions o;
  o.name = "p";
  ASSERT_OK_AND_ASSIGN(auto reader, Consumer::Connect(o));
  for (uint64_t epoch = 0; epoch < 6; ++epoch) {
    ASSERT_OK_AND_ASSIGN(bool more, reader->NextEpoch());
    ASSERT_TRUE(more) << "epoch " << epoch;
    std::vector<int64_t> seen;
    for (size_t n = 0;; ++n) {
      ASSERT_OK_AND_ASSIGN(std::optional<Batch> b, reader->Next());
      if (!b) break;
      seen.insert(seen.end(), b->indices(), b->indices() + b->size());
      if (epoch < sizes.size() && n == epoch + 1) {  // held while the next job joins
        late.push_back(Consume("p", {"--batch-size", sizes[epoch], "--epochs", "3", "--checksum"}));
        const std::string attached = "consumer " + std::to_string(3 + epoch) + " attached";
        ASSERT_TRUE(producer->WaitForStderr(attached, 20000)) << producer->Stderr();
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(kImages)) << "the reader's epoch " << epoch;
  }
  ASSERT_EQ(other->Wait(), 0) << other->Stderr();
  const auto others = ParseJsonLines(other->Stdout());
  ASSERT_EQ(others.size(), 6u) << other->Stdout();
  for (const auto& e : others) ExpectExactEpoch(e);
  for (size_t k = 0; k < late.size(); ++k) {
    ASSERT_EQ(late[k]->Wait(), 0) << late[k]->Stderr();
    const auto epochs = ParseJsonLines(late[k]->Stdout());
    ASSERT_EQ(epochs.size(), 3u) << late[k]->Stdout();
    for (size_t e = 0; e < 3; ++e) {
      EXPECT_EQ(U64(epochs[e], "epoch"), k + e) << "job " << k;
      EXPECT_EQ(epochs[e].at("partial"), "false") << "job " << k << ", epoch " << e;
      ExpectExactEpoch(epochs[e]);
      // The samples decoded again are the same bytes as the shared stream's.
      EXPECT_EQ(epochs[e].at("content_hash"), others[k + e].at("content_hash")) << "job " << k << ", epoch " << e;
    }
    // It came mid-epoch: the producer says what it owed it.
    EXPECT_NE(producer->Stderr().find("consumer " + std::to_string(3 + k) + " joined epoch " + std::to_string(k) +
                                      " at sample "),
              std::string::npos)
        << producer->Stderr();
  }
  reader.reset();
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, WithoutCatchUpALateJoinerGetsTheRestThenWholeEpochs) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "3", "--window", "3", "--no-catch-up"});
  std::unique_ptr<Child> late;
  HoldEpochZeroWhile("p", 3, [&] {
    late = Consume("p");
    ASSERT_TRUE(producer->WaitForStderr("consumer 2 attached", 20000)) << producer->Stderr();
  });
  ASSERT_TRUE(late);
  ASSERT_EQ(late->Wait(), 0) << late->Stderr();
  auto late_epochs = ParseJsonLines(late->Stdout());
  ASSERT_EQ(late_epochs.size(), 3u) << late->Stdout();
  EXPECT_EQ(late_epochs[0].at("partial"), "true");
  EXPECT_EQ(U64(late_epochs[0], "epoch"), 0u);
  EXPECT_LT(U64(late_epochs[0], "samples"), static_cast<uint64_t>(kImages));
  EXPECT_GT(U64(late_epochs[0], "samples"), 0u);
  EXPECT_EQ(U64(late_epochs[0], "samples"), U64(late_epochs[0], "unique_samples"));
  ExpectExactEpoch(late_epochs[1]);
  ExpectExactEpoch(late_epochs[2]);
}

TEST_F(IntegrationTest, WaitForEpochJoinsAtTheNextBoundary) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "3", "--window", "3"});
  std::unique_ptr<Child> waiter;
  HoldEpochZeroWhile("p", 3, [&] {
    waiter = Consume("p", {"--wait-for-epoch"});
    ASSERT_TRUE(producer->WaitForStderr("waits for the next epoch", 20000)) << producer->Stderr();
  });
  ASSERT_TRUE(waiter);
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
  ConsumerOptions o;
  o.name = "p";
  ASSERT_OK_AND_ASSIGN(auto consumer, Consumer::Connect(o));
  for (int epoch = 0; epoch < 2; ++epoch) {
    ASSERT_OK_AND_ASSIGN(bool more, consumer->NextEpoch());
    ASSERT_TRUE(more);
    std::vector<int64_t> seen;
    for (int n = 0;; ++n) {
      ASSERT_OK_AND_ASSIGN(std::optional<Batch> b, consumer->Next());
      if (!b) break;
      seen.insert(seen.end(), b->indices(), b->indices() + b->size());
      if (epoch > 0 || (n != 0 && n != 10)) continue;
      // Holding this batch and reading no further: the producer runs ahead until the window
      // is full, then waits. The window counts from how far the consumer has read: the batch
      // it holds plus `window` published beyond it.
      ASSERT_TRUE(WaitForStatus("p", [&](const JsonLine& s) { return U64(s, "slots_in_use") == window + 1; }))
          << "batch " << n << ": the producer should run ahead up to the window";
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // give a wrong producer time to overrun
      JsonLine s = StatusOf("p");
      EXPECT_EQ(U64(s, "slots"), window + spare);
      EXPECT_EQ(U64(s, "slots_in_use"), window + 1) << "batch " << n;
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(kImages);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << "epoch " << epoch;
  }
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
  ASSERT_OK_AND_ASSIGN(Waited<bool> began, holder->NextEpoch(0));
  ASSERT_FALSE(began.ready());
  ASSERT_OK_AND_ASSIGN(began, reader->NextEpoch(0));
  ASSERT_FALSE(began.ready());
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
  // Zero-copy: the held batch is the ring's slot itself, which the producer cannot ask back (a
  // copying consumer gives it back on the producer's Reclaim, and the producer may end first).
  o.zero_copy = true;
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

TEST_F(IntegrationTest, StatusReportsConsumersAndThroughput) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "3"});
  // 200 ms a batch: the run outlasts the two `status` calls below, however slowly they start
  // (at 20 ms it ended under them in a sanitizer build's pace).
  auto consumer = Consume("p", {"--step-ms", "200", "--batch-size", "6"});
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

TEST_F(IntegrationTest, StatusWithoutANameListsTheRunningProducersAndAMisspeltNameGetsTheClosest) {
  auto imagenet = Serve("imagenet", {"--batch-size", "8", "--forever"});
  auto eval = Serve("eval-set", {"--batch-size", "8", "--forever"});
  Child list(Coloader({"status"}), env_);
  ASSERT_EQ(list.Wait(), 0) << list.Stderr();
  for (const auto& [name, child] : {std::pair{"imagenet", imagenet.get()}, std::pair{"eval-set", eval.get()}}) {
    const std::regex row(std::string("(^|\n)") + name + " +" + std::to_string(child->pid()) + " +waiting for consumers ");
    EXPECT_TRUE(std::regex_search(list.Stdout(), row)) << list.Stdout();
  }
  Child json(Coloader({"status", "--json"}), env_);
  ASSERT_EQ(json.Wait(), 0) << json.Stderr();
  for (const auto& [name, child] : {std::pair{"eval-set", eval.get()}, std::pair{"imagenet", imagenet.get()}}) {
    EXPECT_NE(json.Stdout().find(std::string("{\"name\":\"") + name + "\",\"pid\":" + std::to_string(child->pid()) +
                                 ",\"state\":\"waiting for consumers\""),
              std::string::npos)
        << json.Stdout();
  }
  EXPECT_NE(json.Stdout().find("\"leftovers\":["), std::string::npos) << json.Stdout();
  Child typo(Coloader({"status", "--name", "imagnet"}), env_);
  EXPECT_EQ(typo.Wait(), 1);
  EXPECT_NE(typo.Stderr().find("no producer named 'imagnet' is running; did you mean 'imagenet'? (running here: "
                               "eval-set, imagenet)"),
            std::string::npos)
      << typo.Stderr();
  Child far(Coloader({"status", "--name", "cifar"}), env_);
  EXPECT_EQ(far.Wait(), 1);
  EXPECT_NE(far.Stderr().find("no producer named 'cifar' is running; running here: eval-set, imagenet"),
            std::string::npos)
      << far.Stderr();
  // A job that names a producer not running here gets the same hint (the Python Loader too).
  Child job(Coloader({"consume", "--name", "imagnet", "--wait-ms", "0"}), env_);
  EXPECT_EQ(job.Wait(), 1);
  EXPECT_NE(job.Stderr().find("); did you mean 'imagenet'? (running here: eval-set, imagenet); start one with: "),
            std::string::npos)
      << job.Stderr();
  imagenet->Signal(SIGTERM);
  eval->Signal(SIGTERM);
  EXPECT_EQ(imagenet->Wait(10000), 0) << imagenet->Stderr();
  EXPECT_EQ(eval->Wait(10000), 0) << eval->Stderr();
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
