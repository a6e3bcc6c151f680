// Integration tests of what goes wrong: other users, bad paths and flags, signals, stopped
// and vanished consumers, bad files, malformed and hostile peers (the fixture:
// integration_fixture.h). Each names, counts or survives the fault; the others stay exact.
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

TEST_F(IntegrationTest, CleansUpSharedMemoryAndKeepsTheRunDirPrivate) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  struct stat st {};
  ASSERT_EQ(::stat(run_dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((run_dir_ + "/p.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
  ASSERT_OK_AND_ASSIGN(ProducerPaths paths, PathsFor("p"));
  EXPECT_TRUE(fs::exists("/dev/shm/" + paths.shm_name));
  auto consumer = Consume("p");
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
  EXPECT_FALSE(fs::exists("/dev/shm/" + paths.shm_name));
  EXPECT_FALSE(fs::exists(run_dir_ + "/p.sock"));
  EXPECT_FALSE(fs::exists(run_dir_ + "/p.lock"));
}

TEST_F(IntegrationTest, AnotherUserCannotConnect) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create a second local user";
  if (::system("id coloader-probe >/dev/null 2>&1 || useradd --system --no-create-home coloader-probe") != 0)
    GTEST_SKIP() << "cannot create a second local user (useradd)";
  // Let the other user reach the run directory's parent: only the run directory itself
  // (0700) and the socket (0600) keep it out.
  ::chmod(tmp_.path().c_str(), 0711);
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  auto as_other = [&](std::vector<std::string> args) {
    args = Coloader(args);
    args.insert(args.begin(), {"/usr/bin/setpriv", "--reuid=coloader-probe", "--regid=coloader-probe",
                               "--clear-groups", "--"});
    return std::make_unique<Child>(args, env_);
  };
  if (as_other({"help"})->Wait() != 0)
    GTEST_SKIP() << "the second user cannot run " << Coloader({})[0] << " (its directories are private)";
  auto by_name = as_other({"consume", "--name", "p"});
  EXPECT_EQ(by_name->Wait(), 1);
  EXPECT_NE(by_name->Stderr().find("belongs to uid 0"), std::string::npos) << by_name->Stderr();
  auto by_path = as_other({"consume", "--endpoint", "ipc://" + run_dir_ + "/p.sock"});
  EXPECT_EQ(by_path->Wait(), 1);
  EXPECT_NE(by_path->Stderr().find("permission denied"), std::string::npos) << by_path->Stderr();
  // The owner is served as usual.
  auto mine = Consume("p");
  ASSERT_EQ(mine->Wait(), 0) << mine->Stderr();
  ExpectExactEpoch(ParseJsonLines(mine->Stdout()).at(0));
}

// ---- bad input ------------------------------------------------------------------------------

TEST_F(IntegrationTest, BadDataPathsAreNamed) {
  const std::string empty = tmp_.path() + "/empty";
  fs::create_directories(empty);
  const std::string no_images = tmp_.path() + "/noimg";
  fs::create_directories(no_images + "/cls");
  testing::WriteFile(no_images + "/cls/readme.txt", "hello");
  for (const std::string& path : {tmp_.path() + "/missing", empty, no_images}) {
    Child serve(Coloader({"serve", "--data", path, "--name", "p", "--quiet"}), env_);
    EXPECT_NE(serve.Wait(), 0);
    EXPECT_NE(serve.Stderr().find(path), std::string::npos) << serve.Stderr();
  }
}

TEST_F(IntegrationTest, WrongFlagsAreRejectedWithUsage) {
  const std::vector<std::vector<std::string>> bad = {
      {"serve", "--data", data_, "--name", "p", "--batch-size", "abc"},
      {"serve", "--data", data_, "--name", "p", "--augment", "sideways"},
      {"serve", "--data", data_, "--name", "p", "--bogus"},
      {"serve", "--data", data_},
      {"serve", "--data", data_, "--name", "bad/name"},
      {"serve", "--data", data_, "--name", "p", "--window", "1"},
      {"serve", "--data", data_, "--name", "p", "--gpu-wait", "sometimes"},
      {"serve", "--data", data_, "--name", "p", "--decode", "gpu", "--device", "cuda:0", "--batch-size", "65536"},
      {"consume"},
      {"frobnicate"},
  };
  for (const auto& args : bad) {
    Child c(Coloader(args), env_);
    EXPECT_EQ(c.Wait(), 2) << args.back() << ": " << c.Stderr();
    EXPECT_FALSE(c.Stderr().empty());
  }
}

TEST_F(IntegrationTest, ConsumerOfAMissingProducerFailsClearly) {
  Child c(Coloader({"consume", "--name", "nobody", "--wait-ms", "0"}), env_);
  EXPECT_EQ(c.Wait(10000), 1);
  EXPECT_NE(c.Stderr().find("no producer named 'nobody'"), std::string::npos) << c.Stderr();
  Child s(Coloader({"status", "--name", "nobody"}), env_);
  EXPECT_EQ(s.Wait(10000), 1);
}

TEST_F(IntegrationTest, SignalsDuringTheHandshakeAreNotErrors) {
  // zmq::poll throws EINTR when a signal handler runs; Connect must keep waiting to its deadline
  // and say Timeout, never let the exception out. The producer is stopped, so it never answers.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  producer->Signal(SIGSTOP);
  struct sigaction action {};
  action.sa_handler = [](int) {};  // returns: interrupted calls fail with EINTR (no SA_RESTART)
  struct sigaction previous {};
  ASSERT_EQ(::sigaction(SIGALRM, &action, &previous), 0);
  itimerval every_2ms{{0, 2000}, {0, 2000}};
  ASSERT_EQ(::setitimer(ITIMER_REAL, &every_2ms, nullptr), 0);
  ConsumerOptions o;
  o.name = "p";
  o.connect_timeout_ms = 400;
  auto connected = Consumer::Connect(o);
  itimerval off{};
  ::setitimer(ITIMER_REAL, &off, nullptr);
  ::sigaction(SIGALRM, &previous, nullptr);
  ASSERT_FALSE(connected.ok());
  EXPECT_EQ(connected.status().code(), StatusCode::kTimeout) << connected.status().ToString();
  producer->Signal(SIGCONT);
  producer->Signal(SIGTERM);
  EXPECT_EQ(producer->Wait(10000), 128 + SIGTERM) << producer->Stderr();  // its epoch was not served
}

TEST_F(IntegrationTest, MalformedEndpointsAreNamedNotFatal) {
  for (const char* command : {"status", "consume"}) {
    for (const char* endpoint : {"bogus", "tcp://", "nosuch://x"}) {
      SCOPED_TRACE(std::string(command) + " --endpoint " + endpoint);
      std::vector<std::string> args = {command, "--endpoint", endpoint};
      if (std::string(command) == "consume") args.insert(args.end(), {"--connect-timeout-ms", "1000"});
      Child c(Coloader(args), env_);
      EXPECT_EQ(c.Wait(10000), 1) << c.Stderr();
      EXPECT_NE(c.Stderr().find(std::string("'") + endpoint + "'"), std::string::npos) << c.Stderr();
    }
  }
}

TEST_F(IntegrationTest, StoppedConsumerIsDetachedAfterTheTimeoutAndToldWhenItResumes) {
  // SIGSTOP: alive (its pidfd stays quiet) but silent. The others wait at most the heartbeat
  // timeout (1.5 s here), then it is detached; resumed, it learns so and exits with an error.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2", "--window", "2", "--min-consumers", "2"});
  // 200 ms a batch: still mid-run when the SIGSTOP comes (at 20 ms it could finish first).
  auto stopped = Consume("p", {"--step-ms", "200"});
  auto other = Consume("p", {"--batch-size", "5"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 2; }));
  stopped->Signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(other->Wait(), 0) << other->Stderr();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& e : ParseJsonLines(other->Stdout())) ExpectExactEpoch(e);
  EXPECT_LT(secs, 1.5 + 5.0);  // the timeout, plus two epochs of work on a loaded machine
  EXPECT_NE(producer->Stderr().find("went silent"), std::string::npos) << producer->Stderr();
  stopped->Signal(SIGCONT);
  EXPECT_EQ(stopped->Wait(), 1);
  EXPECT_NE(stopped->Stderr().find("detached"), std::string::npos) << stopped->Stderr();
}

