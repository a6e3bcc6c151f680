#include "toolbox/json_reader.h"

#include <gtest/gtest.h>

#include "tests/support/test_support.h"

namespace coloader {
namespace {

TEST(JsonReader, ParsesEveryKind) {
  ASSERT_OK_AND_ASSIGN(JsonValue v, ParseJson(R"( {"a": [1, -2.5e2, 0.125], "b": "x\"\\\/\n\u00e9\ud83d\ude00",
      "c": true, "d": false, "e": null, "f": {}} )"));
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.members().size(), 6u);
  EXPECT_EQ(v.members()[0].first, "a");  // file order kept
  const JsonValue* a = v.Find("a");
  ASSERT_TRUE(a && a->is_array());
  ASSERT_EQ(a->items().size(), 3u);
  EXPECT_EQ(a->items()[0].number(), 1);
  EXPECT_EQ(a->items()[1].number(), -250);
  EXPECT_EQ(a->items()[2].number(), 0.125);
  EXPECT_EQ(v.Find("b")->string(), "x\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v.Find("c")->bool_value());
  EXPECT_FALSE(v.Find("d")->bool_value());
  EXPECT_TRUE(v.Find("e")->is_null());
  EXPECT_TRUE(v.Find("f")->is_object());
  EXPECT_EQ(v.Find("zz"), nullptr);
}

// Each malformed document fails with the position and what was expected. yaml-cpp finds the
// structural errors (its positions: where it gave up); the JSON-only rules (strings, escapes,
// literals, numbers, trailing commas, duplicates) are checked on top of it.
TEST(JsonReader, MalformedInputSaysWhereAndWhat) {
  struct Case {
    const char* text;
    const char* where;
    const char* what;
  };
  const Case cases[] = {
      {"", "f.json", "the file is empty"},
      {" \n\t", "f.json", "the file is empty"},
      {"{\"a\": 1,\n \"b\" 2}", "f.json:2:6", "end of map flow not found (a missing ',' or '}'?)"},
      {"{\"a\": 1 \"b\": 2}", "f.json:1:12", "a missing ',' or '}'"},
      {"[1, [2, 3]", "f.json:1:1", "a missing ',' or ']'"},
      {"[1, 2,]", "f.json:1:7", "expected a value, got ']' (a trailing comma?)"},
      {"{\"a\": 1,\n}", "f.json:2:1", "expected a member name in double quotes, got '}' (a trailing comma?)"},
      {"[1 2]", "f.json:1:2", "expected ',' between values"},
      {"{a: 1}", "f.json:1:2", "member name in double quotes, got 'a'"},
      {"{\"a\": 'x'}", "f.json:1:7", "strings must be in double quotes"},
      {"{\"a\": yes}", "f.json:1:7", "expected a value (an object, array, string in double quotes, number, true, false or null), got 'yes'"},
      {"{\"a\": ~}", "f.json:1:7", "expected a value"},
      {"{\"a\": }", "f.json:1:7", "expected a value"},
      {"{\"a\": &x 1, \"b\": *x}", "f.json:1:7", "anchors and aliases are YAML, not JSON"},
      {"{\"a\": !!str 1}", "f.json:1:7", "the tag tag:yaml.org,2002:str is not supported"},
      {"a: 1", "f.json:1:1", "block-style YAML is not JSON"},
      {"- 1", "f.json:1:1", "block-style YAML is not JSON"},
      {"{\"a\": 1} # note", "f.json:1:10", "a comment is not JSON"},
      {"\"abc", "f.json:1:5", "unterminated string (it opens at 1:1)"},
      {"\"a\tb\"", "f.json:1:3", "unescaped control character 9"},
      {"\"\\x\"", "f.json:1:3", "invalid escape \\x"},
      {"\"\\u12g4\"", "f.json:1:2", "four hex digits"},
      {"01", "f.json:1:1", "'01' is not a JSON number"},
      {"1.", "f.json:1:1", "'1.' is not a JSON number"},
      {"1e", "f.json:1:1", "'1e' is not a JSON number"},
      {"+1", "f.json:1:1", "got '+1'"},
      {"1e999", "f.json:1:1", "number 1e999 is out of range"},
      {"tru", "f.json:1:1", "expected a value"},
      {"{} {}", "f.json:1:4", "after the end of the document"},
      {"{\"a\": 1, \"a\": 2}", "f.json:1:10", "duplicate member \"a\""},
      {"[\"ok\",\n \"x\\uDC00\"]", "f.json:2:4", "lone low surrogate \\uDC00"},
      {"\"\\udfff\"", "f.json:1:2", "lone low surrogate \\udfff"},
      {"\"\\uD800\\u0041\"", "f.json:1:2", "invalid low surrogate"},
  };
  for (const Case& c : cases) {
    Result<JsonValue> r = ParseJson(c.text, "f.json");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.where), std::string::npos) << c.text << " -> " << r.status().message();
    EXPECT_NE(r.status().message().find(c.what), std::string::npos) << c.text << " -> " << r.status().message();
  }
}

