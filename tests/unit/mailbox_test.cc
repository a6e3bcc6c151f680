// Mailbox and MailboxArea (common/mailbox.h): the single-producer/single-consumer ring of
// announcements in shared memory, its owner check, and its futex doorbell, in one process
// and across two real ones.
#include "common/mailbox.h"

#include <poll.h>
#include <sys/syscall.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/shm.h"
#include "tests/support/test_support.h"

namespace coloader {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MillisSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// An announcement whose every field is derived from `seq`, so a reader can check all of them.
BatchAnnouncement Announcement(uint64_t seq) {
  BatchAnnouncement a;
  a.seq = seq;
  a.slot = static_cast<uint32_t>(seq % 13);
  a.epoch = seq / 1000;
  a.first = seq * 7;
  a.count = static_cast<uint32_t>(seq % 64) + 1;
  a.flags = static_cast<uint8_t>(seq & 0xff);
  a.ready_ns = 1'000'000'000'000ull + seq;
  return a;
}

bool SameAnnouncement(const BatchAnnouncement& a, const BatchAnnouncement& b) {
  return a.seq == b.seq && a.slot == b.slot && a.epoch == b.epoch && a.first == b.first &&
         a.count == b.count && a.flags == b.flags && a.ready_ns == b.ready_ns;
}

::testing::AssertionResult PopsAs(Mailbox& m, uint64_t owner, uint64_t seq) {
  std::optional<BatchAnnouncement> a = m.Pop(owner);
  if (!a) return ::testing::AssertionFailure() << "nothing to pop, expected seq " << seq;
  if (!SameAnnouncement(*a, Announcement(seq))) {
    return ::testing::AssertionFailure() << "popped seq " << a->seq << " (slot " << a->slot << ", first " << a->first
                                         << "), expected seq " << seq;
  }
  return ::testing::AssertionSuccess();
}

class MailboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = "coloader-mailbox-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override { SharedMemory::Remove(name_); }

  std::string name_;
};

TEST_F(MailboxTest, BytesForIsOneHeaderAndItsEntriesPerMailbox) {
  static_assert(sizeof(MailboxEntry) == 48);
  EXPECT_EQ(MailboxArea::BytesFor(1, 1), 128u + 48u);
  EXPECT_EQ(MailboxArea::BytesFor(3, 4), 3u * (128u + 4u * 48u));
  EXPECT_EQ(MailboxArea::BytesFor(0, 16), 0u);
  EXPECT_EQ(MailboxArea::BytesFor(4, 0), 4u * 128u);
  // No 32-bit overflow: 65536 mailboxes of 65536 entries is ~206 GB.
  EXPECT_EQ(MailboxArea::BytesFor(65536, 65536), 65536ull * (128ull + 65536ull * 48ull));
}

TEST_F(MailboxTest, AFreshAreaHasEveryMailboxFreeAndEmpty) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 3, 4));
  EXPECT_EQ(area.count(), 3u);
  EXPECT_EQ(area.capacity(), 4u);
  EXPECT_EQ(area.name(), name_);
  for (uint32_t i = 0; i < area.count(); ++i) {
    Mailbox m = area.at(i);
    EXPECT_TRUE(m.Owned(0)) << "mailbox " << i;
    EXPECT_TRUE(m.Empty()) << "mailbox " << i;
    EXPECT_EQ(m.taken(), 0u) << "mailbox " << i;
    EXPECT_FALSE(m.Pop(0).has_value()) << "mailbox " << i;
  }
}

TEST_F(MailboxTest, PopsWhatWasPushedInOrderWithEveryField) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  m.Reset(7);
  ASSERT_TRUE(m.Push(Announcement(255)));
  ASSERT_TRUE(m.Push(Announcement(1)));
  ASSERT_TRUE(m.Push(Announcement(1'000'003)));
  EXPECT_FALSE(m.Empty());
  EXPECT_TRUE(PopsAs(m, 7, 255));
  EXPECT_TRUE(PopsAs(m, 7, 1));
  EXPECT_TRUE(PopsAs(m, 7, 1'000'003));
  EXPECT_TRUE(m.Empty());
  EXPECT_FALSE(m.Pop(7).has_value());
}

