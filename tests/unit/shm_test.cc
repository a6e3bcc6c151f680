// SharedMemory (common/shm.h): a named POSIX shared-memory region that the producer creates,
// consumers map (read-only), and the producer finally removes; checked through /dev/shm,
// /proc/self/maps and a second, real process.
#include "common/shm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/test_support.h"

namespace coloader {
namespace {

// How many mappings of /dev/shm/<name> this process has (a removed name shows "(deleted)").
int MappingsOf(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  const std::string needle = "/dev/shm/" + name;
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    const size_t at = line.find(needle);
    if (at != std::string::npos && (at + needle.size() == line.size() || line[at + needle.size()] == ' ')) ++n;
  }
  return n;
}

void Fill(uint8_t* p, size_t n, uint8_t salt) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 31 + salt);
}

::testing::AssertionResult Holds(const uint8_t* p, size_t n, uint8_t salt) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<uint8_t>(i * 31 + salt)) {
      return ::testing::AssertionFailure() << "byte " << i << " is " << int{p[i]} << ", expected "
                                           << int{static_cast<uint8_t>(i * 31 + salt)};
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs `body` in a forked child; returns its exit code, or 128 + the signal that ended it.
template <typename F>
int InChild(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class SharedMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = "coloader-shm-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name_.begin(), name_.end(), '/', '-');  // a parameterised test's name has one
  }
  void TearDown() override { SharedMemory::Remove(name_); }
  std::string path() const { return "/dev/shm/" + name_; }

  std::string name_;
};

TEST_F(SharedMemoryTest, ADefaultOneMapsNothing) {
  SharedMemory none;
  EXPECT_EQ(none.data(), nullptr);
  EXPECT_EQ(none.size(), 0u);
  EXPECT_TRUE(none.name().empty());
}

TEST_F(SharedMemoryTest, CreateGivesZeroedMemoryOfTheSizeAskedWithMode0600) {
  constexpr size_t kBytes = 3 * 4096 + 100;  // not a whole number of pages
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, kBytes));
  ASSERT_NE(shm.data(), nullptr);
  EXPECT_EQ(shm.size(), kBytes);
  EXPECT_EQ(shm.name(), name_);
  size_t nonzero = 0;
  for (size_t i = 0; i < kBytes; ++i) nonzero += shm.data()[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  struct stat st {};
  ASSERT_EQ(::stat(path().c_str(), &st), 0) << path();
  EXPECT_EQ(st.st_mode & 07777, 0600u);  // nobody else may read the batches
  EXPECT_EQ(static_cast<size_t>(st.st_size), kBytes);
  EXPECT_EQ(st.st_uid, ::geteuid());
  Fill(shm.data(), kBytes, 1);  // and all of it is writable
  EXPECT_TRUE(Holds(shm.data(), kBytes, 1));
}

TEST_F(SharedMemoryTest, OpenReadOnlySeesTheWritersBytesAndLaterWrites) {
  ASSERT_OK_AND_ASSIGN(SharedMemory writer, SharedMemory::Create(name_, 8192));
  Fill(writer.data(), 8192, 7);
  ASSERT_OK_AND_ASSIGN(SharedMemory reader, SharedMemory::Open(name_, 8192, false));
  EXPECT_EQ(reader.size(), 8192u);
  EXPECT_EQ(reader.name(), name_);
  EXPECT_NE(reader.data(), writer.data());  // its own mapping of the same memory
  EXPECT_TRUE(Holds(reader.data(), 8192, 7));
  Fill(writer.data(), 8192, 99);
  EXPECT_TRUE(Holds(reader.data(), 8192, 99));
}

