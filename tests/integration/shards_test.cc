// WebDataset shards end to end: the fixture's ImageFolder written as shards by `coloader shard`,
// served by `coloader serve --data 'PATTERN'` to real consumers of other batch sizes.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <set>

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

  // Serves `source` (the fixture's dataset as six shards) to consumers of batch sizes 5, 8 and
  // 13 against producer batches of 16, for two epochs: each epoch exact, no file skipped.
  void ExpectExactForThreeConsumers(const std::string& source) {
  auto producer = Serve("w", {"--batch-size", "16", "--epochs", "2", "--min-consumers", "3"}, source);
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
};

TEST_F(WebDatasetTest, ShardsGiveExactEpochsToConsumersOfOtherBatchSizes) {
  const std::string pattern = MakeShards(20);  // 6 shards, the last of 3 samples
  ExpectExactForThreeConsumers(pattern);
}

// Compressed shards (gzip'd by the gzip command) serve as the plain ones do.
TEST_F(WebDatasetTest, CompressedShardsGiveExactEpochsToConsumersOfOtherBatchSizes) {
  const std::string pattern = MakeShards(20);
  ASSERT_EQ(std::system(("gzip " + tmp_.path() + "/shards/*.tar").c_str()), 0);
  ExpectExactForThreeConsumers(pattern + ".gz");
}

// A shard cut short, local and streamed (the same bytes each fetch: a server's file cut short),
// and a .tar.gz cut short: the damage is named with the shard, the members before it served, and
// every epoch exact over what is served.
TEST_F(WebDatasetTest, AShardCutShortIsNamedAndTheRestIsServedExactly) {
  const std::string pattern = MakeShards(20);
  const std::string cut = tmp_.path() + "/shards/train-000002.tar";
  struct stat st {};
  ASSERT_EQ(::stat(cut.c_str(), &st), 0);
  ASSERT_EQ(::truncate(cut.c_str(), st.st_size / 2), 0);
  ASSERT_EQ(std::system(("cd " + tmp_.path() + "/shards && for f in *.tar; do gzip -c $f > $f.gz; done").c_str()), 0);
  const std::string gz_cut = cut + ".gz";  // a gzip of a tar cut short: the tar's damage again
  for (const std::string& source : {pattern, "pipe:cat " + pattern, pattern + ".gz"}) {
    SCOPED_TRACE(source);
    const std::string name = source.find(".gz") != std::string::npos ? gz_cut : source.rfind("pipe:", 0) == 0
                                                                                      ? "pipe:cat " + cut
                                                                                      : cut;
    auto producer = Serve("w", {"--batch-size", "16", "--epochs", "2"}, source);
    auto consumer = Consume("w", {"--batch-size", "7"});
    ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
    ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
    const std::string said = producer->Stderr();
    EXPECT_NE(said.find(name + ": the file is cut short inside member"), std::string::npos) << said;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(said, m, std::regex("(\\d+) samples in 6 WebDataset shard"))) << said;
    const uint64_t served = std::stoull(m[1]);
    EXPECT_LT(served, 103u);
    EXPECT_GE(served, 103u - 20u);
    const auto epochs = ParseJsonLines(consumer->Stdout());
    ASSERT_EQ(epochs.size(), 2u) << consumer->Stdout();
    for (const auto& e : epochs) testing::ExpectExactEpoch(e, served);
  }
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

// The shards served over HTTP by tests/integration/shard_server.py (a real server on a free port).
class StreamedShardsTest : public WebDatasetTest {
 protected:
  // Starts the server over the shards' directory; returns the URL pattern of MakeShards' files.
  std::string ServeOverHttp(const std::string& pattern, bool drop_first = false) {
    std::vector<std::string> argv = {"/usr/bin/python3", std::string(COLOADER_SOURCE_DIR) +
                                                             "/tests/integration/shard_server.py",
                                     tmp_.path() + "/shards"};
    if (drop_first) argv.push_back("--drop-first");
    server_ = std::make_unique<Child>(argv, env_);
    EXPECT_TRUE(server_->WaitForStdout("ready", 20000)) << server_->Stderr();
    const std::string port = server_->Stdout().substr(6, server_->Stdout().find('\n') - 6);
    const std::string file = pattern.substr(pattern.rfind('/') + 1);
    return "http://127.0.0.1:" + port + "/" + file;
  }
  std::unique_ptr<Child> server_;
};

TEST_F(StreamedShardsTest, ShardsOverHttpGiveExactEpochsToConsumersOfOtherBatchSizes) {
  const std::string url = ServeOverHttp(MakeShards(20));
  ExpectExactForThreeConsumers(url);
}

