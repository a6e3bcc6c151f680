// The split rule of consumer groups (common/split.h) against DistributedSampler's counts: for
// a dataset of n samples, W replicas and a DataLoader batch size b, DistributedSampler gives
// every rank ceil(n/W) samples (padding by repetition) or floor(n/W) (drop_last), and the
// DataLoader ceil(T/b) or floor(T/b) batches. Checked exhaustively over small sizes, whole
// epochs and ranges that begin mid-epoch.
#include "common/split.h"
#include "pipeline/source/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

namespace coloader {
namespace {

struct Taken {
  std::map<uint64_t, int> count;  // position -> times taken, over all ranks
  std::vector<uint64_t> per_rank_samples, per_rank_batches;
  uint64_t padding = 0;  // positions taken a second time, over all ranks
};

Taken TakeAll(uint64_t begin, uint64_t end, uint32_t w, uint32_t b, bool drop_last) {
  Taken t;
  for (uint32_t r = 0; r < w; ++r) {
    SplitSpec s{begin, end, w, r, b, drop_last};
    auto plan = PlanSplit(s);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    uint64_t samples = 0;
    std::set<uint64_t> padding;
    for (const Segment& seg : PaddingSegments(s, *plan))
      for (uint64_t p = seg.begin; p < seg.end; ++p) padding.insert(p);
    for (uint64_t k = 0; k < plan->batches; ++k) {
      uint64_t in_batch = 0;
      for (const Segment& seg : BatchSegments(s, *plan, k)) {
        EXPECT_LE(begin, seg.begin);
        EXPECT_LE(seg.end, end);
        EXPECT_LT(seg.begin, seg.end);
        for (uint64_t p = seg.begin; p < seg.end; ++p) ++t.count[p];
        in_batch += seg.size();
      }
      // Every batch but the tail is full.
      if (k + 1 < plan->batches || drop_last) {
        EXPECT_EQ(in_batch, b);
      }
      EXPECT_GT(in_batch, 0u);
      samples += in_batch;
    }
    uint64_t padded = 0;
    for (const Segment& seg : PaddingSegments(s, *plan)) padded += seg.size();
    t.padding += padded;
    // The padding is the end of the member's last batch (what it takes after the stream).
    if (padded > 0) {
      auto last = BatchSegments(s, *plan, plan->batches - 1);
      auto pad = PaddingSegments(s, *plan);
      EXPECT_GE(last.size(), pad.size());
      EXPECT_TRUE(std::equal(pad.begin(), pad.end(), last.end() - static_cast<std::ptrdiff_t>(pad.size())));
    }
    // Every padding position lies in the last round, which every member passes last, and
    // which a group resumed at any round is served again.
    for (uint64_t p : padding) EXPECT_GE(p, plan->wrap_begin);
    EXPECT_GE(plan->wrap_begin, ResumePosition(s, *plan, plan->batches));
    t.per_rank_samples.push_back(samples);
    t.per_rank_batches.push_back(plan->batches);
  }
  return t;
}

TEST(SplitTest, CountsMatchDistributedSamplerAndTheUnionIsExact) {
  for (uint32_t w : {1u, 2u, 3u, 4u, 8u}) {
    for (uint64_t n : {1u, 2u, 5u, 7u, 8u, 16u, 31u, 64u, 100u, 103u, 257u}) {
      for (uint32_t b : {1u, 2u, 3u, 4u, 5u, 8u, 16u, 32u}) {
        for (bool drop_last : {false, true}) {
          for (uint64_t begin : {uint64_t{0}, n / 3, n - 1}) {
            const uint64_t m = n - begin;  // samples in the range
            SCOPED_TRACE("n=" + std::to_string(n) + " begin=" + std::to_string(begin) + " W=" + std::to_string(w) +
                         " b=" + std::to_string(b) + (drop_last ? " drop_last" : ""));
            Taken t = TakeAll(begin, n, w, b, drop_last);
            const uint64_t per_rank = drop_last ? m / w : (m + w - 1) / w;
            const uint64_t batches = drop_last ? per_rank / b : (per_rank + b - 1) / b;
            for (uint32_t r = 0; r < w; ++r) {
              EXPECT_EQ(t.per_rank_batches[r], batches) << "rank " << r;
              EXPECT_EQ(t.per_rank_samples[r], drop_last ? batches * b : per_rank) << "rank " << r;
            }
            uint64_t total = 0;
            for (const auto& [p, c] : t.count) {
              total += static_cast<uint64_t>(c);
              EXPECT_GE(p, begin);
              EXPECT_LT(p, n);
            }
            if (drop_last) {
              // W * (taken per rank) distinct positions, none twice.
              EXPECT_EQ(t.count.size(), w * batches * b);
              for (const auto& [p, c] : t.count) EXPECT_EQ(c, 1) << "position " << p;
            } else {
              // The union covers the whole range; W*T in all, so fewer than W repeats.
              EXPECT_EQ(t.count.size(), m);
              EXPECT_EQ(total, w * per_rank);
              EXPECT_EQ(t.padding, total - m);
              EXPECT_LT(total - m, uint64_t{w});
            }
          }
        }
      }
    }
  }
}

TEST(SplitTest, AGroupOfOneIsThePlainConsumer) {
  // Contiguous batches of b over the whole range, the last one short.
  SplitSpec s{0, 103, 1, 0, 16, false};
  auto plan = PlanSplit(s);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->batches, 7u);
  for (uint64_t k = 0; k < 7; ++k) {
    auto segs = BatchSegments(s, *plan, k);
    ASSERT_EQ(segs.size(), 1u);
    EXPECT_EQ(segs[0], (Segment{k * 16, std::min<uint64_t>(103, (k + 1) * 16)}));
  }
  EXPECT_TRUE(PaddingSegments(s, *plan).empty());
}

TEST(SplitTest, WorkedExampleOfTheDocs) {
  // docs/DISTRIBUTED.md: N = 10, W = 3, b = 2. T = 4, R = 2 rounds, no tail. Round 0 deals
  // 0-1, 2-3, 4-5; round 1 deals 6-7, 8-9 and, to rank 2, virtual 10-11, which wrap into the
  // last round (it starts at F = 6): rank 2 repeats 6-7.
  std::vector<std::vector<std::vector<Segment>>> want = {
      {{{0, 2}}, {{6, 8}}}, {{{2, 4}}, {{8, 10}}}, {{{4, 6}}, {{6, 8}}}};
  for (uint32_t r = 0; r < 3; ++r) {
    SplitSpec s{0, 10, 3, r, 2, false};
    auto plan = PlanSplit(s);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->per_rank, 4u);
    EXPECT_EQ(plan->rounds, 2u);
    EXPECT_EQ(plan->tail, 0u);
    EXPECT_EQ(plan->wrap_begin, 6u);
    for (uint64_t k = 0; k < 2; ++k) EXPECT_EQ(BatchSegments(s, *plan, k), want[r][k]) << "rank " << r << " batch " << k;
  }
}