TEST_F(MailboxTest, KeepsOrderWhileWrappingAroundManyTimes) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 3));
  Mailbox m = area.at(0);
  m.Reset(1);
  uint64_t pushed = 0, popped = 0;
  // Two in, one out, then drain: head and tail cross the end of the ring at every phase.
  for (int round = 0; round < 50; ++round) {
    ASSERT_TRUE(m.Push(Announcement(pushed++)));
    ASSERT_TRUE(m.Push(Announcement(pushed++)));
    ASSERT_TRUE(PopsAs(m, 1, popped++));
    ASSERT_TRUE(PopsAs(m, 1, popped++));
  }
  EXPECT_EQ(m.taken(), 100u);
  EXPECT_TRUE(m.Empty());
}

TEST_F(MailboxTest, PushIsRefusedAtCapacityAndTheRefusedEntryIsNotStored) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  m.Reset(1);
  for (uint64_t s = 0; s < 4; ++s) ASSERT_TRUE(m.Push(Announcement(s))) << "push " << s;
  EXPECT_FALSE(m.Push(Announcement(100)));  // full: the consumer is not taking
  EXPECT_FALSE(m.Push(Announcement(101)));
  ASSERT_TRUE(PopsAs(m, 1, 0));
  EXPECT_TRUE(m.Push(Announcement(4)));  // one taken, one more fits
  EXPECT_FALSE(m.Push(Announcement(102)));
  for (uint64_t s = 1; s <= 4; ++s) EXPECT_TRUE(PopsAs(m, 1, s));
  EXPECT_TRUE(m.Empty());
}

TEST_F(MailboxTest, PopWithAStaleOwnerTakesNothing) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  m.Reset(41);
  ASSERT_TRUE(m.Push(Announcement(0)));
  EXPECT_TRUE(m.Owned(41));
  EXPECT_FALSE(m.Owned(40));
  EXPECT_FALSE(m.Pop(40).has_value());  // another consumer's id
  EXPECT_FALSE(m.Pop(0).has_value());   // the free marker is not an owner either
  EXPECT_EQ(m.taken(), 0u);             // the entry is still there for its owner
  EXPECT_TRUE(PopsAs(m, 41, 0));

  // The mailbox passes to consumer 42: the previous owner reads nothing, even with entries.
  m.Reset(42);
  ASSERT_TRUE(m.Push(Announcement(1)));
  EXPECT_FALSE(m.Owned(41));
  EXPECT_FALSE(m.Pop(41).has_value());
  EXPECT_TRUE(PopsAs(m, 42, 1));
}

TEST_F(MailboxTest, ResetEmptiesTheRingRestartsTakenAndRingsTheDoorbell) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  m.Reset(5);
  for (uint64_t s = 0; s < 4; ++s) ASSERT_TRUE(m.Push(Announcement(s)));
  ASSERT_TRUE(PopsAs(m, 5, 0));
  EXPECT_EQ(m.taken(), 1u);
  const uint32_t bell = m.doorbell();
  m.Reset(6);
  EXPECT_NE(m.doorbell(), bell);  // a waiter of the previous owner re-checks
  EXPECT_TRUE(m.Empty());
  EXPECT_EQ(m.taken(), 0u);
  EXPECT_FALSE(m.Pop(6).has_value());
  for (uint64_t s = 10; s < 14; ++s) EXPECT_TRUE(m.Push(Announcement(s)));  // the full capacity again
  EXPECT_TRUE(PopsAs(m, 6, 10));
}

TEST_F(MailboxTest, TakenCountsEntriesPoppedAndEmptyFollowsThem) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 8));
  Mailbox m = area.at(0);
  m.Reset(3);
  EXPECT_TRUE(m.Empty());
  for (uint64_t s = 0; s < 5; ++s) ASSERT_TRUE(m.Push(Announcement(s)));
  EXPECT_FALSE(m.Empty());
  EXPECT_EQ(m.taken(), 0u);  // pushing is not taking
  for (uint64_t s = 0; s < 5; ++s) {
    ASSERT_TRUE(PopsAs(m, 3, s));
    EXPECT_EQ(m.taken(), s + 1);
  }
  EXPECT_TRUE(m.Empty());
  EXPECT_FALSE(m.Pop(3).has_value());
  EXPECT_EQ(m.taken(), 5u);  // an empty pop takes nothing
}

