#include "base/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/io.h"

namespace kforge {
namespace {

absl::Status FlockRetrying(int fd, const std::string& name, FileLock::Wait wait) {
  const int op = LOCK_EX | (wait == FileLock::Wait::kTry ? LOCK_NB : 0);
  while (flock(fd, op) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat(name, " is locked by another process"));
    }
    return ErrnoStatus(errno, "cannot lock", name);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FileLock> FileLock::Acquire(const std::string& path, Wait wait) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot open lock file", path);
  if (absl::Status s = FlockRetrying(fd, path, wait); !s.ok()) {
    close(fd);
    return s;
  }
  return FileLock(fd, /*owns_fd=*/true);
}

absl::StatusOr<FileLock> FileLock::Lock(int fd, const std::string& name, Wait wait) {
  if (absl::Status s = FlockRetrying(fd, name, wait); !s.ok()) return s;
  return FileLock(fd, /*owns_fd=*/false);
}

FileLock::FileLock(FileLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), owns_fd_(other.owns_fd_) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    owns_fd_ = other.owns_fd_;
  }
  return *this;
}

FileLock::~FileLock() { Release(); }

void FileLock::Release() {
  if (fd_ < 0) return;
  if (owns_fd_) {
    close(fd_);  // drops the flock with the descriptor
  } else {
    flock(fd_, LOCK_UN);
  }
  fd_ = -1;
}

}  // namespace kforge
