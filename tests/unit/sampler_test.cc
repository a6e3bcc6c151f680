// Sampler: seeded per-epoch permutations and torch DistributedSampler sharding.
#include "pipeline/source/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace coloader {
namespace {

using Indices = std::vector<int64_t>;

#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                   \
  auto COLOADER_CONCAT(_result_, __LINE__) = (expr);                      \
  ASSERT_TRUE(COLOADER_CONCAT(_result_, __LINE__).ok())                   \
      << COLOADER_CONCAT(_result_, __LINE__).status().ToString();         \
  lhs = std::move(*COLOADER_CONCAT(_result_, __LINE__))

SamplerOptions Opts(bool shuffle, uint64_t seed = 0, int rank = 0, int world = 1,
                    bool drop_last = false) {
  SamplerOptions o;
  o.shuffle = shuffle;
  o.seed = seed;
  o.rank = rank;
  o.world_size = world;
  o.drop_last = drop_last;
  return o;
}

Indices Iota(size_t n) {
  Indices v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The reference: torch.utils.data.DistributedSampler.__iter__ written out literally, given
// the (already shuffled or sequential) order of the whole dataset.
Indices TorchDistributed(const Indices& order, int rank, int world, bool drop_last) {
  const size_t n = order.size();
  const size_t w = static_cast<size_t>(world);
  size_t num_samples = (drop_last && n % w != 0) ? n / w : (n + w - 1) / w;
  size_t total = num_samples * w;
  Indices indices = order;
  if (!drop_last) {
    size_t padding = total - indices.size();
    if (padding <= indices.size()) {
      indices.insert(indices.end(), indices.begin(), indices.begin() + padding);
    } else {
      Indices repeated;
      size_t times = (padding + n - 1) / n;
      for (size_t t = 0; t < times; ++t) {
        repeated.insert(repeated.end(), order.begin(), order.end());
      }
      indices.insert(indices.end(), repeated.begin(), repeated.begin() + padding);
    }
  } else {
    indices.resize(total);
  }
  Indices mine;
  for (size_t k = static_cast<size_t>(rank); k < total; k += w) mine.push_back(indices[k]);
  return mine;
}

Indices Epoch(size_t n, SamplerOptions o, uint64_t epoch) {
  auto s = Sampler::Make(n, o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? s->EpochIndices(epoch) : Indices();
}

// ---------------------------------------------------------------------------- permutations

TEST(SamplerTest, ShuffledEpochIsAPermutation) {
  for (size_t n : {1u, 2u, 3u, 10u, 1000u, 100003u}) {
    ASSERT_OK_AND_ASSIGN(Sampler s, Sampler::Make(n, Opts(true, 42)));
    EXPECT_EQ(s.epoch_size(), n);
    Indices v = s.EpochIndices(3);
    ASSERT_EQ(v.size(), n);
    std::sort(v.begin(), v.end());
    EXPECT_EQ(v, Iota(n)) << "n=" << n;
  }
}

TEST(SamplerTest, SameSeedAndEpochGiveSameOrder) {
  ASSERT_OK_AND_ASSIGN(Sampler a, Sampler::Make(1000, Opts(true, 7)));
  ASSERT_OK_AND_ASSIGN(Sampler b, Sampler::Make(1000, Opts(true, 7)));
  EXPECT_EQ(a.EpochIndices(5), b.EpochIndices(5));
  EXPECT_EQ(a.EpochIndices(0), a.EpochIndices(0));
}

TEST(SamplerTest, OrderIsPinnedAcrossPlatforms) {
  // The generator is part of the format: these values must never change (they were computed
  // by this implementation; a change here re-orders every user's run).
  EXPECT_EQ(Epoch(10, Opts(true, 0), 0), (Indices{1, 8, 9, 3, 6, 5, 0, 4, 2, 7}));
  EXPECT_EQ(Epoch(10, Opts(true, 1234), 7), (Indices{6, 8, 3, 5, 9, 0, 1, 4, 2, 7}));
}

TEST(SamplerTest, DifferentEpochsAndSeedsDiffer) {
  const size_t n = 1000;
  std::set<Indices> seen;
  for (uint64_t seed : {0ull, 1ull, 2ull, 0xFFFFFFFFFFFFFFFFull}) {
    for (uint64_t epoch : {0ull, 1ull, 2ull, 1000000ull}) {
      seen.insert(Epoch(n, Opts(true, seed), epoch));
    }
  }
  EXPECT_EQ(seen.size(), 16u);
  // Unlike torch's seed + epoch, (seed 0, epoch 1) and (seed 1, epoch 0) are not the same.
  EXPECT_NE(Epoch(n, Opts(true, 0), 1), Epoch(n, Opts(true, 1), 0));
  // And a shuffle actually moves things.
  EXPECT_NE(Epoch(n, Opts(true, 0), 0), Iota(n));
}

TEST(SamplerTest, NoShuffleIsSequentialEveryEpoch) {
  for (uint64_t epoch : {0ull, 1ull, 99ull}) {
    EXPECT_EQ(Epoch(17, Opts(false, 5), epoch), Iota(17));
  }
}

// Chi-square statistic of how often each index lands at each position, over many
// permutations, one statistic per position (n - 1 degrees of freedom each).
std::vector<double> PositionChiSquare(const std::vector<Indices>& perms, size_t n) {
  std::vector<std::vector<int>> counts(n, std::vector<int>(n, 0));
  for (const Indices& p : perms) {
    for (size_t pos = 0; pos < n; ++pos) ++counts[pos][static_cast<size_t>(p[pos])];
  }
  const double expected = static_cast<double>(perms.size()) / static_cast<double>(n);
  std::vector<double> chi2(n, 0.0);
  for (size_t pos = 0; pos < n; ++pos) {
    for (int c : counts[pos]) chi2[pos] += (c - expected) * (c - expected) / expected;
  }
  return chi2;
}

TEST(SamplerTest, EveryPositionIsRoughlyUniformOverSeedsAndOverEpochs) {
  // Deterministic (fixed seeds), so this cannot flake; it catches a biased bounded draw, a
  // broken shuffle loop, or a seeding that leaves some draw independent of seed or epoch.
  const size_t n = 10;
  const int trials = 20000;
  std::vector<Indices> over_seeds;
  std::vector<Indices> over_epochs;
  for (int t = 0; t < trials; ++t) {
    over_seeds.push_back(Epoch(n, Opts(true, static_cast<uint64_t>(t)), 0));
    over_epochs.push_back(Epoch(n, Opts(true, 99), static_cast<uint64_t>(t)));
  }
  // 9 degrees of freedom: P(chi2 > 33.7) = 0.0001.
  const std::vector<double> by_seed = PositionChiSquare(over_seeds, n);
  const std::vector<double> by_epoch = PositionChiSquare(over_epochs, n);
  for (size_t pos = 0; pos < n; ++pos) {
    EXPECT_LT(by_seed[pos], 33.7) << "position " << pos << " over seeds";
    EXPECT_LT(by_epoch[pos], 33.7) << "position " << pos << " over epochs";
  }
}

// ---------------------------------------------------------------------------- sharding

TEST(SamplerTest, HandComputedPaddingExample) {
  // N=10, W=4, no shuffle: num_samples = 3, total = 12, order padded with 0, 1.
  const std::vector<Indices> expected = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  for (int r = 0; r < 4; ++r) {
    ASSERT_OK_AND_ASSIGN(Sampler s, Sampler::Make(10, Opts(false, 0, r, 4)));
    EXPECT_EQ(s.epoch_size(), 3u);
    EXPECT_EQ(s.EpochIndices(0), expected[static_cast<size_t>(r)]) << "rank " << r;
  }
}

TEST(SamplerTest, HandComputedDropLastExample) {
  // N=10, W=4, drop_last: 2 each, indices 0..7, the tail 8, 9 cut.
  const std::vector<Indices> expected = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  for (int r = 0; r < 4; ++r) {
    ASSERT_OK_AND_ASSIGN(Sampler s, Sampler::Make(10, Opts(false, 0, r, 4, true)));
    EXPECT_EQ(s.epoch_size(), 2u);
    EXPECT_EQ(s.EpochIndices(0), expected[static_cast<size_t>(r)]) << "rank " << r;
  }
}

TEST(SamplerTest, PaddingWrapsMoreThanOnceWhenWorldExceedsDataset) {
  // N=2, W=5: every rank gets 1 sample; the order 0,1 is repeated to 0,1,0,1,0.
  const Indices expected = {0, 1, 0, 1, 0};
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(Epoch(2, Opts(false, 0, r, 5), 0), (Indices{expected[static_cast<size_t>(r)]}));
  }
}

TEST(SamplerTest, ShardsMatchDistributedSamplerForManySizes) {
  for (size_t n : {1u, 7u, 10u, 100u, 101u}) {
    for (int w : {1, 2, 3, 4, 8}) {
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          SCOPED_TRACE("N=" + std::to_string(n) + " W=" + std::to_string(w) +
                       " shuffle=" + std::to_string(shuffle) +
                       " drop_last=" + std::to_string(drop_last));
          const size_t wz = static_cast<size_t>(w);
          if (drop_last && n < wz && n % wz != 0) {
            // Nothing for anyone: rejected (torch would hand out empty epochs).
            EXPECT_FALSE(Sampler::Make(n, Opts(shuffle, 3, 0, w, drop_last)).ok());
            continue;
          }
          const uint64_t epoch = 4;
          const Indices whole = Epoch(n, Opts(shuffle, 3), epoch);  // the W=1 order
          std::vector<int> seen(n, 0);
          size_t epoch_size = 0;
          for (int r = 0; r < w; ++r) {
            ASSERT_OK_AND_ASSIGN(Sampler s, Sampler::Make(n, Opts(shuffle, 3, r, w, drop_last)));
            if (r == 0) epoch_size = s.epoch_size();
            EXPECT_EQ(s.epoch_size(), epoch_size) << "every rank gets the same count";
            const Indices mine = s.EpochIndices(epoch);
            ASSERT_EQ(mine.size(), s.epoch_size());
            EXPECT_EQ(mine, TorchDistributed(whole, r, w, drop_last)) << "rank " << r;
            for (int64_t i : mine) {
              ASSERT_GE(i, 0);
              ASSERT_LT(static_cast<size_t>(i), n);
              ++seen[static_cast<size_t>(i)];
            }
          }
          const size_t expected_size =
              (drop_last && n % wz != 0) ? n / wz : (n + wz - 1) / wz;
          EXPECT_EQ(epoch_size, expected_size);
          const int covered = static_cast<int>(std::count_if(seen.begin(), seen.end(),
                                                              [](int c) { return c > 0; }));
          const int repeated = static_cast<int>(std::count_if(seen.begin(), seen.end(),
                                                               [](int c) { return c > 1; }));
          if (drop_last) {
            // Exactly epoch_size * W distinct indices, none twice.
            EXPECT_EQ(static_cast<size_t>(covered), epoch_size * wz);
            EXPECT_EQ(repeated, 0);
          } else {
            EXPECT_EQ(static_cast<size_t>(covered), n) << "the union covers every index";
            if (n % wz == 0) {
              EXPECT_EQ(repeated, 0);
            }
          }
        }
      }
    }
  }
}

