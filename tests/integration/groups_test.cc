// Consumer groups across real processes: a real `coloader serve`, real `coloader consume
// --group` ranks, real sockets and shared memory. What each rank saw is read from its
// `consume --json --indices` lines (every sample's dataset index), and checked against the
// split rule (common/split.h): per epoch each rank gets the same number of batches and
// samples, and the union of a group's ranks is the whole epoch, with fewer than W repeats.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "common/endpoint.h"
#include "common/split.h"
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

constexpr uint64_t kImages = 103;  // a prime: no group size or batch size below divides it

using testing::Indices;

class GroupsTest : public testing::ProducerTest {
 protected:
  GroupsTest() : ProducerTest({static_cast<int>(kImages), 5, 16, {"--indices"}}) {}

  std::vector<std::unique_ptr<Child>> Group(const std::string& name, const std::string& group, uint32_t w, uint32_t b,
                                            std::vector<std::string> extra = {}) {
    std::vector<std::unique_ptr<Child>> ranks;
    for (uint32_t r = 0; r < w; ++r) {
      std::vector<std::string> args = {"--group", group, "--rank", std::to_string(r), "--world-size", std::to_string(w),
                                       "--batch-size", std::to_string(b)};
      args.insert(args.end(), extra.begin(), extra.end());
      ranks.push_back(Consume(name, args));
    }
    return ranks;
  }

  // Every rank exited cleanly with `epochs` epochs, each rank's share as the rule says, and
  // per epoch the union of the group's samples is the whole dataset (W*T in all: fewer than W
  // of them repeated).
  void ExpectExactGroup(std::vector<std::unique_ptr<Child>>& ranks, uint32_t b, size_t epochs) {
    const auto w = static_cast<uint32_t>(ranks.size());
    std::vector<std::vector<JsonLine>> lines;
    for (auto& r : ranks) {
      ASSERT_EQ(r->Wait(), 0) << r->Stderr();
      lines.push_back(ParseJsonLines(r->Stdout()));
      ASSERT_EQ(lines.back().size(), epochs) << r->Stdout();
    }
    auto plan = PlanSplit(SplitSpec{0, kImages, w, 0, b, false});
    ASSERT_TRUE(plan.ok());
    for (size_t e = 0; e < epochs; ++e) {
      std::map<int64_t, int> seen;
      for (uint32_t r = 0; r < w; ++r) {
        const JsonLine& l = lines[r][e];
        EXPECT_EQ(U64(l, "epoch"), e);
        EXPECT_EQ(l.at("partial"), "false");
        EXPECT_EQ(U64(l, "rank"), r);
        EXPECT_EQ(U64(l, "batches"), plan->batches) << "rank " << r << " epoch " << e;
        EXPECT_EQ(U64(l, "expected_batches"), plan->batches);
        EXPECT_EQ(U64(l, "samples"), plan->per_rank) << "rank " << r << " epoch " << e;
        for (int64_t i : Indices(l)) ++seen[i];
      }
      EXPECT_EQ(seen.size(), kImages) << "epoch " << e << ": the group's union is not the whole dataset";
      uint64_t total = 0;
      for (const auto& [i, c] : seen) {
        EXPECT_GE(i, 0);
        EXPECT_LT(i, static_cast<int64_t>(kImages));
        total += static_cast<uint64_t>(c);
      }
      EXPECT_EQ(total, uint64_t{w} * plan->per_rank);
      EXPECT_LT(total - kImages, w);
    }
  }