TEST_F(IntegrationTest, ConsumersResumedLongAfterTheTimeoutLearnTheyWereDetached) {
  // Found by the fault stress test: a consumer resumed after a stop longer than the timeout
  // counted its own stop as producer silence and reported "not heard from" before reading the
  // producer's goodbye waiting in its socket. Several at once make the race near certain.
  // --min-consumers: all five are connected before anything is published, so none is stopped
  // before it has joined (one that had not joined would simply read on, forever, once resumed).
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--window", "2", "--min-consumers", "5"});
  std::vector<std::unique_ptr<Child>> stopped;
  for (int i = 0; i < 4; ++i) stopped.push_back(Consume("p", {"--batch-size", std::to_string(3 + i)}));
  auto other = Consume("p", {"--step-ms", "2"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 4; }));
  for (auto& c : stopped) c->Signal(SIGSTOP);
  // Detached after 1.5 s; stay stopped well past that, while the other consumer goes on.
  ASSERT_TRUE(producer->WaitForStderr("went silent", 10000)) << producer->Stderr();
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // the fault itself: a long stop
  for (auto& c : stopped) c->Signal(SIGCONT);
  for (auto& c : stopped) {
    EXPECT_EQ(c->Wait(10000), 1);
    EXPECT_NE(c->Stderr().find("detached"), std::string::npos) << c->Stderr();
    EXPECT_EQ(c->Stderr().find("not been heard from"), std::string::npos) << c->Stderr();
  }
  EXPECT_TRUE(other->running()) << other->Stderr();
  producer->Signal(SIGTERM);
  EXPECT_EQ(other->Wait(10000), 1) << other->Stderr();
  EXPECT_NE(other->Stderr().find("stopped before serving all its epochs"), std::string::npos) << other->Stderr();
  // The consumer that kept reading saw whole epochs while the others were stopped; the last
  // one, cut by the SIGTERM, is not whole and is not checked.
  int whole = 0;
  for (const auto& e : ParseJsonLines(other->Stdout())) {
    if (e.at("partial") == "true" || U64(e, "samples") != kImages) continue;
    ExpectExactEpoch(e);
    ++whole;
  }
  EXPECT_GT(whole, 0) << other->Stdout();
  EXPECT_EQ(producer->Wait(10000), 0);
}