TEST_F(MailboxTest, MailboxesOfOneAreaDoNotOverlap) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 3, 4));
  for (uint32_t i = 0; i < 3; ++i) area.at(i).Reset(100 + i);
  // Fill the middle one to capacity; its neighbours stay empty and free of its entries.
  Mailbox mid = area.at(1);
  for (uint64_t s = 0; s < 4; ++s) ASSERT_TRUE(mid.Push(Announcement(s)));
  EXPECT_TRUE(area.at(0).Empty());
  EXPECT_TRUE(area.at(2).Empty());
  Mailbox last = area.at(2);
  ASSERT_TRUE(last.Push(Announcement(77)));
  Mailbox first = area.at(0);
  ASSERT_TRUE(first.Push(Announcement(66)));
  EXPECT_TRUE(PopsAs(first, 100, 66));
  EXPECT_TRUE(PopsAs(last, 102, 77));
  for (uint64_t s = 0; s < 4; ++s) EXPECT_TRUE(PopsAs(mid, 101, s));
  EXPECT_TRUE(area.at(0).Owned(100));
  EXPECT_TRUE(area.at(1).Owned(101));
  EXPECT_TRUE(area.at(2).Owned(102));
}

TEST_F(MailboxTest, OpenSharesTheCreatorsMailboxes) {
  ASSERT_OK_AND_ASSIGN(MailboxArea producer_side, MailboxArea::Create(name_, 2, 4));
  ASSERT_OK_AND_ASSIGN(MailboxArea consumer_side, MailboxArea::Open(name_, 2, 4));
  EXPECT_EQ(consumer_side.name(), name_);
  EXPECT_EQ(consumer_side.count(), 2u);
  EXPECT_EQ(consumer_side.capacity(), 4u);
  producer_side.at(1).Reset(9);
  ASSERT_TRUE(producer_side.at(1).Push(Announcement(3)));
  Mailbox mine = consumer_side.at(1);
  EXPECT_TRUE(mine.Owned(9));
  EXPECT_TRUE(PopsAs(mine, 9, 3));
  EXPECT_EQ(producer_side.at(1).taken(), 1u);  // the producer sees how far the consumer read
  EXPECT_TRUE(consumer_side.at(0).Owned(0));
}

TEST_F(MailboxTest, OpenFailsForAMissingAreaOrOneSmallerThanAsked) {
  auto missing = MailboxArea::Open(name_, 1, 4);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(name_), std::string::npos) << missing.status().ToString();
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 2, 4));
  auto more_mailboxes = MailboxArea::Open(name_, 3, 4);
  ASSERT_FALSE(more_mailboxes.ok());
  EXPECT_NE(more_mailboxes.status().message().find(name_), std::string::npos);
  EXPECT_FALSE(MailboxArea::Open(name_, 2, 5).ok());  // deeper rings than were made
}

// A consumer that the producer gave up on (say it was SIGSTOPped past the heartbeat timeout)
// may still be inside Pop when its mailbox passes to the next consumer. The owner check is
// meant to make it harmless. Here a stale consumer pops under its old id in a loop while the
// mailbox is handed over again and again; the new owner must get each entry pushed for it.
//
// Pop used to check the owner, then read head, tail and the entry, then store head + 1: a stale
// Pop that passed the check just before a Reset took the new owner's first entry, or wrote
// back a head from before the Reset (tail - head negative: Push then refused forever). Now
// head carries the handover's generation and Pop takes an entry by compare-and-swap. The race
// is found by chance: with the old Pop this loop lost an entry within 10 ms (7,800 handovers) on
// the 2-core development machine; it runs 3 s.
TEST_F(MailboxTest, AStaleOwnerStillInsidePopNeverTakesTheNextOwnersEntries) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  std::atomic<bool> stop{false};
  std::thread stale([&] {
    while (!stop.load()) (void)m.Pop(1);
  });
  uint64_t handovers = 0, lost = 0;
  const auto t0 = Clock::now();
  for (uint64_t seq = 0; MillisSince(t0) < 3000 && lost == 0; seq += 2, ++handovers) {
    m.Reset(1);
    (void)m.Push(Announcement(seq));  // the stale consumer's last entry, its to take
    m.Reset(2);
    if (!m.Push(Announcement(seq + 1)) || !PopsAs(m, 2, seq + 1)) ++lost;
  }
  stop = true;
  stale.join();
  EXPECT_EQ(lost, 0u) << "the new owner lost its entry after " << handovers << " handovers";
}

