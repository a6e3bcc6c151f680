#include "tests/support/producer_test.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "common/endpoint.h"

namespace coloader::testing {

void ProducerTest::SetUp() {
  run_dir_ = tmp_.path() + "/run";
  data_ = tmp_.path() + "/data";
  MakeImageFolder(data_, setup_.images, setup_.classes);
  env_ = {{"COLOADER_RUN_DIR", run_dir_}};
  ::setenv("COLOADER_RUN_DIR", run_dir_.c_str(), 1);
}

void ProducerTest::TearDown() {
  namespace fs = std::filesystem;
  if (auto paths = PathsFor("x"); paths.ok()) {
    // Every name's objects in this run directory share the prefix of name "x"'s.
    const std::string prefix = paths->shm_name.substr(0, paths->shm_name.size() - 1);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/dev/shm", ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove(e.path(), ec);
  }
  ::unsetenv("COLOADER_RUN_DIR");
}

std::unique_ptr<Child> ProducerTest::Serve(const std::string& name, std::vector<std::string> extra,
                                           const std::string& data) {
  std::vector<std::string> args = {"serve", "--data", data.empty() ? data_ : data, "--name", name,
                                   "--image-size", std::to_string(setup_.image_size), "--workers", "2", "--quiet",
                                   "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "1500"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto child = std::make_unique<Child>(Coloader(args), env_);
  EXPECT_TRUE(child->WaitForStderr("serving", 20000)) << child->Stderr();
  return child;
}

std::unique_ptr<Child> ProducerTest::Consume(const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> args = {"consume", "--name", name, "--json"};
  args.insert(args.end(), setup_.consume_flags.begin(), setup_.consume_flags.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<Child>(Coloader(args), env_);
}

}  // namespace coloader::testing
