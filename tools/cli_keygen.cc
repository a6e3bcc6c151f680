// `coloader keygen`: a CURVE key pair for tcp:// endpoints. The producer's operator lists the
// consumers' .pub files in --authorized-keys; each consumer is given the producer's .pub.
#include <cstdio>
#include <optional>

#include "common/curve.h"
#include "tools/cli.h"

namespace coloader::cli {

namespace {
constexpr const char* kKeygenSynopsis = "coloader keygen --out NAME";
}  // namespace

int Keygen(const std::vector<std::string>& args) {
  std::string out;
  Command cmd("keygen", kKeygenSynopsis,
              "Make a CURVE key pair for tcp:// endpoints: NAME.key (mode 0600, keep it secret) and NAME.pub (give "
              "it to the other side). The public key is also printed.");
  cmd.Add("--out", &out, "the key files' name, without extension")->type_name("NAME");
  if (std::optional<int> exit = cmd.Parse(args)) return *exit;
  if (out.empty()) return cmd.UsageError("--out is required (the key files' name, without extension)");
  Status st;
  Result<CurveKeyPair> pair = GenerateCurveKeyPair();
  if (pair.ok()) st = WriteCurveKeyFiles(out, *pair);
  if (!pair.ok() || !st.ok()) {
    std::fprintf(stderr, "coloader keygen: %s\n", (pair.ok() ? st : pair.status()).message().c_str());
    return 1;
  }
  std::printf("%s\n", pair->public_key.c_str());
  std::fprintf(stderr, "wrote %s.key (keep it secret) and %s.pub (give it to the other side)\n", out.c_str(), out.c_str());
  return 0;
}

}  // namespace coloader::cli
