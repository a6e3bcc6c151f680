// A small JSON reader for the files people write by hand (jobs files, traces) and the one-line
// reports our tools print. Errors say where (line:column) and what was expected; accessors
// that read a field say which field, so a bad jobs file is fixed from the message alone.
// Not a general JSON library: numbers are doubles, objects keep their keys in file order.
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

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

const char* JsonTypeName(JsonValue::Type t);

// Parses one JSON document (trailing whitespace allowed, nothing else). `source` names the
// input in errors ("jobs.json:3:14: expected ',' or '}' after a member, got 'x'").
Result<JsonValue> ParseJson(const std::string& text, const std::string& source = "<input>");
Result<JsonValue> ReadJsonFile(const std::string& path);
// A whole file as text (for the other readers of hand-written files); NotFound names the path.
Result<std::string> ReadTextFile(const std::string& path);

// Typed field access on an object, with errors naming `where` (e.g. "jobs[2] (\"resnet\")")
// and the field. Optional fields take a default when absent; present with a wrong type is an
// error, never silently ignored.
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
  Status Error(const std::string& key, const std::string& what) const;
  const std::string& where() const { return where_; }

 private:
  Result<const JsonValue*> Typed(const std::string& key, JsonValue::Type t) const;
  const JsonValue& obj_;
  std::string where_;
};

}  // namespace coloader