TEST_F(IntegrationTest, FileVanishingAfterTheListingIsSkippedAndNamed) {
  const std::string data = tmp_.path() + "/vanishing";
  testing::MakeImageFolder(data, 30, 2);
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"}, data);  // listed 30 files
  const std::string gone = data + "/class1/img00007.jpg";
  ASSERT_EQ(std::remove(gone.c_str()), 0);
  auto consumer = Consume("p");
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  // Its place is taken by the next good sample of its batch: 30 samples, 29 of them distinct.
  EXPECT_EQ(U64(ParseJsonLines(consumer->Stdout()).at(0), "samples"), 30u);
  EXPECT_EQ(U64(ParseJsonLines(consumer->Stdout()).at(0), "unique_samples"), 29u);
  ASSERT_EQ(producer->Wait(), 0);
  EXPECT_NE(producer->Stderr().find(gone), std::string::npos) << producer->Stderr();
}

TEST_F(IntegrationTest, ConsumerStartedBeforeItsProducerWaitsForIt) {
  // Jobs launched together with their producer may come up first.
  auto consumer = Consume("p", {"--wait-ms", "20000"});
  auto producer = Serve("p", {"--batch-size", "16", "--epochs", "1"});
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ExpectExactEpoch(ParseJsonLines(consumer->Stdout()).at(0));
  EXPECT_EQ(producer->Wait(), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, CorruptFilesAreSkippedAndCountedOrFailTheRun) {
  const std::string data = tmp_.path() + "/withbad";
  testing::MakeImageFolder(data, 40, 2);
  testing::WriteFile(data + "/class0/zz_text.jpg", "this is not an image");
  std::string jpeg = testing::ReadFile(data + "/class1/img00001.jpg");
  testing::WriteFile(data + "/class1/zz_truncated.jpg", jpeg.substr(0, jpeg.size() / 2));
  {
    auto producer = Serve("p", {"--batch-size", "8", "--epochs", "2"}, data);
    auto consumer = Consume("p", {"--batch-size", "7"});
    ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
    ASSERT_EQ(producer->Wait(), 0) << producer->Stderr();
    for (const auto& e : ParseJsonLines(consumer->Stdout())) {
      EXPECT_EQ(U64(e, "samples"), 42u);  // every position filled: two good samples twice
      EXPECT_EQ(U64(e, "unique_samples"), 40u);
    }
    EXPECT_NE(producer->Stderr().find("zz_text.jpg"), std::string::npos) << producer->Stderr();
    EXPECT_NE(producer->Stderr().find("zz_truncated.jpg"), std::string::npos) << producer->Stderr();
  }
  {
    auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1", "--on-bad-file", "fail"}, data);
    auto consumer = Consume("p");
    EXPECT_EQ(producer->Wait(), 1);
    EXPECT_NE(producer->Stderr().find("zz_t"), std::string::npos) << producer->Stderr();
    // Told the producer stopped, naming the bad file, or, when the bad file came in the first
    // batch and the producer stopped while the consumer was still mapping its ring, that.
    EXPECT_EQ(consumer->Wait(), 1) << consumer->Stderr();
    const std::string err = consumer->Stderr();
    EXPECT_TRUE(err.find("the producer stopped while this consumer was connecting") != std::string::npos ||
                (err.find("stopped before serving all its epochs") != std::string::npos &&
                 err.find("zz_t") != std::string::npos))
        << err;
  }
}

TEST_F(IntegrationTest, AnUnreadableDataSetIsAnErrorNotEpochsOfNothing) {
  // Issue 38: every file undecodable gave five empty epochs, "partial": false, and exit 0.
  const std::string data = tmp_.path() + "/allbad";
  for (int c = 0; c < 2; ++c) {
    std::filesystem::create_directories(data + "/class" + std::to_string(c));
    for (int i = 0; i < 12; ++i)
      testing::WriteFile(data + "/class" + std::to_string(c) + "/img" + std::to_string(i) + ".jpg", "not an image");
  }
  auto producer = Serve("p", {"--batch-size", "4", "--epochs", "5"}, data);
  auto consumer = Consume("p");
  EXPECT_EQ(producer->Wait(), 1) << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("the data set looks unreadable"), std::string::npos) << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("img"), std::string::npos) << producer->Stderr();  // names a file
  EXPECT_EQ(consumer->Wait(), 1) << consumer->Stderr();
}

