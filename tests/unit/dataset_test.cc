// Dataset::Open over real temporary trees and file lists. File contents are never read by
// Open, so every image here is an empty file.
#include "pipeline/source/dataset.h"
#include "pipeline/source/read.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace coloader {
namespace {

namespace fs = std::filesystem;

#define ASSERT_OK_AND_ASSIGN(lhs, expr)                              \
  auto COLOADER_CONCAT(_result_, __LINE__) = (expr);                        \
  ASSERT_TRUE(COLOADER_CONCAT(_result_, __LINE__).ok())                     \
      << COLOADER_CONCAT(_result_, __LINE__).status().ToString();           \
  lhs = std::move(*COLOADER_CONCAT(_result_, __LINE__))

using Pairs = std::vector<std::pair<std::string, int64_t>>;

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "coloader_dataset_XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << "mkdtemp failed";
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Creates an empty file (and its parent folders) at dir_/rel.
  void Touch(const std::string& rel) {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p).flush();
  }
  void Mkdir(const std::string& rel) { fs::create_directories(dir_ / rel); }
  void Write(const std::string& rel, const std::string& text) {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string P(const std::string& rel) const { return (dir_ / rel).string(); }

  // Samples as (path relative to dir_, label), for readable comparisons.
  Pairs Relative(const Dataset& ds) const {
    Pairs out;
    for (const Sample& s : ds.samples()) {
      out.emplace_back(fs::path(s.path).lexically_relative(dir_).string(), s.label);
    }
    return out;
  }

  // Opens `rel` expecting failure; returns the status.
  Status OpenError(const std::string& rel) {
    auto r = Dataset::Open(P(rel));
    EXPECT_FALSE(r.ok()) << "expected " << rel << " to fail, got " << r->size() << " samples";
    return r.status();
  }

  fs::path dir_;
};

::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << haystack << "' does not contain '" << needle
                                       << "'";
}

// ---------------------------------------------------------------------------- extensions

TEST(HasImageExtensionTest, TorchvisionListAnyCase) {
  for (const char* name : {"a.jpg", "a.jpeg", "a.png", "a.ppm", "a.bmp", "a.pgm", "a.tif",
                           "a.tiff", "a.webp", "A.JPEG", "b.Png", "c.JpG", "dir/x.TIFF",
                           ".jpg", "a.b.webp"}) {
    EXPECT_TRUE(HasImageExtension(name)) << name;
  }
  for (const char* name : {"", "jpg", "a.gif", "a.txt", "a.jpg.txt", "a.jpe", "a.jpgx",
                           "a_jpg", "a.svg", "a.heic", "a.avif"}) {
    EXPECT_FALSE(HasImageExtension(name)) << name;
  }
}

// ---------------------------------------------------------------------------- ImageFolder

TEST_F(DatasetTest, ClassesSortedByteOrderLabelsByPosition) {
  Touch("root/dog/1.jpg");
  Touch("root/B/1.jpg");  // 'B' (0x42) sorts before 'a' (0x61), as in Python's sorted()
  Touch("root/a/1.jpg");
  Touch("root/_x/1.jpg");
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("root")));
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"B", "_x", "a", "dog"}));
  EXPECT_EQ(Relative(ds),
            (Pairs{{"root/B/1.jpg", 0}, {"root/_x/1.jpg", 1}, {"root/a/1.jpg", 2},
                   {"root/dog/1.jpg", 3}}));
  EXPECT_EQ(ds.size(), 4u);
  EXPECT_EQ(ds[3].label, 3);
  EXPECT_EQ(ds.source(), P("root"));
}

