// ExternalSource (producer/external_source.h): batches made by the caller. The session loop
// grants slots; the caller's thread copies a batch into one and hands it back, the latest
// one held back until it is known whether it ends its epoch. The session loop's side is
// played by the test's main thread; the caller's by the same thread or, where Publish must
// block, by a second thread that the test sees asleep (in /proc) before it acts.
#include "producer/external_source.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/test_support.h"

namespace coloader {
namespace {

constexpr uint32_t kSlots = 4, kBatch = 4;
constexpr uint8_t kUntouched = 0xEE;

// A batch of two fields: 2x2x3 uint8 samples and an int64 label each.
std::vector<FieldSpec> Fields() {
  return {FieldSpec{"[0]", DType::kUInt8, {2, 2, 3}}, FieldSpec{"[1]", DType::kInt64, {}}};
}

// Slots of 4 samples, with a gap between the sections (where nothing may be written) and a
// slot stride larger than the slot's content.
SlotTable Layout() {
  SlotTable t;
  t.shm_name = "unused";
  t.num_slots = kSlots;
  t.batch_size = kBatch;
  t.height = t.width = t.channels = 1;
  t.fields = Fields();
  t.indices_offset = 8;
  t.labels_offset = t.indices_offset + 8 * kBatch + 8;
  t.data_offset = t.labels_offset + 8 * kBatch + 8;
  t.slot_bytes = t.data_offset + t.data_bytes(kBatch) + 24;
  return t;
}

bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

// A batch as the caller hands it over: samples whose bytes derive from `tag`.
struct CallerBatch {
  CallerBatch(uint32_t count, int tag) : data(count * 12), labels(count), indices(count) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(tag * 16 + i);
    for (uint32_t i = 0; i < count; ++i) {
      labels[i] = 1000 * tag + i;
      indices[i] = 50 * tag + 3 * i + 1;
    }
  }
  uint32_t count() const { return static_cast<uint32_t>(labels.size()); }
  std::vector<uint8_t> data;
  std::vector<int64_t> labels, indices;
};

// True once the thread `tid` is asleep in a futex wait (a condition variable's), as the
// kernel reports it; bounded.
bool WaitUntilAsleepInFutex(pid_t tid) {
  const std::string task = "/proc/self/task/" + std::to_string(tid);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
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

// Waits (bounded) until `flag` is set.
bool WaitUntilSet(const std::atomic<bool>& flag) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

class ExternalSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = Layout();
    ring_.assign(layout_.num_slots * layout_.slot_bytes, kUntouched);
    auto made = ExternalSource::Make(Fields(), 0);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    source_ = std::move(*made);
    SourceRing ring;
    ring.table = layout_;
    ring.base = ring_.data();
    ASSERT_TRUE(source_->Attach(ring).ok());
  }

  // The session loop hands the caller a free slot (BatchSource::Fill).
  void Grant(uint32_t s) { source_->Fill(s, Slot(s), 0); }
  void StopSource() { source_->Stop(Status::Disconnected("the producer stopped")); }

  uint8_t* Slot(uint32_t s) { return ring_.data() + s * layout_.slot_bytes; }
  const int64_t* Indices(uint32_t s) { return reinterpret_cast<const int64_t*>(Slot(s) + layout_.indices_offset); }
  const int64_t* Labels(uint32_t s) { return reinterpret_cast<const int64_t*>(Slot(s) + layout_.labels_offset); }

