#ifndef KFORGE_BASE_IO_H_
#define KFORGE_BASE_IO_H_

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge {

// "<what> <path>: <strerror(err)>" with the canonical code for `err`:
// NotFound (ENOENT), PermissionDenied (EACCES, EPERM, EROFS),
// ResourceExhausted (ENOSPC, EDQUOT), Internal otherwise.
absl::Status ErrnoStatus(int err, std::string_view what, std::string_view path);

// Reads a whole file. NotFound / PermissionDenied name the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

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
