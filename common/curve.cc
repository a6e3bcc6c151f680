#include "common/curve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "common/unique_fd.h"

namespace coloader {

namespace {

bool IsZ85Key(const std::string& k) {
  if (k.size() != kZ85KeyChars) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, k.c_str()) != nullptr;
}

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::FromErrno("cannot read key file " + path, errno);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The lines of a key file without comments and surrounding blanks, split into words, each with
// its line number in the file (for errors).
struct KeyLine {
  int number;
  std::vector<std::string> words;
};
std::vector<KeyLine> Lines(const std::string& text) {
  std::vector<KeyLine> out;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    // Z85 uses '#', so only a line that starts with it is a comment.
    if (auto first = line.find_first_not_of(" \t"); first != std::string::npos && line[first] == '#') continue;
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (!w.empty()) out.push_back({number, std::move(w)});
  }
  return out;
}

Status WriteNew(const std::string& path, const std::string& text, mode_t mode) {
  const UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (!fd.valid()) {
    if (errno == EEXIST) return Status::AlreadyExists(path + " exists; remove it or choose another --out");
    return Status::FromErrno("cannot create " + path, errno);
  }
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return Status::FromErrno("cannot write " + path, errno);
  return Status::OK();
}

}  // namespace

Status CurveAvailable() {
  if (zmq_has("curve")) return Status::OK();
  return Status::Invalid("this libzmq was built without CURVE security (libsodium); tcp:// endpoints need it "
                         "(Debian's libzmq5 has it), or --insecure");
}

Result<CurveKeyPair> GenerateCurveKeyPair() {
  COLOADER_RETURN_NOT_OK(CurveAvailable());
  char pub[kZ85KeyChars + 1], sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) return Status::FromErrno("zmq_curve_keypair", errno);
  return CurveKeyPair{pub, sec};
}

Status WriteCurveKeyFiles(const std::string& prefix, const CurveKeyPair& pair) {
  // Both or neither: check both names before writing, and take the secret back if the public
  // half still cannot be written (a .key without its .pub would be an orphan to clean up by hand).
  for (const std::string& path : {prefix + ".key", prefix + ".pub"}) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) return Status::AlreadyExists(path + " exists; remove it or choose another --out");
  }
  COLOADER_RETURN_NOT_OK(WriteNew(prefix + ".key",
                         "# coloader CURVE key pair: keep secret\npublic " + pair.public_key + "\nsecret " +
                             pair.secret_key + "\n",
                         0600));
  if (Status st = WriteNew(prefix + ".pub", pair.public_key + "\n", 0644); !st.ok()) {
    ::unlink((prefix + ".key").c_str());
    return st;
  }
  return Status::OK();
}

Result<CurveKeyPair> ReadCurveKeyPair(const std::string& path) {
  COLOADER_ASSIGN_OR_RETURN(std::string text, ReadText(path));
  CurveKeyPair pair;
  for (const auto& [n, w] : Lines(text)) {
    if (w.size() == 2 && w[0] == "public") pair.public_key = w[1];
    if (w.size() == 2 && w[0] == "secret") pair.secret_key = w[1];
  }
  if (!IsZ85Key(pair.public_key) || !IsZ85Key(pair.secret_key)) {
    return Status::Invalid(path + " is not a coloader key pair file (want 'public <key>' and 'secret <key>' "
                                  "lines of 40 Z85 characters); make one with: coloader keygen --out NAME");
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    return Status::Invalid("key pair file " + path + " is readable by others; chmod 600 " + path);
  }
  return pair;
}

Result<std::string> ReadCurvePublicKey(const std::string& key_or_path) {
  if (IsZ85Key(key_or_path)) return key_or_path;
  COLOADER_ASSIGN_OR_RETURN(std::string text, ReadText(key_or_path));
  for (const auto& [n, w] : Lines(text)) {
    if (w.size() == 1 && IsZ85Key(w[0])) return w[0];
    if (w.size() == 2 && w[0] == "public" && IsZ85Key(w[1])) return w[1];
  }
  return Status::Invalid(key_or_path + " holds no public key (40 Z85 characters); use the .pub file that "
                                       "coloader keygen wrote");
}

Result<std::set<std::string>> ReadAuthorizedKeys(const std::string& path) {
  COLOADER_ASSIGN_OR_RETURN(std::string text, ReadText(path));
  std::set<std::string> keys;
  for (const auto& [line, w] : Lines(text)) {
    if (!IsZ85Key(w[0])) {
      return Status::Invalid("authorized keys file " + path + ":" + std::to_string(line) + ": '" + w[0] +
                             "' is not a public key (40 Z85 characters)");
    }
    keys.insert(w[0]);
  }
  if (keys.empty()) return Status::Invalid("authorized keys file " + path + " lists no key");
  return keys;
}

Result<std::string> UseCurveClientKeys(Socket& sock, const std::string& key_file,
                                       const std::string& server_key) {
  if (key_file.empty() || server_key.empty())
    return Status::Invalid("a CURVE connection needs both this side's key pair (--curve-key) and the producer's public key (--server-key)");
  COLOADER_RETURN_NOT_OK(CurveAvailable());
  COLOADER_ASSIGN_OR_RETURN(CurveKeyPair pair, ReadCurveKeyPair(key_file));
  COLOADER_ASSIGN_OR_RETURN(std::string server, ReadCurvePublicKey(server_key));
  COLOADER_RETURN_NOT_OK(sock.Set(zmq::sockopt::curve_serverkey, server));
  COLOADER_RETURN_NOT_OK(sock.Set(zmq::sockopt::curve_publickey, pair.public_key));
  COLOADER_RETURN_NOT_OK(sock.Set(zmq::sockopt::curve_secretkey, pair.secret_key));
  return pair.public_key;
}

std::string Z85FromRaw(const std::string& raw32) {
  if (raw32.size() != 32) return "";
  char out[kZ85KeyChars + 1];
  if (!zmq_z85_encode(out, reinterpret_cast<const uint8_t*>(raw32.data()), 32)) return "";
  return out;
}

}  // namespace coloader
