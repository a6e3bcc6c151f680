// The fixture of the tests that drive a real producer and its consumers over a dataset of
// their own: a private run directory (COLOADER_RUN_DIR, for this process and the children it
// starts), a small ImageFolder, and `coloader serve` / `coloader consume` with small, fast
// settings (heartbeats every 100 ms, a peer silent for 1.5 s is gone).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace coloader::testing {

struct ProducerTestSetup {
  int images = 0;
  int classes = 0;
  int image_size = 32;                     // serve --image-size
  std::vector<std::string> consume_flags;  // every Consume's, after --name and --json
};

class ProducerTest : public ::testing::Test {
 protected:
  explicit ProducerTest(ProducerTestSetup setup) : setup_(std::move(setup)) {}
  void SetUp() override;
  // A producer still running when its test ends is SIGKILLed (Child's destructor) and leaves
  // its ring and mailboxes in /dev/shm, as a crash would: they are removed here.
  void TearDown() override;

  // `coloader serve` over `data` (the test's dataset by default); returns once it serves.
  std::unique_ptr<Child> Serve(const std::string& name, std::vector<std::string> extra = {},
                               const std::string& data = "");
  std::unique_ptr<Child> Consume(const std::string& name, std::vector<std::string> extra = {});

  ProducerTestSetup setup_;
  TempDir tmp_;
  std::string run_dir_, data_;
  std::map<std::string, std::string> env_;
};

}  // namespace coloader::testing