TEST(SamplerTest, WorldSizeOneIsThePlainPermutation) {
  EXPECT_EQ(Epoch(50, Opts(true, 9, 0, 1, true), 2), Epoch(50, Opts(true, 9), 2));
  EXPECT_EQ(Epoch(50, Opts(false, 9, 0, 1, true), 2), Iota(50));
}

// ---------------------------------------------------------------------------- arguments

// Streamed shards: an epoch reads each block (shard) in one stretch, blocks and their insides in
// a seeded order, every index once; without shuffle, in order.
TEST(SamplerTest, BlocksAreReadWholeInAShuffledOrder) {
  const std::vector<uint64_t> blocks = {5, 1, 7, 3, 4};
  SamplerOptions o;
  o.seed = 11;
  o.blocks = blocks;
  ASSERT_OK_AND_ASSIGN(Sampler s, Sampler::Make(20, o));
  std::vector<size_t> block_of;
  for (size_t b = 0; b < blocks.size(); ++b) block_of.insert(block_of.end(), blocks[b], b);
  std::set<std::vector<int64_t>> orders;
  for (uint64_t epoch = 0; epoch < 6; ++epoch) {
    const std::vector<int64_t> order = s.EpochIndices(epoch);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 20; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
    std::vector<size_t> runs;  // the blocks in the order the epoch visits them, one entry per run
    for (int64_t i : order)
      if (runs.empty() || runs.back() != block_of[static_cast<size_t>(i)]) runs.push_back(block_of[static_cast<size_t>(i)]);
    EXPECT_EQ(runs.size(), blocks.size()) << "epoch " << epoch << ": a block was read in more than one stretch";
    EXPECT_EQ(order, s.EpochIndices(epoch));
    orders.insert(order);
  }
  EXPECT_EQ(orders.size(), 6u) << "every epoch should have its own order";
  o.shuffle = false;
  ASSERT_OK_AND_ASSIGN(Sampler seq, Sampler::Make(20, o));
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(seq.EpochIndices(3)[static_cast<size_t>(i)], i);
  o.blocks = {5, 5};
  EXPECT_FALSE(Sampler::Make(20, o).ok());
}

