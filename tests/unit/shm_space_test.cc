// SharedMemory's reservation (the pages exist before anyone touches them), the ring's
// reservation plan and its /dev/shm message, and the leftover listing of dead producers.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <filesystem>
#include <vector>
#include <string>

#include "common/endpoint.h"
#include "common/shm.h"
#include "producer/slot_layout.h"

namespace coloader {
namespace {

namespace fs = std::filesystem;

// Bytes of /dev/shm actually allocated to an object (st_blocks counts 512-byte units).
uint64_t Allocated(const std::string& name) {
  struct stat st {};
  if (::stat((std::string(kShmDir) + "/" + name).c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

std::string UniqueName(const char* what) { return std::string("coloader-unit-") + what + "-" + std::to_string(::getpid()); }

TEST(SharedMemoryTest, CreateReservesEveryPageOrTheRangesAskedForThenReserveTheRest) {
  const std::string name = UniqueName("reserve");
  constexpr uint64_t kMiB = 1 << 20;
  {
    auto whole = SharedMemory::Create(name, 2 * kMiB);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_GE(Allocated(name), 2 * kMiB);  // a plain ftruncate would show 0 here
    SharedMemory::Remove(name);
  }
  auto part = SharedMemory::Create(name, 2 * kMiB, {{0, 4096}, {kMiB, 4096}});
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_EQ(Allocated(name), 2 * 4096u);
  ASSERT_TRUE(part->Reserve({{0, 2 * kMiB}}).ok());
  EXPECT_GE(Allocated(name), 2 * kMiB);
  // A reservation outside the object is a bug of the caller, said as such.
  EXPECT_EQ(part->Reserve({{2 * kMiB, 1}}).code(), StatusCode::kInternal);
  SharedMemory::Remove(name);
}

TEST(SharedMemoryTest, ALeftoverIsReplacedByAFreshReservedObjectAndAShortOneIsNotMapped) {
  const std::string name = UniqueName("exists");
  auto first = SharedMemory::Create(name, 8192, {{0, 4096}});
  ASSERT_TRUE(first.ok());
  first->data()[0] = 0xAB;
  auto second = SharedMemory::Create(name, 8192);  // as the next producer of a crashed one's name
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->data()[0], 0);             // fresh bytes, not the leftover's
  EXPECT_EQ(first->data()[0], 0xAB);           // whoever mapped the old one keeps it
  EXPECT_GE(Allocated(name), 8192u);           // and the new one is reserved whole
  auto open = SharedMemory::Open(name, 16384, false);
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), StatusCode::kProtocolError);  // mapping past its end would SIGBUS
  ASSERT_TRUE(SharedMemory::Open(name, 8192, false).ok());
  EXPECT_TRUE(SharedMemory::Remove(name));
  EXPECT_FALSE(SharedMemory::Remove(name));
}

ProducerOptions Issue17Options() {
  ProducerOptions o;  // the issue's case: --batch-size 256, float32 224x224, --window 4
  o.spare_slots = 2;
  return o;
}

TEST(SlotReservationTest, StartAndHostTensorRangesCoverTheRingOnceWithADeviceAndStartAloneWithout) {
  for (bool device : {false, true}) {
    ProducerOptions o = Issue17Options();
    if (device) o.devices = {0};
    const SlotLayouts l = MakeSlotLayouts(o, "x");
    SharedMemory::Ranges all = StartReservation(l, device);
    const SharedMemory::Ranges later = HostTensorReservation(l, device);
    EXPECT_EQ(later.empty(), !device);
    all.insert(all.end(), later.begin(), later.end());
    std::sort(all.begin(), all.end());
    uint64_t at = 0;
    for (const auto& [offset, length] : all) {
      EXPECT_EQ(offset, at) << "a gap or an overlap at " << offset << (device ? " (device)" : "");
      at = offset + length;
    }
    EXPECT_EQ(at, l.table.slot_bytes * l.table.num_slots);
  }
}

TEST(SlotReservationTest, TheMessageGivesTheFormulaItsFiguresAndEveryWayOut) {
  ProducerOptions o = Issue17Options();
  ShmSpace space{64ull << 20, 64ull << 20};
  const std::string m = ShmTooSmallMessage(o, space);
  for (const char* part : {"/dev/shm has 64.0 MiB free", "needs 882.2 MiB", "6 slots (--window 4 + 2 spare)",
                           "x 147.0 MiB per slot", "3x224x224 float32", "--shm-size=1103m", "sizeLimit: 1103Mi",
                           "medium: Memory", "--batch-size 18 or less", "--image-size 60 or less",
                           "--device cuda:N", "220.7 MiB (6 slots x 36.8 MiB)"}) {
    EXPECT_NE(m.find(part), std::string::npos) << "missing '" << part << "' in:\n" << m;
  }
  // Each suggested figure really fits, and one more does not.
  ProducerOptions b = o;
  b.batch_size = 18;
  EXPECT_LE(ShmBytesAtStart(b), space.free_bytes);
  b.batch_size = 19;
  EXPECT_GT(ShmBytesAtStart(b), space.free_bytes);
  // The Python-fed producer's message speaks its arguments, not serve's flags.
  o.external.emplace().fields = {FieldSpec{"[0]", DType::kFloat32, {3, 224, 224}}, FieldSpec{"[1]", DType::kInt64, {}}};
  const std::string py = ShmTooSmallMessage(o, space);
  EXPECT_NE(py.find("window=4"), std::string::npos) << py;
  EXPECT_EQ(py.find("--batch-size"), std::string::npos) << py;
}

TEST(SlotReservationTest, ARingOfMoreThanHalfTheMachinesMemoryIsWarnedOf) {
  const uint64_t gib = uint64_t{1} << 30;
  EXPECT_FALSE(LargeRingWarning(8 * gib, 16 * gib));  // half: said nothing
  EXPECT_FALSE(LargeRingWarning(8 * gib, 0));         // memory unknown
  std::optional<std::string> w = LargeRingWarning(12 * gib, 16 * gib);
  ASSERT_TRUE(w);
  for (const char* part : {"12.0 GiB", "75%", "16.0 GiB", "--window", "--device cuda:N"})
    EXPECT_NE(w->find(part), std::string::npos) << "missing '" << part << "' in: " << *w;
}

// A /dev/shm object of our name made by another user (a squatter, or a leftover of a process
// run as root) cannot be replaced: the error names its owner and what to do, not "File exists".
TEST(SlotReservationTest, ANameSquattedByAnotherUserIsNamedWithItsOwner) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: to make the object as one user and create as another";
  const std::string name = UniqueName("squat");
  const std::string path = std::string(kShmDir) + "/" + name;
  ASSERT_GE(::close(::open(path.c_str(), O_CREAT | O_WRONLY, 0600)), 0);  // root's
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);  // nobody
    auto r = SharedMemory::Create(name, 4096);
    const bool ok = !r.ok() && r.status().code() == StatusCode::kAlreadyExists &&
                    r.status().message().find("belongs to user root (uid 0)") != std::string::npos &&
                    r.status().message().find("another --name") != std::string::npos;
    if (!ok) std::fprintf(stderr, "%s\n", r.ok() ? "created" : r.status().ToString().c_str());
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::unlink(path.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

class LeftoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("coloader-unit-run-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    ::setenv("COLOADER_RUN_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    for (const char* n : {"dead", "alive"}) {
      if (auto p = PathsFor(n); p.ok()) RemoveProducerLeftovers(*p);
    }
    fs::remove_all(dir_);
    ::unsetenv("COLOADER_RUN_DIR");
  }
  fs::path dir_;
};

TEST_F(LeftoverTest, ADeadNamesObjectsAreListedAndCleanedALiveNamesNever) {
  auto dead = PathsFor("dead");
  auto alive = PathsFor("alive");
  ASSERT_TRUE(dead.ok() && alive.ok());
  // "dead": a lock file naming a pid, no holder, and a ring; "alive": held, with a ring.
  {
    int fd = ::open(dead->lock.c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "4242\n", 5), 5);
    ::close(fd);
  }
  ASSERT_TRUE(SharedMemory::Create(dead->shm_name, 4096).ok());
  auto held = NameLock::Acquire(alive->lock);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(SharedMemory::Create(alive->shm_name, 4096).ok());

  auto found = FindLeftovers();
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  std::vector<std::string> kinds;
  for (const Leftover& l : *found) {
    EXPECT_EQ(l.name, "dead") << l.path;
    kinds.push_back(l.kind);
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"ring", "lock"}));

  auto removed = CleanLeftovers();
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->size(), 2u);
  EXPECT_FALSE(fs::exists(std::string(kShmDir) + "/" + dead->shm_name));
  EXPECT_FALSE(fs::exists(dead->lock));
  EXPECT_TRUE(fs::exists(std::string(kShmDir) + "/" + alive->shm_name));
  EXPECT_TRUE(fs::exists(alive->lock));

  // The next holder of a dead name learns the pid that held it.
  held->Release();
  {
    int fd = ::open(alive->lock.c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_EQ(::write(fd, "777\n", 4), 4);
    ::close(fd);
  }
  auto again = NameLock::Acquire(alive->lock);
  ASSERT_TRUE(again.ok());
  NameLock moved = std::move(*again);
  EXPECT_EQ(moved.previous_pid(), 777u);
  moved.Release();
}

}  // namespace
}  // namespace coloader