TEST_F(DatasetTest, FilesSortedWithinFolderAndNestedFoldersIncluded) {
  Touch("root/c/b.jpg");
  Touch("root/c/a.jpg");
  Touch("root/c/A.jpg");
  Touch("root/c/sub/z.png");
  Touch("root/c/sub/deeper/y.png");
  Touch("root/c/sub-b/x.png");
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("root")));
  // torchvision walks sorted(os.walk(...)): directories by full path string, so "c/sub-b"
  // ('-' is 0x2d) comes before "c/sub/deeper" ('/' is 0x2f), although sub-b is not inside sub.
  EXPECT_EQ(Relative(ds), (Pairs{{"root/c/A.jpg", 0},
                                 {"root/c/a.jpg", 0},
                                 {"root/c/b.jpg", 0},
                                 {"root/c/sub/z.png", 0},
                                 {"root/c/sub-b/x.png", 0},
                                 {"root/c/sub/deeper/y.png", 0}}));
}

TEST_F(DatasetTest, ExtensionsCaseInsensitiveOthersSkippedHiddenKept) {
  Touch("root/c/one.JPEG");
  Touch("root/c/two.Png");
  Touch("root/c/three.webp");
  Touch("root/c/.hidden.jpg");  // torchvision keeps hidden files with an image extension
  Touch("root/c/notes.txt");
  Touch("root/c/anim.gif");
  Touch("root/c/jpg");
  Mkdir("root/c/folder.jpg");  // a directory with an image name is walked, not taken
  Touch("root/c/folder.jpg/inner.jpg");
  Touch("root/stray.jpg");  // files at the root are not samples
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("root")));
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"c"}));
  EXPECT_EQ(Relative(ds), (Pairs{{"root/c/.hidden.jpg", 0},
                                 {"root/c/one.JPEG", 0},
                                 {"root/c/three.webp", 0},
                                 {"root/c/two.Png", 0},
                                 {"root/c/folder.jpg/inner.jpg", 0}}));
}

TEST_F(DatasetTest, TrailingSlashOnRootGivesCleanPaths) {
  Touch("root/c/a.jpg");
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("root") + "/"));
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].path, P("root/c/a.jpg"));
}

TEST_F(DatasetTest, SymlinkedClassAndSubfolderAreFollowed) {
  Touch("elsewhere/cats/1.jpg");
  Touch("elsewhere/more/2.jpg");
  Touch("root/dogs/1.jpg");
  fs::create_directory_symlink(dir_ / "elsewhere/cats", dir_ / "root/cats");
  fs::create_directory_symlink(dir_ / "elsewhere/more", dir_ / "root/dogs/more");
  fs::create_symlink(dir_ / "elsewhere/cats/1.jpg", dir_ / "root/dogs/link.jpg");
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("root")));
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"cats", "dogs"}));
  EXPECT_EQ(Relative(ds), (Pairs{{"root/cats/1.jpg", 0},
                                 {"root/dogs/1.jpg", 1},
                                 {"root/dogs/link.jpg", 1},
                                 {"root/dogs/more/2.jpg", 1}}));
}

TEST_F(DatasetTest, SymlinkLoopIsCut) {
  Touch("root/c/a.jpg");
  Touch("root/c/sub/b.jpg");
  fs::create_directory_symlink(dir_ / "root/c", dir_ / "root/c/sub/loop");
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("root")));
  EXPECT_EQ(Relative(ds), (Pairs{{"root/c/a.jpg", 0}, {"root/c/sub/b.jpg", 0}}));
}

TEST_F(DatasetTest, SameFolderThroughTwoSymlinksIsListedTwiceAsInTorchvision) {
  Touch("shared/s.jpg");
  Touch("root/c/a.jpg");
  fs::create_directory_symlink(dir_ / "shared", dir_ / "root/c/x");
  fs::create_directory_symlink(dir_ / "shared", dir_ / "root/c/y");
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("root")));
  EXPECT_EQ(Relative(ds),
            (Pairs{{"root/c/a.jpg", 0}, {"root/c/x/s.jpg", 0}, {"root/c/y/s.jpg", 0}}));
}

TEST_F(DatasetTest, RootGivenThroughSymlink) {
  Touch("real/c/a.jpg");
  fs::create_directory_symlink(dir_ / "real", dir_ / "link");
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("link")));
  EXPECT_EQ(Relative(ds), (Pairs{{"link/c/a.jpg", 0}}));
}