TEST_F(SharedMemoryTest, AnotherProcessSeesTheBytesAndCanAnswerThroughAWritableMapping) {
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 2 * 4096));
  Fill(shm.data(), 4096, 42);
  const int rc = InChild([&] {
    auto reader = SharedMemory::Open(name_, 2 * 4096, false);
    if (!reader.ok()) return 2;
    if (!Holds(reader->data(), 4096, 42)) return 3;
    auto writer = SharedMemory::Open(name_, 2 * 4096, true);
    if (!writer.ok()) return 4;
    Fill(writer->data() + 4096, 4096, 43);
    return 0;
  });
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(Holds(shm.data() + 4096, 4096, 43));
}

TEST_F(SharedMemoryTest, AReadOnlyMappingCannotBeWritten) {
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 4096));
  const int rc = InChild([&] {
    auto reader = SharedMemory::Open(name_, 4096, false);
    if (!reader.ok()) return 2;
    // The default action, so the write kills the child: a sanitizer's SIGSEGV handler would
    // report it and exit with its own code instead (scripts/sanitize.sh: 66).
    ::signal(SIGSEGV, SIG_DFL);
    *reinterpret_cast<volatile uint8_t*>(reader->data()) = 1;  // must fault
    return 0;
  });
  EXPECT_EQ(rc, 128 + SIGSEGV);
  EXPECT_EQ(shm.data()[0], 0);
}

TEST_F(SharedMemoryTest, OpenExpectingMoreThanTheRegionHoldsIsAnErrorNamingIt) {
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 4096));
  auto r = SharedMemory::Open(name_, 4097, false);
  ASSERT_FALSE(r.ok());
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find("/dev/shm/" + name_), std::string::npos) << msg;
  EXPECT_NE(msg.find("4096"), std::string::npos) << msg;  // what it holds
  EXPECT_NE(msg.find("4097"), std::string::npos) << msg;  // what was announced
  EXPECT_EQ(MappingsOf(name_), 1);  // nothing mapped for the failed open
}

TEST_F(SharedMemoryTest, OpenExpectingLessMapsOnlyWhatWasExpected) {
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 3 * 4096));
  Fill(shm.data(), 4096, 5);
  ASSERT_OK_AND_ASSIGN(SharedMemory part, SharedMemory::Open(name_, 4096, false));
  EXPECT_EQ(part.size(), 4096u);
  EXPECT_TRUE(Holds(part.data(), 4096, 5));
}

TEST_F(SharedMemoryTest, OpenOfAMissingNameIsAnErrorNamingIt) {
  auto r = SharedMemory::Open(name_, 4096, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/dev/shm/" + name_), std::string::npos) << r.status().ToString();
}

// A missing region is kNotFound (COLOADER_E_NOT_FOUND through the C ABI), not the kIOError of a
// failed mmap: a consumer can tell a producer that removed its ring from one whose ring cannot
// be mapped.
TEST_F(SharedMemoryTest, OpenOfAMissingNameIsNotFound) {
  auto r = SharedMemory::Open(name_, 4096, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
}

TEST_F(SharedMemoryTest, RemoveReturnsTrueOnceThenFalse) {
  EXPECT_FALSE(SharedMemory::Remove(name_));  // nothing there yet
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 4096));
  EXPECT_TRUE(SharedMemory::Remove(name_));
  EXPECT_FALSE(SharedMemory::Remove(name_));
  EXPECT_NE(::access(path().c_str(), F_OK), 0);
  EXPECT_FALSE(SharedMemory::Open(name_, 4096, false).ok());
}

TEST_F(SharedMemoryTest, AMappingStaysValidAfterRemove) {
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 8192));
  ASSERT_OK_AND_ASSIGN(SharedMemory reader, SharedMemory::Open(name_, 8192, false));
  Fill(shm.data(), 8192, 11);
  ASSERT_TRUE(SharedMemory::Remove(name_));
  EXPECT_TRUE(Holds(reader.data(), 8192, 11));
  Fill(shm.data(), 8192, 12);  // the two mappings still share one region
  EXPECT_TRUE(Holds(reader.data(), 8192, 12));
  // A new region of that name is another region.
  ASSERT_OK_AND_ASSIGN(SharedMemory next, SharedMemory::Create(name_, 8192));
  EXPECT_EQ(next.data()[1], 0);
  Fill(next.data(), 8192, 13);
  EXPECT_TRUE(Holds(reader.data(), 8192, 12));
}

