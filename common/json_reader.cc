#include "common/json_reader.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
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

namespace {

// Recursive descent over the text; depth is bounded so a hostile file cannot overflow the stack.
class Parser {
 public:
  Parser(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  Result<JsonValue> Document() {
    SkipSpace();
    ASSIGN_OR_RETURN(JsonValue v, Value(0));
    SkipSpace();
    if (pos_ != s_.size()) return Fail("unexpected " + Describe() + " after the end of the document");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  Status Fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return Status::Invalid(source_ + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + what);
  }
  std::string Describe() const {
    if (pos_ >= s_.size()) return "end of input";
    const char c = s_[pos_];
    if (static_cast<unsigned char>(c) < 0x20) return "control character " + std::to_string(static_cast<int>(c));
    return std::string("'") + c + "'";
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool Literal(const char* word) {
    const std::string w(word);
    if (s_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }

  Result<JsonValue> Value(int depth) {
    if (depth > kMaxDepth) return Fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    if (pos_ >= s_.size()) return Fail("expected a value, got end of input");
    const char c = s_[pos_];
    if (c == '{') return ObjectValue(depth);
    if (c == '[') return ArrayValue(depth);
    if (c == '"') {
      ASSIGN_OR_RETURN(std::string str, StringValue());
      return JsonValue::String(std::move(str));
    }
    if (c == '-' || (c >= '0' && c <= '9')) return NumberValue();
    if (Literal("true")) return JsonValue::Bool(true);
    if (Literal("false")) return JsonValue::Bool(false);
    if (Literal("null")) return JsonValue();
    return Fail("expected a value (object, array, string, number, true, false or null), got " + Describe());
  }

  Result<JsonValue> ObjectValue(int depth) {
    ++pos_;  // '{'
    std::vector<std::pair<std::string, JsonValue>> members;
    std::unordered_set<std::string> seen;  // a set, so a hostile object of n members costs O(n), not O(n^2)
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return JsonValue::Object(std::move(members));
    }
    for (;;) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected a member name in double quotes, got " + Describe());
      const size_t key_at = pos_;
      ASSIGN_OR_RETURN(std::string key, StringValue());
      if (!seen.insert(key).second) {
        pos_ = key_at;
        return Fail("duplicate member \"" + key + "\"");
      }
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected ':' after \"" + key + "\", got " + Describe());
      ++pos_;
      SkipSpace();
      ASSIGN_OR_RETURN(JsonValue v, Value(depth + 1));
      members.emplace_back(std::move(key), std::move(v));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return JsonValue::Object(std::move(members));
      }
      return Fail("expected ',' or '}' after a member, got " + Describe());
    }
  }

  Result<JsonValue> ArrayValue(int depth) {
    ++pos_;  // '['
    std::vector<JsonValue> items;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return JsonValue::Array(std::move(items));
    }
    for (;;) {
      SkipSpace();
      ASSIGN_OR_RETURN(JsonValue v, Value(depth + 1));
      items.push_back(std::move(v));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return JsonValue::Array(std::move(items));
      }
      return Fail("expected ',' or ']' in an array, got " + Describe());
    }
  }

  Result<uint32_t> Hex4() {
    if (pos_ + 4 > s_.size()) return Fail("\\u needs four hex digits");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<uint32_t>(h - 'A' + 10);
      else return Fail("\\u needs four hex digits");
    }
    return v;
  }

  static void AppendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  Result<std::string> StringValue() {
    ++pos_;  // '"'
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) return Fail("unterminated string");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) return Fail("unescaped " + Describe() + " in a string");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) return Fail("unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          const size_t escape_at = pos_ - 2;  // the backslash, for the error's line:col
          ASSIGN_OR_RETURN(uint32_t cp, Hex4());
          if (cp >= 0xDC00 && cp < 0xE000) {  // not valid UTF-8 on its own: it only ends a pair
            pos_ = escape_at;
            return Fail("lone low surrogate \\u" + s_.substr(escape_at + 2, 4) + " (it must follow a high one, \\uD800..\\uDBFF)");
          }
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            if (!Literal("\\u")) return Fail("a high surrogate must be followed by \\u and a low one");
            ASSIGN_OR_RETURN(uint32_t lo, Hex4());
            if (lo < 0xDC00 || lo >= 0xE000) return Fail("invalid low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(&out, cp);
          break;
        }
        default:
          --pos_;
          return Fail("invalid escape \\" + std::string(1, e) + " in a string");
      }
    }
  }

  Result<JsonValue> NumberValue() {
    const size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    auto digits = [&] {
      size_t n = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_, ++n;
      return n;
    };
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
      if (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') return Fail("numbers may not have leading zeros");
    } else if (digits() == 0) {
      return Fail("expected digits in a number, got " + Describe());
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) return Fail("expected digits after '.', got " + Describe());
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) return Fail("expected digits in the exponent, got " + Describe());
    }
    const std::string text = s_.substr(start, pos_ - start);
    errno = 0;
    const double d = std::strtod(text.c_str(), nullptr);
    if (errno == ERANGE && std::isinf(d)) {
      pos_ = start;
      return Fail("number " + text + " is out of range");
    }
    return JsonValue::Number(d);
  }

  const std::string& s_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

Result<JsonValue> ParseJson(const std::string& text, const std::string& source) {
  return Parser(text, source).Document();
}

Result<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<JsonValue> ReadJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseJson(text, path);
}

Status JsonFields::Error(const std::string& key, const std::string& what) const {
  return Status::Invalid(where_ + ": field \"" + key + "\" " + what);
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
  ASSIGN_OR_RETURN(const JsonValue* v, Typed(key, JsonValue::Type::kString));
  return v->string();
}
Result<std::string> JsonFields::String(const std::string& key, const std::string& fallback) const {
  if (!Has(key)) return fallback;
  return String(key);
}
Result<double> JsonFields::Number(const std::string& key) const {
  ASSIGN_OR_RETURN(const JsonValue* v, Typed(key, JsonValue::Type::kNumber));
  return v->number();
}
Result<double> JsonFields::Number(const std::string& key, double fallback) const {
  if (!Has(key)) return fallback;
  return Number(key);
}
Result<bool> JsonFields::Bool(const std::string& key, bool fallback) const {
  if (!Has(key)) return fallback;
  ASSIGN_OR_RETURN(const JsonValue* v, Typed(key, JsonValue::Type::kBool));
  return v->bool_value();
}
Result<std::vector<std::string>> JsonFields::StringList(const std::string& key) const {
  ASSIGN_OR_RETURN(const JsonValue* v, Typed(key, JsonValue::Type::kArray));
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
      return Error(key, "must be a list of strings; item " + std::to_string(i) + " is " + JsonTypeName(item.type()));
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
      return Status::Invalid(where_ + ": unknown field \"" + k + "\" (known: " + list + ")");
    }
  }
  return Status::OK();
}

}  // namespace coloader