TEST_F(DatasetTest, MissingPathIsNotFoundAndSaysWhatToPass) {
  Status st = OpenError("nope");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(st.message(), P("nope")));
  EXPECT_TRUE(Contains(st.message(), "no such file or directory"));
  EXPECT_TRUE(Contains(st.message(), "--data"));
  EXPECT_TRUE(Contains(st.message(), "root/<class>/<image>"));
}

TEST_F(DatasetTest, EmptyDirectoryHasNoClassFolders) {
  Mkdir("root");
  Status st = OpenError("root");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st.message(), P("root") + ": no class folders found"));
  EXPECT_TRUE(Contains(st.message(), "root/<class>/<image>"));
}

TEST_F(DatasetTest, ImagesDirectlyInRootAreNotClassFolders) {
  Touch("root/a.jpg");
  Touch("root/b.jpg");
  Status st = OpenError("root");
  EXPECT_TRUE(Contains(st.message(), "no class folders found"));
}

TEST_F(DatasetTest, ClassFoldersWithoutAnyImagesListExtensions) {
  Touch("root/a/readme.txt");
  Mkdir("root/b/sub");
  Status st = OpenError("root");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st.message(), P("root")));
  EXPECT_TRUE(Contains(st.message(), "no images"));
  EXPECT_TRUE(Contains(st.message(), ".jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp"));
}

TEST_F(DatasetTest, EmptyClassFolderIsAnErrorNamingIt) {
  Touch("root/cat/1.jpg");
  Mkdir("root/dog");
  Touch("root/emu/notes.txt");
  Status st = OpenError("root");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st.message(), "dog, emu"));
  EXPECT_FALSE(Contains(st.message(), "cat"));
}

TEST_F(DatasetTest, HiddenDirectoryCountsAsClassAsInTorchvision) {
  Touch("root/cat/1.jpg");
  Mkdir("root/.ipynb_checkpoints");
  Status st = OpenError("root");
  EXPECT_TRUE(Contains(st.message(), ".ipynb_checkpoints"));
}

TEST_F(DatasetTest, UnreadableSubfolderIsReportedNotSkipped) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  Touch("root/c/a.jpg");
  Touch("root/c/locked/b.jpg");
  fs::permissions(dir_ / "root/c/locked", fs::perms::none);
  Status st = OpenError("root");
  fs::permissions(dir_ / "root/c/locked", fs::perms::owner_all);  // so TearDown can remove it
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_TRUE(Contains(st.message(), P("root/c/locked")));
}

// ---------------------------------------------------------------------------- file lists

TEST_F(DatasetTest, FileListRelativeAndAbsolutePathsCommentsBlankLines) {
  Write("lists/train.txt",
        "# path,label\n"
        "\n"
        "a.jpg,0\n"
        "  sub/b.png , 3  \r\n"
        "/abs/c.jpg,12\n"
        "   # indented comment\n"
        "../up.jpg,-1\n"
        "d.jpg,1");  // no trailing newline
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("lists/train.txt")));
  EXPECT_TRUE(ds.classes().empty());
  ASSERT_EQ(ds.size(), 5u);
  EXPECT_EQ(ds[0].path, P("lists/a.jpg"));
  EXPECT_EQ(ds[0].label, 0);
  EXPECT_EQ(ds[1].path, P("lists/sub/b.png"));
  EXPECT_EQ(ds[1].label, 3);
  EXPECT_EQ(ds[2].path, "/abs/c.jpg");
  EXPECT_EQ(ds[2].label, 12);
  EXPECT_EQ(ds[3].path, P("lists/../up.jpg"));
  EXPECT_EQ(ds[3].label, -1);
  EXPECT_EQ(ds[4].path, P("lists/d.jpg"));
  EXPECT_EQ(ds[4].label, 1);
}

TEST_F(DatasetTest, FileListPathMayContainCommas) {
  Write("list.csv", "photos/a,b,c.jpg,7\n");
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("list.csv")));
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].path, P("photos/a,b,c.jpg"));
  EXPECT_EQ(ds[0].label, 7);
}

