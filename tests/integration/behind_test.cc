// Jobs that stop reading while others read on (an evaluation, a checkpoint, a pause): the
// producer takes back the batches such a job has not taken and catches it up later, decoded
// again for it alone, instead of holding every other job to it (catch_up.cc, "Behind the
// window"). Real `coloader serve` and `coloader consume` processes; the jobs that stop are
// consumers of this process, so that where each stops is exact.
#include <numeric>

#include "tests/integration/integration_fixture.h"

namespace coloader {
namespace {

class BehindTest : public IntegrationTest {
 protected:
  // A consumer of this process with a timeout: a producer that waits for the wrong job fails the
  // test with a Timeout naming who holds it back, rather than hanging.
  static std::unique_ptr<Consumer> Connect(const std::string& name) {
    ConsumerOptions o;
    o.name = name;
    o.timeout_ms = 20000;
    Result<std::unique_ptr<Consumer>> c = Consumer::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Reads `batches` batches of the epoch under way (starting it if none is), adding their
  // dataset indices to `seen`; false once the epoch has ended.
  static bool Read(Consumer& c, std::vector<int64_t>& seen, int batches) {
    for (int n = 0; n < batches; ++n) {
      Result<std::optional<Batch>> b = c.Next();
      EXPECT_TRUE(b.ok()) << b.status().ToString();
      if (!b.ok() || !*b) return false;
      seen.insert(seen.end(), (*b)->indices(), (*b)->indices() + (*b)->size());
    }
    return true;
  }

  // Reads the rest of the epoch under way, then `more` whole epochs; every one must be exact (the
  // first counted with `seen`; `resumed`: the rest of a saved one, which says it is partial).
  static void ReadOn(Consumer& c, std::vector<int64_t> seen, uint64_t first_epoch, int more, const char* who,
                     bool resumed = false) {
    Read(c, seen, 1 << 20);
    ExpectWhole(seen, first_epoch, who);
    EXPECT_EQ(c.partial(), resumed) << who << ", epoch " << first_epoch;
    // What its state_dict() would say: the epoch's order, from where it began, is whole.
    EXPECT_EQ(c.samples_seen(), static_cast<uint64_t>(kImages)) << who;
    for (int e = 1; e <= more; ++e) {
      Result<bool> next = c.NextEpoch();
      ASSERT_TRUE(next.ok() && *next) << who << ", epoch " << first_epoch + e;
      EXPECT_EQ(c.epoch(), first_epoch + e) << who;
      std::vector<int64_t> epoch;
      Read(c, epoch, 1 << 20);
      ExpectWhole(epoch, first_epoch + e, who);
      EXPECT_FALSE(c.partial()) << who << ", epoch " << first_epoch + e;
    }
  }

  static void ExpectWhole(std::vector<int64_t> seen, uint64_t epoch, const char* who) {
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(kImages);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << who << ", epoch " << epoch << ": every sample once";
  }
};

// A job stops mid-epoch (its unread batches wait in its mailbox). The other job reads all its
// epochs meanwhile: it is not held to the one that stopped, nor does that one lose anything.
TEST_F(BehindTest, AJobThatStopsMidEpochIsCaughtUpInsteadOfWaitedFor) {
  auto producer = Serve(
      "p", {"--batch-size", "8", "--epochs", "3", "--window", "3", "--min-consumers", "2", "--lag-timeout-ms", "300"});
  auto other = Consume("p", {"--batch-size", "5", "--timeout-ms", "20000"});
  std::unique_ptr<Consumer> stops = Connect("p");
  ASSERT_TRUE(stops);
  ASSERT_OK_AND_ASSIGN(bool more, stops->NextEpoch());
  ASSERT_TRUE(more);
  std::vector<int64_t> seen;
  ASSERT_TRUE(Read(*stops, seen, 3));
  // It stops here, holding its third batch, until the other job has read every epoch.
  ASSERT_EQ(other->Wait(60000), 0) << "the other job was held to the one that stopped: " << other->Stderr()
                                   << producer->Stderr();
  const auto others = ParseJsonLines(other->Stdout());
  ASSERT_EQ(others.size(), 3u) << other->Stdout();
  for (const auto& e : others) ExpectExactEpoch(e);
  EXPECT_NE(producer->Stderr().find("took no batch for"), std::string::npos) << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("is decoded again for it alone"), std::string::npos) << producer->Stderr();
  // Its epoch goes on where it stopped: the rest of epoch 0 decoded for it, then epochs 1 and 2.
  ReadOn(*stops, seen, 0, 2, "the job that stopped");
  stops.reset();
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
}

// Two jobs stop: one holding its first batch, the other (which joined late, after the first
// stopped) once it reads the part of its epoch decoded for it alone. A third job, resumed from a
// state while both are stopped (the first one's first batch read), is owed the rest of epoch 0,
// decoded for it alone: the second, whose turn it was, took none of its batches, so they go back
// and it comes after (parked). All three are exact when they read again.
TEST_F(BehindTest, JobsThatStopWhileSharedOrWhileCaughtUpHoldNobodyBack) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "3", "--window", "3", "--lag-timeout-ms", "300"});
  std::unique_ptr<Consumer> first = Connect("p");
  ASSERT_TRUE(first);
  ASSERT_OK_AND_ASSIGN(bool more, first->NextEpoch());
  ASSERT_TRUE(more);
  std::vector<int64_t> first_seen, late_seen;
  ASSERT_TRUE(Read(*first, first_seen, 1));  // holds batch 0; the producer waits inside epoch 0
  // The window full (batch 0 held, 3 beyond it), the late job joins at sample 32, so that several
  // batches are decoded for it alone at its epoch's end. It waits for the stream, which goes on
  // without the first once the lag timeout has passed.
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 4; }));
  std::unique_ptr<Consumer> late = Connect("p");
  ASSERT_TRUE(late);
  ASSERT_OK_AND_ASSIGN(more, late->NextEpoch());
  ASSERT_TRUE(more);
  ASSERT_TRUE(Read(*late, late_seen, 1));
  ASSERT_EQ(late->split_begin(), 32u) << "the late job should have joined where the window held the stream";
  while (late->samples_seen() <= kImages - late->split_begin()) ASSERT_TRUE(Read(*late, late_seen, 1));
  EXPECT_NE(producer->Stderr().find("consumer 1 (pid " + std::to_string(::getpid()) + ") took no batch for"),
            std::string::npos)
      << producer->Stderr();
  // Both stop. The third job's rest of epoch 0 must not wait for either.
  std::unique_ptr<Consumer> third = Connect("p");
  ASSERT_TRUE(third);
  ASSERT_OK(third->Resume(0, 0, first_seen.size()));
  ASSERT_OK_AND_ASSIGN(more, third->NextEpoch());
  ASSERT_TRUE(more);
  ReadOn(*third, first_seen, 0, 2, "the resumed job", /*resumed=*/true);
  EXPECT_NE(producer->Stderr().find("consumer 2 (pid " + std::to_string(::getpid()) +
                                    ") took none of the batches decoded for it while another waited"),
            std::string::npos)
      << producer->Stderr();
  third.reset();
  ReadOn(*first, first_seen, 0, 2, "the first job");
  ReadOn(*late, late_seen, 0, 2, "the late job");
  first.reset();
  late.reset();
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
}

