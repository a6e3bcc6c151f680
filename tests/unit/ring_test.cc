// Ring accounting: a slot comes back only when every consumer it went to has let go.
#include "producer/ring.h"

#include <gtest/gtest.h>

namespace coloader {
namespace {

TEST(RingTest, AcquiresLowestFreeSlotUntilFull) {
  RingAccounting ring(3);
  EXPECT_EQ(ring.Acquire(), 0u);
  EXPECT_EQ(ring.Acquire(), 1u);
  EXPECT_EQ(ring.Acquire(), 2u);
  EXPECT_EQ(ring.Acquire(), std::nullopt);
  EXPECT_EQ(ring.in_use(), 3u);
}

TEST(RingTest, SlotIsFreeOnlyAfterEveryHolderReleased) {
  RingAccounting ring(2);
  auto s = *ring.Acquire();
  ring.Publish(s, 10, {1, 2, 3});
  EXPECT_TRUE(ring.Release(1, 10));
  EXPECT_TRUE(ring.Release(3, 10));
  EXPECT_EQ(ring.free_slots(), 1u);
  EXPECT_TRUE(ring.Release(2, 10));
  EXPECT_EQ(ring.free_slots(), 2u);
}

TEST(RingTest, BogusAndDuplicateAcksAreRefused) {
  RingAccounting ring(2);
  auto s = *ring.Acquire();
  ring.Publish(s, 5, {1, 2});
  EXPECT_FALSE(ring.Release(9, 5));   // never held it
  EXPECT_FALSE(ring.Release(1, 6));   // no such batch
  EXPECT_TRUE(ring.Release(1, 5));
  EXPECT_FALSE(ring.Release(1, 5));   // twice
  EXPECT_EQ(ring.HeldBy(2), 1u);
}

TEST(RingTest, PublishingToNobodyFreesAtOnce) {
  RingAccounting ring(1);
  auto s = *ring.Acquire();
  ring.Publish(s, 0, {});
  EXPECT_EQ(ring.free_slots(), 1u);
  EXPECT_FALSE(ring.Release(1, 0));
}

TEST(RingTest, DroppingAConsumerReclaimsItsSlots) {
  RingAccounting ring(4);
  for (uint64_t seq = 0; seq < 4; ++seq) ring.Publish(*ring.Acquire(), seq, {1, 2});
  EXPECT_TRUE(ring.Release(2, 0));
  EXPECT_TRUE(ring.Release(2, 1));
  EXPECT_EQ(ring.free_slots(), 0u);
  EXPECT_EQ(ring.DropConsumer(1), 4u);
  EXPECT_EQ(ring.free_slots(), 2u);  // batches 0 and 1; 2 and 3 are still held by consumer 2
  EXPECT_EQ(ring.OldestHeldBy(2), 2u);
  EXPECT_EQ(ring.OldestHeldBy(1), std::nullopt);
  EXPECT_EQ(ring.DropConsumer(2), 2u);
  EXPECT_EQ(ring.free_slots(), 4u);
}

TEST(RingTest, SlowestConsumerBoundsHowFarTheProducerGets) {
  // One fast consumer acks at once, one slow one never: after K publishes the ring is full.
  const uint32_t k = 3;
  RingAccounting ring(k);
  uint64_t seq = 0;
  while (auto s = ring.Acquire()) {
    ring.Publish(*s, seq, {1, 2});
    EXPECT_TRUE(ring.Release(1, seq));
    ++seq;
  }
  EXPECT_EQ(seq, k);
  EXPECT_EQ(ring.HeldBy(2), k);
  EXPECT_TRUE(ring.Release(2, 0));
  EXPECT_EQ(ring.Acquire(), 0u);  // the slot of the oldest batch comes back first
}

TEST(RingTest, AbandonReturnsAFillingSlot) {
  RingAccounting ring(1);
  auto s = *ring.Acquire();
  ring.Abandon(s);
  EXPECT_EQ(ring.Acquire(), 0u);
}

TEST(RingTest, PublishedListsTheHeldBatchesOldestFirstWithTheirHolders) {
  RingAccounting ring(3);
  for (uint64_t seq = 0; seq < 3; ++seq) {
    auto slot = ring.Acquire();
    ASSERT_TRUE(slot);
    ring.Publish(*slot, seq, seq == 1 ? std::vector<uint64_t>{7} : std::vector<uint64_t>{7, 8});
  }
  ASSERT_TRUE(ring.Release(8, 0));
  auto held = ring.Published();
  ASSERT_EQ(held.size(), 3u);
  EXPECT_EQ(held[0].seq, 0u);
  EXPECT_EQ(held[0].holders, std::vector<uint64_t>{7});
  EXPECT_EQ(held[2].holders, (std::vector<uint64_t>{7, 8}));
  ASSERT_TRUE(ring.Release(7, 0));
  EXPECT_EQ(ring.Published().front().seq, 1u);
}

}  // namespace
}  // namespace coloader
