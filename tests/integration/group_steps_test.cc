// Consumer groups caught up and resumed while they train as DDP does: the ranks are threads of
// this process, each holding its batch until every rank has its own (a training step's
// all-reduce), against a real `coloader serve`. A rank that takes a batch early holds its slot
// while the last reads a round further, so a step needs several catch-up batches at once: the
// producer must keep them free for the group (CatchUpWaiting), or the step never completes.
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "common/split.h"
#include "tests/integration/integration_fixture.h"

namespace coloader {
namespace {

// W ranks of group "g" in threads, `epochs` epochs, a step at a time. Each rank's options get
// a 20 s timeout: a stalled step fails the test, naming who holds the producer back.
class StepGroup {
 public:
  StepGroup(std::string name, uint32_t w, uint32_t b, int epochs)
      : name_(std::move(name)), w_(w), b_(b), epochs_(epochs), got_(w), partial_(w), errors_(w) {}
  ~StepGroup() { Join(); }

  // Starts the ranks; `resume` (epoch, begin, samples) is each rank's saved state, if any.
  void Start(std::optional<std::array<uint64_t, 3>> resume = std::nullopt) {
    for (uint32_t r = 0; r < w_; ++r) threads_.emplace_back([this, r, resume] { Run(r, resume); });
  }
  void Join() {
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }

  // [rank][epoch]: the dataset indices it got, and whether the epoch was partial.
  const std::vector<std::vector<std::vector<int64_t>>>& got() const { return got_; }
  const std::vector<std::vector<bool>>& partial() const { return partial_; }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  void Run(uint32_t rank, std::optional<std::array<uint64_t, 3>> resume) {
    ConsumerOptions o;
    o.name = name_;
    o.group = "g";
    o.rank = rank;
    o.world_size = w_;
    o.batch_size = b_;
    o.timeout_ms = 20000;
    auto fail = [&](const std::string& what) {
      errors_[rank] = what;
      Step(/*failed=*/true);
    };
    auto c = Consumer::Connect(o);
    if (!c.ok()) return fail(c.status().ToString());
    if (resume) {
      if (Status st = (*c)->Resume((*resume)[0], (*resume)[1], (*resume)[2]); !st.ok()) return fail(st.ToString());
    }
    for (int e = 0; e < epochs_; ++e) {
      auto more = (*c)->NextEpoch();
      if (!more.ok()) return fail(more.status().ToString());
      if (!*more) return fail("the stream ended after " + std::to_string(e) + " epoch(s)");
      got_[rank].emplace_back();
      for (;;) {
        auto batch = (*c)->Next();
        if (!batch.ok()) return fail(batch.status().ToString());
        if (!*batch) break;
        got_[rank].back().insert(got_[rank].back().end(), (*batch)->indices(), (*batch)->indices() + (*batch)->size());
        if (!Step(false)) return;  // the batch is held until every rank has its own
      }
      partial_[rank].push_back((*c)->partial());
    }
  }

  // The all-reduce: false if a rank failed or the step did not complete in 30 s.
  bool Step(bool failed) {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed) broken_ = true;
    if (broken_) {
      cv_.notify_all();
      return false;
    }
    const uint64_t generation = generation_;
    if (++arrived_ == w_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return generation_ != generation || broken_; })) {
      broken_ = true;
      cv_.notify_all();
      return false;
    }
    return !broken_;
  }

  const std::string name_;
  const uint32_t w_, b_;
  const int epochs_;
  std::vector<std::vector<std::vector<int64_t>>> got_;
  std::vector<std::vector<bool>> partial_;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
};

// Every rank had `samples` samples in `epoch`, none twice; the ranks' union is `expect` samples.
void ExpectEqualShares(const StepGroup& g, size_t epoch, uint64_t samples, size_t expect) {
  std::set<int64_t> all;
  for (size_t r = 0; r < g.got().size(); ++r) {
    ASSERT_GT(g.got()[r].size(), epoch) << "rank " << r;
    const std::vector<int64_t>& mine = g.got()[r][epoch];
    EXPECT_EQ(mine.size(), samples) << "rank " << r << " epoch " << epoch;
    EXPECT_EQ(std::set<int64_t>(mine.begin(), mine.end()).size(), mine.size()) << "rank " << r << " epoch " << epoch;
    all.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(all.size(), expect) << "epoch " << epoch;
}

// Three ranks with batches of 8 against producer batches of 8: a step spans three of them. The
// group joins mid-epoch while another job reads, and is caught up to whole epochs.
TEST_F(IntegrationTest, AGroupThatStepsTogetherIsCaughtUpWithoutDeadlock) {
  auto producer = Serve("steps", {"--batch-size", "8", "--epochs", "2", "--window", "4", "--spare-slots", "3"});
  StepGroup group("steps", 3, 8, 2);
  HoldEpochZeroWhile("steps", 2, [&] {
    group.Start();
    ASSERT_TRUE(producer->WaitForStderr("group g: all 3 rank(s) attached", 20000)) << producer->Stderr();
  });
  group.Join();
  for (const std::string& e : group.errors()) ASSERT_EQ(e, "") << producer->Stderr();
  auto plan = PlanSplit(SplitSpec{0, kImages, 3, 0, 8, false});
  ASSERT_TRUE(plan.ok());
  for (size_t e = 0; e < 2; ++e) {
    ExpectEqualShares(group, e, plan->per_rank, kImages);
    for (uint32_t r = 0; r < 3; ++r) EXPECT_FALSE(group.partial()[r][e]) << "rank " << r << " epoch " << e;
  }
  EXPECT_NE(producer->Stderr().find("group g joined epoch 0 at sample "), std::string::npos) << producer->Stderr();
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

// The same group resumed with no other reader: the shared stream's decoded batches wait in the
// window's slots for a reader that never comes, and the rest is served in the spare slots.
TEST_F(IntegrationTest, AGroupThatStepsTogetherIsServedItsRestWithNoOtherReader) {
  auto producer = Serve("alone", {"--batch-size", "8", "--epochs", "2", "--window", "4", "--spare-slots", "3"});
  StepGroup group("alone", 3, 8, 2);
  group.Start(std::array<uint64_t, 3>{0, 0, 8});  // each rank had taken one batch of epoch 0
  group.Join();
  for (const std::string& e : group.errors()) ASSERT_EQ(e, "") << producer->Stderr();
  auto plan = PlanSplit(SplitSpec{0, kImages, 3, 0, 8, false});
  ASSERT_TRUE(plan.ok());
  // The rest of epoch 0 from round 1 (position 24): 103 - 24 = 79 samples, 35 - 8 = 27 per rank
  // (two of them the split's padding).
  ExpectEqualShares(group, 0, plan->per_rank - 8, kImages - 24);
  ExpectEqualShares(group, 1, plan->per_rank, kImages);
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_TRUE(group.partial()[r][0]) << "rank " << r;
    EXPECT_FALSE(group.partial()[r][1]) << "rank " << r;
  }
  EXPECT_NE(producer->Stderr().find("resumes a saved state"), std::string::npos) << producer->Stderr();
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

}  // namespace
}  // namespace coloader