TEST_F(IntegrationTest, AProducerWhoseConsumersAllLeftEndsAfterItsAloneTimeout) {
  // Issue 38: with every consumer gone, `serve --epochs` waited at 0 images/s for ever (and a
  // launch script's `wait` with it). It now ends after --alone-timeout, exit 1, saying so.
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "50", "--alone-timeout", "1"});
  auto consumer = Consume("p", {"--epochs", "1"});
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  EXPECT_EQ(producer->Wait(20000), 1) << producer->Stderr();
  EXPECT_NE(producer->Stderr().find("every consumer left and none came back for 1 s"), std::string::npos)
      << producer->Stderr();
}

TEST_F(IntegrationTest, ServeStoppedBeforeItsEpochsAreServedExitsAsTheSignalSays) {
  // Issue 38: after SIGINT or SIGTERM with epochs unserved, `serve --epochs` exited 0, as if it
  // had delivered them. It now exits 128 + the signal, as a shell says it; with --forever a signal
  // is how the run ends, and the exit stays 0 (SigtermTellsConsumersTheStreamStoppedAndWhere).
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string name = sig == SIGTERM ? "term" : "int";
    auto producer = Serve(name, {"--batch-size", "8", "--epochs", "50", "--window", "3"});
    auto consumer = Consume(name, {"--step-ms", "5", "--epochs", "50"});
    ASSERT_TRUE(WaitForStatus(name, [](const JsonLine& s) { return U64(s, "batches_published") >= 5; }));
    producer->Signal(sig);
    EXPECT_EQ(producer->Wait(10000), 128 + sig) << producer->Stderr();
    EXPECT_NE(producer->Stderr().find(std::string("stopped by ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
                                      " before its 50 epoch(s) were served"),
              std::string::npos)
        << producer->Stderr();
    EXPECT_EQ(consumer->Wait(10000), 1) << consumer->Stderr();
  }
}

