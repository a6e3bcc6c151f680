// What the JSON reader (json_reader.cc, yaml-cpp) and the YAML reader (yaml_reader.cc, libyaml)
// share: the bounds on what a file may build, the number grammars, and how an error names its
// place. Not installed: the readers' own.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace coloader::json_detail {

// Deeper nesting than any jobs file or recipe needs is refused, not recursed into.
constexpr int kMaxDepth = 64;
// Aliases let a few lines of YAML name a tree of billions of values ("billion laughs"); the
// tree is built by the readers, so its size is bounded there. Jobs files have hundreds.
constexpr size_t kMaxValues = 1000000;

// JSON: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?
bool IsJsonNumber(const std::string& s);
// YAML 1.2 core: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool IsYamlNumber(const std::string& s);
// A value quoted in a message: long ones show their start and length.
std::string Abbreviated(const std::string& s);
// InvalidArgument "source:line:column: what".
Status FailAt(const std::string& source, int line, int column, const std::string& what);

}  // namespace coloader::json_detail
