// YAML files (jobs files, recipes) read by libyaml's event parser into json_reader.h's value tree.
#include <yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "toolbox/json_reader.h"
#include "toolbox/json_reader_internal.h"

namespace coloader {

namespace {

using json_detail::Abbreviated;
using json_detail::FailAt;
using json_detail::IsYamlNumber;
using json_detail::kMaxDepth;
using json_detail::kMaxValues;

// YAML through libyaml's event parser (yaml-cpp, which reads JSON here, never returns from or
// exhausts its memory on some malformed YAML of a few bytes: "!E,", "&#.#5#,", a flow mapping
// closed early; libyaml is PyYAML's parser and is fuzzed on OSS-Fuzz). The events become the
// same value tree, with the same rules: plain scalars resolved by YAML 1.2's core schema (null,
// booleans, numbers; anything quoted is a string), string keys only, no duplicate keys, no
// tags, one document, aliases counted against kMaxValues, depth against kMaxDepth.
class YamlReader {
 public:
  YamlReader(const std::string& text, const std::string& source)
      : text_(text), source_(std::make_shared<const std::string>(source)) {
    live_ = yaml_parser_initialize(&parser_) != 0;
    if (live_)
      yaml_parser_set_input_string(&parser_, reinterpret_cast<const unsigned char*>(text_.data()), text_.size());
  }
  ~YamlReader() {
    if (live_) yaml_parser_delete(&parser_);
  }
  YamlReader(const YamlReader&) = delete;
  YamlReader& operator=(const YamlReader&) = delete;

  Result<JsonValue> Read() {
    if (!live_) return Status::Internal("yaml_parser_initialize failed");
    Event e;
    COLOADER_RETURN_NOT_OK(Next(&e));  // STREAM_START
    COLOADER_RETURN_NOT_OK(Next(&e));
    if (e.e.type == YAML_STREAM_END_EVENT) return Status::Invalid(*source_ + ": the file is empty");
    COLOADER_RETURN_NOT_OK(Next(&e));  // past DOCUMENT_START: the root
    COLOADER_ASSIGN_OR_RETURN(JsonValue root, Node(e, 0));
    COLOADER_RETURN_NOT_OK(Next(&e));  // DOCUMENT_END
    COLOADER_RETURN_NOT_OK(Next(&e));
    if (e.e.type != YAML_STREAM_END_EVENT) return At(e.e.start_mark, "unexpected content after the end of the document");
    return root;
  }

 private:
  struct Event {
    yaml_event_t e{};
    bool live = false;
    void Reset() {
      if (live) yaml_event_delete(&e);
      live = false;
    }
    ~Event() { Reset(); }
  };

  Status At(const yaml_mark_t& m, const std::string& what) const {
    return FailAt(*source_, static_cast<int>(m.line) + 1, static_cast<int>(m.column) + 1, what);
  }

  Status Next(Event* e) {
    e->Reset();
    if (!yaml_parser_parse(&parser_, &e->e)) {
      if (parser_.error == YAML_MEMORY_ERROR) return Status::Invalid(*source_ + ": out of memory reading it");
      if (parser_.error == YAML_READER_ERROR) {  // not text: its place is a byte offset
        yaml_mark_t at{};
        const size_t end = std::min(parser_.problem_offset, text_.size());
        for (size_t k = 0; k < end; ++k) {
          if (text_[k] == '\n') {
            ++at.line;
            at.column = 0;
          } else {
            ++at.column;
          }
        }
        char byte[16];
        std::snprintf(byte, sizeof byte, " (byte 0x%02x)", static_cast<unsigned>(parser_.problem_value) & 0xffu);
        return At(at, std::string(parser_.problem ? parser_.problem : "not text") +
                          (parser_.problem_value >= 0 ? byte : "") + ": the file is not UTF-8 text");
      }
      std::string what = parser_.problem ? parser_.problem : "malformed YAML";
      if (parser_.context) what = std::string(parser_.context) + ": " + what;
      return At(parser_.problem_mark, what);
    }
    e->live = true;
    return Status::OK();
  }

  // A tag the reader does not take: every value's kind comes from its text.
  Status Untagged(const yaml_char_t* tag, const yaml_mark_t& m) const {
    if (tag == nullptr) return Status::OK();
    const std::string t(reinterpret_cast<const char*>(tag));
    if (t == "!") return Status::OK();
    return At(m, "the tag " + Abbreviated(t) + " is not supported (quote a value to make it a string)");
  }