  // The slot holds `b` where the layout puts it (each field at its region, the slot's own
  // labels -1), and nothing else of it was written.
  ::testing::AssertionResult SlotHolds(uint32_t s, const CallerBatch& b, const std::vector<int64_t>& indices) {
    const uint32_t n = b.count();
    const std::vector<uint64_t> at = FieldOffsets(layout_.fields, kBatch);
    if (std::memcmp(Indices(s), indices.data(), 8 * n) != 0) return ::testing::AssertionFailure() << "indices differ";
    for (uint32_t i = 0; i < n; ++i)
      if (Labels(s)[i] != -1) return ::testing::AssertionFailure() << "slot label " << i << " is " << Labels(s)[i];
    if (std::memcmp(Slot(s) + layout_.data_offset + at[0], b.data.data(), b.data.size()) != 0) {
      return ::testing::AssertionFailure() << "field 0 differs";
    }
    if (std::memcmp(Slot(s) + layout_.data_offset + at[1], b.labels.data(), 8 * n) != 0) {
      return ::testing::AssertionFailure() << "field 1 differs";
    }
    std::vector<bool> written(layout_.slot_bytes, false);
    for (uint64_t i = 0; i < 8 * n; ++i) written[layout_.indices_offset + i] = written[layout_.labels_offset + i] = true;
    for (uint64_t i = 0; i < b.data.size(); ++i) written[layout_.data_offset + at[0] + i] = true;
    for (uint64_t i = 0; i < 8 * n; ++i) written[layout_.data_offset + at[1] + i] = true;
    for (uint64_t i = 0; i < layout_.slot_bytes; ++i) {
      if (!written[i] && Slot(s)[i] != kUntouched) {
        return ::testing::AssertionFailure() << "byte " << i << " of slot " << s << " was written outside the batch";
      }
    }
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult SlotUntouched(uint32_t s) {
    for (uint64_t i = 0; i < layout_.slot_bytes; ++i) {
      if (Slot(s)[i] != kUntouched) return ::testing::AssertionFailure() << "byte " << i << " of slot " << s << " written";
    }
    return ::testing::AssertionSuccess();
  }

  // Publish's outcome for these tests: OK when published, its error, or kInternal when it
  // published nothing because the run was over (Publish's false).
  static Status Published(const Result<bool>& published) {
    if (!published.ok()) return published.status();
    return *published ? Status::OK() : Status::Internal("not published: the run was over");
  }
  Status Publish(const CallerBatch& b, const int64_t* indices) {
    const void* fields[] = {b.data.data(), b.labels.data()};
    return Published(source_->Publish(fields, b.count(), indices));
  }
  Status Publish(const CallerBatch& b) { return Publish(b, b.indices.data()); }
  // A Publish that must not block: if it has not returned within 20 s, the source is
  // stopped (which ends it) and the result is a timeout.
  template <typename F>
  Status WithoutBlocking(F publish) {
    std::atomic<bool> returned{false};
    Status st;
    std::thread caller([&] {
      st = publish();
      returned = true;
    });
    const bool in_time = WaitUntilSet(returned);
    if (!in_time) StopSource();
    caller.join();
    return in_time ? st : Status::Timeout("Publish blocked: no granted slot was left for it");
  }

  SlotTable layout_;
  std::vector<uint8_t> ring_;
  std::unique_ptr<ExternalSource> source_;
};

TEST_F(ExternalSourceTest, APublishedBatchIsWrittenIntoTheGrantedSlotsLayout) {
  Grant(2);
  const CallerBatch b(3, 1);  // fewer than batch_size
  ASSERT_OK(Publish(b));
  EXPECT_TRUE(SlotHolds(2, b, b.indices));
  EXPECT_TRUE(SlotUntouched(0));
  EXPECT_TRUE(SlotUntouched(1));
  EXPECT_TRUE(SlotUntouched(3));
}

TEST_F(ExternalSourceTest, TheLatestBatchIsHeldBackUntilTheNextPublish) {
  for (uint32_t s : {3u, 1u, 0u}) Grant(s);
  const CallerBatch first(4, 1), second(2, 2), third(4, 3);
  ASSERT_OK(Publish(first));
  EXPECT_TRUE(source_->TakeCompleted().empty());  // it may yet be the epoch's last
  ASSERT_OK(Publish(second));
  auto done = source_->TakeCompleted();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->seq, 0u);
  EXPECT_EQ(done[0]->slot, 3u);  // slots are used in the order granted
  EXPECT_EQ(done[0]->epoch, 0u);
  EXPECT_EQ(done[0]->first, 0u);
  EXPECT_FALSE(done[0]->last_in_epoch);
  EXPECT_EQ(done[0]->indices, first.indices);
  EXPECT_EQ(done[0]->slot_base, Slot(3));
  EXPECT_TRUE(done[0]->failures.empty());
  ASSERT_OK(Publish(third));
  done = source_->TakeCompleted();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->seq, 1u);
  EXPECT_EQ(done[0]->slot, 1u);
  EXPECT_EQ(done[0]->first, 4u);  // position within the epoch: after the first batch's 4
  EXPECT_EQ(done[0]->indices, second.indices);
  EXPECT_TRUE(SlotHolds(3, first, first.indices));
  EXPECT_TRUE(SlotHolds(1, second, second.indices));
  EXPECT_TRUE(SlotHolds(0, third, third.indices));
}

