// CURVE key files: keygen writes both halves or neither, and an authorized-keys error names
// the line of the file, so the bad line is found from the message alone.
#include "common/curve.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/support/test_support.h"

namespace coloader {
namespace {

const std::string kKeyA(kZ85KeyChars, '0');  // 40 Z85 characters: 32 zero bytes
const std::string kKeyB(kZ85KeyChars, '1');

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

TEST(Curve, KeygenRefusesBeforeWritingWhenEitherFileExists) {
  testing::TempDir dir;
  const std::string prefix = dir.path() + "/me";
  testing::WriteFile(prefix + ".pub", "somebody else's\n");
  Status st = WriteCurveKeyFiles(prefix, CurveKeyPair{kKeyA, kKeyB});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(prefix + ".pub exists"), std::string::npos) << st.message();
  EXPECT_FALSE(Exists(prefix + ".key")) << "no orphan secret key is left behind";
  EXPECT_EQ(testing::ReadFile(prefix + ".pub"), "somebody else's\n");

  // And the other way round: an existing .key is never overwritten either.
  const std::string other = dir.path() + "/you";
  testing::WriteFile(other + ".key", "keep\n");
  ASSERT_FALSE(WriteCurveKeyFiles(other, CurveKeyPair{kKeyA, kKeyB}).ok());
  EXPECT_FALSE(Exists(other + ".pub"));
  EXPECT_EQ(testing::ReadFile(other + ".key"), "keep\n");

  // Neither exists: both are written, the secret one private.
  const std::string fresh = dir.path() + "/fresh";
  ASSERT_OK(WriteCurveKeyFiles(fresh, CurveKeyPair{kKeyA, kKeyB}));
  struct stat key {};
  ASSERT_EQ(::stat((fresh + ".key").c_str(), &key), 0);
  EXPECT_EQ(key.st_mode & 0777, 0600u);
  ASSERT_OK_AND_ASSIGN(CurveKeyPair back, ReadCurveKeyPair(fresh + ".key"));
  EXPECT_EQ(back.public_key, kKeyA);
  EXPECT_EQ(back.secret_key, kKeyB);
  ASSERT_OK_AND_ASSIGN(std::string pub, ReadCurvePublicKey(fresh + ".pub"));
  EXPECT_EQ(pub, kKeyA);
}

TEST(Curve, AuthorizedKeysErrorsNameTheLineOfTheFile) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/authorized";
  // Comments and blank lines count as lines: the bad key is on line 5.
  testing::WriteFile(path, "# who may connect\n" + kKeyA + "\n\n# the second one\nnot-a-key\n" + kKeyB + "\n");
  Result<std::set<std::string>> r = ReadAuthorizedKeys(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ":5: 'not-a-key' is not a public key"), std::string::npos)
      << r.status().message();
  testing::WriteFile(path, "# who may connect\n" + kKeyA + "\n\n" + kKeyB + "  # laptop\n");
  ASSERT_OK_AND_ASSIGN(std::set<std::string> keys, ReadAuthorizedKeys(path));
  EXPECT_EQ(keys, (std::set<std::string>{kKeyA, kKeyB}));
}

}  // namespace
}  // namespace coloader
