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

  // A consumer of this process that starts its first epoch and reads `batches` batches of it
  // (their indices into `seen`), then stops there.
  static std::unique_ptr<Consumer> ReadThenStop(const std::string& name, int batches, std::vector<int64_t>& seen) {
    std::unique_ptr<Consumer> c = Connect(name);
    if (!c) return nullptr;
    Result<bool> more = c->NextEpoch();
    EXPECT_TRUE(more.ok() && *more) << (more.ok() ? "no epoch" : more.status().ToString());
    EXPECT_TRUE(Read(*c, seen, batches));
    return c;
  }

  // Reads on until the stream says how it ended: it must be that this consumer was detached.
  static Status ReadUntilDetached(Consumer& c) {
    Result<std::optional<Batch>> b = c.Next();
    for (int n = 0; b.ok() && *b && n < 100; ++n) b = c.Next();
    EXPECT_FALSE(b.ok());
    return b.ok() ? Status::OK() : b.status();
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
  std::vector<int64_t> seen;
  std::unique_ptr<Consumer> stops = ReadThenStop("p", 3, seen);
  ASSERT_TRUE(stops);
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
  std::vector<int64_t> first_seen, late_seen;
  std::unique_ptr<Consumer> first = ReadThenStop("p", 1, first_seen);  // holds batch 0: the producer waits
  ASSERT_TRUE(first);
  // The window full (batch 0 held, 3 beyond it), the late job joins at sample 32, so that several
  // batches are decoded for it alone at its epoch's end. It waits for the stream, which goes on
  // without the first once the lag timeout has passed.
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 4; }));
  std::unique_ptr<Consumer> late = ReadThenStop("p", 1, late_seen);
  ASSERT_TRUE(late);
  ASSERT_EQ(late->split_begin(), 32u) << "the late job should have joined where the window held the stream";
  while (late->samples_seen() <= kImages - late->split_begin()) ASSERT_TRUE(Read(*late, late_seen, 1));
  EXPECT_NE(producer->Stderr().find("consumer 1 (pid " + std::to_string(::getpid()) + ") took no batch for"),
            std::string::npos)
      << producer->Stderr();
  // Both stop. The third job's rest of epoch 0 must not wait for either.
  std::unique_ptr<Consumer> third = Connect("p");
  ASSERT_TRUE(third);
  ASSERT_OK(third->Resume(0, 0, first_seen.size()));
  ASSERT_OK_AND_ASSIGN(bool more, third->NextEpoch());
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
  std::vector<int64_t> seen;
  std::unique_ptr<Consumer> stops = ReadThenStop("p", 2, seen);
  ASSERT_TRUE(stops);
  ASSERT_EQ(other->Wait(60000), 0) << other->Stderr() << producer->Stderr();
  ASSERT_EQ(producer->Wait(20000), 0) << "the run's end waited for ever: " << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("stopped reading (stall timeout)"), std::string::npos) << producer->Stderr();
  const Status ended = ReadUntilDetached(*stops);
  EXPECT_EQ(ended.code(), StatusCode::kDetached) << ended.ToString();
  EXPECT_NE(ended.message().find("so that the run could end"), std::string::npos) << ended.ToString();
}

// With --lag-timeout-ms 0 a job that stops holds the others back (the window's old meaning),
// until --stall-timeout-ms detaches it.
TEST_F(BehindTest, WithoutLagTimeoutAStoppedJobHoldsTheOthersUntilTheStallTimeout) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--window", "3", "--min-consumers", "2",
                              "--lag-timeout-ms", "0", "--stall-timeout-ms", "1500"});
  auto other = Consume("p", {"--timeout-ms", "20000"});
  std::vector<int64_t> seen;
  std::unique_ptr<Consumer> stops = ReadThenStop("p", 1, seen);
  ASSERT_TRUE(stops);
  ASSERT_EQ(other->Wait(60000), 0) << other->Stderr();
  ExpectExactEpoch(ParseJsonLines(other->Stdout()).at(0));
  EXPECT_NE(producer->Stderr().find("stopped reading (stall timeout)"), std::string::npos) << producer->Stderr();
  EXPECT_EQ(producer->Stderr().find("took no batch for"), std::string::npos) << producer->Stderr();
  const Status ended = ReadUntilDetached(*stops);
  EXPECT_EQ(ended.code(), StatusCode::kDetached) << ended.ToString();
}

}  // namespace
}  // namespace coloader
