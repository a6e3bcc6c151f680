#include <cerrno>
#include <cstdlib>
#include <limits>

#include "server/cli.h"

namespace coloader::cli {

void Flags::AddString(const std::string& name, std::string* out) { specs_[name] = {Kind::kString, out}; }
void Flags::AddUInt(const std::string& name, uint64_t* out) { specs_[name] = {Kind::kUInt, out}; }
void Flags::AddU32(const std::string& name, uint32_t* out) { specs_[name] = {Kind::kU32, out}; }
void Flags::AddInt(const std::string& name, int* out) { specs_[name] = {Kind::kInt, out}; }
void Flags::AddBool(const std::string& name, bool* out) { specs_[name] = {Kind::kBool, out}; }

Status Flags::Error(const std::string& what) const {
  return Status::Invalid("coloader " + command_ + ": " + what + "\nusage: " + usage_);
}

Status Flags::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) return Error("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) return Error("unknown flag --" + name);
    seen_[name] = true;
    const Spec& spec = it->second;
    if (spec.kind == Kind::kBool) {
      if (has_value) return Error("--" + name + " takes no value");
      *static_cast<bool*>(spec.out) = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return Error("--" + name + " needs a value");
      value = args[++i];
    }
    if (spec.kind == Kind::kString) {
      *static_cast<std::string*>(spec.out) = value;
      continue;
    }
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno != 0) {
      return Error("--" + name + " expects an integer, got '" + value + "'");
    }
    if (spec.kind != Kind::kInt && v < 0) return Error("--" + name + " must not be negative, got " + value);
    if (spec.kind == Kind::kUInt) {
      *static_cast<uint64_t*>(spec.out) = static_cast<uint64_t>(v);
    } else if (spec.kind == Kind::kU32) {
      if (v > std::numeric_limits<uint32_t>::max()) return Error("--" + name + " is too large: " + value);
      *static_cast<uint32_t*>(spec.out) = static_cast<uint32_t>(v);
    } else {
      if (v > std::numeric_limits<int>::max() || v < std::numeric_limits<int>::min())
        return Error("--" + name + " is out of range: " + value);
      *static_cast<int*>(spec.out) = static_cast<int>(v);
    }
  }
  return Status::OK();
}

}  // namespace coloader::cli