TEST_F(StreamedShardsTest, AConnectionDroppedMidShardIsFetchedAgain) {
  const std::string url = ServeOverHttp(MakeShards(40), /*drop_first=*/true);
  auto producer = Serve("w", {"--batch-size", "16", "--epochs", "1"}, url);
  auto consumer = Consume("w", {"--batch-size", "7"});
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
  const auto epochs = ParseJsonLines(consumer->Stdout());
  ASSERT_EQ(epochs.size(), 1u) << consumer->Stdout();
  ExpectExactEpoch(epochs[0]);
  EXPECT_NE(server_->Stderr().find("train-000000.tar dropped"), std::string::npos) << server_->Stderr();
  EXPECT_NE(producer->Stderr().find("fetching shard http://127.0.0.1"), std::string::npos) << producer->Stderr();
}

TEST_F(StreamedShardsTest, AMissingShardIsNamedWithItsStatusAndNotAskedForAgain) {
  std::string url = ServeOverHttp(MakeShards(20));
  url.replace(url.find("000005}"), 7, "000007}");  // two shards past the last
  Child serve(Coloader({"serve", "--data", url, "--name", "w"}), env_);
  EXPECT_EQ(serve.Wait(), 1);
  EXPECT_NE(serve.Stderr().find("train-000006.tar (HTTP status 404)"), std::string::npos) << serve.Stderr();
  const std::string log = server_->Stderr();
  EXPECT_EQ(log.find("GET /train-000006.tar 404"), log.rfind("GET /train-000006.tar 404")) << log;
}

TEST_F(WebDatasetTest, PipeCommandsAreShardsAndTheirFailuresAreNamed) {
  const std::string pattern = MakeShards(20);
  auto producer = Serve("w", {"--batch-size", "16", "--epochs", "1"}, "pipe:cat " + pattern);
  auto consumer = Consume("w", {"--batch-size", "9"});
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
  const auto epochs = ParseJsonLines(consumer->Stdout());
  ASSERT_EQ(epochs.size(), 1u) << consumer->Stdout();
  ExpectExactEpoch(epochs[0]);
  // A command that fails every time: the error names it, what it said, and how often it was tried.
  Child failing(Coloader({"serve", "--data", "pipe:cat " + tmp_.path() + "/nowhere.tar", "--name", "w"}), env_);
  EXPECT_EQ(failing.Wait(30000), 1);
  EXPECT_NE(failing.Stderr().find("cannot fetch shard pipe:cat " + tmp_.path() + "/nowhere.tar (4 attempts, each: "
                                  "the command exited with status 1"),
            std::string::npos)
      << failing.Stderr();
  EXPECT_NE(failing.Stderr().find("No such file or directory"), std::string::npos) << failing.Stderr();
}

// Issue 38: a shard that can no longer be fetched once the epochs run was taken for bad files:
// its samples were skipped, their places filled with others, and the epoch looked whole. It is
// the network's or the server's fault: the run stops, saying so, and its consumers hear it.
TEST_F(WebDatasetTest, AShardThatCannotBeFetchedDuringTheEpochsStopsTheRunNotSkipsItsSamples) {
  const std::string pattern = MakeShards(20);
  auto producer = Serve("w", {"--batch-size", "16", "--epochs", "1"}, "pipe:cat " + pattern);
  const std::string gone = tmp_.path() + "/shards/train-000002.tar";
  ASSERT_EQ(::unlink(gone.c_str()), 0);  // listed at start; gone before the epoch begins
  auto consumer = Consume("w", {"--batch-size", "9"});
  EXPECT_EQ(producer->Wait(), 1) << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("cannot fetch shard pipe:cat " + gone), std::string::npos) << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("not its samples'"), std::string::npos) << producer->Stderr();
  EXPECT_EQ(producer->Stderr().find("skipped bad file"), std::string::npos) << producer->Stderr();
  EXPECT_EQ(consumer->Wait(), 1) << consumer->Stderr();
  EXPECT_NE(consumer->Stderr().find("cannot fetch shard"), std::string::npos) << consumer->Stderr();
}

// A consumer group over streamed shards: each epoch both ranks take the same number of batches
// and together every sample.
TEST_F(WebDatasetTest, AGroupOverStreamedShardsSplitsEveryEpochEvenly) {
  auto producer = Serve("w", {"--batch-size", "16", "--epochs", "2", "--min-consumers", "2"},
                        "pipe:cat " + MakeShards(20));
  std::vector<std::unique_ptr<Child>> ranks;
  for (const char* r : {"0", "1"})
    ranks.push_back(Consume("w", {"--group", "g", "--rank", r, "--world-size", "2", "--batch-size", "8", "--indices"}));
  std::vector<std::vector<JsonLine>> lines;
  for (auto& r : ranks) {
    ASSERT_EQ(r->Wait(), 0) << r->Stderr();
    lines.push_back(ParseJsonLines(r->Stdout()));
    ASSERT_EQ(lines.back().size(), 2u) << r->Stdout();
  }
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(U64(lines[0][e], "batches"), U64(lines[1][e], "batches")) << "epoch " << e;
    std::set<int64_t> seen;
    for (const auto& rank : lines)
      for (int64_t i : testing::Indices(rank[e])) seen.insert(i);
    EXPECT_EQ(seen.size(), 103u) << "epoch " << e << ": the group's union is not the whole dataset";
  }
}

