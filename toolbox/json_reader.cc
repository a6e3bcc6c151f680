#include "toolbox/json_reader.h"
#include "toolbox/json_reader_internal.h"

#include <yaml-cpp/depthguard.h>  // YAML::DeepRecursion, which yaml.h does not include
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

namespace coloader {

JsonValue JsonValue::Bool(bool b) {
  JsonValue v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}
JsonValue JsonValue::Number(double d) {
  JsonValue v;
  v.type_ = Type::kNumber;
  v.number_ = d;
  return v;
}
JsonValue JsonValue::String(std::string s) {
  JsonValue v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}
JsonValue JsonValue::Array(std::vector<JsonValue> items) {
  JsonValue v;
  v.type_ = Type::kArray;
  v.items_ = std::move(items);
  return v;
}
JsonValue JsonValue::Object(std::vector<std::pair<std::string, JsonValue>> members) {
  JsonValue v;
  v.type_ = Type::kObject;
  v.members_ = std::move(members);
  return v;
}

const JsonValue* JsonValue::Find(const std::string& key) const {
  for (const auto& [k, v] : members_) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string JsonValue::Position() const {
  if (!source_) return "";
  return *source_ + ":" + std::to_string(line_) + ":" + std::to_string(column_);
}

void JsonValue::set_position(std::shared_ptr<const std::string> source, int line, int column) {
  source_ = std::move(source);
  line_ = line;
  column_ = column;
}

Status JsonValue::ErrorAt(const std::string& what) const {
  return Status::Invalid(source_ ? Position() + ": " + what : what);
}

const char* JsonTypeName(JsonValue::Type t) {
  switch (t) {
    case JsonValue::Type::kNull: return "null";
    case JsonValue::Type::kBool: return "a boolean";
    case JsonValue::Type::kNumber: return "a number";
    case JsonValue::Type::kString: return "a string";
    case JsonValue::Type::kArray: return "an array";
    case JsonValue::Type::kObject: return "an object";
  }
  return "?";
}

namespace json_detail {

// The number grammars, scanned in one pass (std::regex recursed once per character: a number of
// 40,000 digits overflowed the stack).
size_t Digits(const std::string& s, size_t i) {
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  return i;
}
// [eE][-+]?[0-9]+ at i, or nothing: the index after it, npos where it is malformed.
size_t Exponent(const std::string& s, size_t i) {
  if (i == s.size() || (s[i] != 'e' && s[i] != 'E')) return i;
  ++i;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  const size_t end = Digits(s, i);
  return end > i ? end : std::string::npos;
}
// JSON: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?
bool IsJsonNumber(const std::string& s) {
  size_t i = s.size() > 0 && s[0] == '-' ? 1 : 0;
  if (i == s.size() || s[i] < '0' || s[i] > '9') return false;
  i = s[i] == '0' ? i + 1 : Digits(s, i);
  if (i < s.size() && s[i] == '.') {
    const size_t end = Digits(s, i + 1);
    if (end == i + 1) return false;
    i = end;
  }
  return Exponent(s, i) == s.size();
}
// YAML 1.2 core: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool IsYamlNumber(const std::string& s) {
  size_t i = s.size() > 0 && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i < s.size() && s[i] == '.') {
    const size_t end = Digits(s, i + 1);
    if (end == i + 1) return false;
    i = end;
  } else {
    const size_t end = Digits(s, i);
    if (end == i) return false;
    i = end;
    if (i < s.size() && s[i] == '.') i = Digits(s, i + 1);
  }
  return Exponent(s, i) == s.size();
}

// A value quoted in a message: a hostile one may be megabytes long, so long ones show their
// start and length.
std::string Abbreviated(const std::string& s) {
  return s.size() <= 40 ? s : s.substr(0, 20) + "... (" + std::to_string(s.size()) + " characters)";
}

Status FailAt(const std::string& source, int line, int column, const std::string& what) {
  return Status::Invalid(source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + what);
}

}  // namespace json_detail

