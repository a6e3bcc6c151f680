// Pipeline (pipeline/assemble/pool.h): the producer's worker pool. Over real JPEGs (made with
// TurboJPEG by MakeImageFolder, plus broken files), every sample of a submitted job must land
// at its place in the slot exactly as SampleTransform makes it alone; jobs come back through
// the eventfd in completion order; bad files are recorded and compacted away; and a pool
// destroyed with work queued stops without hanging or leaking.
#include "pipeline/assemble/pool.h"

#include <malloc.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/test_support.h"

#ifndef COLOADER_SOURCE_DIR
#define COLOADER_SOURCE_DIR "."
#endif

namespace coloader {
namespace {

namespace fs = std::filesystem;
using ::coloader::testing::MakeImageFolder;
using ::coloader::testing::ReadFile;
using ::coloader::testing::TempDir;
using ::coloader::testing::WriteFile;
using Jobs = std::vector<std::unique_ptr<BatchJob>>;

constexpr uint32_t kBatch = 8;
constexpr uint64_t kSeed = 2024;
constexpr uint8_t kUntouched = 0xEE;

// RandomResizedCrop + flip to 24x24, normalised float32 NCHW: every random draw and the
// layout conversion are exercised, and a sample written one place off would show.
TransformOptions Options() {
  TransformOptions o;
  o.augment.mode = AugmentMode::kTrain;
  o.augment.size = 24;
  o.output = DType::kFloat32;
  o.layout = TensorLayout::kNCHW;
  return o;
}

SlotTable Layout(uint32_t num_slots) {
  SlotTable t;
  t.num_slots = num_slots;
  t.batch_size = kBatch;
  t.height = t.width = 24;
  t.channels = 3;
  t.dtype = DType::kFloat32;
  t.layout = TensorLayout::kNCHW;
  t.indices_offset = 0;
  t.labels_offset = 8 * kBatch;
  t.data_offset = 16 * kBatch;
  t.slot_bytes = t.data_offset + kBatch * t.sample_bytes();
  return t;
}

// Waits for `n` completed jobs (bounded), taking them whenever the eventfd says so.
Jobs WaitForJobs(Pipeline& p, size_t n, int timeout_ms = 60000) {
  Jobs out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (out.size() < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd fd{p.event_fd(), POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(left.count())) != 1) break;
    for (auto& job : p.TakeCompleted()) out.push_back(std::move(job));
  }
  return out;
}

bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/images";
    ASSERT_EQ(MakeImageFolder(root_, 20, 3), 20);
    // Files a real dataset holds that cannot be decoded: an empty one, one cut short, and
    // text named .jpg. They sort after the good ones of their class.
    WriteFile(root_ + "/class1/zz_empty.jpg", "");
    const std::string good = ReadFile(root_ + "/class0/img00000.jpg");
    WriteFile(root_ + "/class1/zz_truncated.jpg", good.substr(0, good.size() / 2));
    WriteFile(root_ + "/class2/zz_text.jpg",
              ReadFile(std::string(COLOADER_SOURCE_DIR) + "/tests/data/not_an_image.jpg"));
    auto ds = Dataset::Open(root_);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    dataset_ = std::move(*ds);
    ASSERT_EQ(dataset_.size(), 23u);
    for (size_t i = 0; i < dataset_.size(); ++i) {
      if (dataset_[i].path.find("/zz_") == std::string::npos) good_.push_back(static_cast<int64_t>(i));
      else bad_.push_back(static_cast<int64_t>(i));
    }
    ASSERT_EQ(good_.size(), 20u);
    ASSERT_EQ(bad_.size(), 3u);
  }

  void MakePipeline(int workers, uint32_t num_slots = 4) {
    layout_ = Layout(num_slots);
    ring_.assign(layout_.num_slots * layout_.slot_bytes, kUntouched);
    auto p = Pipeline::Make(&dataset_, Options(), workers, kSeed, layout_);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pipeline_ = std::move(*p);
  }

  std::unique_ptr<BatchJob> Job(uint64_t seq, uint32_t slot, uint64_t epoch, std::vector<int64_t> indices) {
    auto job = std::make_unique<BatchJob>();
    job->seq = seq;
    job->slot = slot;
    job->epoch = epoch;
    job->first = seq * kBatch;
    job->indices = std::move(indices);
    job->slot_base = Slot(slot);
    return job;
  }

  uint8_t* Slot(uint32_t s) { return ring_.data() + s * layout_.slot_bytes; }
  const int64_t* Indices(uint32_t s) { return reinterpret_cast<const int64_t*>(Slot(s) + layout_.indices_offset); }
  const int64_t* Labels(uint32_t s) { return reinterpret_cast<const int64_t*>(Slot(s) + layout_.labels_offset); }
  uint8_t* Data(uint32_t s, uint32_t pos) { return Slot(s) + layout_.data_offset + pos * layout_.sample_bytes(); }

  // Dataset sample `index` of `epoch` as one SampleTransform makes it on its own.
  std::vector<uint8_t> Expected(int64_t index, uint64_t epoch) {
    SampleTransform t(Options());
    EXPECT_EQ(t.sample_bytes(), layout_.sample_bytes());
    std::vector<uint8_t> out(t.sample_bytes());
    const Status st = t.Run(dataset_[static_cast<size_t>(index)].path, kSeed, epoch, static_cast<uint64_t>(index), out.data());
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }

  // Position `pos` of slot `s` holds dataset sample `index` of `epoch`: index, label, pixels.
  ::testing::AssertionResult HoldsSample(uint32_t s, uint32_t pos, int64_t index, uint64_t epoch) {
    if (Indices(s)[pos] != index) {
      return ::testing::AssertionFailure() << "slot " << s << " position " << pos << " has index " << Indices(s)[pos]
                                           << ", expected " << index;
    }
    if (Labels(s)[pos] != dataset_[static_cast<size_t>(index)].label) {
      return ::testing::AssertionFailure() << "slot " << s << " position " << pos << " has label " << Labels(s)[pos];
    }
    const std::vector<uint8_t> want = Expected(index, epoch);
    if (std::memcmp(Data(s, pos), want.data(), want.size()) != 0) {
      return ::testing::AssertionFailure() << "slot " << s << " position " << pos << ": pixels differ from sample "
                                           << index << " of epoch " << epoch << " transformed alone";
    }
    return ::testing::AssertionSuccess();
  }

  ::testing::AssertionResult DataUntouched(uint32_t s, uint32_t from_pos) {
    const uint8_t* p = Data(s, from_pos);
    const uint8_t* end = Slot(s) + layout_.slot_bytes;
    for (; p < end; ++p) {
      if (*p != kUntouched) return ::testing::AssertionFailure() << "slot " << s << " written past position " << from_pos;
    }
    return ::testing::AssertionSuccess();
  }

  TempDir dir_;
  std::string root_;
  Dataset dataset_;
  std::vector<int64_t> good_, bad_;
  SlotTable layout_;
  std::vector<uint8_t> ring_;
  std::unique_ptr<Pipeline> pipeline_;
};

