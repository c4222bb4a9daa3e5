// base/file_lock.h: exclusive flocks between processes.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>

#include "base/file_lock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

using ::kforge::testing::TempDir;

TEST(FileLockTest, ExcludesAnotherOpenFileDescription) {
  TempDir dir;
  const std::string path = (dir.path() / "key.lock").string();
  absl::StatusOr<FileLock> held = FileLock::Acquire(path, FileLock::Wait::kBlock);
  ASSERT_TRUE(held.ok()) << held.status();
  // flock locks belong to the open file description: a second open of the
  // same file, in this process too, is excluded.
  absl::StatusOr<FileLock> other = FileLock::Acquire(path, FileLock::Wait::kTry);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kUnavailable) << other.status();
  held->Release();
  other = FileLock::Acquire(path, FileLock::Wait::kTry);
  EXPECT_TRUE(other.ok()) << other.status();
}

TEST(FileLockTest, MovedLockIsReleasedOnce) {
  TempDir dir;
  const std::string path = (dir.path() / "key.lock").string();
  {
    absl::StatusOr<FileLock> held = FileLock::Acquire(path, FileLock::Wait::kBlock);
    ASSERT_TRUE(held.ok());
    FileLock moved = *std::move(held);
    EXPECT_FALSE(FileLock::Acquire(path, FileLock::Wait::kTry).ok());
  }
  EXPECT_TRUE(FileLock::Acquire(path, FileLock::Wait::kTry).ok());
}

TEST(FileLockTest, LockOnABorrowedDescriptorLeavesItOpen) {
  TempDir dir;
  const int fd = open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  {
    absl::StatusOr<FileLock> lock = FileLock::Lock(fd, "dir", FileLock::Wait::kTry);
    ASSERT_TRUE(lock.ok()) << lock.status();
    const int other = open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    EXPECT_EQ(FileLock::Lock(other, "dir", FileLock::Wait::kTry).status().code(),
              absl::StatusCode::kUnavailable);
    close(other);
  }
  EXPECT_NE(fcntl(fd, F_GETFD), -1);  // still open
  const int other = open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  EXPECT_TRUE(FileLock::Lock(other, "dir", FileLock::Wait::kTry).ok());
  close(other);
  close(fd);
}

TEST(FileLockTest, BlockingWaitsForTheHolder) {
  TempDir dir;
  const std::string path = (dir.path() / "key.lock").string();
  absl::StatusOr<FileLock> held = FileLock::Acquire(path, FileLock::Wait::kBlock);
  ASSERT_TRUE(held.ok());
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    absl::StatusOr<FileLock> lock = FileLock::Acquire(path, FileLock::Wait::kBlock);
    got = lock.ok();
  });
  usleep(50 * 1000);
  EXPECT_FALSE(got.load());
  held->Release();
  waiter.join();
  EXPECT_TRUE(got.load());
}

}  // namespace
}  // namespace kforge
