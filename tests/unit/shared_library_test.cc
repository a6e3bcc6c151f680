#include "toolbox/shared_library.h"

#include <gtest/gtest.h>

#include <cstring>

namespace coloader {
namespace {

TEST(SharedLibraryTest, ALibraryThatDoesNotLoadIsNamedWithTheLoadersReason) {
  Result<SharedLibrary> lib = SharedLibrary::Open({"libcoloader-no-such.so.1", "/nowhere/libother.so"});
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kNotFound);
  EXPECT_NE(lib.status().message().find("libcoloader-no-such.so.1"), std::string::npos) << lib.status().message();
  EXPECT_NE(lib.status().message().find("/nowhere/libother.so"), std::string::npos) << lib.status().message();
}

TEST(SharedLibraryTest, TheFirstCandidateThatLoadsGivesItsEntryPointsAndSaysWhichAreMissing) {
  Result<SharedLibrary> lib = SharedLibrary::Open({"libcoloader-no-such.so.1", "libc.so.6"});
  ASSERT_TRUE(lib.ok()) << lib.status().message();
  EXPECT_NE(lib->path().find("libc.so.6"), std::string::npos) << lib->path();
  size_t (*length)(const char*) = nullptr;
  lib->Bind(length, "strlen");
  ASSERT_NE(length, nullptr);
  EXPECT_EQ(length("coloader"), 8u);
  EXPECT_TRUE(lib->complete());
  int (*optional)() = nullptr;
  lib->BindOptional(optional, "coloader_not_in_libc");
  EXPECT_EQ(optional, nullptr);
  EXPECT_TRUE(lib->complete());  // an optional entry point is not missed
  int (*required)() = nullptr, (*also)() = nullptr;
  lib->Bind(required, "coloader_not_in_libc");
  lib->Bind(also, "coloader_nor_this");
  EXPECT_FALSE(lib->complete());
  EXPECT_EQ(lib->missing(), "coloader_not_in_libc, coloader_nor_this");
}

TEST(SharedLibraryTest, AMovedLibraryKeepsItsHandleAndTheMovedFromOneHoldsNothing) {
  Result<SharedLibrary> lib = SharedLibrary::Open({"libc.so.6"});
  ASSERT_TRUE(lib.ok());
  SharedLibrary moved = std::move(*lib);
  size_t (*length)(const char*) = nullptr;
  moved.Bind(length, "strlen");
  EXPECT_NE(length, nullptr);
  length = nullptr;
  lib->Bind(length, "strlen");  // NOLINT(bugprone-use-after-move): what a moved-from object does
  EXPECT_EQ(length, nullptr);
  EXPECT_FALSE(lib->complete());
}

}  // namespace
}  // namespace coloader