  // A group of 2 ranks (batches of 6) started once 3 batches of epoch 0 are out, while a slow
  // reader holds the producer within --window of it: what each rank's `consume --json` lines say.
  std::vector<std::vector<JsonLine>> LateGroupsLines(const std::vector<std::string>& serve_flags) {
    std::vector<std::string> flags = {"--batch-size", "8", "--epochs", "3", "--window", "2"};
    flags.insert(flags.end(), serve_flags.begin(), serve_flags.end());
    auto producer = Serve("p", flags);
    // A slow reader of epoch 0 (13 batches at 200 ms) holds the producer within --window of it,
    // so the group, started once 3 batches are out, joins mid-epoch even on a loaded machine
    // (at 15 ms a step, under ASan and a busy CI box, epoch 0 was sometimes over first).
    auto early = Consume("p", {"--step-ms", "200", "--epochs", "1"});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      Child status(Coloader({"status", "--name", "p", "--json"}), env_);
      EXPECT_EQ(status.Wait(10000), 0);
      auto s = ParseJsonLines(status.Stdout());
      if (!s.empty() && U64(s[0], "batches_published") >= 3) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "epoch 0 did not get 3 batches out in 20 s";
        return {};
      }
    }
    auto ranks = Group("p", "late", 2, 6);
    std::vector<std::vector<JsonLine>> lines;
    for (auto& r : ranks) {
      EXPECT_EQ(r->Wait(), 0) << r->Stderr();
      lines.push_back(ParseJsonLines(r->Stdout()));
    }
    EXPECT_EQ(early->Wait(), 0) << early->Stderr();
    return lines;
  }
};

TEST_F(GroupsTest, MixedGroupsAndAPlainConsumerOnOneProducerAreEachExact) {
  // A 4-rank group with batches of 5 (straddling producer slots of 16), a 2-rank group with
  // batches of 16, and a plain consumer: 7 processes, each counted by --min-consumers.
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "3", "--min-consumers", "7", "--window", "3"});
  auto four = Group("p", "job-a", 4, 5);
  auto two = Group("p", "job-b", 2, 16);
  auto plain = Consume("p", {"--batch-size", "7"});
  ExpectExactGroup(four, 5, 3);
  ExpectExactGroup(two, 16, 3);
  ASSERT_EQ(plain->Wait(), 0) << plain->Stderr();
  auto epochs = ParseJsonLines(plain->Stdout());
  ASSERT_EQ(epochs.size(), 3u);
  for (const auto& e : epochs) testing::ExpectExactEpoch(e, kImages);
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("group job-a: all 4 rank(s) attached"), std::string::npos) << producer->Stderr();
}

TEST_F(GroupsTest, BadFilesLeaveEveryRankTheSameNumberOfBatches) {
  // The hardening issue's case: 42 files of which 2 are bad, a 2-rank group with batches of 1,
  // --on-bad-file skip. Before, a skipped file left a hole in one rank's share (21 batches to
  // one rank, 7 to the other: a DDP job hangs in its all-reduce); now its place is taken by the
  // next good sample of its producer batch, so both ranks get 21 and a plain consumer's len()
  // is what it reads. With producer batches of 1 a bad file's batch has no good sample: it
  // goes round again with the next file of the dataset.
  const std::string data = tmp_.path() + "/withbad";
  testing::MakeImageFolder(data, 40, 2);
  testing::WriteFile(data + "/class0/zz_text.jpg", "this is not an image");
  const std::string jpeg = testing::ReadFile(data + "/class1/img00001.jpg");
  testing::WriteFile(data + "/class1/zz_truncated.jpg", jpeg.substr(0, jpeg.size() / 2));
  for (const char* producer_batch : {"4", "1"}) {
    SCOPED_TRACE(std::string("producer batches of ") + producer_batch);
    const std::string name = std::string("b") + producer_batch;
    std::vector<std::string> args = {"serve", "--data", data, "--name", name, "--image-size", "16", "--quiet",
                                     "--batch-size", producer_batch, "--epochs", "2", "--min-consumers", "3"};
    Child producer(Coloader(args), env_);
    ASSERT_TRUE(producer.WaitForStderr("serving", 20000)) << producer.Stderr();
    auto ranks = Group(name, "job", 2, 1);
    auto plain = Consume(name, {"--batch-size", "5"});
    for (auto& r : ranks) {
      ASSERT_EQ(r->Wait(), 0) << r->Stderr();
      const auto epochs = ParseJsonLines(r->Stdout());
      EXPECT_EQ(epochs.size(), 2u) << r->Stdout();
      for (const JsonLine& e : epochs) {
        EXPECT_EQ(U64(e, "batches"), 21u) << r->Stdout();
        EXPECT_EQ(U64(e, "expected_batches"), 21u);
      }
    }
    ASSERT_EQ(plain->Wait(), 0) << plain->Stderr();
    for (const JsonLine& e : ParseJsonLines(plain->Stdout())) {
      EXPECT_EQ(U64(e, "batches"), U64(e, "expected_batches")) << "len() is what an epoch yields";
      EXPECT_EQ(U64(e, "samples"), 42u);
      EXPECT_EQ(U64(e, "unique_samples"), 40u);
    }
    EXPECT_EQ(producer.Wait(20000), 0) << producer.Stderr();
    EXPECT_NE(producer.Stderr().find("zz_text.jpg"), std::string::npos) << producer.Stderr();
  }
}