namespace {

using json_detail::Abbreviated;
using json_detail::IsJsonNumber;
using json_detail::FailAt;
using json_detail::kMaxDepth;
using json_detail::kMaxValues;

// A surrogate pair that PrepareJson rewrote (12 characters to 10) before yaml-cpp read the
// text: its line and where it ends in the rewritten text, so the columns of marks after it
// on that line can be given back.
struct Shift {
  int line;
  size_t end;
};

int Hex4(const std::string& s, size_t at) {
  if (at + 4 > s.size()) return -1;
  int v = 0;
  for (size_t i = at; i < at + 4; ++i) {
    const char h = s[i];
    v <<= 4;
    if (h >= '0' && h <= '9') v |= h - '0';
    else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
    else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
    else return -1;
  }
  return v;
}

// JSON's lexical rules that YAML's flow syntax relaxes, in one pass over the text before
// yaml-cpp reads it: strings end, hold no raw control characters and only JSON's escapes; no
// comma before a closing bracket; no comments. Surrogate pairs, which YAML does not accept in
// \u escapes, are rewritten as the one \U escape YAML takes for the same character. The
// structure, the numbers and the literals are yaml-cpp's and the converter's business.
Status PrepareJson(const std::string& text, const std::string& source, std::string* out, std::vector<Shift>* shifts) {
  out->clear();
  out->reserve(text.size());
  int line = 1, column = 1, string_line = 0, string_column = 0;
  bool in_string = false;
  char last = '\0';  // the last character outside strings that is not white space
  // The open brackets, checked here: yaml-cpp 0.7 exhausts its memory on some unbalanced flow
  // collections (a '}' closing the document early, found by the json fuzz target).
  struct Open {
    char bracket;
    int line, column;
  };
  std::vector<Open> open;
  bool ended = false;       // the top-level value has ended: only white space may follow
  bool one_string = false;  // ... and it was a string
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (!in_string && c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      if (ended && c != '#')
        return FailAt(source, line, column,
                      one_string
                          ? "content after the end of the document, which is one string (a missing '{' before it?)"
                          : "content after the end of the document (an extra '}' or ']' before it?)");
      if (c == '{' || c == '[') {
        open.push_back({c, line, column});
      } else if (c == '}' || c == ']') {
        const char opener = c == '}' ? '{' : '[';
        if (open.empty()) return FailAt(source, line, column, std::string("'") + c + "' closes nothing");
        if (open.back().bracket != opener)
          return FailAt(source, line, column,
                        std::string("'") + c + "' closes the '" + open.back().bracket + "' opened at " +
                            std::to_string(open.back().line) + ":" + std::to_string(open.back().column));
        open.pop_back();
        ended = open.empty();
      } else if (c == ',') {
        // yaml-cpp 0.7 never returns from a document that is a lone ','.
        if (open.empty()) return FailAt(source, line, column, "',' outside any [...] or {...}");
        if (last == '[' || last == '{' || last == ',' || last == ':')
          return FailAt(source, line, column, "expected a value before ','");
      }
    }
    if (in_string && c == '\\' && i + 1 < text.size()) {
      const char e = text[i + 1];
      if (e != 'u') {
        if (e == '\0' || !std::strchr("\"\\/bfnrt", e)) {
          return FailAt(source, line, column + 1, "invalid escape \\" + std::string(1, e) + " in a string");
        }
        out->append(text, i, 2);
        i += 2;
        column += 2;
        continue;
      }
      const int unit = Hex4(text, i + 2);
      if (unit < 0) return FailAt(source, line, column, "\\u needs four hex digits");
      if (unit >= 0xDC00 && unit < 0xE000) {
        return FailAt(source, line, column,
                      "lone low surrogate \\u" + text.substr(i + 2, 4) + " (it must follow a high one, \\uD800..\\uDBFF)");
      }
      if (unit >= 0xD800 && unit < 0xDC00) {
        const int low = text.compare(i + 6, 2, "\\u") == 0 ? Hex4(text, i + 8) : -1;
        if (low < 0xDC00 || low >= 0xE000) {
          return FailAt(source, line, column,
                        "invalid low surrogate after \\u" + text.substr(i + 2, 4) + " (expected \\uDC00..\\uDFFF)");
        }
        char escape[16];
        std::snprintf(escape, sizeof escape, "\\U%08X", 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00));
        out->append(escape);
        shifts->push_back({line, out->size()});
        i += 12;
        column += 12;
        continue;
      }
      out->append(text, i, 6);
      i += 6;
      column += 6;
      continue;
    }
    if (in_string) {
      if (static_cast<unsigned char>(c) < 0x20) {
        return FailAt(source, line, column,
                      "unescaped control character " + std::to_string(static_cast<int>(c)) + " in a string");
      }
      in_string = c != '"';
      // A document that is one string ends with it (yaml-cpp 0.7 never returned from some text
      // after a top-level string: the json fuzz target's timeout-top-level-string-then-text).
      if (!in_string && open.empty()) ended = one_string = true;
    } else if (c == '"') {
      in_string = true;
      string_line = line;
      string_column = column;
    } else if (c == '#') {
      return FailAt(source, line, column, "a comment is not JSON (a .yaml file may have them)");
    } else if ((c == '}' || c == ']') && last == ',') {
      return FailAt(source, line, column,
                    std::string(c == '}' ? "expected a member name in double quotes" : "expected a value") + ", got '" +
                        c + "' (a trailing comma?)");
    }
    if (c == '"' || (!in_string && c != ' ' && c != '\t' && c != '\n' && c != '\r')) last = c;
    out->push_back(c);
    ++i;
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  if (in_string) {
    return FailAt(source, line, column,
                  "unterminated string (it opens at " + std::to_string(string_line) + ":" + std::to_string(string_column) + ")");
  }
  // Deeper than the reader's bound: its own error (with the converter's position) says so.
  if (!open.empty() && open.size() <= 64)
    return FailAt(source, open.back().line, open.back().column,
                  std::string("'") + open.back().bracket + "' is never closed (a missing ',' or '" +
                      (open.back().bracket == '{' ? '}' : ']') + "'?)");
  return Status::OK();
}