TEST_F(PipelineTest, MakeStartsTheWorkersAskedAndRefusesNone) {
  MakePipeline(3);
  EXPECT_EQ(pipeline_->workers(), 3);
  EXPECT_EQ(pipeline_->in_flight(), 0u);
  EXPECT_FALSE(Readable(pipeline_->event_fd()));
  auto none = Pipeline::Make(&dataset_, Options(), 0, kSeed, Layout(1));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("got 0"), std::string::npos) << none.status().ToString();
}

TEST_F(PipelineTest, EverySampleIsWrittenAtItsPlaceAsTheTransformMakesIt) {
  MakePipeline(3);
  // Shuffled indices, two epochs (their crops differ), a full batch and a short one.
  const std::vector<int64_t> a = {good_[17], good_[2], good_[9], good_[0], good_[19], good_[5], good_[11], good_[3]};
  const std::vector<int64_t> b = {good_[4], good_[16], good_[8], good_[1], good_[12]};
  pipeline_->Submit(Job(0, 2, 0, a));
  pipeline_->Submit(Job(1, 0, 1, b));
  EXPECT_EQ(pipeline_->in_flight(), 2u);
  Jobs done = WaitForJobs(*pipeline_, 2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(pipeline_->in_flight(), 0u);
  for (const auto& job : done) {
    EXPECT_TRUE(job->failures.empty());
    EXPECT_EQ(job->remaining.load(), 0u);
  }
  for (uint32_t pos = 0; pos < a.size(); ++pos) EXPECT_TRUE(HoldsSample(2, pos, a[pos], 0));
  for (uint32_t pos = 0; pos < b.size(); ++pos) EXPECT_TRUE(HoldsSample(0, pos, b[pos], 1));
  EXPECT_TRUE(DataUntouched(0, static_cast<uint32_t>(b.size())));  // a short batch stays inside its samples
  for (uint32_t s : {1u, 3u}) EXPECT_TRUE(DataUntouched(s, 0));
  // The same sample in another epoch is another crop: the comparison above can tell epochs apart.
  EXPECT_NE(Expected(a[0], 0), Expected(a[0], 1));
}

TEST_F(PipelineTest, WithOneWorkerJobsCompleteInSubmissionOrder) {
  MakePipeline(1);
  for (uint64_t seq = 0; seq < 4; ++seq) {
    std::vector<int64_t> indices(seq % 2 == 0 ? 5 : 2);
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = good_[(seq * 5 + i) % good_.size()];
    pipeline_->Submit(Job(seq, static_cast<uint32_t>(seq), 0, indices));
  }
  Jobs done = WaitForJobs(*pipeline_, 4);
  ASSERT_EQ(done.size(), 4u);
  for (uint64_t seq = 0; seq < 4; ++seq) EXPECT_EQ(done[seq]->seq, seq);
}

TEST_F(PipelineTest, WithManyWorkersEveryJobCompletesExactlyOnce) {
  MakePipeline(4, 12);
  for (uint64_t seq = 0; seq < 12; ++seq) {
    std::vector<int64_t> indices(1 + seq % kBatch);
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = good_[(seq * 3 + i) % good_.size()];
    pipeline_->Submit(Job(seq, static_cast<uint32_t>(seq), 0, indices));
  }
  Jobs done = WaitForJobs(*pipeline_, 12);
  ASSERT_EQ(done.size(), 12u);
  std::set<uint64_t> seqs;
  for (const auto& job : done) seqs.insert(job->seq);
  EXPECT_EQ(seqs.size(), 12u);
  EXPECT_EQ(pipeline_->in_flight(), 0u);
  EXPECT_FALSE(Readable(pipeline_->event_fd()));
  EXPECT_TRUE(pipeline_->TakeCompleted().empty());
  for (const auto& job : done) {
    for (uint32_t pos = 0; pos < job->indices.size(); ++pos) EXPECT_TRUE(HoldsSample(job->slot, pos, job->indices[pos], 0));
  }
}

// A later job finishes before an earlier one that waits on its file: the pool hands jobs back
// as they complete, not as they were submitted. The earlier job's file is a FIFO, so its
// worker blocks in open() until the test opens the other end: no timing involved.
TEST_F(PipelineTest, AJobCompletesAsSoonAsItsSamplesAreDoneNotInSubmissionOrder) {
  const std::string gate = dir_.path() + "/gate.jpg";
  ASSERT_EQ(::mkfifo(gate.c_str(), 0600), 0);
  std::string list;
  for (int64_t i : good_) list += dataset_[static_cast<size_t>(i)].path + ",0\n";
  list += gate + ",1\n";
  WriteFile(dir_.path() + "/list.txt", list);
  auto with_gate = Dataset::Open(dir_.path() + "/list.txt");
  ASSERT_TRUE(with_gate.ok()) << with_gate.status().ToString();
  const int64_t gate_index = static_cast<int64_t>(with_gate->size()) - 1;
  layout_ = Layout(2);
  ring_.assign(layout_.num_slots * layout_.slot_bytes, kUntouched);
  auto made = Pipeline::Make(&*with_gate, Options(), 2, kSeed, layout_);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::unique_ptr<Pipeline> p = std::move(*made);
  // However this test ends, the gate opens before the pool is joined.
  struct OpenGateFirst {
    std::string gate;
    std::unique_ptr<Pipeline>& p;
    ~OpenGateFirst() {
      const int fd = ::open(gate.c_str(), O_RDWR | O_CLOEXEC);  // never blocks on a FIFO
      p.reset();
      if (fd >= 0) ::close(fd);
    }
  } guard{gate, p};

  p->Submit(Job(0, 0, 0, {gate_index}));
  p->Submit(Job(1, 1, 0, {0, 1}));
  Jobs first = WaitForJobs(*p, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]->seq, 1u);
  EXPECT_EQ(p->in_flight(), 1u);  // job 0 is still out

  // A writer on the FIFO lets the worker's open() through (whether it is there yet or not).
  const int fd = ::open(gate.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Jobs second = WaitForJobs(*p, 1);
  ::close(fd);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0]->seq, 0u);
  ASSERT_EQ(second[0]->failures.size(), 1u);  // a FIFO holds no image
  EXPECT_NE(second[0]->failures[0].second.find(gate), std::string::npos);
  EXPECT_EQ(p->in_flight(), 0u);
}