// Sends raw frames to the producer's socket as a hostile or outdated peer would.
class RawPeer {
 public:
  explicit RawPeer(const std::string& endpoint) : sock_(ctx_, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.connect(endpoint);
  }
  void Send(const std::vector<uint8_t>& bytes) { sock_.send(zmq::buffer(bytes), zmq::send_flags::none); }
  std::optional<std::vector<uint8_t>> Receive(int timeout_ms) {
    zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    zmq::message_t m;
    if (!(item.revents & ZMQ_POLLIN) || !sock_.recv(m, zmq::recv_flags::dontwait)) return std::nullopt;
    return std::vector<uint8_t>(m.data<uint8_t>(), m.data<uint8_t>() + m.size());
  }

 private:
  zmq::context_t ctx_{1};
  zmq::socket_t sock_;
};

TEST_F(IntegrationTest, ProducerGoneBetweenWelcomeAndMappingIsSaidAsSuch) {
  // Found by the fault stress test: a producer that exits right after its Welcome has already
  // unlinked its ring when the consumer maps it. The consumer must say the producer stopped,
  // not report a missing file. A stand-in producer answers the Hello with the Welcome of a
  // process that is still stopping (a child that exits 300 ms later: a producer unlinks its
  // ring a moment before it ends) and a ring that does not exist.
  const pid_t gone = ::fork();
  if (gone == 0) {
    ::usleep(300 * 1000);
    ::_exit(0);
  }
  ASSERT_GT(gone, 0);

  const std::string endpoint = "ipc://" + tmp_.path() + "/stand-in.sock";
  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  router.set(zmq::sockopt::linger, 0);
  router.bind(endpoint);
  Child consumer(Coloader({"consume", "--endpoint", endpoint, "--json"}), env_);

  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, std::chrono::milliseconds(10000));
  ASSERT_TRUE(item.revents & ZMQ_POLLIN) << "no Hello from the consumer: " << consumer.Stderr();
  zmq::message_t identity, hello;
  ASSERT_TRUE(router.recv(identity, zmq::recv_flags::none));
  ASSERT_TRUE(router.recv(hello, zmq::recv_flags::none));
  ASSERT_TRUE(std::holds_alternative<Hello>(*Decode(hello.data<uint8_t>(), hello.size())));

  Welcome w;
  w.consumer_id = 1;
  w.producer_pid = static_cast<uint32_t>(gone);
  const ProcessIdentity who = IdentityOf(gone);
  w.producer_pid_ns = who.pid_ns;
  w.producer_start_time = who.start_time;
  w.heartbeat_ms = 100;
  w.heartbeat_timeout_ms = 1000;
  w.dataset_size = w.epoch_samples = 16;
  w.slots.shm_name = "coloader-test-never-made-" + std::to_string(::getpid());
  w.slots.num_slots = 2;
  w.slots.batch_size = 8;
  w.slots.indices_offset = 0;
  w.slots.labels_offset = 64;
  w.slots.data_offset = 4096;
  w.slots.height = w.slots.width = 8;
  w.slots.channels = 3;
  w.slots.dtype = DType::kUInt8;
  w.slots.layout = TensorLayout::kNCHW;
  w.slots.slot_bytes = 4096 + 8 * 8 * 8 * 3;
  const std::vector<uint8_t> bytes = Encode(w);
  router.send(identity, zmq::send_flags::sndmore);
  router.send(zmq::buffer(bytes), zmq::send_flags::none);

  EXPECT_EQ(consumer.Wait(10000), 1) << consumer.Stderr();
  EXPECT_NE(consumer.Stderr().find("the producer stopped while this consumer was connecting"), std::string::npos)
      << consumer.Stderr();
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
}