TEST_F(GroupsTest, AGroupOfOneIsThePlainConsumer) {
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "2", "--min-consumers", "2", "--no-shuffle"});
  auto one = Consume("p", {"--group", "solo", "--rank", "0", "--world-size", "1", "--batch-size", "10"});
  auto plain = Consume("p", {"--batch-size", "10"});
  ASSERT_EQ(one->Wait(), 0) << one->Stderr();
  ASSERT_EQ(plain->Wait(), 0) << plain->Stderr();
  auto a = ParseJsonLines(one->Stdout()), b = ParseJsonLines(plain->Stdout());
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(Indices(a[e]), Indices(b[e]));  // the same samples in the same batches' order
    EXPECT_EQ(U64(a[e], "batches"), U64(b[e], "batches"));
  }
}

TEST_F(GroupsTest, DropLastGivesEveryRankTheSameFullBatchesAndNoRepeats) {
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "1", "--min-consumers", "3"});
  auto ranks = Group("p", "g", 3, 8, {"--drop-last"});
  std::set<int64_t> seen;
  uint64_t total = 0;
  for (auto& r : ranks) {
    ASSERT_EQ(r->Wait(), 0) << r->Stderr();
    auto lines = ParseJsonLines(r->Stdout());
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(U64(lines[0], "batches"), 4u);  // floor(floor(103 / 3) / 8)
    EXPECT_EQ(U64(lines[0], "samples"), 32u);
    for (int64_t i : Indices(lines[0])) {
      EXPECT_TRUE(seen.insert(i).second) << "index " << i << " twice";
      ++total;
    }
  }
  EXPECT_EQ(total, 96u);
}

TEST_F(GroupsTest, ARankThatFinishesFirstLetsTheSlowerRanksEndTheirEpoch) {
  // The end of every DDP job: the ranks finish their last epoch a moment apart. Rank 1 reads
  // fast and leaves as soon as its share is done (and the stream's epoch has ended); rank 0,
  // slow, still has up to --window batches of the epoch to read: it must get them, not
  // GroupBroken. Found by the Slurm test under load.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "3", "--min-consumers", "2", "--window", "3"});
  std::vector<std::unique_ptr<Child>> ranks;
  ranks.push_back(Consume("p", {"--group", "job-a", "--rank", "0", "--world-size", "2", "--batch-size", "8",
                                "--epochs", "2", "--step-ms", "40"}));
  ranks.push_back(Consume("p", {"--group", "job-a", "--rank", "1", "--world-size", "2", "--batch-size", "8",
                                "--epochs", "2"}));
  ASSERT_EQ(ranks[1]->Wait(30000), 0) << ranks[1]->Stderr();
  ExpectExactGroup(ranks, 8, 2);
  EXPECT_TRUE(producer->WaitForStderr("left after taking its share of the epoch", 10000)) << producer->Stderr();
}

TEST_F(GroupsTest, TheRankOfAMemberThatFinishedCannotBeTakenWhileItsGroupRuns) {
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--min-consumers", "2", "--window", "3"});
  auto slow = Consume("p", {"--group", "job-a", "--rank", "0", "--world-size", "2", "--batch-size", "8",
                            "--epochs", "3", "--step-ms", "100"});
  auto fast = Consume("p", {"--group", "job-a", "--rank", "1", "--world-size", "2", "--batch-size", "8",
                            "--epochs", "1"});
  ASSERT_EQ(fast->Wait(30000), 0) << fast->Stderr();
  ASSERT_TRUE(producer->WaitForStderr("left after taking its share of the epoch", 10000)) << producer->Stderr();
  // Rank 0 reads on (three epochs at 100 ms a step: seconds); a new process claiming rank 1
  // would wait forever for a group start that happened without it: it is refused instead.
  auto late = Consume("p", {"--group", "job-a", "--rank", "1", "--world-size", "2", "--batch-size", "8"});
  EXPECT_EQ(late->Wait(20000), 1) << late->Stderr();
  EXPECT_NE(late->Stderr().find("is running without rank 1"), std::string::npos) << late->Stderr();
  EXPECT_EQ(slow->Wait(30000), 0) << slow->Stderr();
}