TEST_F(PipelineTest, AJobOfZeroSamplesCompletes) {
  MakePipeline(2);
  pipeline_->Submit(Job(7, 3, 0, {}));
  EXPECT_TRUE(Readable(pipeline_->event_fd()));  // at once: no worker has anything to do
  Jobs done = pipeline_->TakeCompleted();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->seq, 7u);
  EXPECT_TRUE(done[0]->failures.empty());
  EXPECT_EQ(pipeline_->FillFailed(*done[0]), 0u);
  EXPECT_EQ(pipeline_->in_flight(), 0u);
  EXPECT_TRUE(DataUntouched(3, 0));
  EXPECT_EQ(Indices(3)[0], static_cast<int64_t>(0xEEEEEEEEEEEEEEEEull));
}

TEST_F(PipelineTest, BadFilesAreRecordedWithTheirPathAndTakeTheNextGoodSamplesPlace) {
  MakePipeline(3);
  // good, bad, good, good, bad, good, bad, good
  const std::vector<int64_t> indices = {good_[6], bad_[0], good_[13], good_[2], bad_[1], good_[18], bad_[2], good_[7]};
  pipeline_->Submit(Job(0, 1, 2, indices));
  Jobs done = WaitForJobs(*pipeline_, 1);
  ASSERT_EQ(done.size(), 1u);
  BatchJob& job = *done[0];
  auto failures = job.failures;
  std::sort(failures.begin(), failures.end());
  ASSERT_EQ(failures.size(), 3u);
  const uint32_t bad_positions[] = {1, 4, 6};
  for (size_t f = 0; f < 3; ++f) {
    EXPECT_EQ(failures[f].first, bad_positions[f]);
    const std::string& path = dataset_[static_cast<size_t>(indices[bad_positions[f]])].path;
    EXPECT_NE(failures[f].second.find(path), std::string::npos) << failures[f].second;
  }
  EXPECT_NE(failures[0].second.find("empty"), std::string::npos) << failures[0].second;
  EXPECT_NE(failures[1].second.find("truncated"), std::string::npos) << failures[1].second;

  // The batch keeps its 8 samples (every consumer and group rank its count): each bad one
  // takes the next good one's sample, index and label (position 6 wraps to 7, 4 to 5, 1 to 2).
  EXPECT_EQ(pipeline_->FillFailed(job), 8u);
  const std::vector<int64_t> want = {good_[6], good_[13], good_[13], good_[2], good_[18], good_[18], good_[7], good_[7]};
  for (uint32_t pos = 0; pos < want.size(); ++pos) EXPECT_TRUE(HoldsSample(1, pos, want[pos], 2)) << "position " << pos;
}