TEST_F(MailboxTest, TakeBackReturnsTheUntakenEntriesAndLeavesTheMailboxEmptyForTheNext) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  m.Reset(3);
  EXPECT_FALSE(m.TakeBack().has_value()) << "nothing was pushed";
  for (uint64_t seq = 10; seq < 14; ++seq) ASSERT_TRUE(m.Push(Announcement(seq)));
  ASSERT_TRUE(PopsAs(m, 3, 10));
  std::optional<uint64_t> taken = m.TakeBack();
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(*taken, 1u) << "entries 1..3 (seqs 11..13) are back";
  EXPECT_TRUE(m.Empty());
  EXPECT_FALSE(m.Pop(3).has_value());
  EXPECT_EQ(m.taken(), 4u);
  EXPECT_FALSE(m.TakeBack().has_value()) << "nothing untaken is left";
  // The owner keeps its mailbox: what is pushed next is its to take, with the room freed.
  for (uint64_t seq = 20; seq < 24; ++seq) ASSERT_TRUE(m.Push(Announcement(seq)));
  for (uint64_t seq = 20; seq < 24; ++seq) EXPECT_TRUE(PopsAs(m, 3, seq));
}

// The consumer pops while the producer pushes and takes back: every entry is either popped or
// taken back, once, and the consumer sees what it pops in order.
TEST_F(MailboxTest, AnEntryIsEitherPoppedOrTakenBackNeverBothNorNeither) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 8));
  Mailbox m = area.at(0);
  m.Reset(5);
  constexpr uint64_t kEntries = 200000;
  std::atomic<bool> done{false};
  std::vector<uint64_t> popped;
  std::thread consumer([&] {
    while (!done.load() || !m.Empty()) {
      if (std::optional<BatchAnnouncement> a = m.Pop(5)) popped.push_back(a->seq);
    }
  });
  std::vector<uint64_t> back;
  uint64_t pushed = 0, tail = 0;
  while (pushed < kEntries) {
    if (m.Push(Announcement(pushed))) {
      ++pushed;
      ++tail;
    }
    if (pushed % 7 == 0) {
      if (std::optional<uint64_t> from = m.TakeBack())
        for (uint64_t i = *from; i < tail; ++i) back.push_back(i);  // the i-th entry pushed is seq i
    }
  }
  done = true;
  consumer.join();
  ASSERT_FALSE(back.empty()) << "the test never took an entry back";
  ASSERT_FALSE(popped.empty());
  EXPECT_TRUE(std::is_sorted(popped.begin(), popped.end()));
  std::vector<uint64_t> all = popped;
  all.insert(all.end(), back.begin(), back.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), kEntries) << popped.size() << " popped, " << back.size() << " taken back";
  for (uint64_t i = 0; i < kEntries; ++i) ASSERT_EQ(all[i], i);
}

// ------------------------------------------------------------------------- the doorbell

TEST_F(MailboxTest, WaitReturnsAtOnceWhenTheDoorbellAlreadyMovedOrEntriesWait) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  m.Reset(1);
  const uint32_t seen = m.doorbell();
  ASSERT_TRUE(m.Push(Announcement(0)));
  EXPECT_NE(m.doorbell(), seen);  // every push rings
  auto t0 = Clock::now();
  m.Wait(seen, 20000);  // moved since `seen`
  m.Wait(m.doorbell(), 20000);  // not moved, but the ring is not empty
  EXPECT_LT(MillisSince(t0), 10000);
  ASSERT_TRUE(PopsAs(m, 1, 0));
  const uint32_t before_wake = m.doorbell();
  m.Wake();
  EXPECT_NE(m.doorbell(), before_wake);
  t0 = Clock::now();
  m.Wait(before_wake, 20000);
  EXPECT_LT(MillisSince(t0), 10000);
}

