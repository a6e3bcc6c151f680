// Jobs files in YAML: the same value tree as JSON, errors that name the file, line and column.
#include "toolbox/json_reader.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "placement/jobs.h"
#include "placement/planner.h"
#include "tests/support/test_support.h"

namespace coloader {
namespace {

TEST(YamlReader, BlockAndFlowStylesBecomeTheJsonTree) {
  ASSERT_OK_AND_ASSIGN(JsonValue v, ParseYaml(R"(# a comment
name: r18
batch_size: 128
sm_activity: 0.45
isolation: true
shared: false
memory_mib: auto
quoted: "7"
nothing: ~
command: [python3, train.py, --epochs, 2]
pipeline:
  data: /data/train
  image_size: 224
gpus:
  - {index: 0, memory_mib: 81559}
  - index: 1
    memory_mib: 40960
)", "jobs.yaml"));
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.Find("name")->string(), "r18");
  EXPECT_EQ(v.Find("batch_size")->number(), 128);
  EXPECT_DOUBLE_EQ(v.Find("sm_activity")->number(), 0.45);
  EXPECT_EQ(v.Find("isolation")->type(), JsonValue::Type::kBool);
  EXPECT_TRUE(v.Find("isolation")->bool_value());
  EXPECT_FALSE(v.Find("shared")->bool_value());
  EXPECT_EQ(v.Find("memory_mib")->string(), "auto");
  EXPECT_EQ(v.Find("quoted")->string(), "7");
  EXPECT_TRUE(v.Find("nothing")->is_null());
  JsonFields f(v, "job");
  EXPECT_EQ(*f.StringList("command"), (std::vector<std::string>{"python3", "train.py", "--epochs", "2"}));
  EXPECT_EQ(v.Find("pipeline")->Find("data")->string(), "/data/train");
  const JsonValue& gpus = *v.Find("gpus");
  ASSERT_EQ(gpus.items().size(), 2u);
  EXPECT_EQ(gpus.items()[1].Find("memory_mib")->number(), 40960);
  // Keys keep the file's order, as the JSON reader's do.
  EXPECT_EQ(v.members().front().first, "name");
  EXPECT_EQ(v.members().back().first, "gpus");
}

TEST(YamlReader, ErrorsNameTheFileAndTheLine) {
  Result<JsonValue> bad = ParseYaml("jobs:\n  - name: a\n   batch_size: [1, 2\n", "jobs.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("jobs.yaml:", 0), 0u) << bad.status().message();
  EXPECT_NE(bad.status().message().find("jobs.yaml:3"), std::string::npos) << bad.status().message();
  Result<JsonValue> empty = ParseYaml("  \n", "empty.yaml");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty.yaml: the file is empty"), std::string::npos);
  Result<JsonValue> comments = ParseYaml("# only a comment\n", "c.yaml");
  ASSERT_FALSE(comments.ok());
  EXPECT_NE(comments.status().message().find("c.yaml: the file is empty"), std::string::npos);
  const std::pair<const char*, const char*> cases[] = {
      {"a: 1\na: 2\n", "d.yaml:2:1: duplicate key \"a\""},
      {"a: [1, 2\n", "d.yaml:2:1: while parsing a flow sequence: did not find expected ',' or ']'"},
      {"a: 1\n---\nb: 2\n", "d.yaml:2:1: unexpected content after the end of the document"},
      {"a: !!binary aGk=\n", "d.yaml:1:4: the tag tag:yaml.org,2002:binary is not supported"},
      {"a: 1e999\n", "d.yaml:1:4: number 1e999 is out of range"},
  };
  for (const auto& [text, want] : cases) {
    Result<JsonValue> r = ParseYaml(text, "d.yaml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << text << " -> " << r.status().message();
  }
  // A tag is quoted by its start and length, as every value from the file is (the yaml fuzz
  // target's finding: a 1,300-character tag came back whole in the message).
  Result<JsonValue> long_tag = ParseYaml("a: !" + std::string(2000, 't') + " x\n", "d.yaml");
  ASSERT_FALSE(long_tag.ok());
  EXPECT_NE(long_tag.status().message().find("characters) is not supported"), std::string::npos)
      << long_tag.status().message();
  EXPECT_LT(long_tag.status().message().size(), 200u) << long_tag.status().message();
  Result<JsonValue> missing = ReadYamlFile("/nonexistent/jobs.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/jobs.yaml"), std::string::npos);
}

TEST(YamlReader, TheYamlExampleIsTheJsonExample) {
  const std::string dir = std::string(COLOADER_SOURCE_DIR) + "/examples/";
  ASSERT_OK_AND_ASSIGN(JobSet yaml, LoadJobSet(dir + "jobs_example.yaml"));
  ASSERT_OK_AND_ASSIGN(JobSet json, LoadJobSet(dir + "jobs_example.json"));
  ASSERT_EQ(yaml.jobs.size(), json.jobs.size());
  ASSERT_EQ(yaml.gpus.size(), json.gpus.size());
  EXPECT_EQ(yaml.cpu_cores, json.cpu_cores);
  for (size_t i = 0; i < json.jobs.size(); ++i) {
    SCOPED_TRACE(json.jobs[i].name);
    EXPECT_EQ(yaml.jobs[i].name, json.jobs[i].name);
    EXPECT_EQ(yaml.jobs[i].command, json.jobs[i].command);
    EXPECT_EQ(yaml.jobs[i].batch_size, json.jobs[i].batch_size);
    EXPECT_EQ(yaml.jobs[i].memory_mib, json.jobs[i].memory_mib);
    EXPECT_EQ(yaml.jobs[i].sm_activity, json.jobs[i].sm_activity);
    EXPECT_EQ(yaml.jobs[i].priority, json.jobs[i].priority);
  }
  // And the plan is the same.
  PlannerOptions o;
  o.cpu_cores = json.cpu_cores;
  Planner py(o, yaml.gpus, &yaml), pj(o, json.gpus, &json);
  const Plan from_yaml = MakePlan(yaml, yaml.gpus, o, &py);
  const Plan from_json = MakePlan(json, json.gpus, o, &pj);
  EXPECT_EQ(PlanJson(yaml, py, from_yaml), PlanJson(json, pj, from_json));
}

TEST(YamlReader, AJobsFileErrorInYamlNamesTheJobAndField) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/jobs.yaml";
  testing::WriteFile(path, "jobs:\n  - name: a\n    command: [python3, train.py]\n    batch_size: lots\n");
  Result<JobSet> r = LoadJobSet(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("batch_size"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("\"a\""), std::string::npos) << r.status().message();
  // At the value's line and column.
  EXPECT_EQ(r.status().message().rfind(path + ":4:17: jobs[0] (\"a\"): field \"batch_size\"", 0), 0u)
      << r.status().message();
}

// Anchors and aliases are read (YAML's way to repeat a pipeline), but a few lines that
// expand to billions of values ("billion laughs") are refused, not built.
TEST(YamlReader, AliasesAreReadButCannotExplode) {
  ASSERT_OK_AND_ASSIGN(JsonValue v, ParseYaml("base: &p {data: /d, image_size: 160}\ncopy: *p\n", "a.yaml"));
  EXPECT_EQ(v.Find("copy")->Find("image_size")->number(), 160);
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    const std::string prev = "*a" + std::to_string(i - 1);
    bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [" + prev;
    for (int k = 1; k < 10; ++k) bomb += ", " + prev;
    bomb += "]\n";
  }
  Result<JsonValue> r = ParseYaml(bomb, "bomb.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 1000000 values"), std::string::npos) << r.status().message();
}

// Issue 38: yaml-cpp 0.7 exhausted its memory (then aborted on std::bad_alloc) or never returned
// on malformed YAML of a few bytes: a flow mapping closed early (the json fuzz target's findings
// read as YAML), a lone ',', a NUL, an anchor or a tag with flow indicators in it, and more that
// the yaml fuzz target kept finding. YAML is read by libyaml now: each is refused with where,
// and what YAML makes text (brackets in plain, quoted and block scalars, comments) stays text.
TEST(YamlReader, MalformedYamlIsRefusedWithWhereNeverLoopedOn) {
  const std::pair<std::string, std::string> refused[] = {
      {"{\"a\": 1}, \"b\": 2}\n", "f.yaml:1:9: did not find expected <document start>"},
      {"jobs: [{a: 1}], b]\n", "f.yaml:1:15: while parsing a block mapping: did not find expected key"},
      {",\n", "f.yaml:1:1: while parsing a block node: did not find expected node content"},
      {"a: [1, {b: 2]]\n", "f.yaml:1:13: while parsing a flow mapping: did not find expected ',' or '}'"},
      {"a: {b: [1, 2}\n", "f.yaml:1:13: while parsing a flow sequence: did not find expected ',' or ']'"},
      {"!E,\n", "f.yaml:1:3: while scanning a tag: did not find expected whitespace or line break"},
      {"&#.#5#,\n", "f.yaml:1:2: while scanning an anchor: did not find expected alphabetic or numeric character"},
      {std::string("\0,1,\n", 5), "f.yaml:1:1: control characters are not allowed"},
      {"a: \xff\n", "f.yaml:1:4: invalid leading UTF-8 octet"},
      {"a: *nowhere\n", "f.yaml:1:4: the alias *nowhere names no anchor before it"},
  };
  for (const auto& [text, want] : refused) {
    Result<JsonValue> r = ParseYaml(text, "f.yaml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << text << " -> " << r.status().message();
  }
  for (const auto& entry : std::filesystem::directory_iterator(std::string(COLOADER_SOURCE_DIR) +
                                                               "/tests/fuzz/regressions/json")) {
    ASSERT_OK_AND_ASSIGN(const std::string text, ReadTextFile(entry.path().string()));
    EXPECT_FALSE(ParseYaml(text, "f.yaml").ok()) << entry.path();  // returns, refused, memory intact
  }
  const char* text = R"(name: a[0] and b{1}, c]
note: 'it''s [not] a list'
quoted: "x } y"   # a comment with ] in it
block: |
  [lines of
  text} ]
folded: >
  {also text
list:
  - [1, 2]
  - {k: "v, ]"}
desc: resnet - "fast" run, a - [b] c
cmd: train.py --name
  "{producer}" --epochs 90
jobs:
  - name: x
    command: ["python3", "t.py"]
base: &defaults_v1 {lr: 0.1}
other: *defaults_v1
)";
  ASSERT_OK_AND_ASSIGN(JsonValue v, ParseYaml(text, "ok.yaml"));
  EXPECT_EQ(v.Find("name")->string(), "a[0] and b{1}, c]");
  EXPECT_EQ(v.Find("note")->string(), "it's [not] a list");
  EXPECT_EQ(v.Find("block")->string(), "[lines of\ntext} ]\n");
  EXPECT_EQ(v.Find("list")->items().size(), 2u);
  EXPECT_EQ(v.Find("desc")->string(), "resnet - \"fast\" run, a - [b] c");
  EXPECT_EQ(v.Find("cmd")->string(), "train.py --name \"{producer}\" --epochs 90");
  EXPECT_EQ(v.Find("jobs")->items()[0].Find("command")->items().size(), 2u);
  EXPECT_EQ(v.Find("other")->Find("lr")->number(), 0.1);
  // A tagged block scalar passes the check (its text is text); the converter then refuses tags.
  Result<JsonValue> tagged = ParseYaml("tagged: !!str |\n  [not a list\n", "t.yaml");
  ASSERT_FALSE(tagged.ok());
  EXPECT_NE(tagged.status().message().find("t.yaml:1:9: the tag tag:yaml.org,2002:str is not supported"),
            std::string::npos) << tagged.status().message();
  // A flow collection as a key passes the check; the converter then wants a string.
  Result<JsonValue> key = ParseYaml("[1, 2]: complex key\n", "k.yaml");
  ASSERT_FALSE(key.ok());
  EXPECT_NE(key.status().message().find("k.yaml:1:1: expected a key (a string)"), std::string::npos)
      << key.status().message();
}

}  // namespace
}  // namespace coloader