TEST_F(IntegrationTest, MalformedAndOutdatedPeersAreRejectedAndOthersCarryOn) {
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  ASSERT_OK_AND_ASSIGN(ProducerPaths paths, PathsFor("p"));
  RawPeer peer(paths.endpoint);
  peer.Send({1, 2, 3});                                   // shorter than a header
  peer.Send(std::vector<uint8_t>(64, 0xAB));              // bad magic
  std::vector<uint8_t> hello = Encode(Hello{1, 0, 0, 8, 0, "x", "", "", 0, 1, 0, 0, 0, ""});
  hello.resize(hello.size() - 1);                         // truncated Hello
  peer.Send(hello);
  std::vector<uint8_t> future = Encode(Hello{1, 0, 0, 8, 0, "from the future", "", "", 0, 1, 0, 0, 0, ""});
  future[4] = 99;                                         // another protocol version
  peer.Send(future);
  auto reply = peer.Receive(5000);
  ASSERT_TRUE(reply.has_value());
  auto m = Decode(reply->data(), reply->size());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto* reject = std::get_if<Reject>(&*m);
  ASSERT_NE(reject, nullptr);
  EXPECT_EQ(reject->code, RejectCode::kVersion);
  EXPECT_NE(reject->reason.find("99"), std::string::npos);
  // The producer carries on and serves a well-behaved consumer exactly.
  auto consumer = Consume("p");
  ASSERT_EQ(consumer->Wait(), 0) << consumer->Stderr();
  ExpectExactEpoch(ParseJsonLines(consumer->Stdout()).at(0));
  EXPECT_EQ(producer->Wait(), 0);
  EXPECT_NE(producer->Stderr().find("rejected a message"), std::string::npos);
}