TEST(SplitTest, TailWrapsIntoTheFinalRound) {
  // N = 10, W = 4, b = 2: T = 3, R = 1 (positions 0..7 in blocks of 2), t = 1; the tail
  // positions 8, 9, 10, 11 go to ranks 0..3, and 10, 11 wrap to 8, 9.
  std::vector<std::vector<Segment>> want = {{{8, 9}}, {{9, 10}}, {{8, 9}}, {{9, 10}}};
  for (uint32_t r = 0; r < 4; ++r) {
    SplitSpec s{0, 10, 4, r, 2, false};
    auto plan = PlanSplit(s);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->batches, 2u);
    EXPECT_EQ(BatchSegments(s, *plan, 0), (std::vector<Segment>{{uint64_t{r} * 2, uint64_t{r} * 2 + 2}}));
    EXPECT_EQ(BatchSegments(s, *plan, 1), want[r]) << "rank " << r;
    EXPECT_EQ(PaddingSegments(s, *plan).size(), r >= 2 ? 1u : 0u);
  }
}

TEST(SplitTest, ResumePositionIsTheStartOfTheRound) {
  SplitSpec s{0, 103, 4, 2, 8, false};
  auto plan = PlanSplit(s);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(ResumePosition(s, *plan, 0), 0u);
  EXPECT_EQ(ResumePosition(s, *plan, 2), 64u);
  // Batch k of every rank lies at or after the resume position of k.
  for (uint64_t k = 0; k < plan->batches; ++k)
    for (const Segment& seg : BatchSegments(s, *plan, k)) EXPECT_GE(seg.begin, ResumePosition(s, *plan, k));
}