TEST_F(MailboxTest, WaitOnAQuietEmptyMailboxReturnsAfterItsTimeout) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  m.Reset(1);
  const auto t0 = Clock::now();
  m.Wait(m.doorbell(), 150);
  const int64_t waited = MillisSince(t0);
  EXPECT_GE(waited, 140);   // it did sleep
  EXPECT_LT(waited, 10000);  // and not forever
  EXPECT_TRUE(m.Empty());
}

// True once the thread `tid` is asleep in a futex wait (the doorbell's), as the kernel
// reports it in /proc; bounded. Only then does a wake-up have to come from a FUTEX_WAKE.
bool WaitUntilAsleepInFutex(pid_t tid) {
  const std::string task = "/proc/self/task/" + std::to_string(tid);
  const auto t0 = Clock::now();
  while (MillisSince(t0) < 20000) {
    std::ifstream stat_file(task + "/stat"), syscall_file(task + "/syscall");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), {});
    long nr = -1;
    syscall_file >> nr;
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'S' && nr == SYS_futex) {
      return true;
    }
    std::this_thread::yield();
  }
  return false;
}

// A consumer thread that waits once on the mailbox's doorbell and records how long it slept.
class Waiter {
 public:
  Waiter(Mailbox m, int timeout_ms) : thread_([this, m, timeout_ms]() mutable {
    tid_ = static_cast<pid_t>(::syscall(SYS_gettid));
    const auto t0 = Clock::now();
    m.Wait(m.doorbell(), timeout_ms);
    waited_ms_ = MillisSince(t0);
  }) {}
  ~Waiter() { Join(); }
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  bool Asleep() {
    while (tid_.load() == 0) std::this_thread::yield();
    return WaitUntilAsleepInFutex(tid_.load());
  }
  int64_t Join() {
    if (thread_.joinable()) thread_.join();
    return waited_ms_.load();
  }

 private:
  std::atomic<pid_t> tid_{0};
  std::atomic<int64_t> waited_ms_{-1};
  std::thread thread_;
};

TEST_F(MailboxTest, APushWakesASleepingWaiterBeforeItsTimeout) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 2, 4));
  Mailbox m = area.at(1);
  m.Reset(1);
  constexpr int kTimeoutMs = 20000;
  Waiter consumer(m, kTimeoutMs);
  const bool asleep = consumer.Asleep();
  ASSERT_TRUE(m.Push(Announcement(0)));
  const int64_t waited = consumer.Join();
  ASSERT_TRUE(asleep) << "the waiter never slept on the doorbell";
  EXPECT_LT(waited, kTimeoutMs / 2) << "the push did not wake the waiter; it slept until its timeout";
  EXPECT_TRUE(PopsAs(m, 1, 0));
}

TEST_F(MailboxTest, WakeWakesASleepingWaiterWithoutAnEntry) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  m.Reset(1);
  constexpr int kTimeoutMs = 20000;
  Waiter consumer(m, kTimeoutMs);
  const bool asleep = consumer.Asleep();
  m.Wake();  // a goodbye or an error: the consumer re-checks
  const int64_t waited = consumer.Join();
  ASSERT_TRUE(asleep) << "the waiter never slept on the doorbell";
  EXPECT_LT(waited, kTimeoutMs / 2) << "Wake did not wake the waiter; it slept until its timeout";
  EXPECT_TRUE(m.Empty());
}

TEST_F(MailboxTest, ResetWakesTheWaitingPreviousOwner) {
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, 4));
  Mailbox m = area.at(0);
  m.Reset(1);
  constexpr int kTimeoutMs = 20000;
  Waiter consumer(m, kTimeoutMs);
  const bool asleep = consumer.Asleep();
  m.Reset(2);  // the mailbox passes to another consumer: the old one must learn it now
  const int64_t waited = consumer.Join();
  ASSERT_TRUE(asleep) << "the waiter never slept on the doorbell";
  EXPECT_LT(waited, kTimeoutMs / 2) << "Reset did not wake the previous owner";
  EXPECT_FALSE(m.Owned(1));
}

// ------------------------------------------------------------------ across two processes

