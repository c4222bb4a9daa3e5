// base/io.h: errno statuses, durable atomic writes.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "base/io.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

using ::kforge::testing::Contains;
using ::kforge::testing::TempDir;

TEST(ErrnoStatusTest, KeepsTheCanonicalCodeAndNamesThePath) {
  const absl::Status s = ErrnoStatus(ENOENT, "cannot open", "/x/y");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "cannot open /x/y: No such file or directory");
  EXPECT_EQ(ErrnoStatus(EACCES, "a", "b").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(EROFS, "a", "b").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(ENOSPC, "a", "b").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EDQUOT, "a", "b").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EIO, "a", "b").code(), absl::StatusCode::kInternal);
}

// What kforge reads is a regular file of bounded size: a FIFO is refused
// without blocking the open, a device or an oversized file from its type and
// size without reading it, a link only where the caller follows links.
TEST(ReadFileTest, RegularFilesOnlyAndSizesCapped) {
  TempDir dir;
  const std::string fifo = (dir.path() / "fifo").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> r = ReadFile(fifo, 1 << 20, Symlinks::kFollow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), fifo + ": is a FIFO, expected a regular file");
  r = ReadFile("/dev/zero", 1 << 20, Symlinks::kFollow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(r.status().message(), "is a character device")) << r.status();
  EXPECT_EQ(ReadFile(dir.path().string(), 1 << 20).status().code(),
            absl::StatusCode::kFailedPrecondition);

  const std::string file = (dir.path() / "file").string();
  ASSERT_TRUE(WriteFileAtomic(file, std::string(1000, 'x')).ok());
  EXPECT_EQ(ReadFile(file, 1000)->size(), 1000u);
  r = ReadFile(file, 999);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(r.status().message(), "1000 bytes, more than the 999 bytes")) << r.status();

  const std::string link = (dir.path() / "link").string();
  ASSERT_EQ(symlink(file.c_str(), link.c_str()), 0);
  r = ReadFile(link, 1 << 20);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(r.status().message(), "is a symbolic link")) << r.status();
  EXPECT_EQ(ReadFile(link, 1 << 20, Symlinks::kFollow)->size(), 1000u);
  const std::string zero_link = (dir.path() / "zero").string();
  ASSERT_EQ(symlink("/dev/zero", zero_link.c_str()), 0);
  EXPECT_EQ(ReadFile(zero_link, 1 << 20, Symlinks::kFollow).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(WriteFileAtomicTest, WritesCreatesParentsAndReplaces) {
  TempDir dir;
  const std::string path = (dir.path() / "a" / "b" / "file").string();
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  EXPECT_EQ(*ReadFile(path, 1 << 20), "first");
  ASSERT_TRUE(WriteFileAtomic(path, std::string(100000, 'x')).ok());
  EXPECT_EQ(ReadFile(path, 1 << 20)->size(), 100000u);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  // No temporary is left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path() / "a" / "b")) {
    ++files;
    EXPECT_EQ(e.path().filename(), "file");
  }
  EXPECT_EQ(files, 1);
}

TEST(WriteFileAtomicTest, ReadFileOfAMissingFileIsNotFound) {
  TempDir dir;
  EXPECT_EQ(ReadFile((dir.path() / "none").string(), 1 << 20).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(AtomicFileTest, DroppedWithoutCommitLeavesNothing) {
  TempDir dir;
  const std::string path = (dir.path() / "file").string();
  {
    absl::StatusOr<AtomicFile> file = AtomicFile::Create(path);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE(file->Write("half").ok());
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(AtomicFileTest, CommitInStepsRenamesOverTheTarget) {
  TempDir dir;
  const std::string path = (dir.path() / "file").string();
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  absl::StatusOr<AtomicFile> file = AtomicFile::Create(path);
  ASSERT_TRUE(file.ok());
  ASSERT_GE(file->fd(), 0);
  ASSERT_TRUE(file->Write("new").ok());
  ASSERT_TRUE(file->Sync().ok());
  EXPECT_EQ(file->fd(), -1);
  EXPECT_EQ(*ReadFile(path, 1 << 20), "old");  // not visible before the rename
  ASSERT_TRUE(file->Rename().ok());
  EXPECT_EQ(*ReadFile(path, 1 << 20), "new");
  EXPECT_EQ(file->directory(), dir.path().string());
  EXPECT_TRUE(FsyncDir(file->directory()).ok());
  EXPECT_FALSE(file->Rename().ok());
}

TEST(AtomicFileTest, MissingDirectoryIsNotFound) {
  TempDir dir;
  EXPECT_EQ(AtomicFile::Create((dir.path() / "no" / "file").string()).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kforge
