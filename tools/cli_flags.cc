// Command: the part every subcommand shares (tools/cli.h), on CLI11.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "tools/cli.h"

namespace coloader::cli {

namespace {

// --help starts with the same synopsis an error shows, instead of CLI11's generic
// "Usage: NAME [OPTIONS]".
class SynopsisFormatter : public CLI::Formatter {
 public:
  explicit SynopsisFormatter(std::string synopsis) : synopsis_(std::move(synopsis)) { column_width(36); }
  std::string make_usage(const CLI::App*, std::string) const override { return "usage: " + synopsis_ + "\n"; }

 private:
  std::string synopsis_;
};

}  // namespace

CLI::Validator DecimalInteger(int64_t min, uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        const bool negative = !text.empty() && text[0] == '-';
        const size_t first = negative ? 1 : 0;
        if (first >= text.size() || text.find_first_not_of("0123456789", first) != std::string::npos) {
          return "expects an integer, got '" + text + "'";
        }
        if (negative && min == 0) return "must not be negative, got " + text;
        // Leading zeros go, or CLI11's base-0 conversion would read "010" as octal 8.
        const size_t digits = text.find_first_not_of('0', first);
        text.erase(first, (digits == std::string::npos ? text.size() - 1 : digits) - first);
        errno = 0;
        if (negative) {
          const long long v = std::strtoll(text.c_str(), nullptr, 10);
          if (errno == ERANGE || v < min) return "must be at least " + std::to_string(min) + ", got " + text;
        } else {
          const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
          if (errno == ERANGE || v > max) return "must be at most " + std::to_string(max) + ", got " + text;
        }
        return {};
      },
      "");  // no description: the help already says INT or UINT
}

CLI::Validator AtLeast(int64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || v < static_cast<double>(min))
          return "must be at least " + std::to_string(min) + ", got " + text;
        return {};
      },
      "");
}

CLI::Validator FiniteNumber() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
        // strtod also reads "inf", "nan" and hex floats; none of them is a setting anyone means.
        if (text.empty() || *end != '\0' || !std::isfinite(v) ||
            text.find_first_not_of("0123456789+-.eE") != std::string::npos) {
          return "expects a number, got '" + text + "'";
        }
        return {};
      },
      "");
}

CLI::Validator NumberIn(double lo, double hi) {
  char range[64];
  std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
  return CLI::Validator(
      [lo, hi, bounds = std::string(range)](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !(v >= lo && v <= hi)) return "expects a number in " + bounds + ", got " + text;
        return {};
      },
      std::string("in ") + range);
}

Command::Command(const std::string& name, std::string synopsis, const std::string& summary)
    : name_(name), synopsis_(std::move(synopsis)), app_(summary, "coloader " + name) {
  app_.formatter(std::make_shared<SynopsisFormatter>(synopsis_));
  // A flag given twice takes its last value, as shells' aliases and wrapper scripts expect
  // (`alias serve='coloader serve --quiet --window 8'`, then `serve --window 2 ...`).
  app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app_.footer("`coloader help` lists the other commands.");
}

CLI::Option* Command::Positional(const std::string& name, std::string* value, const std::string& help) {
  return app_.add_option(name, *value, help);
}

std::optional<int> Command::Parse(const std::vector<std::string>& args) {
  // CLI11 consumes its vector from the back.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app_.parse(reversed);
  } catch (const CLI::Success&) {  // --help (CLI11 reports it as a "successful" parse error)
    std::fputs(app_.help().c_str(), stdout);
    return 0;
  } catch (const CLI::Error& e) {
    return UsageError(e.what());
  }
  return std::nullopt;
}

Status Command::Error(const std::string& what) const {
  return Status::Invalid("coloader " + name_ + ": " + what + "\nusage: " + synopsis_ + "\n`coloader " + name_ +
                         " --help` lists every option.");
}

int Command::UsageError(const std::string& what) const {
  std::fprintf(stderr, "%s\n", Error(what).message().c_str());
  return 2;
}

}  // namespace coloader::cli
