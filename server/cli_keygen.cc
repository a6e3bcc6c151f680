// `coloader keygen`: a CURVE key pair for tcp:// endpoints. The producer's operator lists the
// consumers' .pub files in --authorized-keys; each consumer is given the producer's .pub.
#include <cstdio>

#include "common/curve.h"
#include "server/cli.h"

namespace coloader::cli {

namespace {
constexpr const char* kKeygenUsage = "coloader keygen --out NAME   (writes NAME.key, mode 0600, and NAME.pub)";
}  // namespace

int Keygen(const std::vector<std::string>& args) {
  std::string out;
  bool help = false;
  Flags f("keygen", kKeygenUsage);
  f.AddString("out", &out);
  f.AddBool("help", &help);
  Status st = f.Parse(args);
  if (help) {
    std::printf("usage: %s\n", kKeygenUsage);
    return 0;
  }
  if (st.ok() && out.empty()) st = f.Error("--out is required (the key files' name, without extension)");
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 2;
  }
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
