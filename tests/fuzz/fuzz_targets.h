// The bodies of the fuzz targets, shared by the libFuzzer entry points (protocol_fuzz.cc,
// decode_fuzz.cc, built with clang by scripts/fuzz.sh) and by the gtest that replays the seed
// corpora and every saved crash in every build (tests/unit/fuzz_regression_test.cc).
//
// Each function takes any byte string. A crash, a sanitizer report or an exception escaping is
// a bug in the code under test; a broken property (the round trip) comes back as a non-empty
// description, which the fuzzer turns into an abort and the gtest into a failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace coloader::fuzz {

// Decode; when that succeeds, Encode the message, Decode the encoding and Encode again: both
// encodings must be equal, and equal to the input (the encoding is canonical: the decoder
// accepts no second spelling of a message).
std::string ProtocolOne(const uint8_t* data, size_t size);

// Decoder::Peek, Decoder::DecodeRgb at scale denominators 1, 2, 4 and 8, and
// SampleTransform::RunBytes (train, uint8 NHWC and eval, float32 NCHW, small outputs). Every
// call must return (a Status or a value), and a decoded image must have the size Peek promised.
std::string DecodeOne(const uint8_t* data, size_t size);

// IndexTarBytes: it must return, and every member it lists must lie inside the input.
std::string TarOne(const uint8_t* data, size_t size);

// ParseJson (resume states, a sample's KEY.json, JSON jobs files and recipes): it must return, and
// an error's message stay short (a hostile value is quoted by its start and length).
std::string JsonOne(const uint8_t* data, size_t size);

// ParseYaml (jobs files and recipes, read by libyaml): the same property. Under yaml-cpp this
// target found a hang every few minutes ("!E,", "&#.#5#,", a NUL...): they are regression seeds.
std::string YamlOne(const uint8_t* data, size_t size);

}  // namespace coloader::fuzz
