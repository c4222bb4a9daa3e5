// base/io.h: errno statuses, durable atomic writes.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "absl/strings/escaping.h"
#include "base/credentials.h"
#include "base/ed25519.h"
#include "base/io.h"
#include "base/sha256.h"
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

TEST(HmacSha256Test, MatchesRfc4231AndComparesInFull) {
  // RFC 4231, test case 2.
  EXPECT_EQ(absl::BytesToHexString(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(Ed25519Test, SignsAndVerifiesAndRefusesOtherKeysAndMessages) {
  absl::StatusOr<Ed25519KeyPair> a = GenerateEd25519KeyPair();
  absl::StatusOr<Ed25519KeyPair> b = GenerateEd25519KeyPair();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(Contains(a->private_pem, "-----BEGIN PRIVATE KEY-----"));
  EXPECT_TRUE(Contains(a->public_pem, "-----BEGIN PUBLIC KEY-----"));
  EXPECT_EQ(*Ed25519PublicKeyOf(a->private_pem), a->public_pem);
  absl::StatusOr<std::string> sig = Ed25519Sign(a->private_pem, "checksums");
  ASSERT_TRUE(sig.ok()) << sig.status();
  EXPECT_EQ(sig->size(), kEd25519SignatureBytes);
  EXPECT_TRUE(Ed25519Verify(a->public_pem, "checksums", *sig).ok());
  EXPECT_EQ(Ed25519Verify(a->public_pem, "checksumz", *sig).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Ed25519Verify(b->public_pem, "checksums", *sig).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Ed25519Verify(a->public_pem, "checksums", sig->substr(1)).code(),
            absl::StatusCode::kUnauthenticated);
  // Keys of the wrong kind or type are named as such.
  EXPECT_EQ(Ed25519Verify(a->private_pem, "x", *sig).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Ed25519Sign(a->public_pem, "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Ed25519Sign("garbage", "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenFileTest, ParsesOnePerLineAndRefusesBadLinesWithoutEchoingThem) {
  absl::StatusOr<std::vector<std::string>> tokens =
      ParseTokens("# comment\n\n  0123456789abcdef0123  \nsecond-token-0123456789\n", "f");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<std::string>{"0123456789abcdef0123", "second-token-0123456789"}));
  absl::StatusOr<std::vector<std::string>> bad =
      ParseTokens("0123456789abcdef\nsecret short\n", "f");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status().message(), "f: line 2")) << bad.status();
  EXPECT_FALSE(Contains(bad.status().message(), "secret")) << bad.status();
  EXPECT_EQ(ParseTokens("# only a comment\n", "f").status().code(),
            absl::StatusCode::kInvalidArgument);
  TempDir tmp("kforge_token_test");
  const std::string fifo = (tmp.path() / "fifo").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::vector<std::string>> from_fifo = ReadTokenFile(fifo, "--auth-token-file");
  EXPECT_FALSE(from_fifo.ok());
  EXPECT_TRUE(Contains(from_fifo.status().message(), "--auth-token-file")) << from_fifo.status();
}

}  // namespace
}  // namespace kforge