// yaml-cpp's parse errors are terse; the common ones get the likely cause.
std::string Explain(const std::string& msg) {
  if (msg == YAML::ErrorMsg::END_OF_MAP_FLOW) return msg + " (a missing ',' or '}'?)";
  if (msg == YAML::ErrorMsg::END_OF_SEQ_FLOW) return msg + " (a missing ',' or ']'?)";
  if (msg == YAML::ErrorMsg::END_OF_MAP || msg == YAML::ErrorMsg::END_OF_SEQ) return msg + " (is the indentation even?)";
  return msg;
}

// Turns yaml-cpp's node tree of a JSON text into JsonValues with positions, applying JSON's rules
// where YAML's flow syntax is laxer.
class Converter {
 public:
  Converter(const std::string& text, const std::string& source, const std::vector<Shift>& shifts)
      : text_(text), source_(std::make_shared<const std::string>(source)), shifts_(shifts) {}

  Status ErrorAt(const YAML::Mark& m, const std::string& what) const {
    if (m.is_null()) return Status::Invalid(*source_ + ": " + what);
    const auto [line, column] = LineColumn(m);
    return FailAt(*source_, line, column, what);
  }

  Result<JsonValue> Convert(const YAML::Node& n, int depth) {
    const YAML::Mark m = n.Mark();
    if (depth > kMaxDepth) return ErrorAt(m, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    if (++values_ > kMaxValues) {
      return ErrorAt(m, "more than " + std::to_string(kMaxValues) + " values (an alias that expands too far?)");
    }
    const char at = m.pos >= 0 && static_cast<size_t>(m.pos) < text_.size() ? text_[static_cast<size_t>(m.pos)] : '\0';
    const std::string& tag = n.Tag();
    if (!tag.empty() && tag != "?" && tag != "!") {
      return ErrorAt(m, "the tag " + Abbreviated(tag) + " is not supported (quote a value to make it a string)");
    }
    JsonValue v;
    switch (n.Type()) {
      case YAML::NodeType::Null:
        if (text_.compare(static_cast<size_t>(std::max(0, m.pos)), 4, "null") != 0) {
          return ErrorAt(m, NotJson(at, ""));
        }
        break;
      case YAML::NodeType::Scalar: {
        COLOADER_ASSIGN_OR_RETURN(v, Scalar(n, m, at));
        break;
      }
      case YAML::NodeType::Sequence: {
        if (at != '[') return ErrorAt(m, NotJsonCollection(at));
        std::vector<JsonValue> items;
        for (const YAML::Node& item : n) {
          COLOADER_ASSIGN_OR_RETURN(JsonValue x, Convert(item, depth + 1));
          items.push_back(std::move(x));
        }
        v = JsonValue::Array(std::move(items));
        break;
      }
      case YAML::NodeType::Map: {
        if (at != '{') return ErrorAt(m, NotJsonCollection(at));
        std::vector<std::pair<std::string, JsonValue>> members;
        std::unordered_set<std::string> seen;  // a set: a hostile object of n members costs O(n), not O(n^2)
        for (const auto& kv : n) {
          const YAML::Node& key = kv.first;
          const YAML::Mark km = key.Mark();
          const char key_at = km.pos >= 0 && static_cast<size_t>(km.pos) < text_.size() ? text_[static_cast<size_t>(km.pos)] : '\0';
          if (!key.IsScalar() || key_at != '"') {
            return ErrorAt(km, std::string("expected a member name in double quotes") +
                                   (key.IsScalar() ? ", got '" + key.Scalar() + "'" : ""));
          }
          if (!seen.insert(key.Scalar()).second) {
            return ErrorAt(km, "duplicate member \"" + key.Scalar() + "\"");
          }
          COLOADER_ASSIGN_OR_RETURN(JsonValue x, Convert(kv.second, depth + 1));
          members.emplace_back(key.Scalar(), std::move(x));
        }
        v = JsonValue::Object(std::move(members));
        break;
      }
      case YAML::NodeType::Undefined:
        return ErrorAt(m, "expected a value");
    }
    const auto [line, column] = LineColumn(m);
    v.set_position(source_, line, column);
    return v;
  }

 private:
  // yaml-cpp counts from 0; people and editors from 1.
  std::pair<int, int> LineColumn(const YAML::Mark& m) const {
    int column = m.column + 1;
    for (const Shift& s : shifts_) {
      if (s.line == m.line + 1 && static_cast<int64_t>(s.end) <= m.pos) column += 2;
    }
    return {m.line + 1, column};
  }

  // What a value that JSON does not allow is told, by the character it starts with.
  static std::string NotJson(char at, const std::string& text) {
    const std::string got = text.empty() ? (at ? std::string(1, at) : std::string("end of input")) : Abbreviated(text);
    if (at == '\'') return "strings must be in double quotes in JSON, got '" + got + "'";
    if (at == '&' || at == '*') return "anchors and aliases are YAML, not JSON";
    if (at == '?' || at == '|' || at == '>') return "block-style YAML is not JSON (write {...} and [...], or name the file .yaml)";
    return "expected a value (an object, array, string in double quotes, number, true, false or null), got '" + got + "'";
  }

  // A sequence or mapping in JSON that does not open with '[' or '{'.
  static std::string NotJsonCollection(char at) {
    if (at == '&' || at == '*' || at == '!') return NotJson(at, "");
    return "block-style YAML is not JSON (write {...} and [...], or name the file .yaml)";
  }

  Result<JsonValue> Scalar(const YAML::Node& n, const YAML::Mark& m, char at) const {
    // yaml-cpp tags a quoted scalar "!" and a plain one "?": only plain ones are numbers,
    // booleans or null, so "7" stays a string.
    const std::string& s = n.Scalar();
    if (n.Tag() == "!") {
      if (at != '"') return ErrorAt(m, NotJson(at, s));
      return JsonValue::String(s);
    }
    if (text_.compare(static_cast<size_t>(std::max(0, m.pos)), s.size(), s) != 0) return ErrorAt(m, NotJson(at, s));
    if (s == "true" || s == "false") return JsonValue::Bool(s == "true");
    if (IsJsonNumber(s)) return Number(s, m);
    if (s.find_first_of(" \t\r\n") != std::string::npos) {
      // yaml-cpp reads `[1 2]` as the one plain scalar "1 2".
      return ErrorAt(m, "expected ',' between values (or a string in double quotes), got '" + Abbreviated(s) + "'");
    }
    if (!s.empty() && (s[0] == '-' || (s[0] >= '0' && s[0] <= '9'))) {
      return ErrorAt(m, "'" + Abbreviated(s) + "' is not a JSON number (no leading zeros, digits after '.' and in the exponent)");
    }
    return ErrorAt(m, NotJson(at, s));
  }

  Result<JsonValue> Number(const std::string& s, const YAML::Mark& m) const {
    errno = 0;
    const double d = std::strtod(s.c_str(), nullptr);
    if (errno == ERANGE && std::isinf(d)) {
      return ErrorAt(m, "number " + Abbreviated(s) + " is out of range");
    }
    return JsonValue::Number(d);
  }

  const std::string& text_;
  std::shared_ptr<const std::string> source_;
  const std::vector<Shift>& shifts_;
  size_t values_ = 0;
};

// JSON through yaml-cpp (JSON is YAML 1.2's flow syntax), after PrepareJson's pre-pass.
Result<JsonValue> ParseJsonText(const std::string& text, const std::string& source) {
  std::string input;
  std::vector<Shift> shifts;
  COLOADER_RETURN_NOT_OK(PrepareJson(text, source, &input, &shifts));
  Converter converter(input, source, shifts);
  // yaml-cpp reports every problem by exception; none may leave this Status-returning function.
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(input);
    if (docs.empty()) return Status::Invalid(source + ": the file is empty");
    if (docs.size() > 1) return converter.ErrorAt(docs[1].Mark(), "unexpected content after the end of the document");
    return converter.Convert(docs[0], 0);
  } catch (const YAML::DeepRecursion& e) {
    return converter.ErrorAt(e.mark, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
  } catch (const YAML::Exception& e) {
    return converter.ErrorAt(e.mark, Explain(e.msg));
  } catch (const std::bad_alloc&) {  // a malformed file yaml-cpp loses itself in
    return Status::Invalid(source + ": the file could not be read within this process's memory (malformed?)");
  }
}

}  // namespace

