#include "base/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kforge {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what,
                         const std::string& path) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, "cannot open", path);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return ErrnoStatus(errno, "cannot read", path);
  return std::move(buf).str();
}

absl::Status WriteFileAtomic(const std::string& path, std::string_view data) {
  std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) {
    std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat(
          "cannot create directory ", target.parent_path().string(), ": ",
          ec.message()));
    }
  }
  std::string tmp = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkstemp(tmp.data());
  if (fd < 0) return ErrnoStatus(errno, "cannot create temporary file for", path);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoStatus(err, "cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  // mkstemp creates 0600; artifacts are meant to be shared like any file.
  if (fchmod(fd, 0644) != 0 || fsync(fd) != 0 || close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot flush", tmp);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot rename into", path);
  }
  return absl::OkStatus();
}

}  // namespace kforge
