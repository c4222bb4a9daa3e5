#ifndef KFORGE_BASE_IO_H_
#define KFORGE_BASE_IO_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge {

// Reads a whole file. NotFound / PermissionDenied name the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `data` to a temporary file in the same directory, fsyncs it and
// renames it over `path`, so a reader sees the old file or the whole new
// one, never a torn write. Creates missing parent directories.
absl::Status WriteFileAtomic(const std::string& path, std::string_view data);

}  // namespace kforge

#endif  // KFORGE_BASE_IO_H_
