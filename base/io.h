#ifndef KFORGE_BASE_IO_H_
#define KFORGE_BASE_IO_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge {

// "<what> <path>: <strerror(err)>" with the canonical code for `err`:
// NotFound (ENOENT), PermissionDenied (EACCES, EPERM, EROFS),
// ResourceExhausted (ENOSPC, EDQUOT), Internal otherwise.
absl::Status ErrnoStatus(int err, std::string_view what, std::string_view path);

// Whether opening a path follows a symbolic link in its last component.
// Files kforge finds inside a directory it owns or checks (cache entries,
// bundle files) are opened without following (a link could point anywhere);
// a path the user names (--spec FILE) may be a link.
enum class Symlinks { kRefuse, kFollow };

// Opens `path` for reading as a regular file of at most `max_bytes`, the one
// way kforge opens what it reads: O_NONBLOCK, so that a FIFO or device
// cannot hang the open (a FIFO in place of a cache entry held a request and
// shutdown); O_NOFOLLOW with Symlinks::kRefuse; then fstat, and anything but
// a regular file, or one larger than `max_bytes` (judged from its size, not
// read), is FailedPrecondition naming the path and what it is. NotFound /
// PermissionDenied name the path. Returns the descriptor (the caller closes
// it) and sets *size.
absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t max_bytes, Symlinks symlinks,
                                    uint64_t* size);

// Reads `size` bytes (fewer if the file is shorter) from `fd`; `path`
// names the file in an error.
absl::StatusOr<std::string> ReadFd(int fd, uint64_t size, std::string_view path);

// A whole regular file through OpenRegularFile; never reads more than
// `max_bytes`.
absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes,
                                     Symlinks symlinks = Symlinks::kRefuse);

// Writes all of `data` to `fd`, retrying short writes and EINTR. `path`
// names the file in an error.
absl::Status WriteAll(int fd, std::string_view data, std::string_view path);

// fsyncs a directory, so that names created or renamed in it survive a
// crash.
absl::Status FsyncDir(const std::string& dir);

// A file written under a temporary name beside `path` ("<path>.tmp.XXXXXX",
// mode 0644), then fsynced, renamed over `path` and the directory fsynced:
// a reader sees the old file or the whole new one, never a torn write, and
// the new one survives a crash once Commit returns. Dropped without Commit
// (an error on the way), the temporary is removed.
class AtomicFile {
 public:
  // Creates the temporary file; the parent directory must exist.
  static absl::StatusOr<AtomicFile> Create(std::string path);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  ~AtomicFile();

  // The open temporary file, for what a caller sets besides the data (its
  // times, say). -1 after Sync.
  int fd() const { return fd_; }
  absl::Status Write(std::string_view data);

  // Sync + Rename + FsyncDir of the parent.
  absl::Status Commit();

  // Commit in steps, for a caller that does its own bookkeeping at the
  // moment of the rename (under its lock) and fsyncs the directory after.
  absl::Status Sync();    // fsync and close the temporary
  absl::Status Rename();  // rename it over the target
  const std::string& path() const { return path_; }
  std::string directory() const;

 private:
  AtomicFile(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  std::string path_;
  std::string tmp_;  // "" once renamed
  int fd_;
};

// Writes `data` to `path` through an AtomicFile (so durably: file and
// directory fsynced). Creates missing parent directories.
absl::Status WriteFileAtomic(const std::string& path, std::string_view data);

}  // namespace kforge

#endif  // KFORGE_BASE_IO_H_