TEST_F(GroupsTest, AKilledMemberEndsItsGroupWithinTheTimeoutAndOthersCarryOn) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "3", "--min-consumers", "4", "--window", "3"});
  auto ranks = Group("p", "job-a", 3, 4, {"--step-ms", "30"});
  auto plain = Consume("p", {"--batch-size", "5"});
  ASSERT_TRUE(ranks[0]->WaitForStdout("\"epoch\":0", 30000)) << ranks[0]->Stderr();
  const auto t0 = std::chrono::steady_clock::now();
  ranks[2]->Signal(SIGKILL);
  for (int r : {0, 1}) {
    EXPECT_EQ(ranks[r]->Wait(20000), 1) << ranks[r]->Stderr();
    EXPECT_NE(ranks[r]->Stderr().find("rank 2 of group job-a left at epoch"), std::string::npos) << ranks[r]->Stderr();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 1.5 + 2.0);  // the heartbeat timeout, plus slack (pidfd sees it at once)
  ASSERT_EQ(plain->Wait(), 0) << plain->Stderr();
  auto epochs = ParseJsonLines(plain->Stdout());
  ASSERT_EQ(epochs.size(), 3u);
  for (const auto& e : epochs) testing::ExpectExactEpoch(e, kImages);
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

TEST_F(GroupsTest, AMemberWaitsForItsGroupAndNothingIsLostMeanwhile) {
  // Rank 0 comes first and the producer could run: it does not get batches (nor does the
  // stream advance past them) until rank 1 is there; then both start at the same batch.
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "1"});
  auto first = Consume("p", {"--group", "g", "--rank", "0", "--world-size", "2", "--batch-size", "8"});
  // Attached, not just connected: from here the producer could publish to it, and must not.
  ASSERT_TRUE(producer->WaitForStderr("consumer 1 attached", 20000)) << producer->Stderr();
  Child status(Coloader({"status", "--name", "p", "--json"}), env_);
  ASSERT_EQ(status.Wait(10000), 0) << status.Stderr();
  auto s = ParseJsonLines(status.Stdout());
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(U64(s[0], "batches_published"), 0u) << status.Stdout();
  Child text(Coloader({"status", "--name", "p"}), env_);
  ASSERT_EQ(text.Wait(10000), 0) << text.Stderr();
  EXPECT_NE(text.Stdout().find("rank 0 of 2 in group g: waiting for the rest of its group"), std::string::npos)
      << text.Stdout();
  auto second = Consume("p", {"--group", "g", "--rank", "1", "--world-size", "2", "--batch-size", "8"});
  std::vector<std::unique_ptr<Child>> ranks;
  ranks.push_back(std::move(first));
  ranks.push_back(std::move(second));
  ExpectExactGroup(ranks, 8, 1);
}