// A consumer that said Hello properly and then misbehaves: each kind of misbehaviour gets a
// Bye(kRejected) naming it, is counted, and costs the producer and the other consumers nothing.
TEST_F(IntegrationTest, HostileConnectedClientsAreDroppedCountedAndOthersCarryOn) {
  auto producer = Serve("p", {"--batch-size", "8", "--forever", "--window", "3"});
  auto honest = Consume("p", {"--batch-size", "5"});
  ASSERT_TRUE(WaitForStatus("p", [](const JsonLine& s) { return U64(s, "batches_published") >= 3; }));
  ASSERT_OK_AND_ASSIGN(ProducerPaths paths, PathsFor("p"));

  // Says Hello as a remote consumer would (pid 0: batches come as messages), waits for its
  // Welcome and first batch, then runs `misbehave`; returns the Bye it got.
  auto attack = [&](const std::function<void(RawPeer&, const BatchAnnouncement&)>& misbehave) -> std::optional<Bye> {
    RawPeer peer(paths.endpoint);
    peer.Send(Encode(Hello{0, 0, 0, 8, 0, "hostile", "", "", 0, 1, 0, 0, 0, ""}));
    std::optional<BatchAnnouncement> first;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    bool misbehaved = false;
    while (std::chrono::steady_clock::now() < deadline) {
      auto bytes = peer.Receive(200);
      if (!bytes) continue;
      auto m = Decode(bytes->data(), bytes->size());
      if (!m.ok()) return std::nullopt;
      if (std::holds_alternative<Welcome>(*m)) peer.Send(Encode(Attach{0}));  // starts reading
      if (auto* a = std::get_if<BatchAnnouncement>(&*m); a && !misbehaved) {
        first = *a;
        misbehave(peer, *first);
        misbehaved = true;
      }
      if (auto* bye = std::get_if<Bye>(&*m)) return *bye;
    }
    return std::nullopt;
  };
  struct Case {
    const char* what;
    std::function<void(RawPeer&, const BatchAnnouncement&)> misbehave;
    const char* expect;  // in the Bye's message
  };
  const std::vector<Case> cases = {
      {"ack for a batch it never got", [](RawPeer& p, const BatchAnnouncement& a) { p.Send(Encode(Ack{a.seq + 1000})); },
       "do not hold"},
      {"ack far out of range", [](RawPeer& p, const BatchAnnouncement&) { p.Send(Encode(Ack{uint64_t{1} << 62})); },
       "do not hold"},
      {"ack twice", [](RawPeer& p, const BatchAnnouncement& a) {
         p.Send(Encode(Ack{a.seq}));
         p.Send(Encode(Ack{a.seq}));
       }, "do not hold"},
      {"unknown message type", [](RawPeer& p, const BatchAnnouncement&) {
         std::vector<uint8_t> m = Encode(Heartbeat{});
         m[6] = 77;  // the type field
         p.Send(m);
       }, "type"},
      {"a producer's message", [](RawPeer& p, const BatchAnnouncement& a) { p.Send(Encode(a)); }, "unexpected"},
      {"flood", [](RawPeer& p, const BatchAnnouncement&) {
         const std::vector<uint8_t> hb = Encode(Heartbeat{});
         for (int i = 0; i < 20000; ++i) p.Send(hb);
       }, "messages in one second"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::optional<Bye> bye = attack(c.misbehave);
    ASSERT_TRUE(bye.has_value()) << "no goodbye for: " << c.what;
    EXPECT_EQ(bye->reason, ByeReason::kRejected);
    EXPECT_NE(bye->message.find(c.expect), std::string::npos) << bye->message;
  }
  JsonLine s = StatusOf("p");
  EXPECT_GE(U64(s, "dropped_clients"), cases.size());
  EXPECT_GE(U64(s, "rejected_messages"), cases.size());
  EXPECT_TRUE(honest->running()) << honest->Stderr();
  // The honest consumer went on throughout and still sees exact epochs.
  const uint64_t published = U64(s, "batches_published");
  ASSERT_TRUE(WaitForStatus("p", [&](const JsonLine& t) { return U64(t, "batches_published") >= published + 30; }));
  producer->Signal(SIGTERM);
  ASSERT_EQ(honest->Wait(10000), 1) << honest->Stderr();  // stopped mid-stream: said so
  EXPECT_NE(honest->Stderr().find("stopped before serving all its epochs"), std::string::npos) << honest->Stderr();
  auto epochs = ParseJsonLines(honest->Stdout());
  ASSERT_GE(epochs.size(), 2u);
  for (size_t i = 0; i + 1 < epochs.size(); ++i) ExpectExactEpoch(epochs[i]);
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

TEST_F(IntegrationTest, AKeptBatchWhoseReclaimFoundNothingIsAskedForAgain) {
  // The producer asks for a kept batch back as soon as the consumer has taken it from its
  // mailbox, which can be a moment before the client opens it: that Reclaim finds no lease and
  // is dropped. A stand-in consumer (remote: batches come as messages) keeps its last batch and
  // drops the first Reclaim for it, as such a client does; the producer asks again, and ends as
  // soon as the batch is given back.
  using std::chrono::steady_clock;
  auto producer = Serve("p", {"--batch-size", "8", "--epochs", "1"});
  ASSERT_OK_AND_ASSIGN(ProducerPaths paths, PathsFor("p"));
  RawPeer peer(paths.endpoint);
  peer.Send(Encode(Hello{0, 0, 0, 8, 0, "keeper", "", "", 0, 1, 0, 0, 0, ""}));
  std::optional<uint64_t> kept;
  int asked = 0;
  auto deadline = steady_clock::now() + std::chrono::seconds(20);
  auto heartbeat = steady_clock::now();
  while (asked < 2 && steady_clock::now() < deadline) {
    if (steady_clock::now() - heartbeat > std::chrono::milliseconds(100)) {
      peer.Send(Encode(Heartbeat{}));
      heartbeat = steady_clock::now();
    }
    auto bytes = peer.Receive(50);
    if (!bytes) continue;
    auto m = Decode(bytes->data(), bytes->size());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    if (std::holds_alternative<Welcome>(*m)) peer.Send(Encode(Attach{0}));
    if (auto* a = std::get_if<BatchAnnouncement>(&*m)) {
      if (a->flags & kBatchLastInEpoch) {
        kept = a->seq;
      } else {
        peer.Send(Encode(Ack{a->seq}));
      }
    }
    // (A Reclaim of a batch acked already, which crossed its Ack, is ignored, as a client does.)
    if (auto* r = std::get_if<Reclaim>(&*m); r && kept && r->seq == *kept) {
      if (++asked == 1) deadline = steady_clock::now() + std::chrono::seconds(3);  // dropped: wait for the next
    }
    if (auto* bye = std::get_if<Bye>(&*m)) FAIL() << "told goodbye: " << bye->message;
  }
  ASSERT_EQ(asked, 2) << "the kept batch was asked for " << asked << " time(s): " << producer->Stderr();
  peer.Send(Encode(Ack{*kept}));
  EXPECT_EQ(producer->Wait(10000), 0) << producer->Stderr();
}

}  // namespace
}  // namespace coloader