// PrivateView: a consumer's own copy-on-write view of part of the ring.
TEST_F(SharedMemoryTest, APrivateViewReadsTheRegionAndKeepsItsWritesToItself) {
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 4 * 4096));
  ASSERT_OK_AND_ASSIGN(SharedMemory reader, SharedMemory::Open(name_, 4 * 4096, false));
  Fill(shm.data(), 4 * 4096, 21);
  ASSERT_OK_AND_ASSIGN(PrivateView view, PrivateView::Map(reader, 4096, 3 * 4096));
  EXPECT_EQ(view.size(), 3u * 4096);
  EXPECT_EQ(0, std::memcmp(view.data(), shm.data() + 4096, 3 * 4096));
  view.data()[5] = 0xEE;       // this process's own page now
  view.data()[4096 + 7] = 0xDD;
  EXPECT_TRUE(Holds(shm.data(), 4 * 4096, 21)) << "a private write reached the region";
  EXPECT_TRUE(Holds(reader.data(), 4 * 4096, 21));
  // Another process's view of the same slot sees the region, not this process's writes.
  EXPECT_EQ(InChild([&] {
              auto other = PrivateView::Map(reader, 4096, 2 * 4096);
              return other.ok() && std::memcmp(other->data(), shm.data() + 4096, 2 * 4096) == 0 ? 0 : 1;
            }),
            0);
  // A page not written still follows the region (the producer refilling a slot after its
  // release); the written ones are this process's own.
  Fill(shm.data(), 4 * 4096, 22);
  EXPECT_EQ(0, std::memcmp(view.data() + 2 * 4096, shm.data() + 3 * 4096, 4096));
  EXPECT_EQ(view.data()[5], 0xEE);
  EXPECT_EQ(view.data()[4096 + 7], 0xDD);
}

class PrivateViewDetachTest : public SharedMemoryTest, public ::testing::WithParamInterface<bool> {};

TEST_P(PrivateViewDetachTest, ADetachedPrivateViewNoLongerFollowsTheRegion) {
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 3 * 4096));
  ASSERT_OK_AND_ASSIGN(SharedMemory reader, SharedMemory::Open(name_, 3 * 4096, false));
  Fill(shm.data(), 3 * 4096, 31);
  ASSERT_OK_AND_ASSIGN(PrivateView view, PrivateView::Map(reader, 0, 3 * 4096));
  view.data()[10] = 0x77;  // one page already its own
  const uint8_t* before = view.data();
  if (GetParam()) {
    ASSERT_OK(view.Detach());
  } else {
    view.DetachPageByPage();  // what Detach falls back to
  }
  EXPECT_EQ(view.data(), before);  // same address: the tensors over it do not move
  Fill(shm.data(), 3 * 4096, 32);  // the producer reuses the slot
  std::vector<uint8_t> expect(3 * 4096);
  Fill(expect.data(), expect.size(), 31);
  expect[10] = 0x77;
  EXPECT_EQ(0, std::memcmp(view.data(), expect.data(), expect.size())) << "the view followed the region";
}

INSTANTIATE_TEST_SUITE_P(MadviseOrPageByPage, PrivateViewDetachTest, ::testing::Bool());

TEST_F(SharedMemoryTest, APrivateViewOutsideTheRegionOrOfACreatedOneIsRefused) {
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 2 * 4096));
  ASSERT_OK_AND_ASSIGN(SharedMemory reader, SharedMemory::Open(name_, 2 * 4096, false));
  EXPECT_FALSE(PrivateView::Map(reader, 4096, 2 * 4096).ok());
  EXPECT_FALSE(PrivateView::Map(reader, 0, 0).ok());
  EXPECT_FALSE(PrivateView::Map(shm, 0, 4096).ok());  // no descriptor kept by Create
  static_assert(!std::is_copy_constructible<PrivateView>::value, "a view is unmapped once");
}

