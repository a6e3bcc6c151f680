// ZeroMQ CURVE keys for tcp:// endpoints (consumers on another machine). A key pair file is
// what `coloader keygen` writes (mode 0600); its public half also goes into a `.pub` file that
// the producer's operator lists in --authorized-keys. Keys are Z85 text (40 characters), the
// form libzmq's curve options take.
//
//   key pair file      "public <z85>\nsecret <z85>\n"
//   public key file    "<z85>\n"
//   authorized keys    one public key per line, optionally followed by a name
// In each, a line starting with '#' is a comment (Z85 itself uses '#', so never mid-line).
#pragma once

#include <set>
#include <vector>
#include <string>

#include "common/socket.h"
#include "common/status.h"

namespace coloader {

inline constexpr size_t kZ85KeyChars = 40;

struct CurveKeyPair {
  std::string public_key;  // Z85
  std::string secret_key;  // Z85
};

// False when this libzmq was built without CURVE (libsodium); the error says so.
Status CurveAvailable();
Result<CurveKeyPair> GenerateCurveKeyPair();
// Writes PREFIX.key (the pair, 0600) and PREFIX.pub (the public key), refusing to overwrite.
Status WriteCurveKeyFiles(const std::string& prefix, const CurveKeyPair& pair);
Result<CurveKeyPair> ReadCurveKeyPair(const std::string& path);
// A public key given as Z85 text, or the path of a file holding one (a .pub or a .key file).
Result<std::string> ReadCurvePublicKey(const std::string& key_or_path);
// Every public key listed in an authorized-keys file.
Result<std::set<std::string>> ReadAuthorizedKeys(const std::string& path);
// Makes `sock` (not yet connected) a CURVE client: this side's key pair file and the server's
// public key (Z85 text or a file). Returns this side's public key, for error messages.
Result<std::string> UseCurveClientKeys(Socket& sock, const std::string& key_file,
                                       const std::string& server_key);
// The 32 raw bytes of a key as ZAP hands them over, in Z85.
std::string Z85FromRaw(const std::string& raw32);

}  // namespace coloader
