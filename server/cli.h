// The `coloader` command line: a small flag parser and the subcommands.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace coloader::cli {

// Parses "--flag value", "--flag=value" and boolean "--flag". Unknown flags, missing values
// and malformed numbers are errors that name the flag and show the usage line.
class Flags {
 public:
  Flags(std::string command, std::string usage) : command_(std::move(command)), usage_(std::move(usage)) {}
  void AddString(const std::string& name, std::string* out);
  void AddUInt(const std::string& name, uint64_t* out);
  void AddU32(const std::string& name, uint32_t* out);
  void AddInt(const std::string& name, int* out);
  void AddBool(const std::string& name, bool* out);
  Status Parse(const std::vector<std::string>& args);
  bool Seen(const std::string& name) const { return seen_.count(name) > 0; }
  const std::string& usage() const { return usage_; }
  Status Error(const std::string& what) const;

 private:
  enum class Kind { kString, kUInt, kU32, kInt, kBool };
  struct Spec {
    Kind kind;
    void* out;
  };
  std::string command_, usage_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, bool> seen_;
};

int Serve(const std::vector<std::string>& args);
int Consume(const std::vector<std::string>& args);
int StatusCommand(const std::vector<std::string>& args);
// Placement (cli_plan.cc).
int PlanCommand(const std::vector<std::string>& args);
int LaunchCommand(const std::vector<std::string>& args);
int SimulateCommand(const std::vector<std::string>& args);
int Keygen(const std::vector<std::string>& args);

}  // namespace coloader::cli
