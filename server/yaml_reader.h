// Jobs files and traces in YAML, read into the same value tree as JSON (common/json_reader.h),
// so one set of field checks serves both. The parser is OpenCV's FileStorage (already a
// dependency of the producer), which reads the block and flow styles people write by hand:
// mappings, sequences, plain and quoted scalars, comments. Not supported: anchors, aliases,
// tags, multi-line scalars, and keys that do not start with a letter or '_'.
//
// Scalars become numbers when they read as one (integers, decimals, exponents), true/false
// become booleans, ~ and null become null, everything else a string; quoting keeps a number
// a string ("7"), but not true/false (OpenCV does not report quoting).
#pragma once

#include <string>

#include "common/json_reader.h"
#include "common/status.h"

namespace coloader {

// `source` names the input in errors ("jobs.yaml:4: incorrect indentation").
Result<JsonValue> ParseYaml(const std::string& text, const std::string& source = "<input>");
Result<JsonValue> ReadYamlFile(const std::string& path);

// ReadYamlFile for names ending in .yaml or .yml, ReadJsonFile otherwise.
Result<JsonValue> ReadJsonOrYamlFile(const std::string& path);

}  // namespace coloader