TEST_F(GroupsTest, ALateGroupIsCaughtUpToWholeEpochsSplitEqually) {
  // The producer serves the group the rest of epoch 0 with the slow reader, then the positions it
  // missed, decoded again once for both ranks: each rank's split is of the whole epoch, in its
  // order from where the group joined round the epoch's end. A step of it (2 x 6 samples) spans
  // two producer batches of 8: the ring needs two spare slots for it.
  const auto lines = LateGroupsLines({"--spare-slots", "2"});
  ASSERT_EQ(lines.size(), 2u);
  ASSERT_EQ(lines[0].size(), 3u) << "3 epochs for each rank";
  ASSERT_EQ(lines[1].size(), 3u);
  auto plan = PlanSplit(SplitSpec{0, kImages, 2, 0, 6, false});
  ASSERT_TRUE(plan.ok());
  EXPECT_GT(U64(lines[0][0], "split_origin"), 0u) << "the group joined after 3 batches of epoch 0";
  for (size_t e = 0; e < 3; ++e) {
    std::map<int64_t, int> seen;
    for (int r : {0, 1}) {
      const JsonLine& l = lines[r][e];
      EXPECT_EQ(U64(l, "epoch"), e);
      EXPECT_EQ(l.at("partial"), "false") << "rank " << r << " epoch " << e << " was not caught up";
      EXPECT_EQ(U64(l, "split_begin"), 0u);
      EXPECT_EQ(U64(l, "split_origin"), U64(lines[0][e], "split_origin")) << "both ranks split one order";
      EXPECT_EQ(U64(l, "batches"), plan->batches) << "rank " << r << " epoch " << e;
      EXPECT_EQ(U64(l, "samples"), plan->per_rank) << "rank " << r << " epoch " << e;
      for (int64_t i : Indices(l)) ++seen[i];
    }
    EXPECT_EQ(seen.size(), kImages) << "epoch " << e << ": the group's union is not the whole dataset";
    uint64_t repeats = 0;
    for (const auto& [i, c] : seen) repeats += static_cast<uint64_t>(c - 1);
    EXPECT_EQ(repeats, 2 * plan->per_rank - kImages) << "epoch " << e << ": only the split's padding repeats";
  }
}

TEST_F(GroupsTest, ALateGroupWhoseStepTheSpareSlotsCannotHoldGetsTheRestAndIsToldWhy) {
  // --window 2 leaves one spare slot; a step of the group needs two batches at once.
  const auto lines = LateGroupsLines({});
  ASSERT_EQ(lines.size(), 2u);
  ASSERT_FALSE(lines[0].empty());
  EXPECT_EQ(lines[0][0].at("partial"), "true");
  const std::string why = lines[0][0].count("no_catch_up") ? lines[0][0].at("no_catch_up") : "";
  EXPECT_NE(why.find("takes 2 batches of 8 at once, more than the producer's 1 spare slot(s)"), std::string::npos)
      << why;
  EXPECT_NE(why.find("--spare-slots 2"), std::string::npos) << why;
}

TEST_F(GroupsTest, ALateGroupOfAProducerWithoutCatchUpGetsTheRestOfTheEpochSplitThenWholeEpochs) {
  const auto lines = LateGroupsLines({"--no-catch-up"});
  ASSERT_EQ(lines.size(), 2u);
  ASSERT_GE(lines[0].size(), 2u);
  ASSERT_EQ(lines[0].size(), lines[1].size());
  const bool partial = lines[0][0].at("partial") == "true";
  EXPECT_TRUE(partial) << "the group joined after 3 batches of epoch 0";
  const uint64_t begin = U64(lines[0][0], "split_begin");
  EXPECT_EQ(U64(lines[1][0], "split_begin"), begin);  // both ranks split the same range
  EXPECT_GT(begin, 0u);
  EXPECT_EQ(U64(lines[0][0], "split_origin"), 0u);
  auto plan = PlanSplit(SplitSpec{begin, kImages, 2, 0, 6, false});
  ASSERT_TRUE(plan.ok());
  std::set<int64_t> first;
  for (int r : {0, 1}) {
    EXPECT_EQ(U64(lines[r][0], "batches"), plan->batches);
    EXPECT_EQ(U64(lines[r][0], "samples"), plan->per_rank);
    for (int64_t i : Indices(lines[r][0])) first.insert(i);
  }
  EXPECT_EQ(first.size(), kImages - begin);  // the rest of the epoch, all of it
  for (size_t e = 1; e < lines[0].size(); ++e) {
    std::set<int64_t> all;
    for (int r : {0, 1}) {
      EXPECT_EQ(lines[r][e].at("partial"), "false");
      EXPECT_EQ(U64(lines[r][e], "samples"), 52u);  // ceil(103 / 2)
      for (int64_t i : Indices(lines[r][e])) all.insert(i);
    }
    EXPECT_EQ(all.size(), kImages);
  }
}