// A pair is one code point (4 bytes of UTF-8); an object with many members still finds its duplicate.
TEST(JsonReader, SurrogatePairsAndManyMembers) {
  ASSERT_OK_AND_ASSIGN(JsonValue v, ParseJson("\"\\uD83D\\uDE00\"", "f.json"));
  EXPECT_EQ(v.string(), "\xF0\x9F\x98\x80");
  std::string doc = "{";
  for (int i = 0; i < 20000; ++i) doc += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ",";
  ASSERT_OK_AND_ASSIGN(JsonValue ok, ParseJson(doc + "\"last\": 0}", "f.json"));
  EXPECT_EQ(ok.members().size(), 20001u);
  Result<JsonValue> dup = ParseJson(doc + "\"k19999\": 0}", "f.json");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("duplicate member \"k19999\""), std::string::npos) << dup.status().message();
}

// Columns after a surrogate pair (rewritten for yaml-cpp, two characters shorter) are the
// file's columns, as are the lines after it.
TEST(JsonReader, PositionsAreTheFilesAroundSurrogatePairs) {
  ASSERT_OK_AND_ASSIGN(JsonValue v, ParseJson("{\"a\": \"\\ud83d\\ude00\", \"b\": 1,\n \"c\": 2}", "f.json"));
  EXPECT_EQ(v.Find("a")->string(), "\xF0\x9F\x98\x80");
  EXPECT_EQ(v.Find("b")->Position(), "f.json:1:28");
  EXPECT_EQ(v.Find("c")->Position(), "f.json:2:7");
  Result<std::string> b = JsonFields(v, "o").String("b");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "f.json:1:28: o: field \"b\" must be a string, got a number");
}

TEST(JsonReader, DeepNestingIsAnErrorNotACrash) {
  std::string deep(100000, '[');
  Result<JsonValue> r = ParseJson(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nesting deeper"), std::string::npos);
  // Deeper than ours (64) but within yaml-cpp's own bound: refused by the converter, with a position.
  Result<JsonValue> ours = ParseJson(std::string(100, '[') + std::string(100, ']'), "f.json");
  ASSERT_FALSE(ours.ok());
  EXPECT_NE(ours.status().message().find("f.json:1:66: nesting deeper than 64 levels"), std::string::npos)
      << ours.status().message();
}

TEST(JsonReader, LongNumbersAreReadWithoutRecursion) {
  // Issue 38: std::regex recursed once per character, so a 40,000-digit number (in a jobs file,
  // a resume state, one sample's KEY.json) overflowed the stack. A million digits now read as any
  // number does: out of range, or the value.
  const std::string digits(1000000, '7');
  Result<JsonValue> json = ParseJson("{\"n\": " + digits + "}", "f.json");
  ASSERT_FALSE(json.ok());
  EXPECT_NE(json.status().message().find("f.json:1:7: number 7777"), std::string::npos) << json.status().message();
  EXPECT_NE(json.status().message().find("... (1000000 characters) is out of range"), std::string::npos);
  EXPECT_LT(json.status().message().size(), 200u);
  Result<JsonValue> yaml = ParseYaml("n: 0." + digits + "\n", "f.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status().message();
  EXPECT_NEAR(yaml->Find("n")->number(), 7.0 / 9.0, 1e-12);
  Result<JsonValue> text = ParseYaml("n: 1" + digits + "x\n");  // not a number: a string
  ASSERT_TRUE(text.ok());
  EXPECT_TRUE(text->Find("n")->is_string());
  // The grammar itself, both syntaxes.
  for (const char* ok : {"0", "-0", "12", "-3.25", "1e9", "1E-9", "2.5e+3"})
    EXPECT_TRUE(ParseJson(ok).ok() && ParseJson(ok)->is_number()) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "--1", "1.2.3", "0x10"})
    EXPECT_FALSE(ParseJson(bad).ok()) << bad;
  for (const char* yes : {"+1", ".5", "1.", "01", "-2.5E3"})
    EXPECT_TRUE(ParseYaml(std::string("v: ") + yes)->Find("v")->is_number()) << yes;
  for (const char* no : {"1e", ".", "1.2.3", "0x10", "1_000"})
    EXPECT_TRUE(ParseYaml(std::string("v: ") + no)->Find("v")->is_string()) << no;
}