TEST(ReplacementTest, TheNextGoodPositionWrappingOrNone) {
  EXPECT_EQ(ReplacementFor(1, {false, true, false}), 2u);
  EXPECT_EQ(ReplacementFor(2, {false, false, true}), 0u);  // wraps to the batch's start
  EXPECT_EQ(ReplacementFor(0, {true, true, false}), 2u);
  EXPECT_EQ(ReplacementFor(0, {true, true}), std::nullopt);
  EXPECT_EQ(ReplacementFor(0, {true}), std::nullopt);
}

TEST_F(PipelineTest, FillFailedLeavesABatchWithoutFailuresAsItIs) {
  MakePipeline(2);
  const std::vector<int64_t> indices = {good_[3], good_[1], good_[4]};
  pipeline_->Submit(Job(0, 0, 0, indices));
  Jobs done = WaitForJobs(*pipeline_, 1);
  ASSERT_EQ(done.size(), 1u);
  const std::vector<uint8_t> before(Slot(0), Slot(0) + layout_.slot_bytes);
  EXPECT_EQ(pipeline_->FillFailed(*done[0]), 3u);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), Slot(0)));
}

TEST_F(PipelineTest, ABatchOfOnlyBadFilesHasNothingToGive) {
  MakePipeline(2);
  pipeline_->Submit(Job(0, 0, 0, bad_));
  Jobs done = WaitForJobs(*pipeline_, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->failures.size(), 3u);
  EXPECT_EQ(pipeline_->FillFailed(*done[0]), 0u);
}

