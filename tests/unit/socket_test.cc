// The ZeroMQ boundary: every failure of a socket call comes back as a Status, never as an
// exception; would-block and a signal are not failures.
#include "common/socket.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <thread>

namespace coloader {
namespace {

TEST(SocketTest, ABadEndpointIsAnErrorNamingIt) {
  zmq::context_t ctx(1);
  Result<Socket> s = Socket::Open(ctx, zmq::socket_type::dealer);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Status bind = s->Bind("nonsense://here");
  EXPECT_EQ(bind.code(), StatusCode::kIOError);
  EXPECT_NE(bind.message().find("nonsense://here"), std::string::npos) << bind.message();
  Status connect = s->Connect("tcp://");
  EXPECT_EQ(connect.code(), StatusCode::kIOError);
  EXPECT_NE(connect.message().find("tcp://"), std::string::npos) << connect.message();
}

TEST(SocketTest, NothingToReadAndNoRoomToSendAreFalseNotErrors) {
  zmq::context_t ctx(1);
  Result<Socket> a = Socket::Open(ctx, zmq::socket_type::pair);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->Set(zmq::sockopt::sndhwm, 1).ok());
  ASSERT_TRUE(a->Bind("inproc://socket-test-hwm").ok());
  zmq::message_t m;
  Result<bool> got = a->Recv(&m, zmq::recv_flags::dontwait);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(*got);
  // No peer: the first message finds no pipe to queue into.
  Result<bool> sent = a->Send(zmq::str_buffer("x"), zmq::send_flags::dontwait);
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  EXPECT_FALSE(*sent);
}

TEST(SocketTest, ARouterSendToAGonePeerIsAnErrorNotAnException) {
  zmq::context_t ctx(1);
  Result<Socket> router = Socket::Open(ctx, zmq::socket_type::router);
  ASSERT_TRUE(router.ok());
  ASSERT_TRUE(router->Set(zmq::sockopt::router_mandatory, 1).ok());
  Status st = router->Send(zmq::str_buffer("no-such-peer"), zmq::send_flags::sndmore | zmq::send_flags::dontwait).status();
  EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
}

TEST(SocketTest, AClosedSocketFailsAsAValue) {
  zmq::context_t ctx(1);
  Socket closed;
  EXPECT_FALSE(closed.is_open());
  EXPECT_EQ(closed.Set(zmq::sockopt::linger, 0).code(), StatusCode::kIOError);
  EXPECT_EQ(closed.Bind("inproc://socket-test-closed").code(), StatusCode::kIOError);
}

TEST(SocketTest, ASignalDuringPollIsAPollThatSawNothing) {
  // A handler without SA_RESTART, as a user's or a profiler's may be: poll returns EINTR.
  struct sigaction sa {}, old {};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  zmq::context_t ctx(1);
  Result<Socket> s = Socket::Open(ctx, zmq::socket_type::pair);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->Bind("inproc://socket-test-eintr").ok());
  // Signals until the poll returns: one of them lands while it waits.
  const pthread_t poller = pthread_self();
  std::atomic<bool> returned{false};
  std::thread signaller([&] {
    while (!returned.load()) {
      pthread_kill(poller, SIGUSR1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::vector<zmq::pollitem_t> items = {{s->handle(), 0, ZMQ_POLLIN, 0}};
  const auto start = std::chrono::steady_clock::now();
  Result<int> ready = Poll(items, std::chrono::milliseconds(10000));
  const auto waited = std::chrono::steady_clock::now() - start;
  returned.store(true);
  signaller.join();
  sigaction(SIGUSR1, &old, nullptr);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_EQ(*ready, 0);
  EXPECT_LT(waited, std::chrono::seconds(5)) << "the signal should have ended the poll";
}

}  // namespace
}  // namespace coloader