TEST(JsonReader, DirectoriesAndEndlessFilesAreNamedNotRead) {
  // Issue 38: `plan` on a directory said "the file is empty"; on /dev/zero it grew to 3.5 GB.
  Result<JsonValue> dir = ReadJsonOrYamlFile(::testing::TempDir());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("is a directory"), std::string::npos) << dir.status().message();
  Result<JsonValue> endless = ReadJsonFile("/dev/zero");
  ASSERT_FALSE(endless.ok());
  EXPECT_NE(endless.status().message().find("/dev/zero is larger than 64 MiB"), std::string::npos)
      << endless.status().message();
}

TEST(JsonReader, UnbalancedDocumentsAreRefusedBeforeYamlCppReadsThem) {
  // Found by the json fuzz target: yaml-cpp 0.7 exhausts memory, or never returns, on these.
  const std::pair<const char*, const char*> cases[] = {
      {",", "f.json:1:1: ',' outside any [...] or {...}"},
      {"{\"a\": 1}, \"b\"", "f.json:1:9: content after the end of the document"},
      {"\"a string\" fc\n?\n", "f.json:1:12: content after the end of the document, which is one string"},
      {"{\"a\": [1, 2}", "f.json:1:12: '}' closes the '[' opened at 1:7"},
      {"]", "f.json:1:1: ']' closes nothing"},
      {"[1, , 2]", "f.json:1:5: expected a value before ','"},
      {"{\"a\": [1]", "f.json:1:1: '{' is never closed"},
  };
  for (const auto& [text, says] : cases) {
    Result<JsonValue> r = ParseJson(text, "f.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(says), std::string::npos) << text << " -> " << r.status().message();
  }
}

TEST(JsonReader, FieldsNameTheFieldAndTheProblem) {
  ASSERT_OK_AND_ASSIGN(JsonValue v, ParseJson(R"({"n": 3, "s": "x", "l": ["a", true], "b": true,
                                                   "argv": ["--epochs", 2, "--lr", 0.1, "--n", 1e6]})",
                                              "f.json"));
  JsonFields f(v, "jobs[0]");  // errors are positioned at the field's value, or the object
  EXPECT_EQ(*f.Number("n"), 3);
  EXPECT_EQ(*f.Number("missing", 7), 7);
  EXPECT_EQ(*f.String("s"), "x");
  EXPECT_TRUE(*f.Bool("b", false));
  Result<std::string> wrong = f.String("n");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().message(), "f.json:1:7: jobs[0]: field \"n\" must be a string, got a number");
  Result<double> missing = f.Number("zz");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "f.json:1:1: jobs[0]: field \"zz\" is missing");
  Result<std::vector<std::string>> list = f.StringList("l");
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.status().message().find("f.json:1:31: jobs[0]: field \"l\" must be a list of strings; item 1 is a boolean"),
            std::string::npos)
      << list.status().message();
  // Numbers in a command line read as their shortest exact text.
  EXPECT_EQ(*f.StringList("argv"), (std::vector<std::string>{"--epochs", "2", "--lr", "0.1", "--n", "1000000"}));
  Status unknown = f.OnlyKnown({"n", "s", "l", "argv"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.message().find("f.json:1:43: jobs[0]: unknown field \"b\""), std::string::npos) << unknown.message();
}

TEST(JsonReader, MissingFileIsNotFound) {
  Result<JsonValue> r = ReadJsonFile("/nonexistent/jobs.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/jobs.json"), std::string::npos);
}

}  // namespace
}  // namespace coloader

namespace coloader {
namespace {

TEST(JsonReader, AnUnsupportedTagIsQuotedByItsStartAndLength) {
  // The json fuzz target's bound (an error of at most 1 KiB): a long tag came back whole.
  Result<JsonValue> r = ParseJson("!" + std::string(1100, 't') + " 1", "t.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("characters) is not supported"), std::string::npos) << r.status().message();
  EXPECT_LT(r.status().message().size(), 200u) << r.status().message();
}

}  // namespace
}  // namespace coloader