// A job taken off the shared stream that never reads again costs nobody anything while the run
// goes on; once every other epoch is delivered, the run's end waits for it for --stall-timeout-ms
// at most: then it is detached, told why, and the producer ends.
TEST_F(BehindTest, AJobThatNeverReadsAgainIsDetachedOnceTheRunWaitsOnlyForIt) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "3", "--min-consumers", "2",
                              "--lag-timeout-ms", "300", "--stall-timeout-ms", "1500"});
  auto other = Consume("p", {"--timeout-ms", "20000"});
  std::unique_ptr<Consumer> stops = Connect("p");
  ASSERT_TRUE(stops);
  ASSERT_OK_AND_ASSIGN(bool more, stops->NextEpoch());
  ASSERT_TRUE(more);
  std::vector<int64_t> seen;
  ASSERT_TRUE(Read(*stops, seen, 2));
  ASSERT_EQ(other->Wait(60000), 0) << other->Stderr() << producer->Stderr();
  ASSERT_EQ(producer->Wait(20000), 0) << "the run's end waited for ever: " << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("stopped reading (stall timeout)"), std::string::npos) << producer->Stderr();
  Result<std::optional<Batch>> b = stops->Next();
  for (int n = 0; b.ok() && *b && n < 100; ++n) b = stops->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kDetached) << b.status().ToString();
  EXPECT_NE(b.status().message().find("so that the run could end"), std::string::npos) << b.status().ToString();
}

// With --lag-timeout-ms 0 a job that stops holds the others back (the window's old meaning),
// until --stall-timeout-ms detaches it.
TEST_F(BehindTest, WithoutLagTimeoutAStoppedJobHoldsTheOthersUntilTheStallTimeout) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--window", "3", "--min-consumers", "2",
                              "--lag-timeout-ms", "0", "--stall-timeout-ms", "1500"});
  auto other = Consume("p", {"--timeout-ms", "20000"});
  std::unique_ptr<Consumer> stops = Connect("p");
  ASSERT_TRUE(stops);
  ASSERT_OK_AND_ASSIGN(bool more, stops->NextEpoch());
  ASSERT_TRUE(more);
  std::vector<int64_t> seen;
  ASSERT_TRUE(Read(*stops, seen, 1));
  ASSERT_EQ(other->Wait(60000), 0) << other->Stderr();
  ExpectExactEpoch(ParseJsonLines(other->Stdout()).at(0));
  EXPECT_NE(producer->Stderr().find("stopped reading (stall timeout)"), std::string::npos) << producer->Stderr();
  EXPECT_EQ(producer->Stderr().find("took no batch for"), std::string::npos) << producer->Stderr();
  Result<std::optional<Batch>> b = stops->Next();
  for (int n = 0; b.ok() && *b && n < 100; ++n) b = stops->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kDetached) << b.status().ToString();
}

}  // namespace
}  // namespace coloader
