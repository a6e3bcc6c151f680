#include "server/yaml_reader.h"

#include <opencv2/core.hpp>

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

namespace coloader {

namespace {

// OpenCV reads YAML only after its own directive; two lines we add and take off line numbers.
constexpr const char* kDirective = "%YAML:1.0\n---\n";
constexpr int kDirectiveLines = 2;

JsonValue Convert(const cv::FileNode& n) {
  if (n.isMap()) {
    std::vector<std::pair<std::string, JsonValue>> members;
    for (auto it = n.begin(); it != n.end(); ++it) members.emplace_back((*it).name(), Convert(*it));
    return JsonValue::Object(std::move(members));
  }
  if (n.isSeq()) {
    std::vector<JsonValue> items;
    for (auto it = n.begin(); it != n.end(); ++it) items.push_back(Convert(*it));
    return JsonValue::Array(std::move(items));
  }
  if (n.isInt() || n.isReal()) return JsonValue::Number(static_cast<double>(n));
  if (n.isString()) {
    const std::string s = static_cast<std::string>(n);
    if (s == "true" || s == "True") return JsonValue::Bool(true);
    if (s == "false" || s == "False") return JsonValue::Bool(false);
    if (s == "~" || s == "null" || s == "Null") return JsonValue();
    return JsonValue::String(s);
  }
  return JsonValue();  // an empty value ("key:" with nothing after it)
}

// OpenCV's parse errors read "...in function '(LINE): What went wrong'": the line (of our
// text, directive included) and the reason, or the whole message when it is not of that form.
std::string ParseErrorOf(const cv::Exception& e, const std::string& source) {
  const std::string what = e.what();
  const size_t open = what.rfind("'(");
  if (open != std::string::npos) {
    size_t i = open + 2;
    int line = 0;
    while (i < what.size() && std::isdigit(static_cast<unsigned char>(what[i]))) line = line * 10 + (what[i++] - '0');
    if (i + 2 < what.size() && what[i] == ')' && what[i + 1] == ':') {
      std::string reason = what.substr(i + 2);
      while (!reason.empty() && (reason.back() == '\n' || reason.back() == '\'')) reason.pop_back();
      while (!reason.empty() && reason.front() == ' ') reason.erase(reason.begin());
      if (!reason.empty()) reason[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(reason[0])));
      return source + ":" + std::to_string(std::max(1, line - kDirectiveLines)) + ": " + reason;
    }
  }
  return source + ": not YAML this reader understands: " + what;
}

}  // namespace

Result<JsonValue> ParseYaml(const std::string& text, const std::string& source) {
  if (text.rfind("%YAML", 0) == 0) {
    return Status::Invalid(source + ":1: a %YAML directive is not needed (and not supported): remove that line");
  }
  try {
    cv::FileStorage fs(kDirective + text, cv::FileStorage::READ | cv::FileStorage::MEMORY | cv::FileStorage::FORMAT_YAML);
    if (!fs.isOpened()) return Status::Invalid(source + ": not YAML this reader understands");
    const cv::FileNode root = fs.root();
    if (root.isNone() || (root.isMap() && root.size() == 0 && text.find_first_not_of(" \t\r\n") == std::string::npos)) {
      return Status::Invalid(source + ": the file is empty");
    }
    return Convert(root);
  } catch (const cv::Exception& e) {
    return Status::Invalid(ParseErrorOf(e, source));
  }
}

Result<JsonValue> ReadYamlFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseYaml(text, path);
}

Result<JsonValue> ReadJsonOrYamlFile(const std::string& path) {
  auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".yaml") || ends_with(".yml")) return ReadYamlFile(path);
  return ReadJsonFile(path);
}

}  // namespace coloader