TEST_F(ExternalSourceTest, EndEpochReleasesTheHeldBatchAsLastInEpochAndStartsTheNext) {
  for (uint32_t s = 0; s < 3; ++s) Grant(s);
  const CallerBatch a(4, 1), b(3, 2), c(4, 3);
  ASSERT_OK(Publish(a));
  ASSERT_OK(Publish(b));
  ASSERT_OK(source_->EndEpoch());
  auto done = source_->TakeCompleted();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0]->seq, 0u);
  EXPECT_FALSE(done[0]->last_in_epoch);
  EXPECT_EQ(done[1]->seq, 1u);
  EXPECT_TRUE(done[1]->last_in_epoch);
  EXPECT_EQ(done[1]->epoch, 0u);
  EXPECT_EQ(done[1]->first, 4u);
  ASSERT_OK(Publish(c));
  ASSERT_OK(source_->EndEpoch());
  done = source_->TakeCompleted();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->seq, 2u);  // numbering goes on across epochs
  EXPECT_EQ(done[0]->epoch, 1u);
  EXPECT_EQ(done[0]->first, 0u);  // positions restart
  EXPECT_TRUE(done[0]->last_in_epoch);
}

TEST_F(ExternalSourceTest, EndEpochWithNothingPublishedCompletesNoBatch) {
  ASSERT_OK(source_->EndEpoch());
  EXPECT_FALSE(Readable(source_->event_fd()));  // nothing for the session loop to wake for
  EXPECT_TRUE(source_->TakeCompleted().empty());
}

TEST_F(ExternalSourceTest, WithoutIndicesEachSampleIsNumberedByItsPositionInTheEpoch) {
  for (uint32_t s = 0; s < 3; ++s) Grant(s);
  const CallerBatch a(3, 1), b(2, 2);
  ASSERT_OK(Publish(a, nullptr));
  ASSERT_OK(Publish(b, nullptr));
  ASSERT_OK(source_->EndEpoch());
  auto done = source_->TakeCompleted();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0]->indices, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(done[1]->indices, (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(SlotHolds(0, a, {0, 1, 2}));
  EXPECT_TRUE(SlotHolds(1, b, {3, 4}));
  const void* first[] = {a.data.data(), a.labels.data()};
  ASSERT_OK(Published(source_->Publish(first, 1, nullptr)));
  ASSERT_OK(source_->EndEpoch());
  done = source_->TakeCompleted();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->indices, (std::vector<int64_t>{0}));  // the new epoch counts from 0
}

TEST_F(ExternalSourceTest, BadBatchesAreRefusedWithoutTakingAGrantedSlot) {
  Grant(1);
  const CallerBatch b(kBatch + 1, 1);
  const void* fields[] = {b.data.data(), b.labels.data()};
  const Status empty = WithoutBlocking([&] { return Published(source_->Publish(fields, 0, nullptr)); });
  EXPECT_EQ(empty.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.message().find("1 to 4"), std::string::npos) << empty.ToString();
  const Status too_many = WithoutBlocking([&] { return Publish(b); });
  EXPECT_EQ(too_many.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("5"), std::string::npos) << too_many.ToString();
  const Status no_fields = WithoutBlocking([&] { return Published(source_->Publish(nullptr, 1, nullptr)); });
  EXPECT_EQ(no_fields.code(), StatusCode::kInvalidArgument) << no_fields.ToString();
  const void* no_labels[] = {b.data.data(), nullptr};
  const Status missing = WithoutBlocking([&] { return Published(source_->Publish(no_labels, 1, nullptr)); });
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument) << missing.ToString();
  EXPECT_NE(missing.message().find("[1]"), std::string::npos) << missing.ToString();  // names the field
  EXPECT_TRUE(SlotUntouched(1));
  // The slot is still granted: a good batch goes into it without another Grant.
  const CallerBatch good(kBatch, 2);
  ASSERT_OK(WithoutBlocking([&] { return Publish(good); }));
  EXPECT_TRUE(SlotHolds(1, good, good.indices));
}

