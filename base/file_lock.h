#ifndef KFORGE_BASE_FILE_LOCK_H_
#define KFORGE_BASE_FILE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"

namespace kforge {

// An exclusive advisory lock (flock) between processes, held while the
// object lives. The lock belongs to the open file description, so it also
// goes when the process dies: a killed holder never leaves it stuck.
// Waiting is retried on EINTR.
class FileLock {
 public:
  enum class Wait { kBlock, kTry };

  // Opens (creating, 0644) the lock file `path` and locks it; the file
  // stays open until the lock is released. With kTry a lock held elsewhere
  // is Unavailable at once.
  static absl::StatusOr<FileLock> Acquire(const std::string& path, Wait wait);

  // Locks an open descriptor the caller keeps owning (a directory, say):
  // released with LOCK_UN, the descriptor left open. `name` is for errors.
  static absl::StatusOr<FileLock> Lock(int fd, const std::string& name, Wait wait);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  ~FileLock();

  // Releases the lock now (the destructor then does nothing).
  void Release();

 private:
  FileLock(int fd, bool owns_fd) : fd_(fd), owns_fd_(owns_fd) {}
  int fd_ = -1;
  bool owns_fd_ = false;
};

}  // namespace kforge

#endif  // KFORGE_BASE_FILE_LOCK_H_