Result<JsonValue> ParseJson(const std::string& text, const std::string& source) {
  return ParseJsonText(text, source);
}

Result<std::string> ReadTextFile(const std::string& path) {
  // A jobs file, recipe or state is kilobytes: a directory, a device or a huge file is a mistake
  // to name, not something to read until memory runs out (`plan /dev/zero` grew to 3.5 GB).
  constexpr size_t kMaxBytes = size_t{64} << 20;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Status::Invalid(path + " is a directory: name the JSON or YAML file in it");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path + ": " + std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxBytes)
      return Status::Invalid(path + " is larger than 64 MiB (a jobs file, recipe or state is a few KB): is it the "
                             "right file?");
  }
  return text;
}

Result<JsonValue> ReadJsonFile(const std::string& path) {
  COLOADER_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseJson(text, path);
}

Result<JsonValue> ReadYamlFile(const std::string& path) {
  COLOADER_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseYaml(text, path);
}

Result<JsonValue> ReadJsonOrYamlFile(const std::string& path) {
  auto ends_with = [&](const std::string& suffix) {
    return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with(".yaml") || ends_with(".yml")) return ReadYamlFile(path);
  return ReadJsonFile(path);
}

Status JsonFields::Error(const std::string& key, const std::string& what) const {
  const JsonValue* v = obj_.Find(key);
  return (v ? *v : obj_).ErrorAt((where_.empty() ? "" : where_ + ": ") + "field \"" + key + "\" " + what);
}


