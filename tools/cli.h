// The `coloader` command line: one Command (CLI11) per subcommand, and the subcommands.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/endpoint.h"
#include "common/status.h"

namespace coloader {
class JsonWriter;  // toolbox/json.h
}  // namespace coloader

namespace coloader::cli {

// CLI11 2.1 reads integers with strtoull/strtoll in base 0, so "010" would be 8, "0x10" 16,
// and "-1" given to a uint64_t flag would wrap to 2^64-1. These validators run on the text
// before CLI11 converts it: decimal integers within the variable's range (messages that say
// which bound; a transform, as it also drops leading zeros), and finite numbers (no "nan",
// "inf") for floating-point flags.
CLI::Validator DecimalInteger(int64_t min, uint64_t max);
CLI::Validator FiniteNumber();
// A number at least `min` (after the flag's own type check): "must be at least 0, got -1".
CLI::Validator AtLeast(int64_t min);
// A number in [lo, hi]; unlike CLI::Range, NaN is outside and the bounds print as written.
CLI::Validator NumberIn(double lo, double hi);

// One subcommand's command line. Every subcommand goes through Parse, so they all behave
// alike: `--help` prints the options (with their defaults) on stdout and exits 0; an unknown
// flag, a missing or malformed value or a value outside a flag's choices prints
// "coloader CMD: what" and the usage line on stderr and exits 2.
//
// A flag is one line: cmd.Add("--wait-ms", &o.wait_ms, "what it does"). Its kind follows the
// variable's type (bool: a flag without a value; integers, double, string: a flag with one).
// Add returns the CLI11 option to chain on: ->type_name("DIR"), ->check(CLI::IsMember({...})),
// ->excludes(other).
class Command {
 public:
  // `synopsis` is the one-line usage shown on errors ("coloader serve --data DIR --name NAME
  // [options]"); `summary` heads the --help text.
  Command(const std::string& name, std::string synopsis, const std::string& summary);
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;

  template <typename T>
  CLI::Option* Add(const std::string& flag, T* value, const std::string& help);
  // A positional argument (plan's JOBS file); checked for presence by the command, which
  // knows what to say when it is missing.
  CLI::Option* Positional(const std::string& name, std::string* value, const std::string& help);

  // Parses `args` (the words after the subcommand). Returns nullopt when the command should
  // run, or the exit code it must return at once: 0 after --help, 2 after a usage error (both
  // already printed).
  std::optional<int> Parse(const std::vector<std::string>& args);
  // Whether the flag was on the command line (for defaults that depend on something else).
  bool Given(const std::string& flag) const { return app_.count(flag) > 0; }

  // A usage error found after parsing (a required flag missing, flags that conflict, a value
  // out of range): "coloader CMD: what\nusage: ..." as an InvalidArgument Status, and the same
  // printed on stderr by UsageError, which returns 2 (the exit code of every usage error).
  Status Error(const std::string& what) const;
  int UsageError(const std::string& what) const;

  CLI::App& app() { return app_; }

 private:
  std::string name_, synopsis_;
  CLI::App app_;
};

template <typename T>
CLI::Option* Command::Add(const std::string& flag, T* value, const std::string& help) {
  if constexpr (std::is_same_v<T, bool>) {
    return app_.add_flag(flag, *value, help);
  } else {
    CLI::Option* o = app_.add_option(flag, *value, help)->capture_default_str();
    if constexpr (std::is_integral_v<T>) {
      o->transform(DecimalInteger(static_cast<int64_t>(std::numeric_limits<T>::min()),
                              static_cast<uint64_t>(std::numeric_limits<T>::max())));
    } else if constexpr (std::is_floating_point_v<T>) {
      o->check(FiniteNumber());
    } else {
      static_assert(std::is_same_v<T, std::string>, "flags are bool, integers, double or std::string");
    }
    return o;
  }
}

int Serve(const std::vector<std::string>& args);
int Consume(const std::vector<std::string>& args);
int StatusCommand(const std::vector<std::string>& args);
// Placement (cli_plan.cc).
int PlanCommand(const std::vector<std::string>& args);
int LaunchCommand(const std::vector<std::string>& args);
int SimulateCommand(const std::vector<std::string>& args);
int Keygen(const std::vector<std::string>& args);
// Leftovers of dead producers (cli_clean.cc): `coloader clean`, and the listing `status` shows.
int Clean(const std::vector<std::string>& args);
int Shard(const std::vector<std::string>& args);
void PrintLeftovers(const std::vector<Leftover>& items, size_t foreign, const char* verb);
// The same as fields of an open JSON object: "leftovers" (name, kind, path, bytes of each) and
// "other_run_dirs".
void LeftoversJson(JsonWriter& w, const std::vector<Leftover>& items, size_t foreign);

}  // namespace coloader::cli