// What the consumer process saw, written to the parent through a pipe.
struct ConsumerReport {
  uint64_t received = 0;
  uint64_t out_of_order = 0;  // entries whose seq or fields were not the next expected ones
  uint64_t slept_to_timeout = 0;  // waits that ran to their timeout: lost wake-ups
  uint64_t waits = 0;
};

// The consumer: opens the area by name and pops `n` entries, waiting on the doorbell
// whenever the ring is empty. Stops at the first wait that times out.
ConsumerReport ConsumeInChild(const std::string& name, uint32_t capacity, uint64_t owner, uint64_t n,
                              int wait_timeout_ms) {
  ConsumerReport r;
  auto area = MailboxArea::Open(name, 1, capacity);
  if (!area.ok()) return r;
  Mailbox m = area->at(0);
  while (r.received < n) {
    const uint32_t seen = m.doorbell();
    if (std::optional<BatchAnnouncement> a = m.Pop(owner)) {
      if (!SameAnnouncement(*a, Announcement(r.received))) ++r.out_of_order;
      ++r.received;
      continue;
    }
    ++r.waits;
    const auto t0 = Clock::now();
    m.Wait(seen, wait_timeout_ms);
    if (MillisSince(t0) >= wait_timeout_ms && m.doorbell() != seen) {
      // Slept the whole timeout although the doorbell had moved: a push did not wake us.
      ++r.slept_to_timeout;
      break;
    }
  }
  return r;
}

TEST_F(MailboxTest, AConsumerProcessReceivesEveryAnnouncementInOrderWithoutLostWakeUps) {
  constexpr uint32_t kCapacity = 4;
  constexpr uint64_t kEntries = 100'000;
  constexpr uint64_t kOwner = 0xC0FFEE;
  constexpr int kWaitTimeoutMs = 3000;
  ASSERT_OK_AND_ASSIGN(MailboxArea area, MailboxArea::Create(name_, 1, kCapacity));
  Mailbox m = area.at(0);
  m.Reset(kOwner);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    const ConsumerReport r = ConsumeInChild(name_, kCapacity, kOwner, kEntries, kWaitTimeoutMs);
    const bool written = ::write(fds[1], &r, sizeof(r)) == static_cast<ssize_t>(sizeof(r));
    ::_exit(written ? 0 : 1);
  }
  ::close(fds[1]);

  // The producer: push as fast as the ring allows; when it is full, wait for the consumer
  // to take (its `taken` moves), to have given up (its report arrived early), or to stall.
  bool consumer_gone = false, stalled = false;
  uint64_t full = 0;
  for (uint64_t s = 0; s < kEntries && !consumer_gone && !stalled;) {
    const uint64_t taken = m.taken();  // read before the push: a pop after it shows as progress
    if (m.Push(Announcement(s))) {
      ++s;
      continue;
    }
    ++full;
    const auto since = Clock::now();
    while (m.taken() == taken) {
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, 0) != 0) {
        consumer_gone = true;
        break;
      }
      if (MillisSince(since) > 10000) {
        stalled = true;
        break;
      }
      std::this_thread::yield();
    }
  }
  ConsumerReport r;
  pollfd p{fds[0], POLLIN, 0};
  const int reported = ::poll(&p, 1, stalled ? 0 : 60000);
  if (reported == 1) {
    EXPECT_EQ(::read(fds[0], &r, sizeof(r)), static_cast<ssize_t>(sizeof(r)));
  }
  ::close(fds[0]);
  if (reported != 1) ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_FALSE(stalled) << "the consumer stopped taking (" << m.taken() << " taken)";
  ASSERT_EQ(reported, 1) << "the consumer process did not finish";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_FALSE(consumer_gone);
  EXPECT_EQ(r.received, kEntries);
  EXPECT_EQ(r.out_of_order, 0u);
  EXPECT_EQ(r.slept_to_timeout, 0u) << "a consumer slept through a push (" << r.waits << " waits)";
  EXPECT_EQ(m.taken(), kEntries);
  EXPECT_GT(full, 0u) << "the ring never filled: the test did not exercise the capacity";
  EXPECT_GT(r.waits, 0u) << "the consumer never waited: the test did not exercise the doorbell";
}

}  // namespace
}  // namespace coloader