// Node shards over streamed shards: the ranks together take every index (the padded tail
// repeated as DistributedSampler does), each the same count, and each rank touches few blocks:
// 12 blocks over 3 ranks leave a rank at most 4 whole ones, two cut at its stretch's ends and,
// for the last rank, the one its padding wraps into: 7, where striding would read all 12.
TEST(SamplerTest, RanksOverBlocksEachReadAFewBlocksAndTogetherAll) {
  const std::vector<uint64_t> blocks = {9, 10, 8, 11, 10, 9, 10, 12, 7, 10, 9, 10};  // 115
  std::vector<size_t> block_of;
  for (size_t b = 0; b < blocks.size(); ++b) block_of.insert(block_of.end(), blocks[b], b);
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    std::multiset<int64_t> all;
    for (int rank = 0; rank < 3; ++rank) {
      SamplerOptions o;
      o.seed = 5;
      o.blocks = blocks;
      o.rank = rank;
      o.world_size = 3;
      ASSERT_OK_AND_ASSIGN(Sampler s, Sampler::Make(115, o));
      const std::vector<int64_t> mine = s.EpochIndices(epoch);
      ASSERT_EQ(mine.size(), 39u);  // ceil(115 / 3)
      std::set<size_t> touched;
      for (int64_t i : mine) touched.insert(block_of[static_cast<size_t>(i)]);
      EXPECT_LE(touched.size(), 7u) << "rank " << rank << " epoch " << epoch;
      all.insert(mine.begin(), mine.end());
    }
    std::set<int64_t> distinct(all.begin(), all.end());
    EXPECT_EQ(distinct.size(), 115u) << "epoch " << epoch;
    EXPECT_EQ(all.size(), 117u) << "two indices padded, as DistributedSampler pads";
  }
}

TEST(SamplerTest, InvalidArgumentsAreRejectedNamingTheValue) {
  struct Case {
    size_t n;
    int rank;
    int world;
    bool drop_last;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {0, 0, 1, false, {"dataset is empty"}},
      {10, 0, 0, false, {"world_size", "got 0"}},
      {10, 0, -3, false, {"world_size", "got -3"}},
      {10, -1, 4, false, {"rank -1", "[0, 4)"}},
      {10, 4, 4, false, {"rank 4", "[0, 4)"}},
      {10, 17, 4, false, {"rank 17", "[0, 4)"}},
      {3, 0, 4, true, {"drop_last", "3 samples", "world_size 4"}},
  };
  for (const Case& c : cases) {
    auto r = Sampler::Make(c.n, Opts(true, 0, c.rank, c.world, c.drop_last));
    ASSERT_FALSE(r.ok()) << "n=" << c.n << " rank=" << c.rank << " world=" << c.world;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    for (const std::string& m : c.mentions) {
      EXPECT_NE(r.status().message().find(m), std::string::npos)
          << "'" << r.status().message() << "' should mention '" << m << "'";
    }
  }
}

}  // namespace
}  // namespace coloader