TEST_F(SharedMemoryTest, CreateReplacesALeftoverOfTheSameName) {
  // A crashed producer's leftover: bigger, full of old bytes, and open to everyone.
  const int fd = ::shm_open(("/" + name_).c_str(), O_CREAT | O_EXCL | O_RDWR, 0666);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fchmod(fd, 0666), 0);  // past the umask
  ASSERT_EQ(::ftruncate(fd, 16384), 0);
  void* old = ::mmap(nullptr, 16384, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(old, MAP_FAILED);
  std::memset(old, 0xAB, 16384);

  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 4096));
  EXPECT_EQ(shm.size(), 4096u);
  size_t nonzero = 0;
  for (size_t i = 0; i < 4096; ++i) nonzero += shm.data()[i] != 0;
  EXPECT_EQ(nonzero, 0u) << "the leftover's bytes show through";
  struct stat st {};
  ASSERT_EQ(::stat(path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 4096);
  shm.data()[0] = 1;
  EXPECT_EQ(static_cast<uint8_t*>(old)[0], 0xAB);  // the leftover is not the new region
  ::munmap(old, 16384);
}

TEST_F(SharedMemoryTest, CreateReplacesALeftoverOfAnotherProcess) {
  ASSERT_EQ(InChild([&] {
              auto shm = SharedMemory::Create(name_, 4096);
              if (!shm.ok()) return 2;
              std::memset(shm->data(), 0x5A, 4096);
              return 0;  // exits without Remove, as a crash would
            }),
            0);
  ASSERT_EQ(::access(path().c_str(), F_OK), 0) << "the child's region should be left over";
  ASSERT_OK_AND_ASSIGN(SharedMemory shm, SharedMemory::Create(name_, 4096));
  EXPECT_EQ(shm.data()[0], 0);
  EXPECT_EQ(shm.data()[4095], 0);
}

TEST_F(SharedMemoryTest, MovingHandsTheMappingOverAndDestructionUnmapsIt) {
  static_assert(!std::is_copy_constructible_v<SharedMemory> && !std::is_copy_assignable_v<SharedMemory>);
  ASSERT_OK_AND_ASSIGN(SharedMemory a, SharedMemory::Create(name_, 4096));
  uint8_t* const p = a.data();
  Fill(p, 4096, 3);
  EXPECT_EQ(MappingsOf(name_), 1);
  {
    SharedMemory b(std::move(a));
    EXPECT_EQ(b.data(), p);
    EXPECT_EQ(b.size(), 4096u);
    EXPECT_EQ(b.name(), name_);
    EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    EXPECT_EQ(a.size(), 0u);
    EXPECT_TRUE(Holds(b.data(), 4096, 3));
    EXPECT_EQ(MappingsOf(name_), 1);  // moved, not mapped twice
  }
  EXPECT_EQ(MappingsOf(name_), 0);  // b's destruction unmapped it
  EXPECT_EQ(::access(path().c_str(), F_OK), 0);  // but the name stays until Remove
}

TEST_F(SharedMemoryTest, MoveAssignmentUnmapsWhatTheTargetHeld) {
  const std::string other = name_ + "-other";
  ASSERT_OK_AND_ASSIGN(SharedMemory target, SharedMemory::Create(other, 4096));
  ASSERT_OK_AND_ASSIGN(SharedMemory source, SharedMemory::Create(name_, 8192));
  uint8_t* const p = source.data();
  EXPECT_EQ(MappingsOf(other), 1);
  target = std::move(source);
  EXPECT_EQ(MappingsOf(other), 0);
  EXPECT_EQ(MappingsOf(name_), 1);
  EXPECT_EQ(target.data(), p);
  EXPECT_EQ(target.size(), 8192u);
  EXPECT_EQ(target.name(), name_);
  EXPECT_TRUE(SharedMemory::Remove(other));
}

}  // namespace
}  // namespace coloader