  // The value that begins with event `e` (consumed, with every event of the value).
  Result<JsonValue> Node(Event& e, int depth) {
    const yaml_mark_t m = e.e.start_mark;
    if (depth > kMaxDepth) return At(m, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    const size_t values_before = values_;
    if (++values_ > kMaxValues)
      return At(m, "more than " + std::to_string(kMaxValues) + " values (an alias that expands too far?)");
    JsonValue v;
    const yaml_char_t* anchor = nullptr;
    switch (e.e.type) {
      case YAML_ALIAS_EVENT: {
        const std::string name(reinterpret_cast<const char*>(e.e.data.alias.anchor));
        auto it = anchors_.find(name);
        if (it == anchors_.end()) return At(m, "the alias *" + Abbreviated(name) + " names no anchor before it");
        values_ += it->second.second - 1;
        if (values_ > kMaxValues)
          return At(m, "more than " + std::to_string(kMaxValues) + " values (an alias that expands too far?)");
        v = it->second.first;
        break;
      }
      case YAML_SCALAR_EVENT: {
        anchor = e.e.data.scalar.anchor;
        const std::string text(reinterpret_cast<const char*>(e.e.data.scalar.value), e.e.data.scalar.length);
        if (e.e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
          COLOADER_RETURN_NOT_OK(Untagged(e.e.data.scalar.tag, m));
          COLOADER_ASSIGN_OR_RETURN(v, Plain(text, m));
        } else {
          if (e.e.data.scalar.tag != nullptr && !e.e.data.scalar.quoted_implicit)
            COLOADER_RETURN_NOT_OK(Untagged(e.e.data.scalar.tag, m));
          v = JsonValue::String(text);
        }
        break;
      }
      case YAML_SEQUENCE_START_EVENT: {
        anchor = e.e.data.sequence_start.anchor;
        COLOADER_RETURN_NOT_OK(Untagged(e.e.data.sequence_start.implicit ? nullptr : e.e.data.sequence_start.tag, m));
        const std::string keep = anchor ? reinterpret_cast<const char*>(anchor) : "";
        std::vector<JsonValue> items;
        for (;;) {
          COLOADER_RETURN_NOT_OK(Next(&e));
          if (e.e.type == YAML_SEQUENCE_END_EVENT) break;
          COLOADER_ASSIGN_OR_RETURN(JsonValue x, Node(e, depth + 1));
          items.push_back(std::move(x));
        }
        v = JsonValue::Array(std::move(items));
        v.set_position(source_, static_cast<int>(m.line) + 1, static_cast<int>(m.column) + 1);
        if (!keep.empty()) anchors_[keep] = {v, values_ - values_before};
        return v;
      }
      case YAML_MAPPING_START_EVENT: {
        anchor = e.e.data.mapping_start.anchor;
        COLOADER_RETURN_NOT_OK(Untagged(e.e.data.mapping_start.implicit ? nullptr : e.e.data.mapping_start.tag, m));
        const std::string keep = anchor ? reinterpret_cast<const char*>(anchor) : "";
        std::vector<std::pair<std::string, JsonValue>> members;
        std::unordered_set<std::string> seen;  // a set: a hostile mapping of n keys costs O(n), not O(n^2)
        for (;;) {
          COLOADER_RETURN_NOT_OK(Next(&e));
          if (e.e.type == YAML_MAPPING_END_EVENT) break;
          const yaml_mark_t km = e.e.start_mark;
          if (e.e.type != YAML_SCALAR_EVENT) return At(km, "expected a key (a string)");
          const std::string key(reinterpret_cast<const char*>(e.e.data.scalar.value), e.e.data.scalar.length);
          if (!seen.insert(key).second) return At(km, "duplicate key \"" + Abbreviated(key) + "\"");
          COLOADER_RETURN_NOT_OK(Next(&e));
          COLOADER_ASSIGN_OR_RETURN(JsonValue x, Node(e, depth + 1));
          members.emplace_back(key, std::move(x));
        }
        v = JsonValue::Object(std::move(members));
        v.set_position(source_, static_cast<int>(m.line) + 1, static_cast<int>(m.column) + 1);
        if (!keep.empty()) anchors_[keep] = {v, values_ - values_before};
        return v;
      }
      default:
        return At(m, "expected a value");
    }
    v.set_position(source_, static_cast<int>(m.line) + 1, static_cast<int>(m.column) + 1);
    if (anchor != nullptr) anchors_[reinterpret_cast<const char*>(anchor)] = {v, values_ - values_before};
    return v;
  }

  // A plain scalar by YAML 1.2's core schema: null, a boolean, a number, or a string.
  Result<JsonValue> Plain(const std::string& s, const yaml_mark_t& m) const {
    if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return JsonValue();
    if (s == "true" || s == "True" || s == "TRUE") return JsonValue::Bool(true);
    if (s == "false" || s == "False" || s == "FALSE") return JsonValue::Bool(false);
    if (IsYamlNumber(s)) {
      errno = 0;
      const double d = std::strtod(s.c_str(), nullptr);
      if (errno == ERANGE && std::isinf(d)) return At(m, "number " + Abbreviated(s) + " is out of range");
      return JsonValue::Number(d);
    }
    return JsonValue::String(s);
  }

  const std::string& text_;
  std::shared_ptr<const std::string> source_;
  yaml_parser_t parser_{};
  bool live_ = false;
  std::unordered_map<std::string, std::pair<JsonValue, size_t>> anchors_;  // and the values each holds
  size_t values_ = 0;
};

}  // namespace

Result<JsonValue> ParseYaml(const std::string& text, const std::string& source) {
  return YamlReader(text, source).Read();
}

}  // namespace coloader