TEST_F(DatasetTest, FileListEntriesNeedNotExist) {
  // Existence is checked by the decoder at read time, not by Open.
  Write("list.txt", "missing/one.jpg,0\nmissing/two.jpg,1\n");
  ASSERT_OK_AND_ASSIGN(Dataset ds, Dataset::Open(P("list.txt")));
  EXPECT_EQ(ds.size(), 2u);
}

TEST_F(DatasetTest, FileListBadLinesNameFileAndLine) {
  struct Case {
    std::string line;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"just/a/path.jpg", "expected 'path,label', got 'just/a/path.jpg'"},
      {"a.jpg,", "expected 'path,label', got 'a.jpg,'"},
      {",3", "expected 'path,label', got ',3'"},
      {"a.jpg,cat", "label 'cat' is not an integer"},
      {"a.jpg,1.5", "label '1.5' is not an integer"},
      {"a.jpg,3 4", "label '3 4' is not an integer"},
      {"a.jpg,99999999999999999999", "is not an integer"},
  };
  for (const Case& c : cases) {
    Write("bad.txt", "# header\nok.jpg,0\n\n" + c.line + "\nlater.jpg,1\n");
    Status st = OpenError("bad.txt");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.line;
    EXPECT_TRUE(Contains(st.message(), P("bad.txt") + ":4: ")) << c.line;
    EXPECT_TRUE(Contains(st.message(), c.expected)) << c.line;
  }
}

TEST_F(DatasetTest, FileListLongBadLineIsCutInMessage) {
  Write("bad.txt", std::string(5000, 'x') + "\n");
  Status st = OpenError("bad.txt");
  EXPECT_TRUE(Contains(st.message(), ":1: expected 'path,label'"));
  EXPECT_LT(st.message().size(), 400u);
}

TEST_F(DatasetTest, EmptyFileListIsAnError) {
  for (const std::string& text : {std::string(), std::string("# only a comment\n\n  \n")}) {
    Write("empty.txt", text);
    Status st = OpenError("empty.txt");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(st.message(), P("empty.txt")));
    EXPECT_TRUE(Contains(st.message(), "no samples"));
  }
}

TEST_F(DatasetTest, SingleImageInsteadOfListSaysSo) {
  Touch("photo.JPG");
  Status st = OpenError("photo.JPG");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(st.message(), "is an image, not a file list"));
}

TEST_F(DatasetTest, FileListRelativeToCurrentDirectoryWhenListHasNoFolder) {
  Write("list.txt", "a.jpg,0\n");
  const fs::path old = fs::current_path();
  fs::current_path(dir_);
  auto r = Dataset::Open("list.txt");
  fs::current_path(old);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].path, "a.jpg");
  EXPECT_EQ(r->source(), "list.txt");
}

}  // namespace
}  // namespace coloader

namespace coloader {
namespace {

TEST(ReadWholeFileTest, OutOfDescriptorsIsTheMachinesFaultNotABadFile) {
  // Issue 38: during a flood every image was "skipped bad file: ... Too many open files". With
  // no descriptor left, the read is tried again for a while, then fails as kUnavailable (the run
  // stops), never as the file's error; a missing file stays the file's.
  const std::string path = testing::TempDir() + "/read_whole_file_test.bin";
  {
    std::ofstream(path) << "bytes";
  }
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(ReadWholeFile(path, &bytes).ok());
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  // The lowest free descriptor is the next open's: allow none above what is open now.
  const int next = ::dup(0);
  ASSERT_GE(next, 0);
  ::close(next);
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(next);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  const Status st = ReadWholeFile(path, &bytes);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("not the file's"), std::string::npos) << st.message();
  EXPECT_TRUE(MachineFault(EMFILE) && MachineFault(EIO) && !MachineFault(ENOENT));
  const Status missing = ReadWholeFile(path + ".missing", &bytes);
  EXPECT_EQ(missing.code(), StatusCode::kIOError) << missing.ToString();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace coloader