Result<const JsonValue*> JsonFields::Typed(const std::string& key, JsonValue::Type t) const {
  const JsonValue* v = obj_.Find(key);
  if (!v) return Error(key, "is missing");
  if (v->type() != t) {
    return Error(key, std::string("must be ") + JsonTypeName(t) + ", got " + JsonTypeName(v->type()));
  }
  return v;
}

Result<std::string> JsonFields::String(const std::string& key) const {
  COLOADER_ASSIGN_OR_RETURN(const JsonValue* v, Typed(key, JsonValue::Type::kString));
  return v->string();
}
Result<std::string> JsonFields::String(const std::string& key, const std::string& fallback) const {
  if (!Has(key)) return fallback;
  return String(key);
}
Result<double> JsonFields::Number(const std::string& key) const {
  COLOADER_ASSIGN_OR_RETURN(const JsonValue* v, Typed(key, JsonValue::Type::kNumber));
  return v->number();
}
Result<double> JsonFields::Number(const std::string& key, double fallback) const {
  if (!Has(key)) return fallback;
  return Number(key);
}
Result<bool> JsonFields::Bool(const std::string& key, bool fallback) const {
  if (!Has(key)) return fallback;
  COLOADER_ASSIGN_OR_RETURN(const JsonValue* v, Typed(key, JsonValue::Type::kBool));
  return v->bool_value();
}
Result<std::vector<std::string>> JsonFields::StringList(const std::string& key) const {
  COLOADER_ASSIGN_OR_RETURN(const JsonValue* v, Typed(key, JsonValue::Type::kArray));
  std::vector<std::string> out;
  for (size_t i = 0; i < v->items().size(); ++i) {
    const JsonValue& item = v->items()[i];
    if (item.is_number()) {
      // ["--epochs", 2]: a number in a command line is its shortest text that reads back the same.
      char text[32];
      const double x = item.number();
      if (x == std::floor(x) && std::fabs(x) < 9007199254740992.0) {
        std::snprintf(text, sizeof text, "%.0f", x);  // integers as integers: 1e6 is 1000000
      } else {
        for (int precision = 1; precision <= 17; ++precision) {
          std::snprintf(text, sizeof text, "%.*g", precision, x);
          if (std::strtod(text, nullptr) == x) break;
        }
      }
      out.emplace_back(text);
      continue;
    }
    if (!item.is_string()) {
      return item.ErrorAt((where_.empty() ? "" : where_ + ": ") + "field \"" + key + "\" must be a list of strings; item " +
                          std::to_string(i) + " is " + JsonTypeName(item.type()));
    }
    out.push_back(item.string());
  }
  return out;
}
Result<std::vector<std::string>> JsonFields::StringList(const std::string& key,
                                                        std::vector<std::string> fallback) const {
  if (!Has(key)) return fallback;
  return StringList(key);
}

Status JsonFields::OnlyKnown(const std::vector<std::string>& known) const {
  for (const auto& [k, v] : obj_.members()) {
    bool ok = false;
    for (const auto& name : known) ok = ok || name == k;
    if (!ok) {
      std::string list;
      for (const auto& name : known) list += (list.empty() ? "" : ", ") + name;
      return v.ErrorAt((where_.empty() ? "" : where_ + ": ") + "unknown field \"" + k + "\" (known: " + list + ")");
    }
  }
  return Status::OK();
}

}  // namespace coloader
