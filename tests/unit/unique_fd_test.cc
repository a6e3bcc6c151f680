// Owned handles: each OS resource has exactly one owner, which closes it once; the types that
// hold one can be moved, never copied.
#include "common/unique_fd.h"

#include <fcntl.h>
#include <poll.h>

#include <type_traits>
#include <utility>

#include <gtest/gtest.h>

#include "client/consumer.h"
#include "common/endpoint.h"
#include "common/process.h"
#include "common/shm.h"
#include "tests/support/test_support.h"

namespace coloader {
namespace {

template <typename T>
constexpr bool kMoveOnly = !std::is_copy_constructible_v<T> && !std::is_copy_assignable_v<T> &&
                           std::is_nothrow_move_constructible_v<T> && std::is_nothrow_move_assignable_v<T>;
static_assert(kMoveOnly<UniqueFd>);
static_assert(kMoveOnly<EventFd>);
static_assert(kMoveOnly<ProcessWatch>);
static_assert(kMoveOnly<SharedMemory>);
static_assert(kMoveOnly<NameLock>);
static_assert(kMoveOnly<Batch>);

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFdTest, ClosesWhatItOwnsExactlyOnce) {
  int raw = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(raw, 0);
  {
    UniqueFd a(raw);
    UniqueFd b(std::move(a));
    EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    EXPECT_EQ(b.get(), raw);
    EXPECT_TRUE(IsOpen(raw));
  }
  EXPECT_FALSE(IsOpen(raw));
}

TEST(UniqueFdTest, ResetAndReleaseHandOverOwnership) {
  int first = ::open("/dev/null", O_RDONLY | O_CLOEXEC), second = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  UniqueFd fd(first);
  fd.Reset(second);  // closes the first
  EXPECT_FALSE(IsOpen(first));
  const int released = fd.Release();
  EXPECT_EQ(released, second);
  EXPECT_FALSE(fd.valid());
  EXPECT_TRUE(IsOpen(second));  // no longer ours to close
  ::close(second);
  UniqueFd target(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int old = target.get();
  target = UniqueFd();  // move-assigning closes what the target held
  EXPECT_FALSE(IsOpen(old));
}

TEST(EventFdTest, SignalMakesItReadableAndDrainCountsAndResets) {
  ASSERT_OK_AND_ASSIGN(EventFd e, EventFd::Make());
  pollfd p{e.fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0);
  EXPECT_EQ(e.Drain(), 0u);  // nothing pending: EAGAIN, not a block
  e.Signal();
  e.Signal();
  EXPECT_EQ(::poll(&p, 1, 0), 1);
  EXPECT_EQ(e.Drain(), 2u);
  EXPECT_EQ(::poll(&p, 1, 0), 0);
  const int fd = e.fd();
  EventFd moved = std::move(e);
  EXPECT_EQ(moved.fd(), fd);
  EXPECT_TRUE(IsOpen(fd));
}

}  // namespace
}  // namespace coloader
