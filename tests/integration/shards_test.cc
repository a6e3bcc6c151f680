// WebDataset shards end to end: the fixture's ImageFolder written as shards by `coloader shard`,
// served by `coloader serve --data 'PATTERN'` to real consumers of other batch sizes.
#include <sys/stat.h>
#include <unistd.h>

#include <regex>

#include "tests/integration/integration_fixture.h"

namespace coloader {
namespace {

class WebDatasetTest : public IntegrationTest {
 protected:
  // The fixture's dataset as shards of `per_shard` samples; returns the brace pattern.
  std::string MakeShards(int per_shard) {
    const std::string out = tmp_.path() + "/shards";
    ::mkdir(out.c_str(), 0755);
    Child shard(Coloader({"shard", "--data", data_, "--out", out + "/train-%06d.tar", "--shard-size",
                          std::to_string(per_shard), "--quiet"}),
                env_);
    EXPECT_EQ(shard.Wait(), 0) << shard.Stderr();
    const int shards = (kImages + per_shard - 1) / per_shard;
    char last[16];
    std::snprintf(last, sizeof last, "%06d", shards - 1);
    return out + "/train-{000000.." + last + "}.tar";
  }
};

TEST_F(WebDatasetTest, ShardsGiveExactEpochsToConsumersOfOtherBatchSizes) {
  const std::string pattern = MakeShards(20);  // 6 shards, the last of 3 samples
  auto producer = Serve("w", {"--batch-size", "16", "--epochs", "2", "--min-consumers", "3"}, pattern);
  std::vector<std::unique_ptr<Child>> consumers;
  for (const char* b : {"5", "8", "13"}) consumers.push_back(Consume("w", {"--batch-size", b}));
  for (auto& c : consumers) {
    ASSERT_EQ(c->Wait(), 0) << c->Stderr();
    const auto epochs = ParseJsonLines(c->Stdout());
    ASSERT_EQ(epochs.size(), 2u) << c->Stdout();
    for (const auto& e : epochs) ExpectExactEpoch(e);
  }
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("103 samples in 6 WebDataset shard(s)"), std::string::npos) << producer->Stderr();
  EXPECT_EQ(producer->Stderr().find("skipped bad file"), std::string::npos) << producer->Stderr();
}

TEST_F(WebDatasetTest, AShardCutShortIsNamedAndTheRestIsServedExactly) {
  const std::string pattern = MakeShards(20);
  const std::string cut = tmp_.path() + "/shards/train-000002.tar";
  struct stat st {};
  ASSERT_EQ(::stat(cut.c_str(), &st), 0);
  ASSERT_EQ(::truncate(cut.c_str(), st.st_size / 2), 0);
  auto producer = Serve("w", {"--batch-size", "16", "--epochs", "1"}, pattern);
  auto consumer = Consume("w", {"--batch-size", "7"});
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
  const std::string said = producer->Stderr();
  EXPECT_NE(said.find(cut + ": the file is cut short inside member"), std::string::npos) << said;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(said, m, std::regex("(\\d+) samples in 6 WebDataset shard")) ) << said;
  const uint64_t served = std::stoull(m[1]);
  EXPECT_LT(served, 103u);
  EXPECT_GE(served, 103u - 20u);
  const auto epochs = ParseJsonLines(consumer->Stdout());
  ASSERT_EQ(epochs.size(), 1u) << consumer->Stdout();
  testing::ExpectExactEpoch(epochs[0], served);
}

TEST_F(WebDatasetTest, AMissingShardOrAnEmptyRangeIsAClearError) {
  const std::string pattern = MakeShards(20);
  const std::string wrong = tmp_.path() + "/shards/train-{000000..000009}.tar";
  Child serve(Coloader({"serve", "--data", wrong, "--name", "w"}), env_);
  EXPECT_EQ(serve.Wait(), 1);  // not found, as a missing ImageFolder
  EXPECT_NE(serve.Stderr().find("train-000006.tar: no such shard"), std::string::npos) << serve.Stderr();
  Child backwards(Coloader({"serve", "--data", tmp_.path() + "/shards/train-{5..1}.tar", "--name", "w"}), env_);
  EXPECT_EQ(backwards.Wait(), 2);  // a value the user gave, as every invalid flag
  EXPECT_NE(backwards.Stderr().find("runs backwards"), std::string::npos) << backwards.Stderr();
}

}  // namespace
}  // namespace coloader
