// A minimal JSON writer for the command line's --json output: one flat or nested object per
// line, keys in insertion order. Enough for our reports; not a general JSON library.
#pragma once

#include <cstdint>
#include <string>

namespace coloader {

class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray(const char* key = nullptr);
  JsonWriter& EndArray();
  JsonWriter& Key(const char* key);
  JsonWriter& Value(const std::string& s);
  JsonWriter& Value(const char* s) { return Value(std::string(s)); }
  JsonWriter& Value(int64_t v);
  JsonWriter& Value(uint64_t v);
  JsonWriter& Value(int v) { return Value(static_cast<int64_t>(v)); }
  JsonWriter& Value(unsigned v) { return Value(static_cast<uint64_t>(v)); }
  JsonWriter& Value(double v);
  JsonWriter& Value(bool v);
  template <typename T>
  JsonWriter& Field(const char* key, const T& v) {
    Key(key);
    return Value(v);
  }
  const std::string& str() const { return out_; }

 private:
  void Separate();
  std::string out_;
  bool need_comma_ = false;
};

std::string JsonEscape(const std::string& s);

}  // namespace coloader