TEST_F(GroupsTest, ClashingRanksSizesAndTopologiesAreRefusedNamingBothSides) {
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--rank", "0", "--world-size", "1"});
  auto holder = Consume("p", {"--group", "g", "--rank", "0", "--world-size", "2"});
  ASSERT_TRUE(producer->WaitForStderr("rank 0 of group g", 20000)) << producer->Stderr();
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--group", "g", "--rank", "0", "--world-size", "2"}, "rank 0 of group g is already attached"},
      {{"--group", "g", "--rank", "1", "--world-size", "3"}, "group g has 2 ranks"},
      {{"--group", "h", "--rank", "0", "--world-size", "2", "--node-rank", "1", "--num-nodes", "2"},
       "this consumer is node 1 of 2, but producer 'p' serves shard 0 of 1 (--rank 0 --world-size 1)"},
      {{"--rank", "1", "--world-size", "2"}, "need --group"},
      {{"--group", "g", "--rank", "2", "--world-size", "2"}, "outside --world-size 2"},
      // 8 ranks of 8: the last rank's block is 56 samples (7 producer batches) past the first's.
      {{"--group", "big", "--rank", "0", "--world-size", "8", "--batch-size", "8"},
       "needs the producer to run 7 batches of 8 ahead of its first rank within a step, but producer 'p' runs "
       "with --window 4: restart it with --window 7"},
  };
  for (const Case& c : cases) {
    auto args = c.args;
    args.insert(args.end(), {"--wait-ms", "0"});
    auto refused = Consume("p", args);
    EXPECT_NE(refused->Wait(10000), 0);
    EXPECT_NE(refused->Stderr().find(c.says), std::string::npos) << refused->Stderr();
  }
  // The refusals left the waiting member alone: its partner still completes the group.
  auto partner = Consume("p", {"--group", "g", "--rank", "1", "--world-size", "2", "--epochs", "1"});
  ASSERT_TRUE(partner->WaitForStdout("\"epoch\":0", 30000)) << partner->Stderr();
}

TEST_F(GroupsTest, AConsumerStartedBeforeItsProducerWaitsByDefaultAndSaysSo) {
  auto early = Consume("p", {"--epochs", "1"});
  ASSERT_TRUE(early->WaitForStderr("waiting up to 60 s for producer 'p'", 20000)) << early->Stderr();
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "1"});
  ASSERT_EQ(early->Wait(), 0) << early->Stderr();
  testing::ExpectExactEpoch(ParseJsonLines(early->Stdout()).at(0), kImages);
  // --wait-ms 0 fails at once, as before.
  auto now = Consume("nobody", {"--wait-ms", "0"});
  EXPECT_EQ(now->Wait(10000), 1);
  EXPECT_NE(now->Stderr().find("no producer named 'nobody'"), std::string::npos) << now->Stderr();
  EXPECT_EQ(now->Stderr().find("waiting"), std::string::npos) << now->Stderr();
}

}  // namespace
}  // namespace coloader

