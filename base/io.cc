#include "base/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"

namespace kforge {

absl::Status ErrnoStatus(int err, std::string_view what, std::string_view path) {
  const std::string msg = absl::StrCat(AsAbsl(what), " ", AsAbsl(path), ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

namespace {

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t max_bytes, Symlinks symlinks,
                                    uint64_t* size) {
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY |
                    (symlinks == Symlinks::kRefuse ? O_NOFOLLOW : 0);
  const int fd = open(path.c_str(), flags);
  if (fd < 0) {
    if (errno == ELOOP && symlinks == Symlinks::kRefuse) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": is a symbolic link, expected a regular file"));
    }
    return ErrnoStatus(errno, "cannot open", path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": is ", FileTypeName(st.st_mode), ", expected a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", st.st_size,
                                                      " bytes, more than the ", max_bytes,
                                                      " bytes such a file may have"));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadFd(int fd, uint64_t size, std::string_view path) {
  std::string data(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd, data.data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (n == 0) break;  // shorter than fstat said
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  return data;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes,
                                     Symlinks symlinks) {
  uint64_t size = 0;
  absl::StatusOr<int> fd = OpenRegularFile(path, max_bytes, symlinks, &size);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<std::string> data = ReadFd(*fd, size, path);
  close(*fd);
  return data;
}

absl::Status WriteAll(int fd, std::string_view data, std::string_view path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open directory", dir);
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, "cannot fsync directory", dir);
  return absl::OkStatus();
}

absl::StatusOr<AtomicFile> AtomicFile::Create(std::string path) {
  // mkstemp opens with O_EXCL: concurrent writers of one path (threads or
  // processes) each get their own temporary, and the last rename wins whole.
  std::string tmp = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot create temporary file for", path);
  // mkstemp creates 0600; artifacts are meant to be shared like any file.
  if (fchmod(fd, 0644) != 0) {
    const int err = errno;
    close(fd);
    unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot chmod", tmp);
  }
  return AtomicFile(std::move(path), std::move(tmp), fd);
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_(std::exchange(other.tmp_, "")),
      fd_(std::exchange(other.fd_, -1)) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  if (!tmp_.empty()) unlink(tmp_.c_str());
}

absl::Status AtomicFile::Write(std::string_view data) {
  if (fd_ < 0) return absl::FailedPreconditionError("AtomicFile: write after Sync");
  return WriteAll(fd_, data, tmp_);
}

absl::Status AtomicFile::Sync() {
  if (fd_ < 0) return absl::FailedPreconditionError("AtomicFile: Sync twice");
  const int fd = std::exchange(fd_, -1);
  const bool synced = fsync(fd) == 0;
  const int err = errno;
  if (close(fd) != 0 && synced) return ErrnoStatus(errno, "cannot close", tmp_);
  if (!synced) return ErrnoStatus(err, "cannot fsync", tmp_);
  return absl::OkStatus();
}

absl::Status AtomicFile::Rename() {
  if (fd_ >= 0 || tmp_.empty()) {
    return absl::FailedPreconditionError("AtomicFile: Rename before Sync or twice");
  }
  if (rename(tmp_.c_str(), path_.c_str()) != 0) {
    return ErrnoStatus(errno, "cannot rename into", path_);
  }
  tmp_.clear();
  return absl::OkStatus();
}

std::string AtomicFile::directory() const {
  const size_t slash = path_.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path_.substr(0, slash);
}

absl::Status AtomicFile::Commit() {
  if (absl::Status s = Sync(); !s.ok()) return s;
  if (absl::Status s = Rename(); !s.ok()) return s;
  return FsyncDir(directory());
}

absl::Status WriteFileAtomic(const std::string& path, std::string_view data) {
  std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) {
    std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) {
      return ErrnoStatus(ec.value(), "cannot create directory", target.parent_path().string());
    }
  }
  absl::StatusOr<AtomicFile> file = AtomicFile::Create(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Write(data); !s.ok()) return s;
  return file->Commit();
}

}  // namespace kforge
