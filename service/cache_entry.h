#ifndef KFORGE_SERVICE_CACHE_ENTRY_H_
#define KFORGE_SERVICE_CACHE_ENTRY_H_

// The bytes of one stored kernel, the same in every tier that keeps bytes
// (a disk entry file, a Redis value), and the checks a read makes on them:
// whatever a tier hands back is treated as hostile until DecodeCacheEntry
// accepts it.

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kforge/v1/artifact.pb.h"

namespace kforge {

bool IsLowerHexDigit(char c);

// A key is exactly the 64 lower-case hex digits of a SHA-256; nothing else
// reaches a path or a Redis key.
bool IsValidCacheKey(std::string_view key);

// InvalidArgument naming the (escaped, truncated) key.
absl::Status CacheKeyError(std::string_view key);

// Version of the entry layout (cache_entry.cc); part of the Redis key
// namespace, so that servers of two layouts never read each other's values.
inline constexpr int kCacheEntryVersion = 1;

// The header that precedes `payload` (a serialized KernelArtifact).
std::string EncodeCacheEntryHeader(std::string_view payload);

// Header + serialized artifact, or Internal if it does not serialize.
absl::StatusOr<std::string> EncodeCacheEntry(const v1::KernelArtifact& artifact);

// The artifact stored in `entry`, or DataLoss saying why `entry` is not a
// valid entry for `key` (truncated, bad magic or version, length or digest
// mismatch, unparsable payload, another key).
absl::StatusOr<v1::KernelArtifact> DecodeCacheEntry(std::string_view entry, std::string_view key);

// What a tier answers after dropping a damaged entry: logs a
// "corrupt_entry" event (tier, key, why) and returns the NotFound a miss
// is ("dropped corrupt artifact KEY on TIER: WHY").
absl::Status DroppedCorruptEntry(std::string_view tier, std::string_view key, std::string_view why);

}  // namespace kforge

#endif  // KFORGE_SERVICE_CACHE_ENTRY_H_
