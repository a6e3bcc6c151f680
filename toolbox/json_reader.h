// Jobs files, traces and the JSON our tools print, read into one value tree, every value marked
// with its line and column, so an error in a hand-written file says where it is ("jobs.yaml:4:17:
// jobs[0] (\"a\"): field \"batch_size\" must be a number, got a string") and is fixed from the
// message. JSON goes through yaml-cpp (JSON is YAML 1.2's flow syntax) after a pre-pass of our own
// that refuses what yaml-cpp loses itself in; YAML goes through libyaml's event parser, since
// yaml-cpp never returns from some malformed YAML of a few bytes (both fuzzed: tests/fuzz).
//
// JSON stays JSON: read as JSON, a file must use double-quoted strings and member names, JSON's
// escapes, numbers and literals (true, false, null), no trailing commas and no duplicate
// members; YAML-only syntax (block style, single quotes, comments, anchors, tags) is refused
// with a line:column, and \uD83D\uDE00 surrogate pairs (Python's json.dumps writes them) are
// read. Read as YAML, a plain scalar is a number when it reads as one (YAML 1.2's core
// schema), true/false a boolean, ~ and null null, anything else a string; quoting keeps "7" a
// string. Objects keep the file's key order.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace coloader {

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  JsonValue() = default;
  static JsonValue Bool(bool b);
  static JsonValue Number(double d);
  static JsonValue String(std::string s);
  static JsonValue Array(std::vector<JsonValue> items);
  static JsonValue Object(std::vector<std::pair<std::string, JsonValue>> members);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }
  bool bool_value() const { return bool_; }
  double number() const { return number_; }
  const std::string& string() const { return string_; }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }
  // The member named `key` of an object, or nullptr (also for non-objects).
  const JsonValue* Find(const std::string& key) const;

  // Where the value starts in the text it was read from: "jobs.yaml:4:17" (line and column
  // from 1), or "" for a value made in code. Set by the readers.
  std::string Position() const;
  int line() const { return line_; }
  int column() const { return column_; }
  void set_position(std::shared_ptr<const std::string> source, int line, int column);
  // InvalidArgument "jobs.yaml:4:17: what", or just "what" without a position.
  Status ErrorAt(const std::string& what) const;

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
  std::shared_ptr<const std::string> source_;
  int line_ = 0, column_ = 0;
};

const char* JsonTypeName(JsonValue::Type t);

// One document of JSON or YAML. `source` names the text in errors and positions
// ("jobs.json:3:14: expected a member name in double quotes, got 'name'").
Result<JsonValue> ParseJson(const std::string& text, const std::string& source = "<input>");
Result<JsonValue> ParseYaml(const std::string& text, const std::string& source = "<input>");
Result<JsonValue> ReadJsonFile(const std::string& path);
Result<JsonValue> ReadYamlFile(const std::string& path);
// ReadYamlFile for names ending in .yaml or .yml, ReadJsonFile otherwise.
Result<JsonValue> ReadJsonOrYamlFile(const std::string& path);
// A whole file as text; NotFound names the path.
Result<std::string> ReadTextFile(const std::string& path);

// Typed field access on an object, with errors naming where the field is (file:line:column),
// `where` (e.g. "jobs[2] (\"resnet\")") and the field. Optional fields take a default when
// absent; present with a wrong type is an error, never silently ignored.
class JsonFields {
 public:
  JsonFields(const JsonValue& object, std::string where) : obj_(object), where_(std::move(where)) {}
  bool Has(const std::string& key) const { return obj_.Find(key) != nullptr; }
  Result<std::string> String(const std::string& key) const;
  Result<std::string> String(const std::string& key, const std::string& fallback) const;
  Result<double> Number(const std::string& key) const;
  Result<double> Number(const std::string& key, double fallback) const;
  Result<bool> Bool(const std::string& key, bool fallback) const;
  Result<std::vector<std::string>> StringList(const std::string& key) const;
  Result<std::vector<std::string>> StringList(const std::string& key, std::vector<std::string> fallback) const;
  // Every key of the object must be in `known`: a misspelt field is an error, not ignored.
  Status OnlyKnown(const std::vector<std::string>& known) const;
  // "FILE:LINE:COL: where: field "key" what", at the field's value (the object's when absent).
  Status Error(const std::string& key, const std::string& what) const;
  const std::string& where() const { return where_; }

 private:
  Result<const JsonValue*> Typed(const std::string& key, JsonValue::Type t) const;
  const JsonValue& obj_;
  std::string where_;
};

}  // namespace coloader
