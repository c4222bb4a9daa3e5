#ifndef KFORGE_SERVICE_CACHE_ENTRY_H_
#define KFORGE_SERVICE_CACHE_ENTRY_H_

// The bytes of one stored kernel, the same in every tier that keeps bytes
// (a disk entry file, a Redis value), and the checks a read makes on them:
// whatever a tier hands back is treated as hostile until DecodeCacheEntry
// accepts it. An entry is an envelope around the serialized artifact that
// records the key it is stored under, where the kernel came from and, with
// a fleet key, an HMAC-SHA256 that only holders of that key can make
// (docs/OPERATIONS.md, "Trust model").

#include <cstdint>
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
//   1: digest-checked payload.
//   2: the envelope: key, origin, optional HMAC-SHA256 with the fleet key.
inline constexpr int kCacheEntryVersion = 2;

// The envelope's header size and where its MAC starts (cache_entry.cc has
// the layout), for the fuzz target, which reseals what it mutates.
inline constexpr size_t kCacheEntryHeaderBytes = 128;
inline constexpr size_t kCacheEntryMacAt = 96;

// The fleet key's bounds: at least 32 bytes (`openssl rand -hex 32` makes
// 64), at most what a key file holds sensibly.
inline constexpr size_t kMinFleetKeyBytes = 32;
inline constexpr size_t kMaxFleetKeyBytes = 4096;

// Where a stored kernel came from, recorded in its entry (a small integer
// on disk and in Redis: never renumber).
enum class EntryOrigin : uint8_t {
  kCompiled = 1,        // compiled by this server or another of the fleet
  kSignedBundle = 2,    // `serve --warm-from` of a bundle checked with --trust
  kUnsignedBundle = 3,  // `serve --warm-from` without --trust
};
std::string_view EntryOriginName(EntryOrigin origin);

// What a tier's reader demands of an entry and how its writer seals one.
struct EntryTrust {
  // The fleet's shared secret (--fleet-key). Set: every entry written
  // carries an HMAC-SHA256 under it, and a read refuses an entry without a
  // valid one. Empty: entries carry no MAC and a read checks their
  // integrity only; a sealed entry, whose MAC it cannot check, is refused.
  std::string fleet_key;
  // `serve --trust`: a read refuses entries that came from an unsigned
  // bundle (EntryOrigin::kUnsignedBundle).
  bool signed_bundles_only = false;
};

// The entry bytes: envelope + serialized artifact, sealed with
// trust.fleet_key when it is set. Internal if the artifact does not
// serialize; InvalidArgument if its key is not a cache key.
absl::StatusOr<std::string> EncodeCacheEntry(const v1::KernelArtifact& artifact, EntryOrigin origin,
                                             const EntryTrust& trust);

// The fleet key in the file at `path` (--fleet-key, KFORGE_FLEET_KEY),
// read as every credential file is (base/credentials.h); surrounding blanks
// and the final newline are not part of it. InvalidArgument naming the
// flag, never the key, when it is shorter than kMinFleetKeyBytes or longer
// than kMaxFleetKeyBytes.
absl::StatusOr<std::string> ReadFleetKeyFile(const std::string& path);

struct DecodedEntry {
  v1::KernelArtifact artifact;
  EntryOrigin origin = EntryOrigin::kCompiled;
  bool authenticated = false;  // its HMAC was checked with the fleet key
};

// The artifact stored in `entry` under `key`, or why a reader with `trust`
// must not use it:
//   DataLoss         damaged (truncated, bad magic, version or header
//                    length, reserved bytes set, unknown origin or MAC kind,
//                    length or digest mismatch, unparsable payload, another
//                    key in the envelope or in the artifact);
//   Unauthenticated  no MAC or a wrong one while trust.fleet_key is set
//                    (written without the fleet key, or forged), or a MAC
//                    while it is not (one this reader cannot check);
//   PermissionDenied an origin `trust` refuses (an unsigned bundle's).
absl::StatusOr<DecodedEntry> DecodeCacheEntry(std::string_view entry, std::string_view key,
                                              const EntryTrust& trust);

// True for the statuses DecodeCacheEntry gives an entry that is whole but
// not trusted (counted apart from damage: it means someone without the
// fleet key wrote to the tier).
bool IsUntrustedEntry(const absl::Status& status);

// What a tier answers after dropping an entry it will not serve: logs a
// "corrupt_entry" event, or "untrusted_entry" for IsUntrustedEntry(why)
// (tier, key, why), and returns the NotFound a miss is ("dropped corrupt
// artifact KEY on TIER: WHY").
absl::Status DroppedCorruptEntry(std::string_view tier, std::string_view key,
                                 const absl::Status& why);

}  // namespace kforge

#endif  // KFORGE_SERVICE_CACHE_ENTRY_H_
