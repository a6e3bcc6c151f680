// Integration tests of consumers on other machines: tcp:// with CURVE keys, a producer that
// drops a consumer mid-handshake, refusing to serve without keys, heartbeats (the fixture:
// integration_fixture.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "client/consumer.h"
#include "common/endpoint.h"
#include "common/process.h"
#include "common/protocol.h"
#include "tests/integration/integration_fixture.h"
#include "tests/support/test_support.h"


namespace coloader {
namespace {

namespace fs = std::filesystem;

std::string TcpEndpointOf(Child& producer) {
  EXPECT_TRUE(producer.WaitForStderr("also serving on tcp://", 20000)) << producer.Stderr();
  const std::string err = producer.Stderr();
  const size_t at = err.find("tcp://", err.find("also serving on"));
  return at == std::string::npos ? "" : err.substr(at, err.find(' ', at) - at);
}

TEST_F(IntegrationTest, TcpConsumersNeedAListedCurveKeyAndSeeExactEpochs) {
  for (const char* who : {"server", "client", "stranger"}) {
    Child keygen(Coloader({"keygen", "--out", tmp_.path() + "/" + who}), env_);
    ASSERT_EQ(keygen.Wait(), 0) << keygen.Stderr();
  }
  struct stat st {};
  ASSERT_EQ(::stat((tmp_.path() + "/client.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string k = tmp_.path() + "/";
  testing::WriteFile(k + "authorized", "# who may connect\n" + testing::ReadFile(k + "client.pub"));
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--tcp", "tcp://127.0.0.1:*", "--curve-key",
                              k + "server.key", "--authorized-keys", k + "authorized"});
  const std::string ep = TcpEndpointOf(*producer);
  ASSERT_FALSE(ep.empty());
  // Listed key: whole epochs, exactly, with batches carried as payload (no shared memory).
  Child good(Coloader({"consume", "--endpoint", ep, "--curve-key", k + "client.key", "--server-key", k + "server.pub",
                       "--batch-size", "5", "--epochs", "2", "--json", "--checksum"}), env_);
  ASSERT_EQ(good.Wait(), 0) << good.Stderr();
  auto epochs = ParseJsonLines(good.Stdout());
  ASSERT_EQ(epochs.size(), 2u) << good.Stdout();
  for (const auto& e : epochs) ExpectExactEpoch(e);
  // An unlisted key, a wrong server key, no keys at all: each refused with a clear reason.
  Child stranger(Coloader({"consume", "--endpoint", ep, "--curve-key", k + "stranger.key", "--server-key",
                           k + "server.pub"}), env_);
  EXPECT_EQ(stranger.Wait(), 1);
  EXPECT_NE(stranger.Stderr().find("refused this consumer's key"), std::string::npos) << stranger.Stderr();
  Child wrong_server(Coloader({"consume", "--endpoint", ep, "--curve-key", k + "client.key", "--server-key",
                               k + "stranger.pub", "--connect-timeout-ms", "3000"}), env_);
  EXPECT_EQ(wrong_server.Wait(), 1);
  EXPECT_NE(wrong_server.Stderr().find("--server-key"), std::string::npos) << wrong_server.Stderr();
  // Without keys: refused, and told which flags it lacks. The wording depends on where the
  // handshake broke off (a refusal, or the connection closed mid-handshake, which on a busy
  // machine comes first), so the test checks what the user must learn, not one phrasing.
  Child keyless(Coloader({"consume", "--endpoint", ep, "--connect-timeout-ms", "3000"}), env_);
  EXPECT_EQ(keyless.Wait(), 1);
  EXPECT_NE(keyless.Stderr().find("CURVE keys"), std::string::npos) << keyless.Stderr();
  EXPECT_NE(keyless.Stderr().find("--curve-key"), std::string::npos) << keyless.Stderr();
  EXPECT_NE(keyless.Stderr().find("--server-key"), std::string::npos) << keyless.Stderr();
  EXPECT_NE(producer->Stderr().find("is not in --authorized-keys"), std::string::npos) << producer->Stderr();
  // Its status, over tcp with a listed key, from wherever the operator is.
  Child status(Coloader({"status", "--endpoint", ep, "--curve-key", k + "client.key", "--server-key", k + "server.pub",
                         "--json"}), env_);
  ASSERT_EQ(status.Wait(), 0) << status.Stderr();
  EXPECT_NE(status.Stdout().find("\"pid\":" + std::to_string(producer->pid())), std::string::npos) << status.Stdout();
  // Without keys the request is dropped in the handshake: the timeout names the likely cause.
  Child keyless_status(Coloader({"status", "--endpoint", ep, "--timeout-ms", "1000"}), env_);
  EXPECT_EQ(keyless_status.Wait(), 1);
  EXPECT_NE(keyless_status.Stderr().find("--curve-key"), std::string::npos) << keyless_status.Stderr();
  producer->Signal(SIGTERM);
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, TcpConsumerWaitsOutAProducerThatDropsItMidHandshake) {
  // A producer restarting on its port closes the connections it had accepted mid-handshake.
  // Stood in for by a plain listener that does just that; the consumer must keep trying until
  // its deadline and meet the producer that then binds the port, not give up blaming its keys.
  for (const char* who : {"server", "client"}) {
    Child keygen(Coloader({"keygen", "--out", tmp_.path() + "/" + who}), env_);
    ASSERT_EQ(keygen.Wait(), 0) << keygen.Stderr();
  }
  const std::string k = tmp_.path() + "/";
  testing::WriteFile(k + "authorized", testing::ReadFile(k + "client.pub"));
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(::listen(listener, 8), 0);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  Child c(Coloader({"consume", "--endpoint", ep, "--curve-key", k + "client.key", "--server-key", k + "server.pub",
                    "--connect-timeout-ms", "20000", "--batch-size", "5", "--json"}), env_);
  for (int dropped = 0; dropped < 3; ++dropped) {
    pollfd p{listener, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 10000), 1) << "the consumer did not (re)connect: " << c.Stderr();
    const int conn = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(conn, 0);
    ::close(conn);
  }
  ::close(listener);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the old code has given up by now
  EXPECT_TRUE(c.running()) << c.Stderr();
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--tcp", ep, "--curve-key", k + "server.key",
                              "--authorized-keys", k + "authorized"});
  ASSERT_EQ(c.Wait(), 0) << c.Stderr();
  ExpectExactEpoch(ParseJsonLines(c.Stdout()).at(0));
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, TcpWithoutKeysRefusesToStartUnlessInsecure) {
  Child refused(Coloader({"serve", "--data", data_, "--name", "p", "--tcp", "tcp://127.0.0.1:*", "--quiet"}), env_);
  EXPECT_EQ(refused.Wait(), 2);
  EXPECT_NE(refused.Stderr().find("without authentication"), std::string::npos) << refused.Stderr();
  EXPECT_NE(refused.Stderr().find("--insecure"), std::string::npos) << refused.Stderr();
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--tcp", "tcp://127.0.0.1:*", "--insecure"});
  // Serve returns on the ipc:// line; the tcp:// line with its warning comes just after it.
  EXPECT_TRUE(producer->WaitForStderr("INSECURE", 20000)) << producer->Stderr();
  // Asked for the device path, a remote consumer is told why it gets the host path.
  Child c(Coloader({"consume", "--endpoint", TcpEndpointOf(*producer), "--batch-size", "7", "--json", "--device"}),
          env_);
  ASSERT_EQ(c.Wait(), 0) << c.Stderr();
  ExpectExactEpoch(ParseJsonLines(c.Stdout()).at(0));
  EXPECT_NE(c.Stderr().find("over tcp:// read the host path"), std::string::npos) << c.Stderr();
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

// Catch-up over tcp://: batches travel as payload and without a mailbox; a remote consumer that
// joins mid-epoch gets whole epochs all the same (the private batches, and its rejoining).
TEST_F(IntegrationTest, ARemoteConsumerJoiningMidEpochIsCaughtUp) {
  auto producer =
      Serve("p", {"--batch-size", "8", "--epochs", "3", "--window", "3", "--tcp", "tcp://127.0.0.1:*", "--insecure"});
  const std::string ep = TcpEndpointOf(*producer);
  ASSERT_FALSE(ep.empty());
  std::unique_ptr<Child> remote;
  HoldEpochZeroWhile("p", 3, [&] {
    remote = std::make_unique<Child>(
        Coloader({"consume", "--endpoint", ep, "--batch-size", "7", "--json", "--checksum"}), env_);
    ASSERT_TRUE(producer->WaitForStderr("consumer 2 attached", 20000)) << producer->Stderr();
  });
  ASSERT_TRUE(remote);
  ASSERT_EQ(remote->Wait(), 0) << remote->Stderr();
  auto epochs = ParseJsonLines(remote->Stdout());
  ASSERT_EQ(epochs.size(), 3u) << remote->Stdout();
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(U64(epochs[e], "epoch"), e);
    EXPECT_EQ(epochs[e].at("partial"), "false") << "epoch " << e;
    ExpectExactEpoch(epochs[e]);
  }
  EXPECT_NE(producer->Stderr().find("consumer 2 joined epoch 0 at sample "), std::string::npos) << producer->Stderr();
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, TcpConsumerThatVanishesIsDetachedByHeartbeatAndOthersStayExact) {
  // A remote consumer has no pidfd: when it dies, the heartbeat timeout (1.5 s) frees its slots.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "3", "--min-consumers", "2",
                              "--tcp", "tcp://127.0.0.1:*", "--insecure"});
  Child remote(Coloader({"consume", "--endpoint", TcpEndpointOf(*producer), "--step-ms", "1000"}), env_);
  auto local = Consume("p", {"--batch-size", "6"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 2; }));
  remote.Signal(SIGKILL);
  ASSERT_EQ(local->Wait(), 0) << local->Stderr();
  auto epochs = ParseJsonLines(local->Stdout());
  ASSERT_EQ(epochs.size(), 2u);
  for (const auto& e : epochs) ExpectExactEpoch(e);
  EXPECT_NE(producer->Stderr().find("went silent"), std::string::npos) << producer->Stderr();
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

}  // namespace
}  // namespace coloader