namespace coloader {
namespace {

TEST_F(GroupsTest, ServeResumeRefusesAStateOfOtherDataAndNamesWhatIsMissing) {
  const std::string state = tmp_.path() + "/state.json";
  auto serve_with = [&](const std::string& json) {
    testing::WriteFile(state, json);
    auto serve = std::make_unique<Child>(Coloader({"serve", "--data", data_, "--name", "r", "--epochs", "2", "--seed",
                                                   "4", "--quiet", "--resume", state}),
                                         env_);
    EXPECT_EQ(serve->Wait(20000), 2) << json;
    return serve;
  };
  // Another dataset's key: refused, naming this producer's, which the cases below then carry.
  const std::string says_other = "the state was saved from data key 0123456789abcdef, but this producer's is ";
  auto other = serve_with(
      R"({"epoch": 1, "samples_seen_in_epoch": 16, "batch_size": 8, "world_size": 2, "data_key": "0123456789abcdef"})");
  const size_t at = other->Stderr().find(says_other);
  ASSERT_NE(at, std::string::npos) << other->Stderr();
  const std::string key = other->Stderr().substr(at + says_other.size(), 16);
  auto with_key = [&](const std::string& fields) { return "{" + fields + R"(, "data_key": ")" + key + R"("})"; };
  struct Case {
    std::string json, says;
  };
  const std::vector<Case> cases = {
      {with_key(R"("epoch": 1, "batch_size": 8)"), "no \"samples_seen_in_epoch\""},
      {with_key(R"("epoch": 1, "samples_seen_in_epoch": 16, "batch_size": 8, "seed": 3)"),
       "saved with --seed 3, but --seed 4"},
      {with_key(R"("epoch": 5, "samples_seen_in_epoch": 16, "batch_size": 8)"), "resumes at epoch 5, but --epochs 2"},
      {with_key(R"("epoch": 1, "samples_seen_in_epoch": 16, "batch_size": 8, "world_size": 2, "rank": 2)"),
       "rank 2 is not a rank of a world of 2"},
      {with_key(R"("epoch": 1, "samples_seen_in_epoch": 500, "batch_size": 8, "world_size": 2)"),
       "has seen 500 samples of epoch 1, but a rank's share of it is 52"},
      {R"({"epoch": 1, "samples_seen_in_epoch": 16, "batch_size": 8})", "no \"data_key\""},
      {"[1, 2]", "expected a JSON object"},
      // Issue 38: 1e30 and 2^64 resumed at epoch 0; 0.5 was truncated.
      {with_key(R"("epoch": 1e30, "samples_seen_in_epoch": 16, "batch_size": 8)"),
       "\"epoch\" must be a whole number in [0, 2^53], got 1e+30"},
      {with_key(R"("epoch": 18446744073709551616, "samples_seen_in_epoch": 16, "batch_size": 8)"),
       "\"epoch\" must be a whole number in [0, 2^53]"},
      {with_key(R"("epoch": 0.5, "samples_seen_in_epoch": 16, "batch_size": 8)"),
       "\"epoch\" must be a whole number in [0, 2^53], got 0.5"},
      {with_key(R"("epoch": 1, "samples_seen_in_epoch": 16, "batch_size": 8, "seed": 1e30)"),
       "\"seed\" must be a whole number"},
      {with_key(R"("epoch": 1, "samples_seen_in_epoch": 16, "batch_size": 8, "world_size": 2, "split_origin": 103)"),
       "split_origin 103 is outside an epoch of 103 samples"},
  };
  for (const Case& c : cases) {
    auto serve = serve_with(c.json);
    EXPECT_NE(serve->Stderr().find(c.says), std::string::npos) << c.json << ": " << serve->Stderr();
  }
  // A good one: the producer starts at the round where a 2-rank group that had taken two
  // batches of 8 resumes (2 x 2 x 8 = 32).
  testing::WriteFile(state, with_key(R"("epoch": 1, "samples_seen_in_epoch": 16, "batch_size": 8, "world_size": 2)"));
  Child serve(Coloader({"serve", "--data", data_, "--name", "r", "--epochs", "2", "--quiet", "--resume", state}), env_);
  ASSERT_TRUE(serve.WaitForStderr("resuming at epoch 1, position 32", 20000)) << serve.Stderr();
  // A group's state saved in an epoch it was caught up on (its order from position 40 round the
  // epoch's end, two batches of 8 per rank taken): its rest begins at 40 + 2 x 2 x 8 = 72, where
  // the run starts (the ranks read on to the epoch's end, then [0, 40) is decoded for them).
  // Without catch-up the rest is not served, and says so.
  testing::WriteFile(state, with_key(R"("epoch": 0, "samples_seen_in_epoch": 16, "batch_size": 8, "world_size": 2, )"
                                     R"("split_origin": 40)"));
  Child rotated(Coloader({"serve", "--data", data_, "--name", "r2", "--epochs", "2", "--quiet", "--resume", state}),
                env_);
  ASSERT_TRUE(rotated.WaitForStderr("resuming at epoch 0, position 72", 20000)) << rotated.Stderr();
  Child alone(Coloader({"serve", "--data", data_, "--name", "r3", "--epochs", "2", "--quiet", "--no-catch-up",
                        "--resume", state}),
              env_);
  ASSERT_TRUE(alone.WaitForStderr("resuming at epoch 1, position 0", 20000)) << alone.Stderr();
  EXPECT_NE(alone.Stderr().find("the rest of it (36 samples per rank) is not served without catch-up; starting at "
                                "epoch 1"),
            std::string::npos)
      << alone.Stderr();
}

}  // namespace
}  // namespace coloader