TEST_F(ExternalSourceTest, PublishBlocksWhileNoSlotIsGrantedAndWakesWhenOneIs) {
  Grant(0);
  const CallerBatch a(2, 1), b(3, 2);
  ASSERT_OK(Publish(a));  // takes the only slot granted
  std::atomic<pid_t> tid{0};
  std::atomic<bool> returned{false};
  Status st = Status::Internal("not returned");
  std::thread caller([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    st = Publish(b);
    returned = true;
  });
  while (tid.load() == 0) std::this_thread::yield();
  EXPECT_TRUE(WaitUntilAsleepInFutex(tid.load())) << "the caller never blocked";
  EXPECT_FALSE(returned.load()) << "Publish returned without a slot";
  EXPECT_TRUE(SlotUntouched(2));
  EXPECT_TRUE(source_->TakeCompleted().empty());
  Grant(2);
  const bool woke = WaitUntilSet(returned);
  if (!woke) StopSource();  // so that the caller can be joined
  caller.join();
  ASSERT_TRUE(woke) << "Grant did not wake the blocked Publish";
  ASSERT_OK(st);
  EXPECT_TRUE(SlotHolds(2, b, b.indices));
  auto done = source_->TakeCompleted();  // the woken Publish released the batch before it
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->slot, 0u);
}

TEST_F(ExternalSourceTest, StopWakesABlockedPublishWithAnError) {
  const CallerBatch b(2, 1);
  Status st = Status::Internal("not returned");
  std::atomic<pid_t> tid{0};
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    st = Publish(b);
    returned = true;
  });
  while (tid.load() == 0) std::this_thread::yield();
  const bool blocked = WaitUntilAsleepInFutex(tid.load());
  StopSource();
  const bool woke = WaitUntilSet(returned);
  if (!woke) Grant(0);  // so that the caller can be joined
  caller.join();
  ASSERT_TRUE(blocked) << "the caller never blocked";
  ASSERT_TRUE(woke) << "Stop did not wake the blocked Publish";
  EXPECT_EQ(st.code(), StatusCode::kDisconnected) << st.ToString();
  EXPECT_TRUE(SlotUntouched(0));
  // Once stopped, a Publish fails at once, even with a slot granted.
  Grant(0);
  EXPECT_EQ(Publish(b).code(), StatusCode::kDisconnected);
  EXPECT_TRUE(SlotUntouched(0));
}

TEST_F(ExternalSourceTest, FinishReleasesTheHeldBatchAndReturnsTheUnfilledSlots) {
  for (uint32_t s : {2u, 0u, 3u, 1u}) Grant(s);
  const CallerBatch a(4, 1), b(1, 2);
  ASSERT_OK(Publish(a));
  ASSERT_OK(Publish(b));
  EXPECT_FALSE(source_->exhausted());
  EXPECT_TRUE(source_->TakeReturned().empty());  // nothing given back before Finish
  source_->Finish();
  EXPECT_TRUE(source_->exhausted());
  auto done = source_->TakeCompleted();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[1]->slot, 0u);
  EXPECT_TRUE(done[1]->last_in_epoch);  // nothing follows it
  EXPECT_EQ(source_->TakeReturned(), (std::vector<uint32_t>{3, 1}));
  EXPECT_TRUE(source_->TakeReturned().empty());  // given back once
  EXPECT_TRUE(SlotUntouched(3));
  EXPECT_TRUE(SlotUntouched(1));
  const Status after = Publish(b);
  EXPECT_EQ(after.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(after.message().find("finished"), std::string::npos) << after.ToString();
}