TEST(SplitTest, BatchesTakenCountsTheShortLastBatch) {
  // 103 samples in batches of 10: ten of 10 and one of 3. A rank that took all 103 took all 11.
  SplitSpec s{0, 103, 1, 0, 10, false};
  auto plan = PlanSplit(s);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(BatchesTaken(s, *plan, 0), 0u);
  EXPECT_EQ(BatchesTaken(s, *plan, 40), 4u);
  EXPECT_EQ(BatchesTaken(s, *plan, 100), 10u);
  EXPECT_EQ(BatchesTaken(s, *plan, 103), 11u);
  // drop_last: the short batch is never taken; its share is the ten full ones.
  SplitSpec d{0, 103, 1, 0, 10, true};
  auto dplan = PlanSplit(d);
  ASSERT_TRUE(dplan.ok());
  EXPECT_EQ(BatchesTaken(d, *dplan, 100), 10u);
  EXPECT_EQ(dplan->batches, 10u);
  // Two ranks with padding: ceil(103/2) = 52 each, batches of 8: six of 8, one of 4.
  SplitSpec g{0, 103, 2, 1, 8, false};
  auto gplan = PlanSplit(g);
  ASSERT_TRUE(gplan.ok());
  EXPECT_EQ(BatchesTaken(g, *gplan, 48), 6u);
  EXPECT_EQ(BatchesTaken(g, *gplan, 52), gplan->batches);
}

TEST(SplitTest, BadSpecsAreNamed) {
  EXPECT_NE(PlanSplit({0, 10, 0, 0, 2, false}).status().message().find("world size"), std::string::npos);
  EXPECT_NE(PlanSplit({0, 10, 2, 2, 2, false}).status().message().find("rank 2 is outside a group of 2"),
            std::string::npos);
  EXPECT_FALSE(PlanSplit({0, 10, 2, 0, 0, false}).ok());
  EXPECT_FALSE(PlanSplit({5, 4, 2, 0, 2, false}).ok());
}

}  // namespace
}  // namespace coloader

namespace coloader {
namespace {

// The global rule (docs/DISTRIBUTED.md): node n of N serves its DistributedSampler share of
// one global permutation (pipeline/source/sampler.h, --rank n --world-size N); the L ranks on the node
// split that share. Over all nodes and ranks: every sample at least once, every global rank
// the same number of samples and batches, and the repeats are only the padding of the two
// levels (fewer than N at the node level, fewer than L per node).
TEST(SplitTest, GlobalRuleOverNodesAndLocalRanks) {
  for (int nodes : {1, 2, 3, 4}) {
    for (uint32_t local : {1u, 2u, 8u}) {
      for (size_t n : {size_t{64}, size_t{100}, size_t{103}, size_t{1000}}) {
        for (uint32_t b : {4u, 7u, 32u}) {
          SCOPED_TRACE("nodes=" + std::to_string(nodes) + " local=" + std::to_string(local) +
                       " n=" + std::to_string(n) + " b=" + std::to_string(b));
          std::map<int64_t, int> seen;
          std::set<uint64_t> batches_per_rank, samples_per_rank;
          uint64_t total = 0, share = 0;
          for (int node = 0; node < nodes; ++node) {
            SamplerOptions so;
            so.seed = 7;
            so.rank = node;
            so.world_size = nodes;
            auto sampler = Sampler::Make(n, so);
            ASSERT_TRUE(sampler.ok()) << sampler.status().ToString();
            const std::vector<int64_t> order = sampler->EpochIndices(3);
            share = order.size();
            for (uint32_t r = 0; r < local; ++r) {
              SplitSpec s{0, order.size(), local, r, b, false};
              auto plan = PlanSplit(s);
              ASSERT_TRUE(plan.ok());
              uint64_t taken = 0;
              for (uint64_t k = 0; k < plan->batches; ++k)
                for (const Segment& seg : BatchSegments(s, *plan, k))
                  for (uint64_t p = seg.begin; p < seg.end; ++p) {
                    ++seen[order[p]];
                    ++taken;
                  }
              batches_per_rank.insert(plan->batches);
              samples_per_rank.insert(taken);
              total += taken;
            }
          }
          EXPECT_EQ(batches_per_rank.size(), 1u) << "global ranks with different batch counts hang DDP";
          EXPECT_EQ(samples_per_rank.size(), 1u);
          EXPECT_EQ(seen.size(), n) << "a sample no rank saw";
          const uint64_t node_padding = uint64_t(nodes) * share - n;  // < nodes
          EXPECT_LT(node_padding, uint64_t(nodes));
          EXPECT_LT(total - n, node_padding + uint64_t(nodes) * local);
          EXPECT_EQ(total, uint64_t(nodes) * local * *samples_per_rank.begin());
        }
      }
    }
  }
}

}  // namespace
}  // namespace coloader