TEST_F(PipelineTest, EventFdIsReadableOnlyWhileCompletedJobsWait) {
  MakePipeline(1);
  EXPECT_FALSE(Readable(pipeline_->event_fd()));
  pipeline_->Submit(Job(0, 0, 0, {good_[0], good_[1]}));
  pollfd fd{pipeline_->event_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&fd, 1, 60000), 1) << "no completion signalled";
  Jobs done = pipeline_->TakeCompleted();
  ASSERT_EQ(done.size(), 1u);  // readable meant a job was there
  EXPECT_FALSE(Readable(pipeline_->event_fd()));
  EXPECT_TRUE(pipeline_->TakeCompleted().empty());
}

// In-use heap bytes (glibc, every arena): what the process has allocated and not freed.
size_t HeapInUse() {
  const struct mallinfo2 m = ::mallinfo2();
  return m.uordblks + m.hblkhd;
}

// Destroying the pool with most of its work still queued: the workers stop and are joined,
// and every job it held is freed. Run in a child process, so that a hang is a failure
// reported by the parent, not a test run that never ends.
TEST_F(PipelineTest, DestroyingThePoolWithJobsInFlightJoinsAndFreesThem) {
  constexpr uint32_t kJobs = 16;
  constexpr size_t kJobHeapBytes = 4 << 20;  // each job's indices reserve this: a leak shows
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    const SlotTable layout = Layout(kJobs);
    std::vector<uint8_t> ring(layout.num_slots * layout.slot_bytes, kUntouched);
    size_t report[4] = {0, 0, 0, 0};  // heap before, heap after, jobs submitted, samples written
    {
      auto made = Pipeline::Make(&dataset_, Options(), 2, kSeed, layout);
      if (!made.ok()) ::_exit(2);
      std::unique_ptr<Pipeline> p = std::move(*made);
      report[0] = HeapInUse();
      for (uint32_t j = 0; j < kJobs; ++j) {
        auto job = std::make_unique<BatchJob>();
        job->seq = j;
        job->slot = j;
        job->slot_base = ring.data() + j * layout.slot_bytes;
        job->indices.reserve(kJobHeapBytes / sizeof(int64_t));
        for (uint32_t i = 0; i < kBatch; ++i) job->indices.push_back(good_[(j + i) % good_.size()]);
        p->Submit(std::move(job));
        ++report[2];
      }
    }  // ~Pipeline with up to kJobs * kBatch samples queued
    report[1] = HeapInUse();
    for (uint32_t j = 0; j < kJobs; ++j) {
      const uint8_t* labels = ring.data() + j * layout.slot_bytes + layout.labels_offset;
      for (uint32_t i = 0; i < kBatch; ++i) report[3] += labels[8 * i] != kUntouched;
    }
    const bool written = ::write(fds[1], report, sizeof(report)) == static_cast<ssize_t>(sizeof(report));
    ::_exit(written ? 0 : 1);
  }
  ::close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  const int ready = ::poll(&p, 1, 60000);
  size_t report[4] = {0, 0, 0, 0};
  const ssize_t got = ready == 1 ? ::read(fds[0], report, sizeof(report)) : -1;
  ::close(fds[0]);
  if (ready != 1) ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(ready, 1) << "destroying the pool did not return within 60 s";
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(report)));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(report[2], kJobs);
  EXPECT_LT(report[3], kJobs * kBatch) << "every sample was done before the pool was destroyed: nothing was in flight";
  const size_t before = report[0], after = report[1];
  EXPECT_LT(after, before + kJobHeapBytes) << "heap in use grew from " << before << " to " << after
                                           << " bytes: jobs held by the pool were not freed";
}

}  // namespace
}  // namespace coloader