// Node shards over streamed shards (serve --rank/--world-size, one producer per node): each
// epoch the two nodes serve the same number of samples and together every one, and each node
// fetches only the shards its stretch of the epoch covers. The command logs each fetch.
TEST_F(WebDatasetTest, NodesOverStreamedShardsSplitEveryEpochAndFetchOnlyTheirShards) {
  const std::string pattern = MakeShards(20);  // 6 shards
  const std::string script = tmp_.path() + "/fetch.sh";
  testing::WriteFile(script, "echo \"$2\" >> \"$1\"; exec cat \"$2\"\n");
  std::vector<std::unique_ptr<Child>> producers, consumers;
  for (const char* node : {"0", "1"}) {
    const std::string name = std::string("n") + node;
    producers.push_back(Serve(name, {"--batch-size", "16", "--epochs", "1", "--rank", node, "--world-size", "2"},
                              "pipe:sh " + script + " " + tmp_.path() + "/fetched-" + node + " " + pattern));
    consumers.push_back(Consume(name, {"--batch-size", "8", "--indices"}));
  }
  std::set<int64_t> seen;
  std::vector<size_t> counts;
  for (size_t n = 0; n < 2; ++n) {
    ASSERT_EQ(consumers[n]->Wait(), 0) << consumers[n]->Stderr();
    ASSERT_EQ(producers[n]->Wait(), 0) << producers[n]->Stderr();
    const auto epochs = ParseJsonLines(consumers[n]->Stdout());
    ASSERT_EQ(epochs.size(), 1u) << consumers[n]->Stdout();
    const std::vector<int64_t> mine = testing::Indices(epochs[0]);
    counts.push_back(mine.size());
    seen.insert(mine.begin(), mine.end());
    // Six fetches to index the shards at start, then those of the epoch: 52 samples cover at
    // most 3 shards of 20 and parts of two more (striding over the epoch would fetch all 6).
    std::string log = testing::ReadFile(tmp_.path() + "/fetched-" + std::to_string(n));
    const auto fetches = static_cast<size_t>(std::count(log.begin(), log.end(), '\n'));
    EXPECT_GE(fetches, 6u + 3u) << log;
    EXPECT_LE(fetches, 6u + 5u) << "node " << n << " fetched shards outside its stretch:\n" << log;
  }
  EXPECT_EQ(counts[0], 52u);
  EXPECT_EQ(counts[1], 52u);
  EXPECT_EQ(seen.size(), 103u) << "the nodes' union is not the whole dataset";
}

// Resume on streamed shards: a producer started from a saved position serves the rest of that
// epoch in the same order as the run that saved it, then whole epochs.
TEST_F(WebDatasetTest, AResumedProducerGoesOnWhereTheSavedRunWas) {
  const std::string source = "pipe:cat " + MakeShards(20);
  auto first = Serve("w", {"--batch-size", "8", "--epochs", "2", "--seed", "9"}, source);
  auto whole = Consume("w", {"--indices"});
  ASSERT_EQ(whole->Wait(), 0) << whole->Stderr();
  ASSERT_EQ(first->Wait(), 0) << first->Stderr();
  const auto epochs = ParseJsonLines(whole->Stdout());
  ASSERT_EQ(epochs.size(), 2u);
  const std::vector<int64_t> epoch1 = testing::Indices(epochs[1]);
  ASSERT_EQ(epoch1.size(), 103u);

  // The data key comes from the refusal of a state of other data, as a user would see it.
  const std::string state = tmp_.path() + "/state.json";
  testing::WriteFile(state, R"({"epoch": 1, "samples_seen_in_epoch": 40, "batch_size": 8, "data_key": "0000000000000000"})");
  Child refused(Coloader({"serve", "--data", source, "--name", "w", "--image-size", std::to_string(setup_.image_size),
                          "--epochs", "3", "--seed", "9", "--resume", state}),
                env_);
  ASSERT_EQ(refused.Wait(), 2);
  const std::string says = "but this producer's is ";
  const size_t at = refused.Stderr().find(says);
  ASSERT_NE(at, std::string::npos) << refused.Stderr();
  const std::string key = refused.Stderr().substr(at + says.size(), 16);
  testing::WriteFile(state, R"({"epoch": 1, "samples_seen_in_epoch": 40, "batch_size": 8, "data_key": ")" + key + R"("})");
  auto resumed = Serve("w", {"--batch-size", "8", "--epochs", "3", "--seed", "9", "--resume", state}, source);
  auto rest = Consume("w", {"--indices"});
  ASSERT_EQ(rest->Wait(), 0) << rest->Stderr();
  ASSERT_EQ(resumed->Wait(), 0) << resumed->Stderr();
  const auto after = ParseJsonLines(rest->Stdout());
  ASSERT_EQ(after.size(), 2u) << rest->Stdout();
  EXPECT_EQ(testing::Indices(after[0]), std::vector<int64_t>(epoch1.begin() + 40, epoch1.end()));
  ExpectExactEpoch(after[1]);
}

}  // namespace
}  // namespace coloader