// The caller's bounded wait: not yet while no slot is free, true once one is; once the run is
// over, false when it ended without an error (its consumers all left) and the error otherwise
// (the first reason given is the one).
TEST_F(ExternalSourceTest, WaitForSlotIsBoundedAndHearsHowTheRunEnded) {
  ASSERT_OK_AND_ASSIGN(Waited<bool> slot, source_->WaitForSlot(10));
  EXPECT_FALSE(slot.ready());
  Grant(1);
  ASSERT_OK_AND_ASSIGN(slot, source_->WaitForSlot(10));
  ASSERT_TRUE(slot.ready());
  EXPECT_TRUE(*slot);
  ASSERT_OK(Publish(CallerBatch(1, 1)));
  ASSERT_OK_AND_ASSIGN(slot, source_->WaitForSlot(10));
  EXPECT_FALSE(slot.ready());
  source_->Stop(Status::OK());  // the consumers all left
  source_->Stop(Status::Disconnected("the producer stopped"));
  ASSERT_OK_AND_ASSIGN(slot, source_->WaitForSlot(10));
  ASSERT_TRUE(slot.ready());
  EXPECT_FALSE(*slot);
  Grant(2);  // a slot granted after the end is not used
  const CallerBatch b(1, 2);
  const void* fields[] = {b.data.data(), b.labels.data()};
  ASSERT_OK_AND_ASSIGN(const bool published, source_->Publish(fields, b.count(), b.indices.data()));
  EXPECT_FALSE(published);
  EXPECT_TRUE(SlotUntouched(2));
}

TEST_F(ExternalSourceTest, AfterAnErrorStopTheWaitAndPublishReturnTheError) {
  source_->Stop(Status::Disconnected("the producer stopped: a socket failed"));
  source_->Stop(Status::OK());
  const Result<Waited<bool>> slot = source_->WaitForSlot(10);
  EXPECT_EQ(slot.status().code(), StatusCode::kDisconnected) << slot.status().ToString();
  EXPECT_EQ(slot.status().message(), "the producer stopped: a socket failed");
  EXPECT_EQ(Publish(CallerBatch(1, 1)).code(), StatusCode::kDisconnected);
}

// The session loop may hand out a slot just after the caller finished: it is not used, and it
// comes back (else the ring would never empty and the run never end).
TEST_F(ExternalSourceTest, SlotsGrantedAfterFinishAreNotUsedAndComeBack) {
  source_->Finish();
  (void)source_->TakeReturned();
  Grant(2);
  EXPECT_NE(Publish(CallerBatch(1, 1)).code(), StatusCode::kOk);
  EXPECT_TRUE(SlotUntouched(2));
  EXPECT_EQ(source_->TakeReturned(), std::vector<uint32_t>{2});
}

TEST_F(ExternalSourceTest, EventFdIsReadableWhileACompletedBatchOrFinishWaits) {
  const int fd = source_->event_fd();
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(Readable(fd));
  for (uint32_t s = 0; s < 3; ++s) Grant(s);
  ASSERT_OK(Publish(CallerBatch(1, 1)));
  EXPECT_FALSE(Readable(fd));  // held back: nothing for the session loop yet
  ASSERT_OK(Publish(CallerBatch(1, 2)));
  EXPECT_TRUE(Readable(fd));
  EXPECT_EQ(source_->TakeCompleted().size(), 1u);
  EXPECT_FALSE(Readable(fd));  // taking drains it
  ASSERT_OK(source_->EndEpoch());
  EXPECT_TRUE(Readable(fd));
  EXPECT_EQ(source_->TakeCompleted().size(), 1u);
  EXPECT_FALSE(Readable(fd));
  source_->Finish();  // nothing held, yet the loop must learn that the caller is done
  EXPECT_TRUE(Readable(fd));
  EXPECT_TRUE(source_->TakeCompleted().empty());
  EXPECT_EQ(source_->TakeReturned(), (std::vector<uint32_t>{2}));
}

}  // namespace
}  // namespace coloader
